# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Tags by stage (README "Tags"): every task of site.yml's plays carries exactly one stage tag, or `always`
when it only reads what the later stages need. `--tags build` runs the build stage and, of the other stages,
only such reads; `--tags driver` runs no build task. Read with ansible-playbook --list-tasks / --list-tags
against the l20 inventory (it parses, it connects to nothing)."""
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, load_yaml

STAGES = ("bundle", "bootstrap", "preflight", "driver", "toolkit", "build", "models", "serve", "validate",
          "gateway", "fleet", "monitoring")
# What a task tagged `always` may run: modules that change nothing on the node (and includes, read through).
READ_ONLY = {"ansible.builtin.set_fact", "ansible.builtin.assert", "ansible.builtin.debug",
             "ansible.builtin.fail", "ansible.builtin.meta", "ansible.builtin.include_vars",
             "ansible.builtin.validate_argument_spec", "llmops.serving.gpu_facts"}
MODULE = re.compile(r"^(ansible\.builtin|ansible\.posix|community\.\w+|llmops\.serving)\.")
BUILD_PLAY = "Build (or reuse) the pinned engines"


def _action(task):
    (action,) = [key for key in task if MODULE.match(key)]
    return action


def _role_file(role, name):
    base = os.path.join(ROOT, "roles", role, "tasks", name)
    return base if base.endswith(".yml") else base + ".yml"


def read_only(task, role=None):
    """Whether a task changes nothing: a read-only module, or an include of task files that change nothing."""
    for key in ("block", "rescue", "always"):
        if key in task:
            return all(read_only(t, role) for t in task[key])
    action = _action(task)
    if action in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
        args = task[action]
        role = args["name"].split(".")[-1]
        path = _role_file(role, args.get("tasks_from", "main"))
    elif action in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
        args = task[action]
        path = _role_file(role, args["file"] if isinstance(args, dict) else args)
    else:
        return action in READ_ONLY or action.endswith("_info")
    return all(read_only(t, role) for t in load_yaml(path) or [])


def site_plays():
    plays = []
    for entry in load_yaml(os.path.join(ROOT, "site.yml")):
        plays += load_yaml(os.path.join(ROOT, entry["ansible.builtin.import_playbook"]))
    return plays


def listed(*args):
    """[(play name, task name, tags)] that ansible-playbook site.yml --list-tasks prints."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "site.yml",
            "-i", "inventories/l20", "--list-tasks"] + list(args)
    result = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    tasks, play = [], None
    for line in result.stdout.splitlines():
        found = re.match(r"^  play #\d+ \([^)]*\): (.*)\tTAGS: ", line)
        if found:
            play = found.group(1)
            continue
        found = re.match(r"^      (.*)\tTAGS: \[(.*)\]\Z", line)
        if found:
            tasks.append((play, found.group(1), [t.strip() for t in found.group(2).split(",") if t.strip()]))
    return tasks


def _task_of(play_name, task_name):
    """The task a --list-tasks line names (a role's argument check: validate_argument_spec)."""
    if re.match(r"^\S+ : Validating arguments against arg spec ", task_name):
        return {"ansible.builtin.validate_argument_spec": {}}
    (play,) = [p for p in site_plays() if p["name"] == play_name]
    (task,) = [t for t in play.get("tasks") or [] if t.get("name") == task_name]
    return task


def _tags(entry):
    tags = entry.get("tags") or []
    return [tags] if isinstance(tags, str) else tags


def test_every_task_and_role_of_site_yml_carries_one_stage_tag_or_always():
    for play in site_plays():
        assert "tags" not in play, play["name"]        # a tagged play would skip its fact gathering
        for entry in (play.get("roles") or []) + (play.get("tasks") or []):
            tags = _tags(entry)
            assert len(tags) == 1 and (tags[0] in STAGES or tags[0] == "always"), (play["name"], entry)
            action = [k for k in entry if k in ("ansible.builtin.include_role",)]
            if action:                                 # the role's own tasks get the tag too
                assert entry[action[0]].get("apply", {}).get("tags") == tags, (play["name"], entry["name"])
            if tags == ["always"]:
                assert read_only(entry), (play["name"], entry["name"])


@pytest.mark.timeout(300)
def test_tags_build_runs_the_build_stage_and_of_the_others_only_reads():
    tasks = listed("--tags", "build")
    for play, name, tags in tasks:
        if "build" in tags:
            assert play == BUILD_PLAY, (play, name)
        else:
            assert "always" in tags and read_only(_task_of(play, name)), (play, name, tags)
    (build,) = [p for p in site_plays() if p["name"] == BUILD_PLAY]
    assert [name for play, name, _tags in tasks if play == BUILD_PLAY] == [t["name"] for t in build["tasks"]]


@pytest.mark.timeout(300)
def test_tags_driver_runs_the_driver_and_no_build_task():
    tasks = listed("--tags", "driver")
    assert [(p, n) for p, n, tags in tasks if p == BUILD_PLAY or "build" in tags] == []
    assert "Install, pin and activate the NVIDIA driver" in [n for _p, n, tags in tasks if "driver" in tags]
    assert "Install the Docker engine and the NVIDIA Container Toolkit" not in [n for _p, n, _t in tasks]


@pytest.mark.timeout(300)
def test_list_tags_shows_the_stages():
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "site.yml",
            "-i", "inventories/l20", "--list-tags"]
    result = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=240, check=True)
    found = set()
    for line in result.stdout.splitlines():
        if line.startswith("      TASK TAGS: ["):              # one line per play
            play_tags = set(t.strip() for t in line.split("[", 1)[1].rstrip("]").split(",") if t.strip())
            assert len(play_tags - {"always"}) <= 2, line      # its stage (gpu_host's play: driver, toolkit)
            found |= play_tags
    # site.yml runs every stage of a node; gateway, fleet and monitoring are their own playbooks
    assert found == {"always"} | set(STAGES) - {"gateway", "fleet", "monitoring"}


def test_read_only_tells_a_change_from_a_read():
    """The other direction: the classifier refuses what changes, directly or through an include."""
    assert read_only({"name": "r", "llmops.serving.disk_space_info": {}})
    assert read_only({"name": "r", "ansible.builtin.include_role": {"name": "llmops.serving.serving",
                                                                     "tasks_from": "runtime_check"}})
    assert not read_only({"name": "w", "ansible.builtin.copy": {"dest": "/x", "content": ""}})
    assert not read_only({"name": "w", "ansible.builtin.include_role": {"name": "llmops.serving.llama_cpp"}})


@pytest.mark.parametrize("playbook", ["gateway", "monitoring", "rolling_update", "rollback"])
def test_the_playbooks_outside_site_yml_carry_their_stage_tag(playbook):
    want = {"gateway": "gateway", "monitoring": "monitoring"}.get(playbook, "fleet")
    for play in load_yaml(os.path.join(ROOT, "playbooks", playbook + ".yml")):
        assert "tags" not in play
        for entry in (play.get("roles") or []) + (play.get("tasks") or []):
            assert _tags(entry) == [want], (playbook, entry)
