# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""How a GPU is named: by its index or its UUID, as nvidia-smi lists them.

One rule for every place that matches a name against the GPUs: gpu_facts' `devices` (module_utils/_gpu/smi.py,
on the node) and the instances' `gpus` (plugin_utils/gpu_assignment.py, on the controller).

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def gpu_key(gpu):
    """One spelling per GPU, to compare indices and UUIDs whatever their case or spaces."""
    return str(gpu).strip().lower()


def matches_gpu(name, entry):
    """True when `name` (an index such as 2 or "2", or a UUID such as GPU-... or MIG-..., any case) names the
    GPU `entry` (an llmops_gpus entry: index, uuid)."""
    key = gpu_key(name)
    if key.isdigit():
        index = entry.get("index")
        return index is not None and gpu_key(index).isdigit() and int(key) == int(gpu_key(index))
    uuid = entry.get("uuid")
    return bool(uuid) and key == gpu_key(uuid)
