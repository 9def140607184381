# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The attributes of the collection's modules, as community.general's attributes fragments do it.

    DOCUMENTATION (``llmops.serving.attributes``) says what each attribute means and that every module runs on
    a POSIX node; every module extends it (instead of ansible.builtin.action_common_attributes) and states its
    own support, or takes it from INFO_MODULE. A fragment listed earlier wins over a later one, and the
    module's own DOCUMENTATION over all of them."""

    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying the target.
  diff_mode:
    description: Will return details on what has changed (or would change in check mode), when in diff mode.
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: posix
"""

    # Modules that only read (the *_info modules): check mode returns what a real run does, nothing to diff.
    INFO_MODULE = r"""
attributes:
  check_mode:
    support: full
    details: Read-only, so check mode returns the same result as a real run.
  diff_mode:
    support: none
    details: Read-only, so there is nothing to diff.
"""

    # Modules that publish facts (gpu_facts, gpu_pci_info).
    FACTS = r"""
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
"""
