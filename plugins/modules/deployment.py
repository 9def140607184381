#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: deployment
short_description: The deployment lifecycle of a serving instance's unit, env file and record
author:
  - llmops.serving developers (@llmops)
version_added: "0.7.0"
description:
  - The deployment lifecycle of one serving instance (role C(llmops.serving.serving)'s health gate and role
    C(llmops.serving.fleet)'s rollback) - its live systemd unit and environment file, and beside them
    C(<dir>/<name>/) (root 0700, never a symbolic link) with C(current.json), C(previous.service),
    C(previous.env), C(previous.json), C(before.service)/C(before.env) while a change waits for its health
    gate, and C(lock.json) while a run holds the instance.
  - V(deploy) writes O(unit_content) to O(unit_file) and O(env_content) to O(env_file) (root 0600) when they
    differ; the files they replace are kept as C(before.*). V(restore) puts C(before.*) back (a change
    that failed its health gate) and keeps the failed unit as O(keep_failed_unit). V(commit) makes
    C(before.*) the previous deployment and writes C(current.json) from O(record) (the change is healthy).
    V(swap) exchanges the live unit, env file and record with the previous ones (a failed smoke check,
    C(playbooks/rollback.yml)); it refuses, keeping the current unit live, when C(previous.service) is not
    the unit C(previous.json) records (its SHA-256) or the live unit is not the one C(current.json) records.
    V(release) gives the lock back. V(query) lists the records and changes nothing.
  - The lock - deploy, restart, health gate and commit or restore are several module calls, so the run that
    makes them holds the instance in C(lock.json) (O(lock_token), O(lock_holder), when it took the lock and
    when it turns stale, O(lock_timeout) later). V(deploy) (when there is a change to gate) and V(swap) take
    it; V(commit) and V(restore) need it and give it back; V(release) gives it back. Another run's lock
    refuses the step, changing nothing, with a message naming that run and how to clear the lock; a stale
    one (past its deadline) is taken over with a warning.
  - Every write repairs a file's mode and owner (the env file root 0600) even when its content is the same.
  - Every step writes each new file to a temporary name beside it and renames them all into place only when
    all are written - a step that fails leaves the files as they were.
  - The content of an environment file is never returned or shown in a diff; the diff shows the unit.
  - The logic is in C(plugins/module_utils/_serving/deployment.py).
options:
  state:
    description:
      - The lifecycle step.
    type: str
    required: true
    choices: [deploy, restore, commit, swap, release, query]
  dir:
    description:
      - The deployments directory, one subdirectory per instance (role serving's C(serving_deployments_dir)).
    type: path
    required: true
  name:
    description:
      - The instance. Required unless O(state=query), which lists every instance when it is not given.
    type: str
  unit_file:
    description:
      - The instance's systemd unit file (absolute path). Required unless O(state=query).
    type: path
  env_file:
    description:
      - The instance's environment file (absolute path; root 0600). Required unless O(state=query).
    type: path
  unit_content:
    description:
      - The unit's text, for O(state=deploy).
    type: str
  env_content:
    description:
      - The environment file's text, for O(state=deploy); unset leaves the file alone. Holds secrets.
    type: str
  keep_failed_unit:
    description:
      - For O(state=restore) - where the unit that failed its health check is kept for inspection.
    type: path
  record:
    description:
      - For O(state=commit) - the record of what runs now (the filter
        C(llmops.serving.fleet_deployment_record)); the module adds the unit's checksum.
    type: dict
  unrecorded_record:
    description:
      - For O(state=commit) - the record of the previous deployment when it predates records
        (C(llmops.serving.fleet_unrecorded_deployment)).
    type: dict
  unit_changed:
    description:
      - For O(state=commit) - whether V(deploy) changed the unit in this run (RV(unit_changed)).
    type: bool
    default: false
  env_changed:
    description:
      - For O(state=commit) - whether V(deploy) changed the environment file in this run (RV(env_changed)).
    type: bool
    default: false
  lock_token:
    description:
      - This run's token, the same for every step of one run of a play (role serving passes the filter
        C(llmops.serving.fleet_deployment_run)'s C(token)) - 8 to 128 letters, digits, C(.), C(_), C(:)
        or C(-). Required unless O(state=query).
    type: str
  lock_holder:
    description:
      - Who this run is (the play, the user and the controller), written into the lock for the messages of
        another run it refuses. One line.
    type: str
  lock_timeout:
    description:
      - Seconds after which a lock this step takes counts as stale (the run that took it is gone) and the next
        run takes it over. Longer than the restart, health gate and rollback it covers.
    type: int
    default: 3600
  lock_owner:
    description:
      - The process of this run, written into the lock - C(host=<controller host name> boot=<boot id>
        pidns=<pid namespace inode> pid=<ansible-playbook pid> start=<its start time in clock ticks>) (role
        serving passes the filter C(llmops.serving.fleet_deployment_run)'s C(owner)). The next run's
        controller reads it back from RV(lock) to tell whether this run was killed
        (C(llmops.serving.fleet_lock_owner_gone)).
    type: str
  lock_takeover:
    description:
      - The token of another run's lock whose process the controller found gone (killed part-way, or ended
        without giving the lock back) - the C(token) of RV(lock) of the refused step. That lock is taken over
        at once, with a note, instead of after its O(lock_timeout); a lock with any other token is still
        refused.
    type: str
attributes:
  check_mode:
    support: full
    details: Reads the files and reports what the step would change, without changing them.
  diff_mode:
    support: full
    details: The unit's change (not shown when the replaced unit predates env files and held env values).
extends_documentation_fragment:
  - llmops.serving.attributes
"""

EXAMPLES = r"""
# One token for every step of this run: made once and kept (a variable would be a new token each time)
- name: Name this run for the deployment locks
  ansible.builtin.set_fact:
    qwen_run: "{{ ansible_play_name | llmops.serving.fleet_deployment_run }}"
  when: qwen_run is not defined

- name: The lifecycle of instance qwen (what role serving and playbooks/rollback.yml do)
  module_defaults:
    llmops.serving.deployment:
      dir: /var/lib/llmops/deployments
      name: qwen
      unit_file: /etc/systemd/system/llama-server-qwen.service
      env_file: /etc/llama-server/qwen.env
      lock_token: "{{ qwen_run.token }}"
      lock_holder: "{{ qwen_run.holder }}"
  block:
    - name: Write the unit and env file (the replaced ones are kept until the instance is healthy)
      llmops.serving.deployment:
        state: deploy
        lock_timeout: 2400
        unit_content: "{{ lookup('ansible.builtin.template', 'serving.service.j2') }}"
        env_content: "{{ lookup('ansible.builtin.template', 'serving.env.j2') }}"
      register: deployed

    - name: Restart qwen and wait until it is healthy (role serving's health gate)
      ansible.builtin.include_tasks: health-gate.yml

    - name: It is healthy - the replaced files become the previous deployment, next to the new record
      llmops.serving.deployment:
        state: commit
        record: "{{ qwen_record }}"
        unit_changed: "{{ deployed.unit_changed }}"
        env_changed: "{{ deployed.env_changed }}"
      when: deployed.commit_needed

    - name: Later, when a smoke check fails - swap the previous deployment back in (this run holds it then)
      llmops.serving.deployment:
        state: swap
      when: qwen_smoke_failed | default(false)
  rescue:
    - name: The health gate failed - put the replaced unit and env file back, keeping the failed unit
      llmops.serving.deployment:
        state: restore
        keep_failed_unit: /var/lib/llmops/deployments/qwen/failed.service
  always:
    - name: Give the lock back (a no-op when commit or restore did)
      llmops.serving.deployment:
        state: release

- name: List the records of every instance
  llmops.serving.deployment:
    state: query
    dir: /var/lib/llmops/deployments
  register: deployments
"""

RETURN = r"""
dir:
  description: The deployments directory.
  returned: always
  type: str
instance_dir:
  description: The instance's directory under RV(dir).
  returned: unless O(state=query)
  type: str
files:
  description: The files the step changed (or, in check mode, would change), by path.
  returned: unless O(state=query)
  type: list
  elements: str
unit_changed:
  description: Whether the unit differs from O(unit_content).
  returned: O(state=deploy)
  type: bool
env_changed:
  description: Whether the environment file differs from O(env_content).
  returned: O(state=deploy)
  type: bool
rollback:
  description: What a failed health gate can put back (V(unit), V(environment file)) after this change.
  returned: O(state=deploy)
  type: list
  elements: str
restored:
  description: What was put back (V(unit), V(environment file)); empty when there was nothing to restore.
  returned: O(state=restore)
  type: list
  elements: str
locked:
  description: Whether this run holds the instance's lock after the step (V(deploy) with a change to gate,
    V(swap)); the lock is not counted as a change.
  returned: unless O(state=query)
  type: bool
notes:
  description: What the step did about another run's lock (a stale one taken over), also printed as warnings.
  returned: unless O(state=query)
  type: list
  elements: str
failed_unit:
  description: Where the failed unit is kept (O(keep_failed_unit)), when something was restored.
  returned: O(state=restore)
  type: str
previous:
  description: Whether the instance has a previous deployment now.
  returned: O(state=commit) or O(state=deploy)
  type: bool
commit_needed:
  description: Whether O(state=commit) has anything to do once the instance is healthy - a change in this
    step, files kept by a change that never passed its gate, or no record yet. A run that changes nothing
    skips it.
  returned: O(state=deploy)
  type: bool
record:
  description: The record of the deployment that runs after the swap.
  returned: O(state=swap)
  type: dict
previous_record:
  description: The record of the deployment swapped out.
  returned: O(state=swap)
  type: dict
lock:
  description: When another run's live lock refused the step, that lock - C(token), C(holder), C(owner)
    (O(lock_owner) of that run, or null), C(step), C(taken) and C(expires) (epoch seconds).
  returned: failure, when another run holds the instance
  type: dict
records:
  description: The records, C({name, current, previous, previous_record}) per instance, sorted by name.
  returned: O(state=query)
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._serving import deployment  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    state=dict(type="str", required=True, choices=list(deployment.STATES)),
    dir=dict(type="path", required=True),
    name=dict(type="str"),
    unit_file=dict(type="path"),
    env_file=dict(type="path"),
    unit_content=dict(type="str"),
    env_content=dict(type="str", no_log=True),
    keep_failed_unit=dict(type="path"),
    record=dict(type="dict"),
    unrecorded_record=dict(type="dict"),
    unit_changed=dict(type="bool", default=False),
    env_changed=dict(type="bool", default=False),
    # A run's name for its lock, not a secret (it is in lock.json and the refusal messages).
    lock_token=dict(type="str", no_log=False),
    lock_holder=dict(type="str"),
    lock_timeout=dict(type="int", default=deployment.LOCK_TIMEOUT),
    lock_owner=dict(type="str"),
    lock_takeover=dict(type="str", no_log=False),
)
REQUIRED_IF = [("state", "deploy", ("name", "unit_file", "env_file", "unit_content", "lock_token")),
               ("state", "restore", ("name", "unit_file", "env_file", "lock_token")),
               ("state", "commit", ("name", "unit_file", "env_file", "record", "lock_token")),
               ("state", "swap", ("name", "unit_file", "env_file", "lock_token")),
               ("state", "release", ("name", "lock_token"))]


def main():
    run_module(AnsibleModule, "deployment", _run, argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF,
               expected=(deployment.DeploymentError,))


def _run(module):
    p = module.params
    try:
        result = _step(p, module.check_mode)
    except deployment.LockHeld as exc:
        # the lock, so that the controller can tell whether its run is gone (lock_takeover)
        module.fail_json(msg=str(exc), changed=False, lock=exc.lock)
    if not module._diff:
        result.pop("diff", None)
    for note in result.get("notes") or ():
        module.warn(note)
    module.exit_json(**result)


def _step(p, check_mode):
    return deployment.run(p["state"], p["dir"], name=p["name"], unit_file=p["unit_file"],
                          env_file=p["env_file"], unit_content=p["unit_content"],
                          env_content=p["env_content"], keep_failed_unit=p["keep_failed_unit"],
                          record=p["record"], unrecorded_record=p["unrecorded_record"],
                          unit_changed=p["unit_changed"], env_changed=p["env_changed"],
                          lock_token=p["lock_token"], lock_holder=p["lock_holder"],
                          lock_timeout=p["lock_timeout"], lock_owner=p["lock_owner"],
                          lock_takeover=p["lock_takeover"], check_mode=check_mode)


if __name__ == "__main__":
    main()
