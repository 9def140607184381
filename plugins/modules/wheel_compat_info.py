#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: wheel_compat_info
short_description: Tell whether a node can install a Python wheel, and why not, before downloading it
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Compares what a wheel needs with what the node has - the node's glibc (C(os.confstr), else
    C(ldd --version)) against C(manylinux_X_Y), the node's machine against the platform tag, and the
    interpreter O(python) against the C(cpXY)/C(abi3)/C(pyX) tags and C(Requires-Python).
  - The tags come from the file name of O(wheel), else from O(tags); C(Requires-Python) from the METADATA
    of O(wheel) when that file is on the node, else from O(requires_python).
  - Used by role C(llmops.serving.vllm) before it installs vLLM into a virtualenv. The logic is in
    C(plugins/module_utils/_software/wheel_tags.py).
  - Read-only; never changes the host.
options:
  python:
    description:
      - The interpreter the wheel would be installed for (the one the virtualenv is made with); a name looked
        up on E(PATH) or a path.
    type: str
    default: python3
  wheel:
    description:
      - Path or file name of the wheel. Its name gives the tags; when the file exists on the node, its
        C(Requires-Python) is read from it.
    type: str
  tags:
    description:
      - Wheel tags (V(cp38-abi3-manylinux_2_28_x86_64), compressed sets such as V(py2.py3-none-any) allowed)
        when O(wheel) is not given. The wheel fits when one of them does. Empty means a source tree built on
        the node - only the interpreter and C(Requires-Python) are checked.
    type: list
    elements: str
    default: []
  requires_python:
    description:
      - C(Requires-Python) specifier (V(>=3.11,<3.15)) used when O(wheel) is not a file on the node.
    type: str
    default: ""
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
seealso:
  - module: llmops.serving.gpu_facts
    description: The other half of a node's fitness for vLLM (GPUs, compute capability, memory).
"""

EXAMPLES = r"""
- name: Check the node against the vLLM 0.33.0 wheel
  llmops.serving.wheel_compat_info:
    python: python3.11
    tags: [cp38-abi3-manylinux_2_28_x86_64]
    requires_python: ">=3.11,<3.15"
  register: vllm_compat

- name: Refuse with the reasons
  ansible.builtin.assert:
    that: vllm_compat.compatible
    fail_msg: "{{ vllm_compat.reasons | join('; ') }}"
"""

RETURN = r"""
compatible:
  description: Whether C(pip install) of the wheel can succeed on this node with O(python).
  returned: always
  type: bool
  sample: false
reasons:
  description: One sentence per unmet need, with the numbers; empty when compatible.
  returned: always
  type: list
  elements: str
  sample: ["manylinux_2_28_x86_64 needs glibc 2.28 or newer; this node has glibc 2.17"]
failed_checks:
  description: Which checks failed, so a caller can say what to do.
  returned: always
  type: list
  elements: str
  choices: [python, requires_python, glibc, machine, platform]
  sample: [glibc]
matching_tags:
  description: The tags (one per python-abi-platform triple) this node can install.
  returned: always
  type: list
  elements: str
  sample: [cp38-abi3-manylinux_2_28_x86_64]
tags:
  description: The tags checked, expanded to triples.
  returned: always
  type: list
  elements: str
  sample: [cp38-abi3-manylinux_2_28_x86_64]
requires_python:
  description: The C(Requires-Python) specifier checked (from the wheel's METADATA or O(requires_python)).
  returned: always
  type: str
  sample: ">=3.11,<3.15"
glibc:
  description: The node's glibc version, empty when it has none or it cannot be read.
  returned: always
  type: str
  sample: "2.17"
machine:
  description: The node's machine (C(uname -m)).
  returned: always
  type: str
  sample: x86_64
python:
  description: The interpreter O(python) as found (C(executable), C(implementation), C(version)) or C(error).
  returned: always
  type: dict
  sample: {"executable": "/usr/bin/python3", "implementation": "cpython", "version": [3, 6, 8]}
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._software import wheel_tags  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    python=dict(type="str", default="python3"),
    wheel=dict(type="str"),
    tags=dict(type="list", elements="str", default=[]),
    requires_python=dict(type="str", default=""),
)


def main():
    run_module(AnsibleModule, "wheel_compat_info", _run, argument_spec=ARGUMENT_SPEC,
               mutually_exclusive=[("wheel", "tags")], expected=(wheel_tags.WheelTagError, OSError))


def _run(module):
    params = module.params
    tags = (wheel_tags.parse_wheel_filename(params["wheel"])["tags"] if params["wheel"]
            else [t for tag in params["tags"] for t in wheel_tags.expand_tags(tag)])
    requires_python = params["requires_python"]
    if params["wheel"] and os.path.isfile(params["wheel"]):
        requires_python = wheel_tags.requires_python_from_wheel(params["wheel"])
    python = module.get_bin_path(params["python"]) or params["python"]
    host = {"glibc": wheel_tags.glibc_version(), "machine": os.uname()[4],
            "python": wheel_tags.probe_python(python)}
    result = wheel_tags.check(host, tags, requires_python)
    module.exit_json(changed=False, tags=tags, requires_python=requires_python,
                     glibc=wheel_tags.dotted(host["glibc"]) if host["glibc"] else "", machine=host["machine"],
                     python=host["python"], **result)


if __name__ == "__main__":
    main()
