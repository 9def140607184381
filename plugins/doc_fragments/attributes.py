# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Attributes the collection's modules share (used with ansible.builtin.action_common_attributes)."""

    # Modules that only read the node: check mode returns what a real run returns, there is nothing to diff.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: Read-only, so check mode returns the same result as a real run.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

    # Modules whose work runs on the managed node itself, standard library only (model_download,
    # model_snapshot, safetensors_info).
    NODE = r"""
attributes:
  platform:
    support: full
    platforms: posix
    description: Any POSIX node with Python 3.6 or later.
notes:
  - Runs on the managed node with Python 3.6 or later and the standard library only.
"""
