# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The CUDA release an engine runtime was built for, as roles llama_cpp and vllm publish it (cuda_version in
llmops_llama_cpp / llmops_vllm), which the serving plan checks against the node's driver.

    cuda_version: "{{ (_inspect.stdout | from_json) | llmops.serving.cuda_from_image_env }}"   # an image
    cuda_version: "{{ _nvcc.stdout | llmops.serving.cuda_from_nvcc }}"                         # a build

Both give None when the source does not say (a CPU image, a CPU build): the fact is never invented. The
parsing lives in plugins/module_utils/_gpu/cuda_compat.py with CUDA's rules.
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.module_utils._gpu.cuda_compat import (
    cuda_from_image_env,
    cuda_from_nvcc,
)

__metaclass__ = type


class FilterModule(object):
    """The CUDA release of an image (its Config.Env) or of an nvcc (its --version text)."""

    def filters(self):
        return {"cuda_from_image_env": cuda_from_image_env, "cuda_from_nvcc": cuda_from_nvcc}
