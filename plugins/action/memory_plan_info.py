# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""memory_plan_info on the controller when the node has nothing to add.

The planner is arithmetic on what the task is given: the GPUs (llmops_gpus), the host's RAM and each
instance's model metadata (gguf_info's or the snapshot's summary, which the roles pass as `model`). Running
that as a module costs a round trip to the node and a Python start there (half a second a call, twice a run:
preflight and the serve stage) for no reading of the node. So this action plans on the controller with the
same code (module_utils/_memory_plan/plan.py plan_result) and the module's own argument spec, and runs
the module on the node only when an instance names its model by a path there (model_path, a vLLM model
directory), which only the node can read.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.plan import needs_node, plan_result
from ansible_collections.llmops.serving.plugins.modules.memory_plan_info import ARGUMENT_SPEC


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # not used
        instances = self._task.args.get("instances")
        # not a list: the module says what is wrong with it
        if not isinstance(instances, list) or needs_node(instances):
            result.update(self._execute_module(module_name="llmops.serving.memory_plan_info",
                                               module_args=self._task.args, task_vars=task_vars))
            return result
        # The module's options, checked as AnsibleModule checks them (types, choices, required).
        try:
            params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        except AnsibleActionFail as exc:
            return dict(result, **exc.result)
        try:
            planned, warnings, error = plan_result(params)
        except Exception as exc:  # the module's last line of defence (module_guard), here: one line, no trace
            return dict(result, failed=True, changed=False,
                        msg="memory_plan_info failed: %s: %s" % (type(exc).__name__, str(exc)[:2000]))
        result.update(planned)
        if warnings:
            result["warnings"] = list(warnings)
        if error:
            result.update(failed=True, msg=error)
        return result
