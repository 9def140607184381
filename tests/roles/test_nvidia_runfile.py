# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role nvidia_driver and a driver installed with NVIDIA's .run installer (issue 35, point 1): the detect step
hands the install method and nvidia_driver_runfile_policy to the module, and the install stops (or
uninstalls the runfile driver) before anything is installed."""

import os
import sys

import yaml
from ansible_collections.llmops.serving.plugins.module_utils._gpu.runfile import RUNFILE_POLICIES

from tests.helpers import ROOT, load_yaml, run_local_playbook
from tests.roles.test_nvidia_driver import el7, flat_tasks

ROLE = os.path.join(ROOT, "roles", "nvidia_driver")


def test_the_policy_is_documented_and_defaults_to_refuse():
    r = el7()
    assert r.var("nvidia_driver_runfile_policy") == "refuse"
    spec = load_yaml(os.path.join(ROLE, "meta", "argument_specs.yml"))["argument_specs"]["main"]["options"]
    assert tuple(spec["nvidia_driver_runfile_policy"]["choices"]) == RUNFILE_POLICIES
    assert spec["nvidia_driver_runfile_policy"]["default"] == "refuse"
    detect = next(t for t in r.tasks("detect.yml") if "llmops.serving.nvidia_driver_info" in t)
    args = detect["llmops.serving.nvidia_driver_info"]
    assert args["install_method"] == "{{ nvidia_driver_install_method }}"
    assert args["runfile_policy"] == "{{ nvidia_driver_runfile_policy }}"


def test_the_runfile_is_dealt_with_before_anything_is_installed():
    r = el7()
    tasks = list(flat_tasks(r.tasks("install.yml")))
    refuse = next(i for i, t in enumerate(tasks) if "ansible.builtin.fail" in t)
    uninstall = next(i for i, t in enumerate(tasks)
                     if "nvidia-uninstall" in str(t.get("ansible.builtin.command")))
    first_change = next(i for i, t in enumerate(tasks) if "ansible.builtin.include_tasks" in t)
    assert refuse < uninstall < first_change
    assert tasks[uninstall]["ansible.builtin.command"]["argv"] == ["/usr/bin/nvidia-uninstall", "--silent"]
    for action, fails, uninstalls in (("refuse", True, False), ("uninstall", False, True),
                                      ("none", False, False)):
        plan = el7(_nvidia_driver_plan={"runfile_action": action, "runfile_message": "m"})
        assert plan.expr("{{ %s }}" % tasks[refuse]["when"]) is fails
        assert plan.expr("{{ %s }}" % tasks[uninstall]["when"]) is uninstalls
    # the plan decided without the node (the wanted driver works) has no runfile keys: nothing happens
    known = el7(_nvidia_driver_plan={"action": "none"})
    assert known.expr("{{ %s }}" % tasks[refuse]["when"]) is False
    assert known.expr("{{ %s }}" % tasks[uninstall]["when"]) is False


def test_a_refused_runfile_stops_the_install_with_the_modules_message(tmp_path):
    message = "A runfile driver 535.104.05 is on this node: re-run NVIDIA-Linux-x86_64-550.54.14.run --dkms."
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "vars": {"_nvidia_driver_plan": {"action": "install", "runfile_action": "refuse",
                                              "runfile_message": message}},
             "tasks": [{"ansible.builtin.include_role": {"name": "llmops.serving.nvidia_driver",
                                                         "tasks_from": "install"}}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    result, stats = run_local_playbook(path, str(tmp_path),
                                       extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])
    assert result.returncode != 0 and stats["failed"] == 1 and stats["ok"] == 0, result.stdout
    assert message in " ".join(result.stdout.split())
