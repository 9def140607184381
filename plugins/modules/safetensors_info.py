#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: safetensors_info
short_description: Describe a vLLM model directory (config.json and safetensors headers), local or on the hub
author:
  - llmops.serving developers (@llmops)
description:
  - Returns what the vLLM memory planner (M(llmops.serving.memory_plan_info)) reads from a model directory -
    the model's C(config.json) (the C(text_config) of a multimodal Qwen3.5/3.6 config wins) and the bytes of
    its top-level C(*.safetensors) shards - as RV(vllm), plus every shard's checked header in RV(shards).
  - The shards counted are those vLLM loads - with C(model.safetensors.index.json), only those it names (a
    consolidated copy beside them is not counted twice); a shard it names that is missing is refused. Every
    count of C(config.json) is checked first (layers at most 4096). On the node, C(config.json) and the index
    must be regular files (never a link, FIFO or device) of at most 4 MiB and 64 MiB.
  - Each shard's header is checked as the safetensors library checks it - a header length within 16 MiB and
    the file, known dtypes, shapes of non-negative integers, each tensor's byte count equal to its shape times
    its dtype, the tensors back to back from offset 0 and ending exactly at the end of the file (a truncated
    download is caught without hashing). Only the 8-byte length and the header are read, never the tensors.
  - With O(path), reads the directory on the node (a M(llmops.serving.model_snapshot) dest or any directory
    with C(config.json)).
  - With O(repo), plans before downloading - the commit and file listing as M(llmops.serving.model_snapshot)
    reads them (same bounds and refusals, same O(allow_patterns)/O(ignore_patterns)), C(config.json) fetched
    and checked against the listing's checksum, and each shard's header read with two HTTP Range requests
    (the 8-byte length, then the header). The token rules are those of M(llmops.serving.model_download).
version_added: "0.5.0"
options:
  path:
    description:
      - The model directory on the node. Exactly one of O(path) and O(repo) is required.
    type: path
  repo:
    description: Hub repository, C(org/name), read remotely.
    type: str
  allow_patterns:
    description: With O(repo), the files model_snapshot would fetch (its option of the same name).
    type: list
    elements: str
    default: []
  ignore_patterns:
    description: With O(repo), the files model_snapshot would leave out.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.download
seealso:
  - module: llmops.serving.model_snapshot
  - module: llmops.serving.gguf_info
"""

EXAMPLES = r"""
- name: Plan the vLLM model before downloading it
  llmops.serving.safetensors_info:
    repo: Qwen/Qwen3.6-27B-FP8
    endpoint: https://hf-mirror.com
  register: fp8

- name: Check the shards of the snapshot on the node
  llmops.serving.safetensors_info:
    path: /home/models/Qwen3.6-27B-FP8
"""

RETURN = r"""
vllm:
  description: What memory_plan_vllm.vllm_model_summary() returns for the directory (layers, heads, head_dim,
    layer types, dtype, quantization_config, weights_bytes...), the memory_plan_info module's model input.
    C(weights_files) are the shards counted, C(weights_index) the shard index that chose them (null without
    one) and C(weights_ignored) the C(*.safetensors) files it leaves out (vLLM does not load them).
  returned: always
  type: dict
shards:
  description: Per shard counted (those C(model.safetensors.index.json) names, or every top-level
    C(*.safetensors) without it), C(name), C(size), C(header_bytes), C(tensor_count),
    C(tensor_bytes), C(dtypes) (bytes per dtype) and C(metadata).
  returned: always
  type: list
  elements: dict
commit:
  description: With O(repo), the commit read (null for a ModelScope branch).
  returned: always
  type: str
remote:
  description: With O(repo), C(url), C(revision), C(bytes_read) (header bytes) and C(requests).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download import messages as download_messages  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._download import options as download_options  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import common as memory_plan_common  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import vllm as memory_plan_vllm  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._model_format import (  # noqa: E402
    safetensors,
    safetensors_remote,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = download_options.header_read_argument_spec(
    ("repo",),
    path=dict(type="path"),
    allow_patterns=dict(type="list", elements="str", default=[]),
    ignore_patterns=dict(type="list", elements="str", default=[]),
)


def main():
    run_module(AnsibleModule, "safetensors_info", _run, argument_spec=ARGUMENT_SPEC,
               mutually_exclusive=[("path", "repo")], required_one_of=[("path", "repo")])


def _run(module):
    p = module.params
    token = p["token"]
    try:
        if p["path"]:
            summary, shards = safetensors.local_summary(p["path"], memory_plan_vllm.vllm_summary)
            result = {"vllm": summary, "shards": shards, "commit": None, "remote": None}
        else:
            result = safetensors_remote.remote_summary(p, p["allow_patterns"], p["ignore_patterns"])
    except safetensors.SafetensorsError as exc:
        module.fail_json(msg=download_messages.scrub("safetensors check failed: %s" % exc, token))
    except (download_messages.DownloadError, memory_plan_common.PlanError, OSError) as exc:
        module.fail_json(msg=download_messages.scrub(str(exc), token))
    except (MemoryError, OverflowError, RecursionError) as exc:  # a backstop: the limits should prevent these
        module.fail_json(msg="safetensors check failed: %s while reading a header (crafted file?)"
                             % type(exc).__name__)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
