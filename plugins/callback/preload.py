# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: preload
type: aggregate
short_description: Load the collection's filter and action plugins once, before the first task
version_added: "0.7.0"
description:
  - Ansible runs each task in a worker process forked from the main one. A worker that templates the first
    C(llmops.serving.*) filter of its task resolves the collection (its C(meta/runtime.yml), the list of its
    filter plugins, each plugin file) all over again, because the main process never did - about 0.1 s per
    task on a 2-core controller, on most of the roles' tasks.
  - This callback resolves the collection's filters and action plugins once in the main process when the
    playbook starts, so every worker inherits them. It changes no result and prints nothing; a run without it
    is only slower. Enabled in the collection's C(ansible.cfg) (C(callbacks_enabled)); a controller that does
    not enable it (an AWX job template with its own callbacks) runs as before.
requirements:
  - enabled in callbacks_enabled (ansible.cfg or ANSIBLE_CALLBACKS_ENABLED)
author:
  - llmops.serving developers (@llmops)
"""

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible.plugins.loader import action_loader, filter_loader  # noqa: E402

# One filter is enough to resolve the collection's filter plugins (Ansible loads every file of plugins/filter
# to find a collection filter by name); the action plugins are resolved one by one.
FILTER = "llmops.serving.node_path_state"
ACTIONS = ("llmops.serving.memory_plan_info", "llmops.serving.download_wait")


def preload(filters=filter_loader, actions=action_loader):
    """Resolve the collection's filters and action plugins in this process; returns what failed (name and
    error), which the callback ignores: a plugin that does not resolve here fails in its task as before."""
    failed = []
    for loader, names in ((filters, (FILTER,)), (actions, ACTIONS)):
        for name in names:
            try:
                if loader.get(name, class_only=True) is None:
                    failed.append((name, "not found"))
            except Exception as exc:  # a preload never stops a run
                failed.append((name, str(exc)))
    return failed


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "llmops.serving.preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        for name, error in preload():
            self._display.vvv("llmops.serving.preload: %s was not preloaded (%s)" % (name, error))
