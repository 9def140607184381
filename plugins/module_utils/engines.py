# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving engines, one descriptor each: the only place that knows what differs between engines by name.

Every other place asks the descriptor of the engine an instance names (:func:`get`, :func:`lookup`,
:func:`by_alias`) and reads a field; nothing else compares an engine's name
(tests/unit/plugins/module_utils/test_engines.py refuses such a comparison anywhere else in plugins/ and
roles/).
A third engine is a new :class:`Engine` in :data:`ENGINES`, plus its flag table (plugins/plugin_utils, named
by ``flag_table``) and memory planner (plugins/module_utils/_memory_plan, named by ``planner``) when it cannot
use an existing one.

Fields of :class:`Engine`:

* ``name``: as an instance's ``engine`` says it; ``label``: as messages name the engine;
  ``aliases``: other spellings the memory planner accepts (any case);
* ``context_setting`` / ``slots_setting``: the settings keys of the context length and of the requests run
  at once (monitoring's figures, the gateway's server timeout);
* ``key_variable``: the variable that holds the API key in the engine's environment (the benchmark's default
  for an env file); ``key_in_env``: the unit passes the key that way (its 0600 env file), else as a file;
* ``unit_prefix``: the systemd unit of an instance is ``<unit_prefix><name>.service`` (unless
  serving_unit_prefix says otherwise);
* ``model_kind``: what the engine serves, ``gguf`` (a GGUF file) or ``snapshot`` (a model directory: HF
  config.json and safetensors);
* ``ray``: an instance may span a Ray cluster (``ray_cluster``);
* ``build_role`` / ``build_fact``: the role that builds the engine and the fact it sets;
* ``flag_table``: the module of plugins/plugin_utils that builds its command line; ``planner``: the module
  of plugins/module_utils/_memory_plan that plans its memory;
* ``slots_path``: the endpoint that lists its slots (None: none); ``load_metrics``: the Prometheus gauges of
  requests (running, waiting) on /metrics; ``spec_metrics``: the counters (accepted, drafted) of speculative
  decoding on /metrics that the benchmark reads around a run (None: the server's own figures come in the
  last streamed chunk's ``timings`` instead).

Plain Python 3.6, standard library only: the modules on the nodes (memory_plan_info, llm_benchmark) import it
as the controller's plugins do.
"""
from __future__ import absolute_import, division, print_function

from collections import OrderedDict, namedtuple

__metaclass__ = type

Engine = namedtuple("Engine", (
    "name", "label", "aliases", "context_setting", "slots_setting", "key_variable", "key_in_env",
    "unit_prefix", "model_kind", "ray", "build_role", "build_fact", "flag_table", "planner", "slots_path",
    "load_metrics", "spec_metrics",
))
MODEL_KINDS = ("gguf", "snapshot")

LLAMA_CPP = Engine(
    name="llama.cpp", label="llama.cpp", aliases=("llama_cpp", "llama-cpp", "llamacpp"),
    context_setting="ctx_size", slots_setting="parallel",
    # llama-server reads LLAMA_API_KEY too, but the unit gives it --api-key-file (never in an environment)
    key_variable="LLAMA_API_KEY", key_in_env=False,
    unit_prefix="llama-server-", model_kind="gguf", ray=False,
    build_role="llama_cpp", build_fact="llmops_llama_cpp",
    flag_table="llama_server_flags", planner="llama_cpp",
    # /slots is on by default; /metrics only with --metrics
    slots_path="/slots", load_metrics=("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    spec_metrics=None,
)
VLLM = Engine(
    name="vllm", label="vLLM", aliases=(),
    context_setting="max_model_len", slots_setting="max_num_seqs",
    key_variable="VLLM_API_KEY", key_in_env=True,
    unit_prefix="vllm-", model_kind="snapshot", ray=True,
    build_role="vllm", build_fact="llmops_vllm",
    flag_table="vllm_flags", planner="vllm",
    # summed over label sets: a data-parallel server reports one set per engine core
    slots_path=None, load_metrics=("vllm:num_requests_running", "vllm:num_requests_waiting"),
    spec_metrics=("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
)

# name -> descriptor, in the order messages list them. Mutable only for tests that register an engine.
ENGINES = OrderedDict((engine.name, engine) for engine in (LLAMA_CPP, VLLM))
# The engine of an instance that names none (serving_default_engine's default).
DEFAULT_ENGINE = LLAMA_CPP.name


class UnknownEngine(ValueError):
    """An engine name no descriptor has; the message lists the known ones."""


def names():
    """The known engine names, in registration order."""
    return tuple(ENGINES)


def lookup(name):
    """The descriptor of engine `name` (exact), or None."""
    return ENGINES.get(name) if isinstance(name, str) else None


def get(name):
    """The descriptor of engine `name` (exact); UnknownEngine when there is none."""
    engine = lookup(name)
    if engine is None:
        raise UnknownEngine("unknown engine %r; known engines: %s" % (name, ", ".join(sorted(ENGINES))))
    return engine


def or_default(name):
    """The descriptor of `name`, or of DEFAULT_ENGINE when `name` is empty or unknown (for readers of facts
    whose instances the planner already checked)."""
    return lookup(name or DEFAULT_ENGINE) or ENGINES[DEFAULT_ENGINE]


def by_alias(name):
    """The descriptor whose name or one of its aliases is `name`, any case (the memory planner's spelling
    rule); None when none is."""
    text = str(name).lower()
    for engine in ENGINES.values():
        if text == engine.name.lower() or text in engine.aliases:
            return engine
    return None


def with_field(field, value):
    """The names of the engines whose `field` is `value`, in registration order (e.g. with_field("ray",
    True): the engines that may span a Ray cluster)."""
    return tuple(engine.name for engine in ENGINES.values() if getattr(engine, field) == value)


def field(name, key):
    """Field `key` of engine `name`'s descriptor (the filter engine_setting); UnknownEngine for an unknown
    engine, ValueError for an unknown field."""
    if key not in Engine._fields:
        raise ValueError("an engine descriptor has no field %r; fields: %s"
                         % (key, ", ".join(Engine._fields)))
    return getattr(get(name), key)
