# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving layer's error type, how the filters report it, and the small helpers its checks share.

Controller-only (plugin_utils): used by the filters of plugins/filter/ through the planner (instance_plan.py),
the engines' flag tables (flag_table.py, llama_server_flags.py, vllm_flags.py), the gateway and the fleet.
"""
from __future__ import absolute_import, division, print_function

import functools

__metaclass__ = type


class ServingError(ValueError):
    """Bad instances, settings or environment; the message says what to change."""


class VllmArgsError(ServingError):
    """Bad vLLM settings or extra_args; the message says what to change (vllm_flags.py and its GPU and Ray
    checks, vllm_preflight.py)."""


def is_number(value):
    """True for YAML numbers; YAML booleans are not numbers although Python's bool is an int."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def filter_errors(prefix):
    """A decorator that raises ServingError as AnsibleFilterError("<prefix>: <message>"): what Ansible prints
    as the task's failure, without a traceback."""
    from ansible.errors import AnsibleFilterError

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except ServingError as exc:
                raise AnsibleFilterError("%s: %s" % (prefix, exc)) from None
        return wrapper
    return decorate


def get_var(mapping, key, default=None):
    """mapping[key], or default when missing or None (dicts and Ansible's lazily templated hostvars)."""
    try:
        value = mapping[key]
    except (KeyError, TypeError):
        return default
    return default if value is None else value
