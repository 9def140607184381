# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llama-server's command line, in one table, for the pinned llama.cpp version.

This file is the ONLY place in the collection that knows how llama-server spells a flag. Instance settings
(a dict such as ``{"ctx_size": 262144, "cache_type_k": "q8_0"}``) are turned into an argv by
:func:`build_argv`; :func:`plan_instances` resolves whole instances (model path, GPUs, ports, key file,
systemd environment, container arguments) for the role's templates. Plain Python 3.6, standard library only,
unit-tested without Ansible.

Pinned engine: llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570, 2026-10-01).
Checked against that build's ``llama-server --help`` by tests/unit/plugins/plugin_utils/test_llama_server_help.py. Differences
from older command lines (such as the L20 seed notes) that this table absorbs:

* ``--no-mmap`` and ``--mlock`` no longer exist: they are ``--load-mode none|mmap|mlock|mmap+mlock``
  (``--no-mmap --mlock`` == ``--load-mode mlock``).
* ``--draft-p-min`` is the legacy alias of ``--spec-draft-p-min``; ``--draft``/``--draft-max``/
  ``--draft-min`` were removed (``--spec-draft-n-max``/``--spec-draft-n-min``).
* ``enable_thinking`` inside ``--chat-template-kwargs`` is deprecated in favour of ``--reasoning on|off``.
"""
from __future__ import absolute_import, division, print_function

import json
import re
from collections import OrderedDict

__metaclass__ = type

PINNED_LLAMA_CPP = {
    "source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp",
    "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
}


class LlamaServerArgsError(ValueError):
    """Bad instance settings; the message says what to change."""


# kinds:
#   value   --flag VALUE
#   switch  True -> --flag ; False/None -> nothing (the flag has no negative form)
#   bool    True -> --flag ; False -> the negative flag
#   onoff   on|off|auto (booleans accepted: True -> on, False -> off)
#   choice  one of `choices`
#   csv     list -> "a,b,c" (a string is passed as is)
#   json    dict -> compact JSON
# `aliases` are the other spellings llama-server accepts for the same option (checked against --help);
# `legacy` are spellings of older builds that mean the same and that the table translates.
def _f(flag, kind="value", aliases=(), negative=None, choices=None, help_text=""):
    return {"flag": flag, "kind": kind, "aliases": tuple(aliases), "negative": negative,
            "choices": tuple(choices) if choices else None, "help": help_text}


KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
ONOFF = ("on", "off", "auto")

# Ordered as llama-server's own --help groups them; the argv follows this order.
FLAGS = OrderedDict([
    # --- managed by the role (instance fields, not settings) -------------------------------------------
    ("model", _f("--model", aliases=("-m",), help_text="GGUF path (instance field `model`)")),
    ("alias", _f("--alias", aliases=("-a",), help_text="model name(s) served by the API")),
    ("host", _f("--host", help_text="bind address(es) (instance field `host`)")),
    ("port", _f("--port", help_text="TCP port (instance field `port`)")),
    ("api_key_file", _f("--api-key-file", help_text="managed by the role from llama_server_api_keys")),
    # --- context and offload -------------------------------------------------------------------------
    ("ctx_size", _f("--ctx-size", aliases=("-c",))),
    ("n_gpu_layers", _f("--gpu-layers", aliases=("-ngl", "--n-gpu-layers"))),
    ("split_mode", _f("--split-mode", "choice", aliases=("-sm",),
                      choices=("none", "layer", "row", "tensor"))),
    ("tensor_split", _f("--tensor-split", "csv", aliases=("-ts",))),
    ("main_gpu", _f("--main-gpu", aliases=("-mg",),
                    help_text="a PHYSICAL GPU of the instance; the argv gets its position in the GPU list")),
    ("fit", _f("--fit", "choice", aliases=("-fit",), choices=("on", "off"))),
    # --- slots and batching ----------------------------------------------------------------------------
    ("parallel", _f("--parallel", aliases=("-np",))),
    ("kv_unified", _f("--kv-unified", "bool", aliases=("-kvu",), negative="--no-kv-unified")),
    ("cont_batching", _f("--cont-batching", "bool", aliases=("-cb",), negative="--no-cont-batching")),
    ("batch_size", _f("--batch-size", aliases=("-b",))),
    ("ubatch_size", _f("--ubatch-size", aliases=("-ub",))),
    ("cache_ram", _f("--cache-ram", aliases=("-cram",))),
    # --- KV cache and attention ------------------------------------------------------------------------
    ("cache_type_k", _f("--cache-type-k", "choice", aliases=("-ctk",), choices=KV_CACHE_TYPES)),
    ("cache_type_v", _f("--cache-type-v", "choice", aliases=("-ctv",), choices=KV_CACHE_TYPES)),
    ("flash_attn", _f("--flash-attn", "onoff", aliases=("-fa",), choices=ONOFF)),
    # --- loading: mmap/mlock booleans are folded into --load-mode ------------------------------------
    ("load_mode", _f("--load-mode", "choice", aliases=("-lm",),
                     choices=("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"))),
    # --- speculative decoding (MTP) --------------------------------------------------------------------
    ("spec_type", _f("--spec-type", "csv")),
    ("spec_draft_n_max", _f("--spec-draft-n-max")),
    ("spec_draft_n_min", _f("--spec-draft-n-min")),
    ("spec_draft_p_min", _f("--spec-draft-p-min")),
    ("spec_draft_cache_type_k", _f("--spec-draft-type-k", "choice", aliases=("-ctkd", "--cache-type-k-draft"),
                                   choices=KV_CACHE_TYPES)),
    ("spec_draft_cache_type_v", _f("--spec-draft-type-v", "choice", aliases=("-ctvd", "--cache-type-v-draft"),
                                   choices=KV_CACHE_TYPES)),
    # --- sampling defaults -----------------------------------------------------------------------------
    ("temp", _f("--temp", aliases=("--temperature",))),
    ("top_k", _f("--top-k")),
    ("top_p", _f("--top-p")),
    ("min_p", _f("--min-p")),
    ("repeat_penalty", _f("--repeat-penalty")),
    # --- chat template and reasoning -------------------------------------------------------------------
    ("jinja", _f("--jinja", "bool", negative="--no-jinja")),
    ("chat_template_kwargs", _f("--chat-template-kwargs", "json")),
    ("reasoning", _f("--reasoning", "onoff", aliases=("-rea",), choices=ONOFF)),
    ("reasoning_format", _f("--reasoning-format", "choice",
                            choices=("none", "deepseek", "deepseek-legacy", "auto"))),
    # --- server ----------------------------------------------------------------------------------------
    ("metrics", _f("--metrics", "switch")),
    ("slots", _f("--slots", "bool", negative="--no-slots")),
    ("webui", _f("--ui", "bool", aliases=("--webui", "--no-webui"), negative="--no-ui")),
    ("timeout", _f("--timeout", aliases=("-to",))),
    ("threads", _f("--threads", aliases=("-t",))),
    ("threads_batch", _f("--threads-batch", aliases=("-tb",))),
    ("threads_http", _f("--threads-http")),
])

# Instance fields the role fills; they may not appear in `settings`.
MANAGED_KEYS = ("model", "host", "port", "api_key_file")

# Setting keys that are not flags of their own but are folded into one (see _fold_load_mode).
FOLDED_KEYS = ("mmap", "mlock")

# Flags of older llama-server builds, and what they are now. Used to refuse them in extra_args with a
# useful message, and by the tests that compare a seed command line with the generated one.
LEGACY_FLAGS = {
    "--draft-p-min": "--spec-draft-p-min",
    "--draft-p-split": "--spec-draft-p-split",
    "--no-mmap": "--load-mode (setting mmap: false)",
    "--mlock": "--load-mode (setting mlock: true)",
    "--cache-type-k-draft": "--spec-draft-type-k",
    "--cache-type-v-draft": "--spec-draft-type-v",
    "--model-draft": "--spec-draft-model",
    "--gpu-layers-draft": "--spec-draft-ngl",
    "--n-gpu-layers-draft": "--spec-draft-ngl",
    "--threads-draft": "--spec-draft-threads",
}
REMOVED_FLAGS = {
    "--draft": "--spec-draft-n-max (setting spec_draft_n_max)",
    "--draft-n": "--spec-draft-n-max (setting spec_draft_n_max)",
    "--draft-max": "--spec-draft-n-max (setting spec_draft_n_max)",
    "--draft-min": "--spec-draft-n-min (setting spec_draft_n_min)",
    "--draft-n-min": "--spec-draft-n-min (setting spec_draft_n_min)",
    "--spec-ngram-size-n": "the respective --spec-ngram-*-size-n",
    "--spec-ngram-size-m": "the respective --spec-ngram-*-size-m",
    "--spec-ngram-min-hits": "the respective --spec-ngram-*-min-hits",
    "--defrag-thold": "nothing (deprecated and ignored)",
    "-dt": "nothing (--defrag-thold is deprecated and ignored)",
}
# Never on a command line: visible in ps, /proc and the unit.
SECRET_FLAGS = ("--api-key", "--hf-token", "-hft", "--ssl-key-file")

# chat-template kwargs that have their own flag now.
DEPRECATED_TEMPLATE_KWARGS = {"enable_thinking": "reasoning"}

LOOPBACK_HOSTS = ("localhost", "::1", "ip6-localhost")


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar(key, value):
    if isinstance(value, bool):
        raise LlamaServerArgsError("setting %s: expected a number or string, got %r" % (key, value))
    if isinstance(value, float):
        return repr(value)
    if _is_number(value):
        return str(value)
    if isinstance(value, str):
        if value == "":
            raise LlamaServerArgsError("setting %s is empty: remove it or give a value" % key)
        return value
    raise LlamaServerArgsError("setting %s: expected a number or string, got %s"
                               % (key, type(value).__name__))


def _json_setting(key, text):
    error = None
    try:
        return json.loads(text)
    except ValueError as exc:
        error = str(exc)
    raise LlamaServerArgsError("setting %s is not valid JSON: %s" % (key, error))


def _onoff(key, value):
    if value is True:
        return "on"
    if value is False:
        return "off"
    text = str(value).lower()
    if text not in ONOFF:
        raise LlamaServerArgsError("setting %s must be one of on, off, auto (or true/false), got %r"
                                   % (key, value))
    return text


def _fold_load_mode(settings):
    """mmap/mlock booleans (the old --no-mmap/--mlock) -> load_mode, unless load_mode is set."""
    settings = dict(settings)
    mmap = settings.pop("mmap", None)
    mlock = settings.pop("mlock", None)
    for key, value in (("mmap", mmap), ("mlock", mlock)):
        if value is not None and not isinstance(value, bool):
            raise LlamaServerArgsError("setting %s must be true or false, got %r" % (key, value))
    if mmap is None and mlock is None:
        return settings
    if settings.get("load_mode") is not None:
        raise LlamaServerArgsError(
            "settings mmap/mlock and load_mode are both set: keep load_mode (the pinned llama-server has no "
            "--no-mmap/--mlock; they became --load-mode) or drop it and keep mmap/mlock")
    if mlock:
        settings["load_mode"] = "mlock" if mmap is False else "mmap+mlock"
    elif mmap is False:
        settings["load_mode"] = "none"
    elif mmap is True:
        settings["load_mode"] = "mmap"
    return settings


def uses_mlock(settings):
    """True when the instance locks its model in RAM (the unit then needs LimitMEMLOCK=infinity)."""
    settings = _fold_load_mode(settings or {})
    return settings.get("load_mode") in ("mlock", "mmap+mlock")


def _fold_template_kwargs(settings):
    """`enable_thinking` in chat_template_kwargs -> `reasoning` (the non-deprecated spelling)."""
    kwargs = settings.get("chat_template_kwargs")
    if kwargs is None:
        return settings
    if isinstance(kwargs, str):
        kwargs = _json_setting("chat_template_kwargs", kwargs)
    if not isinstance(kwargs, dict):
        raise LlamaServerArgsError("setting chat_template_kwargs must be a mapping (JSON object)")
    settings = dict(settings)
    kwargs = dict(kwargs)
    if "enable_thinking" in kwargs:
        thinking = kwargs.pop("enable_thinking")
        if not isinstance(thinking, bool):
            raise LlamaServerArgsError("chat_template_kwargs.enable_thinking must be true or false")
        wanted = "on" if thinking else "off"
        current = settings.get("reasoning")
        if current is not None and _onoff("reasoning", current) != wanted:
            raise LlamaServerArgsError(
                "chat_template_kwargs.enable_thinking=%s contradicts reasoning=%s: keep only `reasoning`"
                % (str(thinking).lower(), current))
        settings["reasoning"] = wanted
    settings["chat_template_kwargs"] = kwargs or None
    return settings


def normalize_settings(settings):
    """Validate setting keys and fold legacy ones. Returns a new dict without None values."""
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise LlamaServerArgsError("settings must be a mapping of setting name -> value")
    for key in settings:
        if key in MANAGED_KEYS:
            raise LlamaServerArgsError(
                "setting %s is an instance field: set `%s` on the instance, not under settings" % (key, key))
        if key not in FLAGS and key not in FOLDED_KEYS:
            known = sorted(k for k in FLAGS if k not in MANAGED_KEYS) + list(FOLDED_KEYS)
            raise LlamaServerArgsError(
                "unknown llama-server setting %r; known settings: %s. Options the table does not know go to "
                "the instance's extra_args list" % (key, ", ".join(known)))
    settings = _fold_template_kwargs(_fold_load_mode(settings))
    return dict((k, v) for k, v in settings.items() if v is not None)


def flag_args(key, value):
    """The argv fragment for one setting (may be empty)."""
    spec = FLAGS[key]
    kind = spec["kind"]
    if value is None:
        return []
    if kind == "switch":
        if not isinstance(value, bool):
            raise LlamaServerArgsError("setting %s must be true or false, got %r" % (key, value))
        return [spec["flag"]] if value else []
    if kind == "bool":
        if not isinstance(value, bool):
            raise LlamaServerArgsError("setting %s must be true or false, got %r" % (key, value))
        return [spec["flag"]] if value else [spec["negative"]]
    if kind == "onoff":
        return [spec["flag"], _onoff(key, value)]
    if kind == "choice":
        text = _scalar(key, value)
        if text not in spec["choices"]:
            raise LlamaServerArgsError("setting %s must be one of %s, got %r"
                                       % (key, ", ".join(spec["choices"]), value))
        return [spec["flag"], text]
    if kind == "csv":
        if isinstance(value, (list, tuple)):
            if not value:
                raise LlamaServerArgsError("setting %s is an empty list: remove it or give values" % key)
            return [spec["flag"], ",".join(_scalar(key, v) for v in value)]
        return [spec["flag"], _scalar(key, value)]
    if kind == "json":
        if isinstance(value, str):
            value = _json_setting(key, value)
        return [spec["flag"], json.dumps(value, separators=(",", ":"), sort_keys=True)]
    return [spec["flag"], _scalar(key, value)]


def known_flag_spellings():
    """Every spelling (flag, aliases, negatives) the table can emit or that it claims the engine accepts."""
    out = {}
    for key, spec in FLAGS.items():
        for name in (spec["flag"],) + spec["aliases"] + ((spec["negative"],) if spec["negative"] else ()):
            out[name] = key
    return out


def emitted_flags():
    """The flags :func:`build_argv` can put on a command line (canonical spellings and negatives)."""
    out = []
    for spec in FLAGS.values():
        out.append(spec["flag"])
        if spec["negative"]:
            out.append(spec["negative"])
    return out


def check_extra_args(extra_args):
    """Refuse secrets, removed flags and flags the table manages (they would be given twice)."""
    if extra_args is None:
        return []
    if not isinstance(extra_args, (list, tuple)):
        raise LlamaServerArgsError("extra_args must be a list of strings, e.g. ['--no-warmup']")
    managed = known_flag_spellings()
    out = []
    for arg in extra_args:
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
            raise LlamaServerArgsError("extra_args items must be strings, got %r" % (arg,))
        arg = str(arg)
        name = arg.split("=", 1)[0]
        if name in SECRET_FLAGS:
            raise LlamaServerArgsError(
                "extra_args contains %s: secrets never go on a command line (ps, the unit). Put the API key "
                "in llama_server_api_keys (Ansible Vault / AWX credential); the role passes --api-key-file"
                % name)
        if name in REMOVED_FLAGS:
            raise LlamaServerArgsError("extra_args contains %s, which the pinned llama-server removed; use %s"
                                       % (name, REMOVED_FLAGS[name]))
        if name in LEGACY_FLAGS:
            raise LlamaServerArgsError("extra_args contains the legacy flag %s; use %s"
                                       % (name, LEGACY_FLAGS[name]))
        if name in managed:
            raise LlamaServerArgsError("extra_args contains %s; use the setting `%s` instead"
                                       % (name, managed[name]))
        out.append(arg)
    return out


def spec_types(settings):
    value = settings.get("spec_type")
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _follow_draft_cache_types(settings):
    """A draft context (draft-mtp, draft-simple, ...) gets the main KV cache types unless set.

    The pinned llama-server gives the draft context its own cache types (default f16); with a 256K context
    an f16 MTP cache next to a q8_0 main cache would cost twice the memory the seed line planned for.
    """
    if not any(t.startswith("draft-") for t in spec_types(settings)):
        return
    for main, draft in (("cache_type_k", "spec_draft_cache_type_k"),
                        ("cache_type_v", "spec_draft_cache_type_v")):
        if settings.get(main) is not None and settings.get(draft) is None:
            settings[draft] = settings[main]


def build_argv(settings, model=None, host=None, port=None, api_key_file=None, extra_args=None,
               gpus=None):
    """Return llama-server's argv (without the binary) for one instance.

    `settings` are the instance settings (already merged with role defaults). `gpus` is the instance's
    physical GPU list: a `main_gpu` setting names one of them and becomes its position (the process only
    sees its own GPUs, renumbered from 0, through CUDA_VISIBLE_DEVICES or docker --gpus).
    """
    settings = normalize_settings(settings)
    managed = {"model": model, "host": host, "port": port, "api_key_file": api_key_file}
    if settings.get("main_gpu") is not None:
        settings["main_gpu"] = relative_main_gpu(settings["main_gpu"], gpus)
    _follow_draft_cache_types(settings)
    split = settings.get("tensor_split")
    if isinstance(split, (list, tuple)) and gpus and len(split) != len(gpus):
        raise LlamaServerArgsError("tensor_split has %d entries but the instance owns %d GPUs (%s)"
                                   % (len(split), len(gpus), ", ".join(str(g) for g in gpus)))
    argv = []
    for key in FLAGS:
        value = managed[key] if key in MANAGED_KEYS else settings.get(key)
        argv.extend(flag_args(key, value))
    argv.extend(check_extra_args(extra_args))
    return argv


def _gpu_key(gpu):
    return str(gpu).strip().lower()


def relative_main_gpu(main_gpu, gpus):
    """Physical main GPU (index or UUID among `gpus`) -> its index as the engine sees it."""
    if isinstance(main_gpu, bool):
        raise LlamaServerArgsError("main_gpu must be a GPU index or UUID, got %r" % main_gpu)
    if not gpus:
        if _is_number(main_gpu) or str(main_gpu).isdigit():
            return int(main_gpu)
        raise LlamaServerArgsError("main_gpu %r needs the instance's gpus list" % main_gpu)
    keys = [_gpu_key(g) for g in gpus]
    wanted = _gpu_key(main_gpu)
    if wanted not in keys:
        raise LlamaServerArgsError(
            "main_gpu %s is not one of this instance's GPUs (%s). main_gpu names a PHYSICAL GPU; the role "
            "passes its position among the instance's GPUs to --main-gpu (gpus [2, 3] + main_gpu 2 -> "
            "--main-gpu 0)" % (main_gpu, ", ".join(str(g) for g in gpus)))
    return keys.index(wanted)


_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")


def normalize_gpus(gpus, gpu_facts=None, instance="instance"):
    """Validate an instance's GPU list (indices or UUIDs) against llmops_gpus when present."""
    if gpus is None or gpus == []:
        return []
    if not isinstance(gpus, (list, tuple)):
        gpus = [g.strip() for g in str(gpus).split(",") if g.strip()]
    out = []
    for gpu in gpus:
        if isinstance(gpu, bool):
            raise LlamaServerArgsError("%s: GPU %r is neither an index nor a UUID" % (instance, gpu))
        if _is_number(gpu) or (isinstance(gpu, str) and gpu.isdigit()):
            out.append(int(gpu))
        elif isinstance(gpu, str) and _UUID_RE.match(gpu):
            out.append(gpu)
        else:
            raise LlamaServerArgsError("%s: GPU %r is neither an index (2) nor a UUID (GPU-...)"
                                       % (instance, gpu))
    if len(set(_gpu_key(g) for g in out)) != len(out):
        raise LlamaServerArgsError("%s: GPU list %s names a GPU twice" % (instance, out))
    if gpu_facts and gpu_facts.get("present"):
        known = gpu_facts.get("gpus") or []
        indices = set(int(g["index"]) for g in known if "index" in g)
        uuids = set(str(g["uuid"]).lower() for g in known if g.get("uuid"))
        for gpu in out:
            if isinstance(gpu, int) and gpu not in indices:
                raise LlamaServerArgsError(
                    "%s: GPU %d does not exist on this host (llmops_gpus has indices %s)"
                    % (instance, gpu, sorted(indices)))
            if not isinstance(gpu, int) and gpu.lower() not in uuids:
                raise LlamaServerArgsError("%s: GPU %s does not exist on this host (llmops_gpus UUIDs: %s)"
                                           % (instance, gpu, ", ".join(sorted(uuids))))
    elif gpu_facts is not None and gpu_facts.get("present") is False and out:
        raise LlamaServerArgsError("%s asks for GPUs %s but llmops_gpus says this host has no NVIDIA GPU"
                                   % (instance, out))
    return out


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
        raise LlamaServerArgsError("%s has no model: give a name from llmops_models or an absolute path"
                                   % instance)
    models_fact = models_fact or {}
    if model in models_fact:
        entry = models_fact[model] or {}
        if not entry.get("path"):
            raise LlamaServerArgsError("%s: llmops_models[%s] has no path" % (instance, model))
        return entry["path"], entry.get("sha256")
    if str(model).startswith("/"):
        return str(model), None
    raise LlamaServerArgsError(
        "%s: model %r is neither a model of llmops_models (%s) nor an absolute path; run the model role "
        "first or give the GGUF path" % (instance, model, ", ".join(sorted(models_fact)) or "empty"))


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

CONTAINER_MODEL_DIR = "/models"
CONTAINER_KEY_FILE = "/run/secrets/llama-server-api-key"

# Instance environment (`env`) may hold secrets (LLAMA_API_KEY, HF_TOKEN, ...): it never goes into the unit
# or on a command line, only into <config_dir>/<name>.env (root, 0600), read as root by systemd
# (EnvironmentFile=, host mode) or by the docker client (docker run --env-file, container mode).
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# systemd keeps multi-line EnvironmentFile values since 239 (older ones drop the assignment); any version
# before 248 drops values with other control characters (TAB excepted).
SYSTEMD_ENV_NEWLINE_SINCE = 239
# docker's --env-file reader (bufio.Scanner) refuses lines of 64 KiB and more.
DOCKER_ENV_LINE_MAX = 65535


def _control_chars(value, allowed):
    return [c for c in value if (ord(c) < 32 or ord(c) == 127) and c not in allowed]


def check_env(env, mode="host", systemd_version=None, instance="instance"):
    """Validate an instance's `env` for its env file. Returns an OrderedDict name -> str, sorted by name.

    Error messages name the variable, never its value. `mode` picks the reader: host -> systemd's
    EnvironmentFile= (double-quoted, multi-line from systemd 239), container -> docker's --env-file (one
    literal line per variable: no newline). `systemd_version` None skips the version checks.
    """
    if env is None:
        return OrderedDict()
    if not isinstance(env, dict):
        raise LlamaServerArgsError("%s: env must be a mapping NAME -> value" % instance)
    out = OrderedDict()
    for key in sorted(env, key=str):
        name, value = str(key), env[key]
        if not _ENV_NAME_RE.match(name):
            raise LlamaServerArgsError(
                "%s: env %r is not a valid variable name (letters, digits and '_', not starting with a digit)"
                % (instance, name))
        if value is None:
            raise LlamaServerArgsError("%s: env %s has no value; give a string ('' for empty)"
                                       % (instance, name))
        if isinstance(value, (dict, list, tuple)):
            raise LlamaServerArgsError("%s: env %s must be a string or a number, got a %s"
                                       % (instance, name, type(value).__name__))
        value = str(value)
        if "\x00" in value:
            raise LlamaServerArgsError("%s: env %s contains a NUL byte, which no environment can carry"
                                       % (instance, name))
        if mode == "container":
            if "\n" in value:
                raise LlamaServerArgsError(
                    "%s: env %s contains a newline; container mode passes env with docker run --env-file, "
                    "which has one variable per line and no quoting. Use a single-line value (e.g. base64) "
                    "or host mode" % (instance, name))
            if _control_chars(value, "\t"):
                raise LlamaServerArgsError("%s: env %s contains a control character (other than TAB), which "
                                           "docker --env-file cannot carry" % (instance, name))
            if len(("%s=%s" % (name, value)).encode("utf-8")) > DOCKER_ENV_LINE_MAX:
                raise LlamaServerArgsError("%s: env %s is longer than docker --env-file accepts (64 KiB a "
                                           "line)" % (instance, name))
        else:
            if _control_chars(value, "\t\n"):
                raise LlamaServerArgsError("%s: env %s contains a control character (other than TAB and "
                                           "newline), which systemd before 248 drops" % (instance, name))
            if "\n" in value and systemd_version is not None \
                    and int(systemd_version or 0) < SYSTEMD_ENV_NEWLINE_SINCE:
                raise LlamaServerArgsError(
                    "%s: env %s contains a newline; systemd %s on this node drops multi-line EnvironmentFile "
                    "values (systemd %d and later keep them). Use a single-line value"
                    % (instance, name, systemd_version, SYSTEMD_ENV_NEWLINE_SINCE))
        out[name] = value
    return out


def systemd_env_quote(value):
    """One value for an EnvironmentFile= line: in double quotes, with backslash, double quote, dollar and
    backquote escaped by a backslash.

    Every systemd version reads these four escapes back as the character (older ones unescape any character,
    newer ones exactly these), the rest is literal (no %-specifiers, no $VAR expansion in env files), a
    newline inside the quotes is part of the value, and the line is also valid POSIX sh (`. file`).
    """
    out = str(value)
    for char in ("\\", '"', "$", "`"):
        out = out.replace(char, "\\" + char)
    return '"%s"' % out


def env_file_lines(env, mode="host"):
    """The assignment lines of an env file (already checked with :func:`check_env` for `mode`)."""
    if mode == "container":
        return ["%s=%s" % (name, value) for name, value in env.items()]
    return ["%s=%s" % (name, systemd_env_quote(value)) for name, value in env.items()]


def instance_env_file(instances, name, mode="host", systemd_version=None):
    """Assignments of the env file of instance `name` of `instances` (llama_server_instances), as text."""
    for raw in instances or ():
        if isinstance(raw, dict) and str(raw.get("name")) == str(name):
            env = check_env(raw.get("env"), mode, systemd_version, "instance %s" % name)
            return "".join(line + "\n" for line in env_file_lines(env, mode))
    raise LlamaServerArgsError("no instance named %s in llama_server_instances" % name)


def plan_instances(instances, defaults=None, llama_cpp=None, models=None, gpus=None, api_key_names=(),
                   key_dir="/etc/llama-server", unit_prefix="llama-server-", binary_override=None,
                   mode_override=None, image_override=None, systemd_version=None):
    """Resolve every instance of a host. Returns a list of dicts (no secrets in them).

    Refuses: duplicate names/ports, GPUs shared by two instances, missing binary/image, a non-loopback bind
    without an API key, unknown settings, removed flags, env its env file cannot carry (see check_env).
    `env` values stay out of the plan (it is a fact): `env_names` lists the names, `env_file` is where the
    role writes them (always written, empty when there is no env, so a removed variable is removed there too).
    """
    if not isinstance(instances, (list, tuple)):
        raise LlamaServerArgsError("llama_server_instances must be a list of instance mappings")
    llama_cpp = llama_cpp or {}
    api_key_names = set(api_key_names or ())
    names, ports, owners = set(), {}, {}
    plans = []
    for raw in instances:
        if not isinstance(raw, dict) or not raw.get("name"):
            raise LlamaServerArgsError("each instance needs a name: %r" % (raw,))
        name = str(raw["name"])
        if not _NAME_RE.match(name):
            raise LlamaServerArgsError("instance name %r: use letters, digits, '.', '_' or '-' (it names the "
                                       "systemd unit)" % name)
        if name in names:
            raise LlamaServerArgsError("instance name %s is used twice" % name)
        names.add(name)
        unknown = set(raw) - set(("name", "model", "gpus", "host", "port", "settings", "extra_args", "env",
                                  "mode"))
        if unknown:
            raise LlamaServerArgsError("instance %s: unknown field(s) %s; engine options go under settings "
                                       "or extra_args" % (name, ", ".join(sorted(unknown))))
        port = raw.get("port")
        if isinstance(port, bool) or not (_is_number(port) or str(port).isdigit()) \
                or not 0 < int(port) < 65536:
            raise LlamaServerArgsError("instance %s: port must be a number 1-65535, got %r" % (name, port))
        port = int(port)
        if port in ports:
            raise LlamaServerArgsError("instances %s and %s both use port %d" % (ports[port], name, port))
        ports[port] = name
        host = str(raw.get("host") or "127.0.0.1")
        has_key = name in api_key_names
        if not has_key and not all(is_loopback(h) for h in host.split(",")):
            raise LlamaServerArgsError(
                "instance %s binds %s without an API key: anyone on the network could use it. Put its key in "
                "llama_server_api_keys['%s'] (Ansible Vault or an AWX credential), or bind 127.0.0.1"
                % (name, host, name))
        gpu_list = normalize_gpus(raw.get("gpus"), gpus, "instance %s" % name)
        for gpu in gpu_list:
            owner = owners.get(_gpu_key(gpu))
            if owner:
                raise LlamaServerArgsError("GPU %s is given to both %s and %s" % (gpu, owner, name))
            owners[_gpu_key(gpu)] = name
        model_path, model_sha = resolve_model(raw.get("model"), models, "instance %s" % name)
        settings = dict(defaults or {})
        settings.update(raw.get("settings") or {})
        mode = mode_override or raw.get("mode") or llama_cpp.get("mode") or "host"
        if mode not in ("host", "container"):
            raise LlamaServerArgsError("instance %s: mode must be host or container, got %r" % (name, mode))
        key_file = "%s/%s.key" % (key_dir.rstrip("/"), name) if has_key else None
        model_dir, model_file = model_path.rsplit("/", 1)
        argv_model = model_path if mode == "host" else "%s/%s" % (CONTAINER_MODEL_DIR, model_file)
        argv_key = key_file if mode == "host" or not key_file else CONTAINER_KEY_FILE
        argv = build_argv(settings, model=argv_model, host=host, port=port, api_key_file=argv_key,
                          extra_args=raw.get("extra_args"), gpus=gpu_list)
        # `env` holds what the role computes (not secret, visible in the unit); the instance's own env goes to
        # its env file only.
        env = {}
        if mode == "host" and gpu_list:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_list)
        instance_env = check_env(raw.get("env"), mode, systemd_version, "instance %s" % name)
        for key in instance_env:
            if key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES") and gpu_list:
                raise LlamaServerArgsError("instance %s: %s comes from its gpus list; do not set it in env"
                                           % (name, key))
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
            ("mlock", uses_mlock(settings)),
            ("argv", argv),
            ("env", env),
            ("env_file", "%s/%s.env" % (key_dir.rstrip("/"), name)),
            ("env_names", list(instance_env)),
            ("build_id", llama_cpp.get("build_id")),
        ])
        if mode == "host":
            binary = binary_override or llama_cpp.get("binary")
            if not binary:
                raise LlamaServerArgsError(
                    "instance %s: no llama-server binary: run the llama_cpp role first (fact "
                    "llmops_llama_cpp.binary) or set llama_server_binary" % name)
            plan["binary"] = binary
            plan["container_name"] = None
            plan["image"] = None
            plan["container_entrypoint"] = None
        else:
            image = image_override or llama_cpp.get("image")
            if not image:
                raise LlamaServerArgsError(
                    "instance %s: mode container needs an image: run the llama_cpp role (fact "
                    "llmops_llama_cpp.image) or set llama_server_image" % name)
            plan["binary"] = None
            plan["image"] = image
            # llama_cpp's container builds record where llama-server lives inside the image
            plan["container_entrypoint"] = llama_cpp.get("binary") if not image_override else None
            plan["container_name"] = "%s%s" % (unit_prefix, name)
        plans.append(plan)
    return plans


def docker_run_args(plan, user=None, docker="/usr/bin/docker", entrypoint=None):
    """argv of `docker run` for a container-mode instance (only its GPUs; model dir and key read-only; env
    from its file).

    `entrypoint`: llama-server's path inside the image; default the plan's (llmops_llama_cpp.binary of a
    container build), else the image's own ENTRYPOINT (upstream llama.cpp server images).
    """
    entrypoint = entrypoint or plan.get("container_entrypoint")
    args = [docker, "run", "--rm", "--name", plan["container_name"], "--network", "host", "--init"]
    if plan["gpus"]:
        # docker parses --gpus as CSV: the quotes keep "device=2,3" one field.
        args += ["--gpus", '"device=%s"' % ",".join(str(g) for g in plan["gpus"])]
    if user:
        args += ["--user", str(user)]
    if plan["mlock"]:
        args += ["--ulimit", "memlock=-1:-1"]
    args += ["-v", "%s:%s:ro" % (plan["model_dir"], CONTAINER_MODEL_DIR)]
    if plan["key_file"]:
        args += ["-v", "%s:%s:ro" % (plan["key_file"], CONTAINER_KEY_FILE)]
    # The instance's env: read from its 0600 file by the docker client (root), never on this command line.
    if plan.get("env_file"):
        args += ["--env-file", plan["env_file"]]
    for key, value in plan["env"].items():      # only what the role computes (nothing secret)
        args += ["-e", "%s=%s" % (key, value)]
    if entrypoint:
        args += ["--entrypoint", entrypoint]
    args.append(plan["image"])
    return args + list(plan["argv"])


_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg):
    """Quote one argument for an ExecStart= line (systemd 219+ rules: "...", \\ escapes, %% and $$)."""
    arg = str(arg).replace("%", "%%").replace("$", "$$")
    if arg and _SYSTEMD_SAFE.match(arg):
        return arg
    return '"%s"' % arg.replace("\\", "\\\\").replace('"', '\\"')


def systemd_command(argv):
    return " ".join(systemd_quote(a) for a in argv)


# (directive, value, first systemd version that knows it). NEVER PrivateDevices / DevicePolicy=closed:
# the GPUs (/dev/nvidia*) would vanish. No MemoryDenyWriteExecute: CUDA JIT needs W+X pages.
HARDENING = (
    ("NoNewPrivileges", "yes", 187),
    ("PrivateTmp", "yes", 1),
    ("ProtectSystem", "full", 214),
    ("ProtectSystem", "strict", 232),
    ("ProtectHome", "{home}", 214),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK", 211),
    ("SystemCallArchitectures", "native", 209),
    ("ProtectKernelTunables", "yes", 232),
    ("ProtectKernelModules", "yes", 232),
    ("ProtectControlGroups", "yes", 232),
    ("RestrictRealtime", "yes", 231),
    ("RestrictNamespaces", "yes", 233),
    ("LockPersonality", "yes", 235),
    ("RestrictSUIDSGID", "yes", 242),
    ("ProtectHostname", "yes", 242),
    ("ProtectKernelLogs", "yes", 244),
    ("ProtectClock", "yes", 245),
    ("ProtectProc", "invisible", 247),
)


def hardening(systemd_version, read_paths=(), mode="host"):
    """Hardening directives for a node's systemd version, as an ordered list of (directive, value).

    ProtectHome is read-only when a model or the binary lives under /home or /root (the L20 box keeps its
    models in /home/models), else yes. In container mode the unit only runs the docker client: the container
    is the sandbox, and namespace/address-family restrictions would break the client, so only the basics.
    """
    version = int(systemd_version or 0)
    under_home = any(str(p).startswith(("/home/", "/root/", "/run/user/")) for p in read_paths or ())
    chosen = OrderedDict()
    for directive, value, since in HARDENING:
        if version < since:
            continue
        if mode == "container" and directive not in ("PrivateTmp",):
            continue
        chosen[directive] = value.replace("{home}", "read-only" if under_home else "yes")
    return list(chosen.items())


def restart_policy(systemd_version, restart_sec=10, interval=600, burst=5, max_delay=300):
    """Bounded restart backoff, spelled for the node's systemd. Returns {"unit": [...], "service": [...]}.

    systemd < 230 (CentOS 7: 219) only knows StartLimitInterval/StartLimitBurst in [Service]; newer ones
    want StartLimitIntervalSec/StartLimitBurst in [Unit]. systemd >= 254 also grows RestartSec
    exponentially up to RestartMaxDelaySec.
    """
    version = int(systemd_version or 0)
    unit, service = [], [("Restart", "on-failure"), ("RestartSec", str(restart_sec))]
    if version >= 230:
        unit += [("StartLimitIntervalSec", str(interval)), ("StartLimitBurst", str(burst))]
    else:
        service += [("StartLimitInterval", str(interval)), ("StartLimitBurst", str(burst))]
    if version >= 254:
        service += [("RestartSteps", "5"), ("RestartMaxDelaySec", str(max_delay))]
    return {"unit": unit, "service": service}


def parse_systemd_version(text):
    """`systemctl --version` output -> 219 / 252 (0 when unreadable)."""
    match = re.search(r"systemd\s+(\d+)", text or "")
    return int(match.group(1)) if match else 0
