# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving layer's error type, and the number test that its checks share.

Controller-only (plugin_utils): used by the filter plugins/filter/serving.py through the planner
(instance_plan.py) and the engines' flag tables (flag_table.py, llama_server_flags.py, vllm_flags.py).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ServingError(ValueError):
    """Bad instances, settings or environment; the message says what to change."""


def is_number(value):
    """True for YAML numbers; YAML booleans are not numbers although Python's bool is an int."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
