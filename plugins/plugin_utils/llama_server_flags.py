# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llama-server's command line, in one table, for the pinned llama.cpp version.

This file is the ONLY place in the collection that knows how llama-server spells a flag: it is where the
llama-server command line is built. Instance settings (a dict such as
``{"ctx_size": 262144, "cache_type_k": "q8_0"}``) are turned into an argv by :func:`build_argv`; extra_args
are checked (secrets, removed and legacy flags, flags the table manages). The engine-neutral planner
(instance_plan.py, through the descriptor ``engines.LLAMA_CPP``) resolves whole instances (model path,
GPUs, ports, key file, env file, unit) around this argv; what every engine's table does alike (spelling
values, the kinds of flags, the extra_args loop) is flag_table.py. Controller-only (plugin_utils),
unit-tested without Ansible by tests/unit/plugins/plugin_utils/test_llama_server_flags.py.

Pinned engine: llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570, 2026-10-01).
Checked against that build's ``llama-server --help`` by
tests/unit/plugins/plugin_utils/test_llama_server_help.py; a build that reports another commit is planned
with a warning (:func:`version_warning`). Differences from older command lines (such as
the L20 seed notes) that this table absorbs:

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

from ansible_collections.llmops.serving.plugins.module_utils._gpu.names import gpu_key
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.llama_cpp_spec import (
    draft_cache_settings,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.flag_table import (
    ONOFF,
    FlagTable,
    compact_json,
    without_none,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.flag_table import entry as _f
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, is_number

__metaclass__ = type

PINNED_LLAMA_CPP = {
    "source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp",
    "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
}


# What the engine-neutral planner (instance_plan.py) needs to know of this engine's command line (see its
# docstring); the rest is the engine's descriptor, plugins/module_utils/engines.py.
PROGRAM = "llama-server"
ROLE = "serving"
# A 19 GB GGUF read with --load-mode mlock takes minutes on a busy disk.
TIMEOUT_START_SEC = 900
SUBCOMMAND = ()
CONTAINER_ARGS = ()
OPEN_PATHS = None           # --api-key-file guards every endpoint but /health
KEY_GUARDED_PATHS = None
# When the node's driver cannot run the build's CUDA (plugins/module_utils/_gpu/cuda_compat.py): the ways
# round it
# that belong to this engine, listed before "upgrade the driver" and forward compatibility.
CUDA_WAYS_OUT = (
    "rebuild llama.cpp with a CUDA toolkit the driver runs (role llama_cpp: llama_cpp_builder_image_tag and "
    "llama_cpp_runtime_image_tag, e.g. 12.4.1-devel-ubuntu22.04 / 12.4.1-runtime-ubuntu22.04, whose 12.x "
    "runs on any driver >= 525.60.13; host builds: the node's nvcc)",
)
# Environment that makes the engine load a forward-compatibility libcuda (None: the instance's env must put
# the cuda-compat directory on LD_LIBRARY_PATH itself).
FORWARD_COMPAT_ENV = None


class LlamaServerArgsError(ServingError):
    """Bad llama-server settings or extra_args; the message says what to change."""


# Rows are flag_table.entry (kinds documented there). `aliases` are the other spellings llama-server accepts
# for the same option (checked against --help); LEGACY_FLAGS are spellings of older builds that mean the same.
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

# Ordered as llama-server's own --help groups them; the argv follows this order.
FLAGS = OrderedDict([
    # --- managed by the role (instance fields, not settings) -------------------------------------------
    ("model", _f("--model", aliases=("-m",), help_text="GGUF path (instance field `model`)")),
    ("served_model_name", _f("--alias", "csv", aliases=("-a",),
                             help_text="stable name(s) served by the API (instance field)")),
    ("host", _f("--host", help_text="bind address(es) (instance field `host`)")),
    ("port", _f("--port", help_text="TCP port (instance field `port`)")),
    ("api_key_file", _f("--api-key-file", help_text="managed by the role from serving_api_keys")),
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
MANAGED_KEYS = ("model", "served_model_name", "host", "port", "api_key_file")

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


def _json_setting(key, text):
    error = None
    try:
        return json.loads(text)
    except ValueError as exc:
        error = str(exc)
    raise LlamaServerArgsError("setting %s is not valid JSON: %s" % (key, error))


def _json_text(key, value):
    """A mapping, or a JSON string (as older inventories wrote chat_template_kwargs), -> compact JSON."""
    if isinstance(value, str):
        value = _json_setting(key, value)
    return compact_json(value)


def build_commit(version):
    """The llama.cpp commit a build reports ('0.5.0-dev (build 1, commit 0c1e570)' or '6000 (abcdef12)', as
    `llama-server --version` prints it) -> '0c1e570'; None when the text names none."""
    match = re.search(r"(?:\bcommit |\()([0-9a-f]{7,40})\b", str(version or ""))
    return match.group(1) if match else None


def _same_commit(short, full):
    return full.startswith(short) or short.startswith(full)


# The table is checked against the pinned commit's `llama-server --help`; a build that reports another commit
# is warned about (a build that reports none, such as one made before the version was recorded, is not).
TABLE = FlagTable(FLAGS, LlamaServerArgsError, PROGRAM, managed_keys=MANAGED_KEYS, folded_keys=FOLDED_KEYS,
                  json_text=_json_text, checked_versions=(PINNED_LLAMA_CPP["commit"],),
                  version_key=build_commit, same_version=_same_commit)


def version_warning(version, argv):
    """None when the build's commit (llmops_llama_cpp.version) is the one the table was checked against, or
    the build names no commit; else why the command line is unchecked."""
    return TABLE.version_warning(version, argv, unknown_is_checked=True)


def cuda_ways_out(version):
    """The ways round a driver too old for the build's CUDA (the same for every llama.cpp version)."""
    return CUDA_WAYS_OUT


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
        if current is not None and TABLE.onoff("reasoning", current) != wanted:
            raise LlamaServerArgsError(
                "chat_template_kwargs.enable_thinking=%s contradicts reasoning=%s: keep only `reasoning`"
                % (str(thinking).lower(), current))
        settings["reasoning"] = wanted
    settings["chat_template_kwargs"] = kwargs or None
    return settings


# Settings that name something the serving layer owns.
INSTANCE_OWNED_SETTINGS = {
    "alias": "the instance's served_model_name (rendered as --alias)",
    "device_ids": "set the instance's gpus (the process sees only them, through CUDA_VISIBLE_DEVICES)",
    "device": "set the instance's gpus (the process sees only them, through CUDA_VISIBLE_DEVICES)",
}


def _setting_refusal(key):
    if key in INSTANCE_OWNED_SETTINGS:
        return "setting %s: %s" % (key, INSTANCE_OWNED_SETTINGS[key])
    return None


def normalize_settings(settings):
    """Validate setting keys and fold legacy ones. Returns a new dict without None values."""
    settings = TABLE.check_setting_names(settings, _setting_refusal)
    return without_none(_fold_template_kwargs(_fold_load_mode(settings)))


def flag_args(key, value):
    """The argv fragment for one setting (may be empty)."""
    return TABLE.flag_args(key, value)


def known_flag_spellings():
    """Every spelling (flag, aliases, negatives) the table can emit or that it claims the engine accepts."""
    return TABLE.spellings()


def emitted_flags():
    """The flags :func:`build_argv` can put on a command line (canonical spellings and negatives)."""
    return TABLE.emitted_flags()


def _extra_arg_refusal(name):
    if name in SECRET_FLAGS:
        return ("extra_args contains %s: secrets never go on a command line (ps, the unit). Put the API key "
                "in serving_api_keys (Ansible Vault / AWX credential); the role passes --api-key-file"
                % name)
    if name in REMOVED_FLAGS:
        return ("extra_args contains %s, which the pinned llama-server removed; use %s"
                % (name, REMOVED_FLAGS[name]))
    if name in LEGACY_FLAGS:
        return "extra_args contains the legacy flag %s; use %s" % (name, LEGACY_FLAGS[name])
    return TABLE.managed_refusal(name)


def check_extra_args(extra_args):
    """Refuse secrets, removed flags and flags the table manages (they would be given twice)."""
    return TABLE.check_extra_args(extra_args, "--no-warmup", _extra_arg_refusal)


def build_argv(settings, model=None, host=None, port=None, api_key_file=None, extra_args=None,
               gpus=None, served_model_name=None, allowed_extra_flags=()):
    """Return llama-server's argv (without the binary) for one instance.

    `settings` are the instance settings (already merged with role defaults). `gpus` is the instance's
    physical GPU list: a `main_gpu` setting names one of them and becomes its position (the process only
    sees its own GPUs, renumbered from 0, through CUDA_VISIBLE_DEVICES or docker --gpus).
    `served_model_name` is rendered as --alias. `allowed_extra_flags` is vLLM's (a fork's own options):
    llama-server's extra_args are not allow-listed, so it is not used here.
    """
    settings = normalize_settings(settings)
    managed = {"model": model, "served_model_name": served_model_name, "host": host, "port": port,
               "api_key_file": api_key_file}
    if settings.get("main_gpu") is not None:
        settings["main_gpu"] = relative_main_gpu(settings["main_gpu"], gpus)
    # a draft context's KV cache follows the main cache types unless set
    # (module_utils/_memory_plan/llama_cpp_spec.py)
    settings.update(draft_cache_settings(settings))
    split = settings.get("tensor_split")
    if isinstance(split, (list, tuple)) and gpus and len(split) != len(gpus):
        raise LlamaServerArgsError("tensor_split has %d entries but the instance owns %d GPUs (%s)"
                                   % (len(split), len(gpus), ", ".join(str(g) for g in gpus)))
    return TABLE.argv(settings, managed) + check_extra_args(extra_args)


def relative_main_gpu(main_gpu, gpus):
    """Physical main GPU (index or UUID among `gpus`) -> its index as the engine sees it."""
    if isinstance(main_gpu, bool):
        raise LlamaServerArgsError("main_gpu must be a GPU index or UUID, got %r" % main_gpu)
    if not gpus:
        if is_number(main_gpu) or str(main_gpu).isdigit():
            return int(main_gpu)
        raise LlamaServerArgsError("main_gpu %r needs the instance's gpus list" % main_gpu)
    keys = [gpu_key(g) for g in gpus]
    wanted = gpu_key(main_gpu)
    if wanted not in keys:
        raise LlamaServerArgsError(
            "main_gpu %s is not one of this instance's GPUs (%s). main_gpu names a PHYSICAL GPU; the role "
            "passes its position among the instance's GPUs to --main-gpu (gpus [2, 3] + main_gpu 2 -> "
            "--main-gpu 0)" % (main_gpu, ", ".join(str(g) for g in gpus)))
    return keys.index(wanted)


def model_check_path(model_path):
    """The file that must exist on the node: the GGUF itself."""
    return model_path


def unit_env(timeout_start_sec):
    """Variables the unit sets for llama-server: none (its start has no timeout of its own)."""
    return {}


def preflight(settings, gpus, gpu_entries, running=False):
    """llama-server's GPU checks beyond the shared ones: none (llama.cpp fits what it can). No warnings."""
    return []
