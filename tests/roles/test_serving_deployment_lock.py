# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The deployment lock as role serving drives it, run for real by Ansible on localhost (issue 34):
tasks/run.yml names the run once, so that every step of the run - the role's deploy and the release of
tasks/deployment.yml that role fleet and playbooks/rollback.yml include - is one holder, across plays of one
ansible-playbook run; an instance another run holds is refused with that run named, its lock left alone."""

import json
import os
import sys

import yaml
from ansible_collections.llmops.serving.plugins.module_utils._serving import deployment

from tests.helpers import run_local_playbook

OTHER_RUN = "20261205T100500Z-bbbbbbbbbbbbbbbb"
# what the first play saw, written for the test to read
SEEN = ("{{ {'token': _serving_run.token, 'holder': _serving_run.holder, 'locked': deployed.locked,"
        " 'held': held.content | b64decode | from_json, 'after': after.stat.exists,"
        " 'refused': refused.msg | default('')} | to_json }}")


def deploy_task(tmp_path, name):
    return {"llmops.serving.deployment": {
        "state": "deploy", "dir": "{{ serving_deployments_dir }}", "name": name,
        "unit_file": str(tmp_path / (name + ".service")), "env_file": str(tmp_path / (name + ".env")),
        "unit_content": "[Service]\nEnvironmentFile=%s\n" % (tmp_path / (name + ".env")), "env_content": "",
        "lock_token": "{{ _serving_run.token }}", "lock_holder": "{{ _serving_run.holder }}",
        "lock_timeout": 4380}}


def serving_step(step, **extra):
    include = {"name": "llmops.serving.serving", "tasks_from": "deployment"}
    return {"ansible.builtin.include_role": include,
            "vars": dict({"serving_deployment_step": step}, **extra)}


def test_one_run_holds_and_releases_and_another_runs_instance_is_refused(tmp_path):
    root = tmp_path / "deployments"
    # instance r: deployed by another run, still in its health gate (its lock is live)
    deployment.run("deploy", str(root), name="r", unit_file=str(tmp_path / "r.service"),
                   env_file=str(tmp_path / "r.env"), unit_content="[Service]\n", env_content="",
                   lock_token=OTHER_RUN, lock_holder="play 'Serve' by bob on ctl-b")
    lock_q = str(root / "q" / "lock.json")
    first = {"hosts": "localhost", "gather_facts": False, "connection": "local",
             "vars": {"serving_deployments_dir": str(root)},
             "tasks": [
                 serving_step("query"),
                 dict(deploy_task(tmp_path, "q"), register="deployed"),
                 {"ansible.builtin.slurp": {"src": lock_q}, "register": "held"},
                 serving_step("release", serving_deployment_instance="q"),
                 {"ansible.builtin.stat": {"path": lock_q}, "register": "after"},
                 dict(deploy_task(tmp_path, "r"), register="refused", ignore_errors=True),
                 serving_step("release", serving_deployment_instance="r"),
                 {"ansible.builtin.set_fact": {"first_token": "{{ _serving_run.token }}"}},
                 {"ansible.builtin.copy": {"dest": str(tmp_path / "first.json"), "content": SEEN}}]}
    second = {"hosts": "localhost", "gather_facts": False, "connection": "local",
              "vars": {"serving_deployments_dir": str(root)},
              "tasks": [serving_step("query"),
                        {"ansible.builtin.assert": {"that": "_serving_run.token == first_token"}}]}
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([first, second]))
    result, recap = run_local_playbook(path, str(tmp_path),
                                       extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])
    assert recap.get("failed") == 0 and recap.get("ignored") == 1, \
        result.stdout[-3000:] + result.stderr[-2000:]
    seen = json.loads((tmp_path / "first.json").read_text())
    assert deployment.TOKEN_RE.fullmatch(seen["token"]) and seen["holder"].startswith("play 'localhost'")
    # the deploy took q's lock for this run; the release of tasks/deployment.yml (the same run) gave it back
    assert seen["locked"] is True and seen["held"]["token"] == seen["token"] and seen["after"] is False
    assert seen["held"]["expires"] - seen["held"]["taken"] == 4380
    # r is another run's: refused, named, and its lock left alone by this run's release
    assert "instance r is locked by play 'Serve' by bob on ctl-b (run %s)" % OTHER_RUN in seen["refused"]
    assert json.loads((root / "r" / "lock.json").read_text())["token"] == OTHER_RUN
    assert "the deployment lock of instance r is held by play 'Serve' by bob" in result.stdout + result.stderr
    assert not os.path.exists(str(tmp_path / "q.service.failed"))
