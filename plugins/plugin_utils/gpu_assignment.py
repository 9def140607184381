# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which GPUs an instance gets, for every engine: checked against llmops_gpus, never shared.

An instance names PHYSICAL GPUs (indices or UUIDs). The engine process only sees its own GPUs, renumbered
from 0 (CUDA_VISIBLE_DEVICES in host mode, docker --gpus in container mode), so an engine's flag table turns
a GPU named in a setting into its position in the instance's list (llama_server_flags.relative_main_gpu).
A name matches a GPU by module_utils/_gpu/names.py, the rule gpu_facts' `devices` follows too. Tested by
tests/unit/plugins/plugin_utils/test_instance_plan.py.
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.module_utils._gpu.names import gpu_key, matches_gpu
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, is_number

__metaclass__ = type

_UUID_RE = whole(r"(GPU|MIG)-[0-9a-fA-F-]+")


def normalize_gpus(gpus, gpu_facts=None, instance="instance"):
    """Validate an instance's GPU list (indices or UUIDs) against llmops_gpus when present."""
    if gpus is None or gpus == []:
        return []
    if not isinstance(gpus, (list, tuple)):
        gpus = [g.strip() for g in str(gpus).split(",") if g.strip()]
    out = []
    for gpu in gpus:
        if isinstance(gpu, bool):
            raise ServingError("%s: GPU %r is neither an index nor a UUID" % (instance, gpu))
        if is_number(gpu) or (isinstance(gpu, str) and gpu.isdigit()):
            out.append(int(gpu))
        elif isinstance(gpu, str) and _UUID_RE.match(gpu):
            out.append(gpu)
        else:
            raise ServingError("%s: GPU %r is neither an index (2) nor a UUID (GPU-...)" % (instance, gpu))
    if len(set(gpu_key(g) for g in out)) != len(out):
        raise ServingError("%s: GPU list %s names a GPU twice" % (instance, out))
    _check_present(out, gpu_facts, instance)
    return out


def _check_present(gpus, gpu_facts, instance):
    if gpu_facts and gpu_facts.get("present"):
        known = gpu_facts.get("gpus") or []
        for gpu in gpus:
            if any(matches_gpu(gpu, entry) for entry in known):
                continue
            if gpu_facts.get("error"):
                # A GPU lost (fallen off the bus) or in a bad state is left out of llmops_gpus: say so, with
                # what gpu_facts found, not that it "does not exist".
                indices = sorted(set(int(g["index"]) for g in known if "index" in g))
                raise ServingError("%s: GPU %s is not usable on this host now: llmops_gpus lists only the "
                                   "working GPUs %s, and gpu_facts reports: %s Deploy the instance onto a "
                                   "working GPU (serving_instances[].gpus) or repair this one first"
                                   % (instance, gpu, indices, gpu_facts["error"]))
            if isinstance(gpu, int):
                indices = sorted(set(int(g["index"]) for g in known if "index" in g))
                raise ServingError("%s: GPU %d does not exist on this host (llmops_gpus has indices %s)"
                                   % (instance, gpu, indices))
            uuids = sorted(set(str(g["uuid"]).lower() for g in known if g.get("uuid")))
            raise ServingError("%s: GPU %s does not exist on this host (llmops_gpus UUIDs: %s)"
                               % (instance, gpu, ", ".join(uuids)))
    elif gpu_facts is not None and gpu_facts.get("present") is False and gpus:
        raise ServingError("%s asks for GPUs %s but llmops_gpus says this host has no NVIDIA GPU"
                           % (instance, gpus))


def claim_gpus(owners, gpus, name):
    """Record that instance `name` owns `gpus` in `owners` (gpu key -> instance); refuse a GPU owned twice."""
    for gpu in gpus:
        owner = owners.get(gpu_key(gpu))
        if owner:
            raise ServingError("GPU %s is given to both %s and %s" % (gpu, owner, name))
        owners[gpu_key(gpu)] = name


def gpu_entries(gpus, gpu_facts=None):
    """The llmops_gpus entries (index, uuid, compute_cap, memory_*_mib) of an instance's GPUs, in the
    instance's order (a tensor split follows it); [] without facts."""
    if not gpu_facts or not gpu_facts.get("present"):
        return []
    found = []
    for gpu in gpus:
        for entry in gpu_facts.get("gpus") or []:
            if matches_gpu(gpu, entry):
                found.append(entry)
                break
    return found
