# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Marks the point of a run at which molecule/fleet's faults kill it (files/kill_at.py does the killing).

Enabled only in the runs a fault starts (ANSIBLE_CALLBACKS_ENABLED=fault_marker, ANSIBLE_CALLBACK_PLUGINS=this
directory). The point is a task, named by the start of its name, optionally on one host:

    LLMOPS_FAULT_TASK   the task name's beginning (role tasks' names are templated, so a prefix is robust)
    LLMOPS_FAULT_HOST   only when a worker starts that task on this host (v2_runner_on_start); without it,
                        when the play reaches the task, before any host runs it (v2_playbook_on_task_start)
    LLMOPS_FAULT_MARK   the file written then (the task's name and host, one line)
    LLMOPS_FAULT_HOLD   seconds to hold the run there (the play reaches the task and goes no further until
                        killed; bounded, then it goes on): a kill that lands exactly between two tasks

The marker is the run's own sequence of tasks, not a guess from timing or output: it works at any load.
"""
from __future__ import absolute_import, division, print_function

import os
import time

from ansible.plugins.callback import CallbackBase

__metaclass__ = type


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "fault_marker"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        self.task = os.environ.get("LLMOPS_FAULT_TASK") or None
        self.host = os.environ.get("LLMOPS_FAULT_HOST") or None
        self.mark = os.environ.get("LLMOPS_FAULT_MARK") or None
        self.hold = float(os.environ.get("LLMOPS_FAULT_HOLD") or 0)
        self.done = False

    def _reached(self, task, host=None):
        # the task's own name: get_name() puts "<role> : " before the tasks of a role
        name = task.get_name().split(" : ", 1)[-1]
        if self.done or not self.task or not self.mark or not name.startswith(self.task):
            return
        self.done = True
        with open(self.mark + ".tmp", "w") as handle:
            handle.write("%s\t%s\t%.3f\n" % (name, host or "-", time.time()))
        os.rename(self.mark + ".tmp", self.mark)
        end = time.time() + self.hold
        while time.time() < end:
            time.sleep(0.05)

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self.host is None:
            self._reached(task)

    def v2_runner_on_start(self, host, task):
        if self.host is not None and host.get_name() == self.host:
            self._reached(task, self.host)
