# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving layer's instance planner, the same for every engine.

instances + default settings + build fact + llmops_models + llmops_gpus -> one plan per instance: its GPUs,
host/port/url, key file, env file, model path, unit and container names, and the engine's argv. What differs
per engine is its descriptor (plugins/module_utils/engines.py: setting names, unit prefix, key variable, model
kind, Ray...) and its flag table, the module of :data:`FLAG_TABLES` the descriptor names, that provides

* ``build_argv(settings, model=, host=, port=, api_key_file=, extra_args=, gpus=)`` and
  ``uses_mlock(settings)``;
* ``build_argv(settings, model=, host=, port=, api_key_file=, extra_args=, gpus=, served_model_name=,
  allowed_extra_flags=)``, ``uses_mlock(settings)``, ``model_check_path(model_path)`` (the file that must
  exist on the node), ``unit_env(timeout_start_sec)`` (variables the unit sets) and
  ``preflight(settings, gpus, gpu_entries, running)`` (refusals raised, warnings returned);
* ``PROGRAM`` (llama-server, vllm), ``ROLE`` (the role whose variables the messages name: serving),
  ``TIMEOUT_START_SEC``, ``SUBCOMMAND`` (``serve``), ``CONTAINER_ARGS``, ``OPEN_PATHS``/
  ``KEY_GUARDED_PATHS`` (what the key leaves open, None when it guards everything), ``cuda_ways_out(version)``
  (the engine's own ways round a driver too old for its CUDA), ``version_warning(version, argv)`` (None when
  the flag table was checked against that engine version) and ``FORWARD_COMPAT_ENV`` (what makes it load a
  forward-compatibility libcuda, None when the instance's env must do it).

Controller-only (plugin_utils), plain Python, unit-tested without Ansible by
tests/unit/plugins/plugin_utils/test_instance_plan.py; the role reaches it through the filter
plugins/filter/serving.py.
"""
from __future__ import absolute_import, division, print_function

import re
import shlex

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils._gpu import cuda_compat
from ansible_collections.llmops.serving.plugins.module_utils.secrets import secret_problem
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags, vllm_flags
from ansible_collections.llmops.serving.plugins.plugin_utils.container import (
    CONTAINER_KEY_FILE,
    CONTAINER_MODEL_DIR,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import check_env, env_file_lines
from ansible_collections.llmops.serving.plugins.plugin_utils.gpu_assignment import (
    claim_gpus,
    gpu_entries,
    normalize_gpus,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, is_number

__metaclass__ = type

# A descriptor's flag_table (the module's name) -> that flag table.
FLAG_TABLES = {module.__name__.rsplit(".", 1)[1]: module for module in (llama_server_flags, vllm_flags)}

INSTANCE_FIELDS = ("name", "engine", "model", "served_model_name", "gpus", "host", "port", "settings",
                   "extra_args", "env", "mode", "accept_exposure", "ray_cluster", "cuda_forward_compat")
MODES = ("host", "container")
LOOPBACK_HOSTS = ("localhost", "::1", "ip6-localhost")
# A vLLM instance (an engine whose descriptor says ray) that spans nodes names the inventory group of its
# Ray cluster (`ray_cluster: <group>`, on the head's serving_instances); vLLM then runs its workers as Ray
# actors on the cluster's GPUs.
RAY_BACKEND = "ray"
# What role ray_cluster declares to Ray per node: this host variable when set, else every GPU of llmops_gpus.
RAY_NUM_GPUS_VAR = "ray_cluster_num_gpus"
# Variables the role computes from the gpus list; the instance's env may not set them.
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

_NAME_RE = whole(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# A control character in anything the unit carries would end its line there: the rest becomes a directive
# of its own (ExecStartPre=, Environment=, User=...). systemd has no way to quote a newline in a unit line.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def engine_descriptor(name):
    """The descriptor of engine `name` (plugins/module_utils/engines.py); ServingError when unknown."""
    try:
        return engines.get(name)
    except engines.UnknownEngine as exc:
        raise ServingError(str(exc)) from None


def engine_flags(name):
    """The flag table module of engine `name`: the module its descriptor's flag_table names."""
    return FLAG_TABLES[engine_descriptor(name).flag_table]


def key_env(name):
    """The variable through which the unit gives engine `name` its API key (its env file), or None when the
    key goes to a file (--api-key-file)."""
    descriptor = engine_descriptor(name)
    return descriptor.key_variable if descriptor.key_in_env else None


def is_loopback(host):
    host = str(host).strip().strip("[]").lower()
    if host in LOOPBACK_HOSTS or host.endswith(".sock"):
        return True
    return bool(matches(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", host))


def exposed_ports(plans):
    """'<port>/tcp' of the planned instances that bind beyond loopback (what a firewall must let in), sorted
    by port; an instance on 127.0.0.1 needs no opening."""
    ports = set()
    for plan in plans or ():
        hosts = str(plan.get("host") or "127.0.0.1").split(",")
        if not all(is_loopback(h) for h in hosts):
            ports.add(int(plan["port"]))
    return ["%d/tcp" % p for p in sorted(ports)]


def exposed_listeners(plans):
    """[{port: '<port>/tcp', host: bind address(es)}] of the instances exposed_ports() opens: firewall_ports
    opens each in the firewalld zone of the interface carrying its address (issue 35.5)."""
    exposed = set(exposed_ports(plans))
    return [{"port": "%d/tcp" % int(plan["port"]), "host": str(plan.get("host"))}
            for plan in sorted(plans or (), key=lambda p: int(p["port"]))
            if "%d/tcp" % int(plan["port"]) in exposed and plan.get("host")]


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


def check_model_kind(model, models_fact, engine, instance="instance"):
    """An engine of model_kind snapshot (vLLM) serves a model directory (a model_models item with snapshot:
    true), one of model_kind gguf (llama.cpp) a GGUF file: naming the other kind would fail later, at the
    node's model check or at the engine's start."""
    entry = (models_fact or {}).get(model) if isinstance(model, str) else None
    if not isinstance(entry, dict):
        return
    descriptor = engine_descriptor(engine)
    if descriptor.model_kind == "snapshot" and not entry.get("snapshot") \
            and str(entry.get("path") or "").endswith(".gguf"):
        raise ServingError("%s (%s): model_models item %s is a GGUF file (%s); %s serves a model "
                           "directory: add a model_models item with repo and snapshot: true (the safetensors "
                           "checkpoint) and name it here"
                           % (instance, engine, model, entry.get("path"), descriptor.label))
    if descriptor.model_kind != "snapshot" and entry.get("snapshot"):
        raise ServingError("%s (%s): model_models item %s is a snapshot (a model directory for %s); "
                           "%s serves a GGUF file: name a model_models item with filename"
                           % (instance, engine, model, _labels("model_kind", "snapshot"), descriptor.label))


def _labels(field, value):
    """The labels of the engines whose descriptor `field` is `value` ("vLLM"; "vLLM or SGLang")."""
    return " or ".join(engine_descriptor(name).label for name in engines.with_field(field, value))


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


def _check_bind(name, host, has_key, flags, fronted_by_proxy, accept_exposure):
    """Loopback always; anything else needs a key, and for an engine whose key leaves paths open (vLLM), a
    fronting proxy or the instance's explicit acceptance of that exposure."""
    if all(is_loopback(h) for h in host.split(",")):
        return
    if flags.OPEN_PATHS and not (fronted_by_proxy or accept_exposure is True):
        raise ServingError(
            "instance %s binds %s, but %s's API key guards only %s (%s stay open to anyone who can reach "
            "the port). Bind 127.0.0.1, or set %s_fronted_by_proxy: true when the fleet's gateway fronts "
            "it, or set accept_exposure: true on the instance to accept that exposure explicitly"
            % (name, host, flags.PROGRAM, flags.KEY_GUARDED_PATHS, flags.OPEN_PATHS, flags.ROLE))
    if not has_key:
        raise ServingError(
            "instance %s binds %s without an API key: anyone on the network could use it. Put its key in "
            "%s_api_keys['%s'] (Ansible Vault or an AWX credential), or bind 127.0.0.1"
            % (name, host, flags.ROLE, name))


def _runner(name, mode, build, override, flags, engine):
    """What a unit starts: the binary (host mode) or the image (container mode), from the build fact or the
    role's override. Returns the plan's binary/image/container fields."""
    build_role, build_fact = engine_descriptor(engine).build_role, engine_descriptor(engine).build_fact
    field = "binary" if mode == "host" else "image"
    value = override or build.get(field)
    if not value:
        if mode == "host":
            raise ServingError("instance %s: no %s binary: run the %s role first (fact %s.binary) or set "
                               "%s_binary['%s']"
                               % (name, flags.PROGRAM, build_role, build_fact, flags.ROLE,
                                  engine))
        raise ServingError("instance %s: mode container needs an image: run the %s role (fact %s.image) "
                           "or set %s_image['%s']"
                           % (name, build_role, build_fact, flags.ROLE, engine))
    container = mode == "container"
    return {
        "binary": None if container else value,
        "image": value if container else None,
        # container builds record where the engine lives inside the image
        "container_entrypoint": build.get("binary") if container and not override else None,
    }


def by_engine(mapping, engine, variable):
    """The `engine` entry of a role variable keyed by engine ({llama.cpp: ..., vllm: ...}); None if unset."""
    if mapping is None:
        return None
    if not isinstance(mapping, dict):
        raise ServingError("%s must be a mapping keyed by engine (%s)"
                           % (variable, ", ".join(sorted(engines.names()))))
    unknown = sorted(str(k) for k in mapping if engines.lookup(k) is None)
    if unknown:
        raise ServingError("%s is keyed by engine (%s); %s is not an engine"
                           % (variable, ", ".join(sorted(engines.names())), ", ".join(unknown)))
    return mapping.get(engine)


def instance_settings(raw, defaults, engine):
    """The instance's settings over serving_default_settings[engine] (a null value is kept: it drops the
    default when the flag table renders them)."""
    settings = dict(by_engine(defaults, engine, "serving_default_settings") or {})
    settings.update(raw.get("settings") or {})
    return settings


def ray_settings(raw, settings, engine, name):
    """The settings of an instance with `ray_cluster`: only an engine whose descriptor says ray (vLLM), and
    distributed_executor_backend ray (set when absent or left null; a different value in the instance's own
    settings is refused, one inherited from serving_default_settings is replaced: the defaults are written
    for single-node instances). Returns `settings` unchanged for an instance without ray_cluster."""
    group = raw.get("ray_cluster")
    if group is None:
        return settings
    if not isinstance(group, str) or not group:
        raise ServingError("instance %s: ray_cluster must be the name of an inventory group (the hosts of "
                           "the Ray cluster), got %r" % (name, group))
    if not engine_descriptor(engine).ray:
        ray_engines = " or ".join(engines.with_field("ray", True))
        raise ServingError("instance %s: ray_cluster is for engine %s (its Ray executor spans nodes); "
                           "engine %s runs on one node: remove ray_cluster or set engine: %s"
                           % (name, ray_engines, engine, ray_engines))
    own = (raw.get("settings") or {}).get("distributed_executor_backend")
    if own is not None and str(own) != RAY_BACKEND:
        raise ServingError("instance %s: ray_cluster %s runs vLLM with distributed_executor_backend ray, but "
                           "its settings say %r: remove that setting (ray_cluster implies ray) or remove "
                           "ray_cluster to run on this node only" % (name, group, own))
    settings = dict(settings)
    settings["distributed_executor_backend"] = RAY_BACKEND
    return settings


def _host_vars(hostvars, host):
    try:
        return hostvars[host]
    except KeyError:
        return {}


def _count(value, what):
    if isinstance(value, bool) or not (is_number(value) or str(value).strip().isdigit()) or int(value) < 0:
        raise ServingError("%s must be a number of GPUs, got %r" % (what, value))
    return int(value)


def ray_cluster_nodes(group, hostvars, groups, head=None, head_gpus=None, name="instance"):
    """The nodes of Ray cluster `group` (an inventory group) as role ray_cluster declares them to Ray:
    a list of {"host", "num_gpus" (None when unknown), "gpus" (the llmops_gpus entries Ray uses, None when
    the node's llmops_gpus is unknown), "unknown" (why, or None)}, the head first.

    A node declares ray_cluster_num_gpus when set (the first that many GPUs by index), else every GPU of its
    llmops_gpus. On the head, the instance's own `head_gpus` (its gpus list, physical indexes) are the GPUs it
    uses when given (in the instance's order). `hostvars`/`groups` are Ansible's; None when the caller has
    none (returns None)."""
    if hostvars is None or groups is None:
        return None
    hosts = list((groups or {}).get(group) or ())
    if not hosts:
        raise ServingError("instance %s: ray_cluster %s is not an inventory group with hosts (the Ray head "
                           "and workers): add the group or name the right one" % (name, group))
    if head in hosts:
        hosts = [head] + [h for h in hosts if h != head]
    nodes = []
    for host in hosts:
        hv = _host_vars(hostvars, host)
        fact = hv.get("llmops_gpus") if hasattr(hv, "get") else None
        declared = hv.get(RAY_NUM_GPUS_VAR) if hasattr(hv, "get") else None
        known = isinstance(fact, dict) and fact.get("present") and isinstance(fact.get("gpus"), list)
        entries = sorted(fact["gpus"], key=lambda g: int(g.get("index") or 0)) if known else None
        num = None
        if declared is not None and declared != "":
            num = _count(declared, "%s of host %s" % (RAY_NUM_GPUS_VAR, host))
        elif entries is not None:
            num = len(entries)
        if host == head and head_gpus:
            if num is not None and len(head_gpus) != num:
                raise ServingError(
                    "instance %s: its gpus list %d GPU(s) of the head %s, but the head declares %d to Ray "
                    "(%s, else all of llmops_gpus): make them equal (Ray, not the instance, places the "
                    "workers)" % (name, len(head_gpus), host, num, RAY_NUM_GPUS_VAR))
            num = len(head_gpus)
            if entries is not None:
                entries = gpu_entries(head_gpus, fact)
        elif entries is not None and num is not None:
            if num > len(entries):
                raise ServingError("instance %s: host %s declares %s %d, but llmops_gpus lists %d GPU(s)"
                                   % (name, host, RAY_NUM_GPUS_VAR, num, len(entries)))
            entries = entries[:num]
        unknown = None
        if entries is None:
            unknown = ("the GPUs of %s are unknown (llmops_gpus not gathered there: run gpu_facts on every "
                       "host of %s in the play)" % (host, group))
        nodes.append({"host": host, "num_gpus": num, "gpus": entries, "unknown": unknown})
    return nodes


def runtime_cuda(build, mode, override):
    """(CUDA release, where it comes from) of what the instance runs: the build fact's cuda_version, which
    role llama_cpp reads from nvcc and role vllm from torch or the image's environment. None when the fact
    has none (a CPU build, a runtime that does not say) or an override replaces the runtime the fact
    describes: never guessed."""
    if override and override != build.get("binary" if mode == "host" else "image"):
        return None, "serving_%s overrides the runtime the build fact describes" % (
            "binary" if mode == "host" else "image")
    if build.get("mode") and build.get("mode") != mode:
        return None, ("the build fact describes a %s runtime, the instance runs in %s mode"
                      % (build["mode"], mode))
    return build.get("cuda_version") or None, build.get("cuda_source") or None


def cuda_decision(name, engine, flags, build, mode, override, gpu_facts, gpu_list, forward_compat):
    """CUDA's compatibility rules (module_utils/_gpu/cuda_compat.py) for one instance: the plan's `cuda`
    record {decision, runtime_cuda, source, driver, minimum_driver, message}, its warnings, and the refusal (a
    message naming the instance, the runtime's version, where its CUDA was read and the ways out) or None."""
    if forward_compat is not None and not isinstance(forward_compat, bool):
        raise ServingError("instance %s: cuda_forward_compat must be true or false, got %r"
                           % (name, forward_compat))
    cuda, source = runtime_cuda(build, mode, override)
    facts = gpu_facts if isinstance(gpu_facts, dict) else {}
    entries = gpu_entries(gpu_list, facts) if gpu_list else list(facts.get("gpus") or ())
    driver = facts.get("driver_version") or next((e.get("driver_version") for e in entries
                                                  if e.get("driver_version")), "")
    version = build.get("version") or build.get("build_id")
    what = "%s %s" % (flags.PROGRAM, version or "(version unknown)")
    result = cuda_compat.decide(cuda, driver, [e.get("name") for e in entries], what=what,
                                forward_compat=forward_compat is True, ways_out=flags.cuda_ways_out(version))
    record = {"decision": result["decision"], "runtime_cuda": result["runtime_cuda"], "source": source,
              "driver": result["driver"], "minimum_driver": result["minimum_driver"],
              "message": result["message"]}
    refusal = None
    if result["decision"] == cuda_compat.REFUSE:
        refusal = ("instance %s: %s (forward compatibility is opted in per instance: cuda_forward_compat: "
                   "true). CUDA %s of %s is read from: %s."
                   % (name, result["message"].rstrip("."), result["runtime_cuda"], what,
                      source or "the build fact"))
    warnings = list(result["warnings"])
    if result["decision"] == cuda_compat.FORWARD_COMPAT and not flags.FORWARD_COMPAT_ENV:
        warnings.append("forward compatibility for %s: put the cuda-compat-%s directory first on "
                        "LD_LIBRARY_PATH in the instance's env"
                        % (engine, result["runtime_cuda"].replace(".", "-")))
    return record, warnings, refusal


def cuda_check(name, engine, flags, build, mode, override, gpu_facts, gpu_list, forward_compat):
    """cuda_decision, raising its refusal: the planner's last guard (the role leaves refused instances out
    first, see runtime_refusals). Returns the `cuda` record and the warnings."""
    record, warnings, refusal = cuda_decision(name, engine, flags, build, mode, override, gpu_facts, gpu_list,
                                              forward_compat)
    if refusal:
        raise ServingError(refusal)
    return record, warnings


def instance_mode(raw, engine, build, mode_override=None):
    """host or container: serving_mode[engine], else the instance's mode, else the build fact's, else host."""
    mode = by_engine(mode_override, engine, "serving_mode") or raw.get("mode") or build.get("mode") or "host"
    if mode not in MODES:
        raise ServingError("instance %s: mode must be host or container, got %r" % (raw.get("name"), mode))
    return mode


def runtime_override(engine, mode, binary_override=None, image_override=None):
    """serving_binary[engine] (host mode) or serving_image[engine] (container mode), or None."""
    return by_engine(binary_override if mode == "host" else image_override, engine,
                     "serving_binary" if mode == "host" else "serving_image")


def driver_after_gpu_stage(gpus, wanted_driver="", manage_driver=True):
    """The driver the node runs once the GPU host stage is done: the pinned nvidia_driver_version when role
    nvidia_driver manages the driver (llmops_manage_driver) and the inventory pins one, else the one
    gpu_facts read now ('' when neither is known)."""
    wanted = str(wanted_driver or "").strip()
    if manage_driver in (True, "true", "True", "yes", 1, "1") and wanted:
        return wanted
    return str((gpus or {}).get("driver_version") or "") if isinstance(gpus, dict) else ""


def runtime_refusals(instances, builds=None, gpus=None, default_engine=engines.DEFAULT_ENGINE,
                     mode_override=None, binary_override=None, image_override=None, driver=None):
    """The instances whose engine runtime the node's driver cannot run (CUDA's rules, cuda_decision), to be
    left out of the run while the others deploy: [{name, engine, model, message}], in instance order.

    `builds` are per engine what will run: in preflight the runtimes the build roles will install (role
    vllm's planned runtime: its CUDA from the variant name or the wheel table, before any pull), in the serve
    stage the build facts. `driver`, when given, replaces the driver of `gpus` (preflight: the driver the
    GPU host stage leaves, driver_after_gpu_stage). Instances the planner would refuse for other reasons are
    left to it (they fail the run with their own message)."""
    facts = dict(gpus) if isinstance(gpus, dict) else {}
    if driver:
        facts["driver_version"] = driver
        facts["gpus"] = [dict(e, driver_version=driver) for e in facts.get("gpus") or ()]
    refused = []
    for raw in instances or ():
        if not isinstance(raw, dict) or not raw.get("name"):
            continue
        engine = str(raw.get("engine") or default_engine or engines.DEFAULT_ENGINE)
        if engines.lookup(engine) is None:
            continue
        flags = engine_flags(engine)
        build = by_engine(builds, engine, "the build facts") or {}
        mode = instance_mode(raw, engine, build, mode_override)
        override = runtime_override(engine, mode, binary_override, image_override)
        # The GPUs only name the cards (forward compatibility); a bad list is the planner's to refuse.
        try:
            gpu_list = normalize_gpus(raw.get("gpus"), None, "instance %s" % raw["name"])
        except ServingError:
            gpu_list = []
        refusal = cuda_decision(str(raw["name"]), engine, flags, build, mode, override, facts, gpu_list,
                                raw.get("cuda_forward_compat"))[2]
        if refusal:
            refused.append({"name": str(raw["name"]), "engine": engine, "model": raw.get("model"),
                            "message": refusal})
    return refused


def without_refused(instances, refused):
    """serving_instances without the instances named in `refused` (runtime_refusals' entries or names)."""
    names = set(r["name"] if isinstance(r, dict) else str(r) for r in refused or ())
    return [raw for raw in instances or () if not (isinstance(raw, dict) and str(raw.get("name")) in names)]


def models_in_use(models, instances, refused):
    """model_models without the models that only refused instances serve (runtime_refusals' entries name
    their model): a model no instance names (a download of its own) and a model a kept instance of
    `instances` also serves stay. `instances` may already be without the refused ones."""
    names = set(r["name"] for r in refused or ())
    kept = set(str(raw.get("model")) for raw in instances or ()
               if isinstance(raw, dict) and str(raw.get("name")) not in names)
    dropped = set(str(r.get("model")) for r in refused or ()) - kept
    return [m for m in models or () if not (isinstance(m, dict) and str(m.get("name")) in dropped)]


def refusal_report(refused):
    """The message that fails a run which left instances out: each one's refusal (with its ways out)."""
    refused = list(refused or ())
    return ("%d instance(s) not deployed in this run, the others were: %s Take one of the ways out and run "
            "again." % (len(refused), " ".join("[%s (%s)] %s" % (r["name"], r["engine"], r["message"])
                                               for r in refused)))


def unit_name(name, engine, unit_prefix=None):
    """The systemd unit of instance `name`: serving_unit_prefix[engine] (or the engine's own) + name."""
    prefix = by_engine(unit_prefix, engine, "serving_unit_prefix") or engine_descriptor(engine).unit_prefix
    return "%s%s.service" % (prefix, name)


def unit_names(instances, default_engine=engines.DEFAULT_ENGINE, unit_prefix=None):
    """The systemd units of serving_instances (what the role asks systemd about before planning); entries
    without a name or with an unknown engine are left to the planner, which refuses them with the reason."""
    units = []
    for raw in instances or []:
        if isinstance(raw, dict) and raw.get("name"):
            engine = raw.get("engine") or default_engine
            if engines.lookup(engine) is not None:
                units.append(unit_name(str(raw["name"]), engine, unit_prefix))
    return units


def engine_paths(plans, docker_binary):
    """What must be executable on the node for each instance plan, in order: its binary in host mode, the
    docker client in container mode."""
    return [plan.get("binary") if plan.get("mode") == "host" else docker_binary for plan in plans or []]


def health_wait_args(target, timeout, journal_lines=40):
    """The arguments of roles/serving/files/serving-wait.py for an instance: its plan (role serving's health
    gate) or its deployment record (role fleet, after a rollback): url, unit, first served name, the key by
    file or by the env file's variable, the timeout and how many journal lines a failure quotes."""
    served = target.get("served_model_name")
    served = served[0] if isinstance(served, (list, tuple)) else served
    args = ["--url", target["url"], "--unit", target["unit"], "--model", served or target["name"]]
    if target.get("key_file"):
        args += ["--key-file", target["key_file"]]
    if target.get("api_key_env"):
        args += ["--env-file", target["env_file"], "--key-env", target["api_key_env"]]
    args += ["--timeout", str(int(timeout)), "--journal-lines", str(int(journal_lines))]
    return " ".join(shlex.quote(str(arg)) for arg in args)


def served_name(raw, name, models_fact):
    """The stable name clients use: the instance's served_model_name, else its model's name from
    llmops_models, else the instance name; never a file path (clients would change when a file moves)."""
    value = raw.get("served_model_name")
    if not value:
        model = raw.get("model")
        value = model if model in (models_fact or {}) else name
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in names:
        if not isinstance(item, str) or not item or "/" in item:
            raise ServingError("instance %s: served_model_name %r must be a name, not a path (clients keep "
                               "it when the file moves)" % (name, item))
    return value


def _instance_env(raw, name, mode, gpu_list, systemd_version, flags, api_key_env):
    """The instance's own env, checked; the role's variables (GPUs, the API key) may not be set there."""
    env = check_env(raw.get("env"), mode, systemd_version, "instance %s" % name)
    for key in env:
        if key in GPU_ENV and gpu_list:
            raise ServingError("instance %s: %s comes from its gpus list; do not set it in env" % (name, key))
        if key == api_key_env:
            raise ServingError("instance %s: %s comes from %s_api_keys['%s'] (the health check uses it "
                               "too); do not set it in env" % (name, key, flags.ROLE, name))
    return env


def check_api_keys(api_keys):
    """serving_api_keys: every key a usable secret (module_utils/secrets.py, the collection's one rule: no
    whitespace or control character, e.g. a trailing newline from a vault lookup). The refusal names the
    instance, never the key. Empty values mean "no key" and pass."""
    if api_keys is None:
        return
    if not isinstance(api_keys, dict):
        raise ServingError("serving_api_keys must be a mapping of instance names to keys")
    for name in sorted(api_keys, key=str):
        value = api_keys[name]
        if value is None or value == "":
            continue
        problem = secret_problem(str(value) if is_number(value) else value, "serving_api_keys[%s]" % name)
        if problem:
            raise ServingError(problem)


def _unit_text(value, setting, name):
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _unit_text(item, "%s[%d]" % (setting, index), name)
    elif isinstance(value, dict):
        for key in value:
            _unit_text(str(key), "%s (a key)" % setting, name)
            _unit_text(value[key], "%s.%s" % (setting, key), name)
    elif isinstance(value, str) and _CONTROL_RE.search(value):
        raise ServingError(
            "instance %s: %s contains a control character (a newline?); it would become a line of its own in "
            "the systemd unit. Remove it (the value is not shown here)" % (name, setting))


def check_unit_values(raw, settings, name, host, model_path, served, argv, env, build):
    """Everything user-given that the unit renders (its comment, Description=, Environment=, ExecStart=, the
    docker run line): no control character, each refusal naming the setting (issue 23)."""
    _unit_text(host, "host", name)
    _unit_text(raw.get("model"), "model", name)
    _unit_text(model_path, "the model's path", name)
    _unit_text(served, "served_model_name", name)
    for key in sorted(settings or {}, key=str):
        _unit_text(str(key), "a settings key", name)
        _unit_text(settings[key], "setting %s" % key, name)
    _unit_text(raw.get("extra_args"), "extra_args", name)
    for key, value in (env or {}).items():
        _unit_text(str(key), "an env name of the build fact", name)
        _unit_text(value, "env %s of the build fact" % key, name)
    for key in ("build_id", "version", "binary", "image"):
        _unit_text(build.get(key), "the build fact's %s" % key, name)
    _unit_text(list(argv), "an argument of the command line", name)


def _build_env(build, instance_env, name, build_fact, api_key_env):
    """The build fact's runtime-wide env minus the keys the instance's own env overrides."""
    build_env = build.get("env") or {}
    if not isinstance(build_env, dict):
        raise ServingError("instance %s: %s.env must be a mapping of names to values"
                           % (name, build_fact))
    env = {}
    for key in sorted(build_env):
        if key in GPU_ENV or key == api_key_env:
            raise ServingError("instance %s: %s.env sets %s, which the role computes (gpus, API keys)"
                               % (name, build_fact, key))
        if key not in instance_env:
            env[str(key)] = str(build_env[key])
    return env


def plan_instances(instances, defaults=None, builds=None, models=None, gpus=None, api_key_names=(),
                   key_dir="/etc/llama-server", unit_prefix=None, binary_override=None, mode_override=None,
                   image_override=None, systemd_version=None, default_engine=engines.DEFAULT_ENGINE,
                   timeouts=None, fronted_by_proxy=False, running_units=(), hostvars=None, groups=None,
                   inventory_hostname=None, api_keys=None):
    """Resolve every instance of a host. Returns a list of dicts (no secrets in them).

    Per-engine arguments are mappings keyed by engine (llama.cpp, vllm): `defaults` (settings), `builds`
    (llmops_llama_cpp, llmops_vllm: mode, binary or image, build_id/version, extra_flags), `unit_prefix`,
    `binary_override`, `mode_override`, `image_override`, `timeouts` (TimeoutStartSec). `running_units` are
    the units running now (a running instance holds its own GPU memory: only a warning then).
    Refuses: duplicate names/ports, GPUs shared by two instances, missing binary/image, an exposed bind (see
    _check_bind), unknown settings, removed flags, env its env file cannot carry (see check_env), what an
    engine's preflight refuses (vLLM: parallel sizes vs GPUs, memory), and a runtime whose CUDA the node's
    driver cannot run (cuda_check: CUDA's compatibility rules; `cuda_forward_compat: true` on the instance
    opts in to forward compatibility); the warnings go to the plan, the CUDA decision to its `cuda`.
    `env` values stay out of the plan (it is a fact): `env_names` lists the names, `env_file` is where the
    role writes them (always written, empty when there is no env, so a removed variable is removed there too).
    An instance with `ray_cluster` (vLLM on a Ray cluster, see ray_settings) is checked against the cluster's
    nodes, read from `hostvars`/`groups` (Ansible's; `inventory_hostname` is the head): without them only a
    warning says the cluster could not be checked. `api_keys` (serving_api_keys) is only checked (each key a
    usable secret, see check_api_keys), never put in a plan; without `api_key_names` its names with a key
    are those. Every value the unit renders is checked for control characters (check_unit_values).
    """
    if not isinstance(instances, (list, tuple)):
        raise ServingError("serving_instances must be a list of instance mappings")
    check_api_keys(api_keys)
    if api_keys and not api_key_names:
        api_key_names = [key for key, value in api_keys.items() if value]
    api_key_names = set(api_key_names or ())
    running_units = set(running_units or ())
    names, ports, owners = set(), {}, {}
    plans = []
    for raw in instances:
        name = _instance_name(raw, names)
        engine = str(raw.get("engine") or default_engine)
        flags = engine_flags(engine)
        api_key_env = key_env(engine)
        build = by_engine(builds, engine, "the build facts") or {}
        port = _instance_port(raw, name, ports)
        host = str(raw.get("host") or "127.0.0.1")
        _unit_text(host, "host", name)  # before any message quotes it
        has_key = name in api_key_names
        _check_bind(name, host, has_key, flags, fronted_by_proxy, raw.get("accept_exposure"))
        gpu_list = normalize_gpus(raw.get("gpus"), gpus, "instance %s" % name)
        claim_gpus(owners, gpu_list, name)
        model_path, model_sha = resolve_model(raw.get("model"), models, "instance %s" % name)
        check_model_kind(raw.get("model"), models, engine, "instance %s" % name)
        settings = ray_settings(raw, instance_settings(raw, defaults, engine), engine, name)
        mode = instance_mode(raw, engine, build, mode_override)
        # llama-server reads its key from a file; an engine whose key is in env (vLLM) from its 0600 env file.
        key_file = "%s/%s.key" % (key_dir.rstrip("/"), name) if has_key and not api_key_env else None
        plan_key_env = api_key_env if has_key and api_key_env else None
        model_dir, model_file = model_path.rsplit("/", 1)
        argv_model = model_path if mode == "host" else "%s/%s" % (CONTAINER_MODEL_DIR, model_file)
        argv_key = key_file if mode == "host" or not key_file else CONTAINER_KEY_FILE
        served = served_name(raw, name, models)
        argv = flags.build_argv(settings, model=argv_model, host=host, port=port, api_key_file=argv_key,
                                extra_args=raw.get("extra_args"), gpus=gpu_list, served_model_name=served,
                                allowed_extra_flags=build.get("extra_flags") or ())
        unit = unit_name(name, engine, unit_prefix)
        if raw.get("ray_cluster"):
            cluster = {"group": raw["ray_cluster"],
                       "nodes": ray_cluster_nodes(raw["ray_cluster"], hostvars, groups,
                                                  head=inventory_hostname, head_gpus=gpu_list, name=name)}
            try:
                warnings = flags.preflight(settings, gpu_list, gpu_entries(gpu_list, gpus),
                                           unit in running_units, cluster=cluster)
            except ServingError as exc:
                raise ServingError("instance %s: %s" % (name, exc)) from None
        else:
            warnings = flags.preflight(settings, gpu_list, gpu_entries(gpu_list, gpus), unit in running_units)
        override = runtime_override(engine, mode, binary_override, image_override)
        # Before any unit changes: a runtime the node's driver cannot run is refused here.
        cuda, cuda_warnings = cuda_check(name, engine, flags, build, mode, override, gpus, gpu_list,
                                         raw.get("cuda_forward_compat"))
        warnings = list(warnings) + cuda_warnings
        # The flag table names the engine versions it was checked against: another one is warned about.
        if not override:
            version = flags.version_warning(build.get("version"), argv)
            warnings += [version] if version else []
        timeout = int(by_engine(timeouts, engine, "serving_timeout_start_sec") or flags.TIMEOUT_START_SEC)
        # `env` holds what is not secret (visible in the unit): the build's runtime-wide env (llmops_vllm.env,
        # e.g. a fork's switches) unless the instance's own env sets the key, then what the role computes.
        # The instance's own env goes to its env file only.
        instance_env = _instance_env(raw, name, mode, gpu_list, systemd_version, flags, api_key_env)
        env = _build_env(build, instance_env, name, engine_descriptor(engine).build_fact, api_key_env)
        if mode == "host" and gpu_list:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_list)
        env.update(flags.unit_env(timeout))
        if cuda["decision"] == cuda_compat.FORWARD_COMPAT and flags.FORWARD_COMPAT_ENV:
            env.update(flags.FORWARD_COMPAT_ENV)
        runner = _runner(name, mode, build, override, flags, engine)
        check_unit_values(raw, settings, name, host, model_path, served, argv, env, build)
        plan = dict([
            ("name", name),
            ("engine", engine),
            ("program", flags.PROGRAM),
            ("unit", unit),
            ("mode", mode),
            ("host", host),
            ("port", port),
            ("url", "http://%s:%d" % (connect_host(host), port)),
            ("gpus", gpu_list),
            ("model", raw.get("model")),
            ("served_model_name", served),
            ("model_path", model_path),
            ("model_dir", model_dir or "/"),
            ("model_check", flags.model_check_path(model_path)),
            ("model_sha256", model_sha),
            ("key_file", key_file),
            ("api_key_env", plan_key_env),
            ("settings", settings),
            ("mlock", flags.uses_mlock(settings)),
            ("subcommand", list(flags.SUBCOMMAND)),
            ("argv", argv),
            ("env", env),
            ("env_file", "%s/%s.env" % (key_dir.rstrip("/"), name)),
            ("env_names", list(instance_env) + ([api_key_env] if plan_key_env else [])),
            ("build_id", build.get("build_id") or build.get("version")),
            ("binary", runner["binary"]),
            ("image", runner["image"]),
            ("container_entrypoint", runner["container_entrypoint"]),
            ("container_name", unit[:-len(".service")] if mode == "container" else None),
            ("container_args", list(flags.CONTAINER_ARGS)),
            ("timeout_start_sec", timeout),
            ("ray_cluster", raw.get("ray_cluster")),
            ("cuda", cuda),
            ("warnings", warnings),
        ])
        plans.append(plan)
    return plans


def instance_env_file(instances, name, mode="host", systemd_version=None, api_keys=None,
                      default_engine=engines.DEFAULT_ENGINE):
    """Assignments of the env file of instance `name` of `instances` (serving_instances), as text.

    Secret: an engine that reads its key from the environment (vLLM: VLLM_API_KEY) gets it here, from
    `api_keys` (serving_api_keys), and only here."""
    for raw in instances or ():
        if isinstance(raw, dict) and str(raw.get("name")) == str(name):
            engine = str(raw.get("engine") or default_engine)
            flags, api_key_env = engine_flags(engine), key_env(engine)
            env = dict(_instance_env(raw, name, mode, raw.get("gpus"), systemd_version, flags, api_key_env))
            key = (api_keys or {}).get(name)
            if api_key_env and key:
                problem = secret_problem(key, "serving_api_keys[%s]" % name)
                if problem:  # the env file would carry it, and its reader would split it (never shown)
                    raise ServingError(problem)
                env[api_key_env] = key
            env = check_env(env, mode, systemd_version, "instance %s" % name)
            return "".join(line + "\n" for line in env_file_lines(env, mode))
    raise ServingError("no instance named %s in serving_instances" % name)
