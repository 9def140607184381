# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the serving-layer tests share: a host's facts, the planner with them, argv as flag -> value."""
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan

MODELS = {"tiny": {"path": "/home/models/tiny/tiny.gguf", "sha256": "ab" * 32}}
GPUS = {"present": True, "count": 4,
        "gpus": [{"index": i, "uuid": "GPU-%08d-aaaa-bbbb-cccc-dddddddddddd" % i, "memory_total_mib": 46068}
                 for i in range(4)]}
HOST_CPP = {"mode": "host", "binary": "/opt/llama.cpp/builds/b1/bin/llama-server", "build_id": "b1"}


def pairs(argv):
    """argv -> {flag: value or True}; fails on a flag given twice."""
    out = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("-"), argv
        assert flag not in out, "flag %s given twice in %s" % (flag, argv)
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[flag] = argv[i + 1]
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def plan(instances, build=HOST_CPP, binary_override=None, vllm=None, **kw):
    """plan_instances with this file's llama.cpp build (or `build`), vLLM build `vllm`, models (and GPUs when
    given); `binary_override` is llama.cpp's."""
    kw.setdefault("builds", {"llama.cpp": build, "vllm": vllm or {}})
    kw.setdefault("models", MODELS)
    if binary_override:
        kw["binary_override"] = {"llama.cpp": binary_override}
    return instance_plan.plan_instances(instances, **kw)
