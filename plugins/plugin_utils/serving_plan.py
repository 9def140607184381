# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving layer's instance planner, the same for every engine.

instances + default settings + build fact + llmops_models + llmops_gpus -> one plan per instance: its GPUs,
host/port/url, key file, env file, model path, unit and container names, and the engine's argv. What differs
per engine is its flag table, a module of :data:`ENGINES` that provides

* ``build_argv(settings, model=, host=, port=, api_key_file=, extra_args=, gpus=)`` and
  ``uses_mlock(settings)``;
* ``PROGRAM`` (llama-server), ``ROLE`` (the role whose variables the messages name: llama_server),
  ``BUILD_ROLE`` and ``BUILD_FACT`` (the role and fact that build the engine: llama_cpp, llmops_llama_cpp).

Controller-only (plugin_utils), plain Python, unit-tested without Ansible by
tests/unit/plugins/plugin_utils/test_serving_plan.py; the role reaches it through the filter
plugins/filter/llama_server.py.
"""
from __future__ import absolute_import, division, print_function

import re

from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags
from ansible_collections.llmops.serving.plugins.plugin_utils.container import (
    CONTAINER_KEY_FILE,
    CONTAINER_MODEL_DIR,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import check_env, env_file_lines
from ansible_collections.llmops.serving.plugins.plugin_utils.gpu_assignment import claim_gpus, normalize_gpus
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, is_number

__metaclass__ = type

# Engine name (as llmops_llama_cpp / the instance say it) -> its flag table.
ENGINES = {"llama.cpp": llama_server_flags}

INSTANCE_FIELDS = ("name", "model", "gpus", "host", "port", "settings", "extra_args", "env", "mode")
MODES = ("host", "container")
LOOPBACK_HOSTS = ("localhost", "::1", "ip6-localhost")
# Variables the role computes from the gpus list; the instance's env may not set them.
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def engine_flags(engine):
    """The flag table module of `engine` (a key of ENGINES)."""
    if engine not in ENGINES:
        raise ServingError("unknown engine %r; known engines: %s" % (engine, ", ".join(sorted(ENGINES))))
    return ENGINES[engine]


def is_loopback(host):
    host = str(host).strip().strip("[]").lower()
    if host in LOOPBACK_HOSTS or host.endswith(".sock"):
        return True
    return bool(re.match(r"^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$", host))


def connect_host(host):
    """Where a client on the node reaches a server bound to `host`."""
    first = str(host).split(",", 1)[0].strip()
    if first in ("0.0.0.0", ""):
        return "127.0.0.1"
    if first in ("::", "[::]"):
        return "[::1]"
    if ":" in first and not first.startswith("["):
        return "[%s]" % first
    return first


def resolve_model(model, models_fact, instance="instance"):
    """Model name from llmops_models, or an absolute path -> (path, sha256 or None)."""
    if not model:
        raise ServingError("%s has no model: give a name from llmops_models or an absolute path" % instance)
    models_fact = models_fact or {}
    if model in models_fact:
        entry = models_fact[model] or {}
        if not entry.get("path"):
            raise ServingError("%s: llmops_models[%s] has no path" % (instance, model))
        return entry["path"], entry.get("sha256")
    if str(model).startswith("/"):
        return str(model), None
    raise ServingError(
        "%s: model %r is neither a model of llmops_models (%s) nor an absolute path; run the model role "
        "first or give the GGUF path" % (instance, model, ", ".join(sorted(models_fact)) or "empty"))


def _instance_name(raw, names):
    if not isinstance(raw, dict) or not raw.get("name"):
        raise ServingError("each instance needs a name: %r" % (raw,))
    name = str(raw["name"])
    if not _NAME_RE.match(name):
        raise ServingError("instance name %r: use letters, digits, '.', '_' or '-' (it names the systemd "
                           "unit)" % name)
    if name in names:
        raise ServingError("instance name %s is used twice" % name)
    names.add(name)
    unknown = set(raw) - set(INSTANCE_FIELDS)
    if unknown:
        raise ServingError("instance %s: unknown field(s) %s; engine options go under settings or extra_args"
                           % (name, ", ".join(sorted(unknown))))
    return name


def _instance_port(raw, name, ports):
    port = raw.get("port")
    if isinstance(port, bool) or not (is_number(port) or str(port).isdigit()) or not 0 < int(port) < 65536:
        raise ServingError("instance %s: port must be a number 1-65535, got %r" % (name, port))
    port = int(port)
    if port in ports:
        raise ServingError("instances %s and %s both use port %d" % (ports[port], name, port))
    ports[port] = name
    return port


def _check_bind(name, host, has_key, flags):
    if not has_key and not all(is_loopback(h) for h in host.split(",")):
        raise ServingError(
            "instance %s binds %s without an API key: anyone on the network could use it. Put its key in "
            "%s_api_keys['%s'] (Ansible Vault or an AWX credential), or bind 127.0.0.1"
            % (name, host, flags.ROLE, name))


def _runner(name, mode, build, override, flags):
    """What a unit starts: the binary (host mode) or the image (container mode), from the build fact or the
    role's override. Returns the plan's binary/image/container fields."""
    field = "binary" if mode == "host" else "image"
    value = override or build.get(field)
    if not value:
        if mode == "host":
            raise ServingError("instance %s: no %s binary: run the %s role first (fact %s.binary) or set "
                               "%s_binary"
                               % (name, flags.PROGRAM, flags.BUILD_ROLE, flags.BUILD_FACT, flags.ROLE))
        raise ServingError("instance %s: mode container needs an image: run the %s role (fact %s.image) "
                           "or set %s_image" % (name, flags.BUILD_ROLE, flags.BUILD_FACT, flags.ROLE))
    container = mode == "container"
    return {
        "binary": None if container else value,
        "image": value if container else None,
        # container builds record where the engine lives inside the image
        "container_entrypoint": build.get("binary") if container and not override else None,
    }


def plan_instances(instances, defaults=None, build=None, models=None, gpus=None, api_key_names=(),
                   key_dir="/etc/llama-server", unit_prefix="llama-server-", binary_override=None,
                   mode_override=None, image_override=None, systemd_version=None, engine="llama.cpp"):
    """Resolve every instance of a host. Returns a list of dicts (no secrets in them).

    `build` is the engine's build fact (llmops_llama_cpp: mode, binary or image, build_id).
    Refuses: duplicate names/ports, GPUs shared by two instances, missing binary/image, a non-loopback bind
    without an API key, unknown settings, removed flags, env its env file cannot carry (see check_env).
    `env` values stay out of the plan (it is a fact): `env_names` lists the names, `env_file` is where the
    role writes them (always written, empty when there is no env, so a removed variable is removed there too).
    """
    flags = engine_flags(engine)
    if not isinstance(instances, (list, tuple)):
        raise ServingError("%s_instances must be a list of instance mappings" % flags.ROLE)
    build = build or {}
    api_key_names = set(api_key_names or ())
    names, ports, owners = set(), {}, {}
    plans = []
    for raw in instances:
        name = _instance_name(raw, names)
        port = _instance_port(raw, name, ports)
        host = str(raw.get("host") or "127.0.0.1")
        has_key = name in api_key_names
        _check_bind(name, host, has_key, flags)
        gpu_list = normalize_gpus(raw.get("gpus"), gpus, "instance %s" % name)
        claim_gpus(owners, gpu_list, name)
        model_path, model_sha = resolve_model(raw.get("model"), models, "instance %s" % name)
        settings = dict(defaults or {})
        settings.update(raw.get("settings") or {})
        mode = mode_override or raw.get("mode") or build.get("mode") or "host"
        if mode not in MODES:
            raise ServingError("instance %s: mode must be host or container, got %r" % (name, mode))
        key_file = "%s/%s.key" % (key_dir.rstrip("/"), name) if has_key else None
        model_dir, model_file = model_path.rsplit("/", 1)
        argv_model = model_path if mode == "host" else "%s/%s" % (CONTAINER_MODEL_DIR, model_file)
        argv_key = key_file if mode == "host" or not key_file else CONTAINER_KEY_FILE
        argv = flags.build_argv(settings, model=argv_model, host=host, port=port, api_key_file=argv_key,
                                extra_args=raw.get("extra_args"), gpus=gpu_list)
        # `env` holds what the role computes (not secret, visible in the unit); the instance's own env goes to
        # its env file only.
        env = {}
        if mode == "host" and gpu_list:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_list)
        instance_env = check_env(raw.get("env"), mode, systemd_version, "instance %s" % name)
        for key in instance_env:
            if key in GPU_ENV and gpu_list:
                raise ServingError("instance %s: %s comes from its gpus list; do not set it in env"
                                   % (name, key))
        runner = _runner(name, mode, build, binary_override if mode == "host" else image_override, flags)
        plan = dict([
            ("name", name),
            ("unit", "%s%s.service" % (unit_prefix, name)),
            ("mode", mode),
            ("host", host),
            ("port", port),
            ("url", "http://%s:%d" % (connect_host(host), port)),
            ("gpus", gpu_list),
            ("model", raw.get("model")),
            ("model_path", model_path),
            ("model_dir", model_dir or "/"),
            ("model_sha256", model_sha),
            ("key_file", key_file),
            ("mlock", flags.uses_mlock(settings)),
            ("argv", argv),
            ("env", env),
            ("env_file", "%s/%s.env" % (key_dir.rstrip("/"), name)),
            ("env_names", list(instance_env)),
            ("build_id", build.get("build_id")),
            ("binary", runner["binary"]),
            ("image", runner["image"]),
            ("container_entrypoint", runner["container_entrypoint"]),
            ("container_name", "%s%s" % (unit_prefix, name) if mode == "container" else None),
        ])
        plans.append(plan)
    return plans


def instance_env_file(instances, name, mode="host", systemd_version=None, engine="llama.cpp"):
    """Assignments of the env file of instance `name` of `instances` (<role>_instances), as text."""
    for raw in instances or ():
        if isinstance(raw, dict) and str(raw.get("name")) == str(name):
            env = check_env(raw.get("env"), mode, systemd_version, "instance %s" % name)
            return "".join(line + "\n" for line in env_file_lines(env, mode))
    raise ServingError("no instance named %s in %s_instances" % (name, engine_flags(engine).ROLE))
