# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The deployment lifecycle of one serving instance on its node: where a failed deploy is rolled back.

An instance runs from two live files, its systemd unit and its environment file (root 0600: it holds
secrets). Beside them, ``<deployments dir>/<instance>/`` (root 0700) keeps:

    current.json                 the record of what runs now (written once the instance is healthy)
    previous.service/.env/.json  the deployment before it: what playbooks/rollback.yml and the fleet put back
    before.service/.env          the live files a change replaced, until that change passed its health gate
    lock.json                    the run that deploys or swaps the instance now, until it commits, restores
                                 or releases it (see "The lock" below)

The lifecycle, one function per step (each returns what it did; ``check_mode`` computes, writes nothing):

    deploy   write the new unit and env file; the replaced ones are kept as before.*  (role serving)
    restore  the change failed the health gate: before.* back in place, the failed unit
             kept for inspection                                                      (role serving's rescue)
    commit   the change is healthy: before.* become previous.*, the former current.json
             previous.json, and current.json records what runs now                     (role serving)
    swap     current <-> previous: unit, env file and record                           (the fleet: a failed
             smoke check, playbooks/rollback.yml; a swap, so running it again returns to the newer one)
    release  give the lock back (a gate that failed without a restore, the end of a fleet swap)
    query    the records of one or every instance                                      (the fleet)

The lock. deploy -> restart -> health gate -> commit or restore is several module calls, so a lock that lives
as long as one process (flock) cannot cover it: two plays on one instance would interleave (play A commits
its unit while play B's failed unit runs and gets A's record). So ``lock.json`` records the run holding the
instance: its token (one per play run, ``lock_token``), who it is (``lock_holder``: the play, user and
controller), when it took the lock and when the lock turns stale (``lock_timeout`` later: that run is gone).
deploy (when there is a change to gate) and swap take it; commit and restore need it and give it back;
release gives it back. Another run's live lock refuses the step, naming the holder, changing nothing; a stale
one is taken over with a note. A run killed part-way (SIGKILL, a lost terminal) leaves its lock until the
deadline, which covers two health gates (43 minutes for llama.cpp): so the lock also names the process of
its run (``lock_owner``: the controller's host name, boot id and pid namespace, the ansible-playbook pid
and its start time), the refusal returns the lock (``LockHeld.lock``), and the controller, which alone can
see its own processes (plugins/plugin_utils/rollout.py lock_owner_gone), passes that lock's token back as
``lock_takeover`` when the process is gone: that lock is then taken over at once, with a note. A lock of
another controller, or of a process that still runs, is never taken over before its deadline. Each step
itself holds flock on the instance directory while it reads and writes, so that two steps never see the
lock half-changed.

A swap puts previous.service live only when its SHA-256 is the one previous.json records, and only when the
live unit is the one current.json records (nothing pending, nothing edited by hand): else it refuses and the
current unit stays live. Every write also repairs a file's mode and owner (an env file at 0644 becomes 0600
even when its content is the same). The instance directory is never a symbolic link (O_NOFOLLOW).

One mechanism carries out every step (``apply``): each step computes the new content of every file it
touches from what it read, then ``apply`` writes each new file to a temporary name in its own directory and
only when all of them are written renames them into place. A step that cannot be written (disk full, a
directory gone) leaves every file as it was; a rename that fails half-way is undone with the contents read
at the start. Nothing here returns the content of an environment file.

Plain Python 3.6, standard library only; importable and unit-tested without Ansible
(tests/unit/plugins/module_utils/test_deployment.py).
"""
from __future__ import absolute_import, division, print_function

import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import time

from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

__metaclass__ = type

STATES = ("deploy", "restore", "commit", "swap", "release", "query")
# A unit or an env file is a few KiB; a bigger file in these places is not one the role wrote.
MAX_FILE = 1 << 20
# Instance names as role serving allows them (instance_plan._NAME_RE): a single path component.
NAME_RE = whole(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# The kinds of live file, as the messages name them.
UNIT, ENV = "unit", "environment file"
UNIT_MODE, ENV_MODE, RECORD_MODE, DIR_MODE = 0o644, 0o600, 0o600, 0o700
# The slots of an instance directory and their modes (a write repairs a slot's mode and owner).
SLOT_MODES = (("before.service", UNIT_MODE), ("before.env", ENV_MODE), ("previous.service", UNIT_MODE),
              ("previous.env", ENV_MODE), ("previous.json", RECORD_MODE), ("current.json", RECORD_MODE))
LOCK = "lock.json"
# A run's token: what the role passes (fleet_deployment_run); the holder: who that run is, for the messages.
TOKEN_RE = whole(r"[A-Za-z0-9][A-Za-z0-9._:-]{7,127}")
HOLDER_RE = whole(r"[^\x00-\x1f\x7f]{1,300}")
# The process of a run (rollout.run_owner): host name, boot id, pid namespace, ansible-playbook's pid and its
# start time in clock ticks since boot (a pid used again by another process has another start time).
OWNER_RE = whole(
    r"host=[A-Za-z0-9._-]{1,253} boot=[0-9a-f-]{36} pidns=[0-9]{1,20} pid=[0-9]{1,10} start=[0-9]{1,20}")
# How long a lock holds when the caller does not say (the role passes its health timeouts): after that
# the run that took it counts as gone.
LOCK_TIMEOUT = 3600
# How long a step waits for another step on the same instance to finish its reads and writes (seconds).
GUARD_WAIT = 30.0


class DeploymentError(Exception):
    """A lifecycle step cannot be carried out; the message says why and what to do."""


class LockHeld(DeploymentError):
    """Another run's live lock refused the step; ``lock`` is its record ({token, holder, owner, step, taken,
    expires}), for the controller to tell whether that run's process is gone (``lock_takeover``)."""

    def __init__(self, message, lock):
        super(LockHeld, self).__init__(message)
        self.lock = dict((key, lock.get(key))
                         for key in ("token", "holder", "owner", "step", "taken", "expires"))


class Paths(object):
    """The live files of instance `name` and its slots under `<root>/<name>/`."""

    def __init__(self, root, name, unit_file=None, env_file=None):
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise DeploymentError("instance name %r: use letters, digits, '.', '_' or '-' (at most 63, "
                                  "starting with a letter or digit)" % (name,))
        for label, path in (("dir", root), ("unit_file", unit_file), ("env_file", env_file)):
            if path is not None and (not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path):
                raise DeploymentError("%s must be an absolute path, got %r" % (label, path))
        self.root = root
        self.name = name
        self.dir = os.path.join(root, name)
        self.unit_file = unit_file
        self.env_file = env_file

    def slot(self, filename):
        return os.path.join(self.dir, filename)


def read_file(path):
    """The bytes of regular file `path`, or None when there is none. Never follows a link or opens a FIFO."""
    if path is None:
        return None
    try:
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise DeploymentError("cannot read %s: %s" % (path, exc.strerror or exc)) from None
    if not stat.S_ISREG(st.st_mode):
        raise DeploymentError("%s is not a regular file (a link, directory or device): the deployment "
                              "lifecycle never follows or replaces one. Remove it and run again" % path)
    if st.st_size > MAX_FILE:
        raise DeploymentError("%s is %d bytes, larger than any unit, env file or record (%d): not one "
                              "role serving wrote. Remove it and run again" % (path, st.st_size, MAX_FILE))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise DeploymentError("cannot read %s: %s" % (path, exc.strerror or exc)) from None
    try:
        data = b""
        while len(data) <= MAX_FILE:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return data


def read_record(path):
    """The JSON record at `path` (a dict), or None when there is none."""
    data = read_file(path)
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeError) as exc:
        raise DeploymentError("deployment record %s is not JSON (%s): remove it, or restore it from a "
                              "backup, and run again" % (path, exc)) from None
    if not isinstance(record, dict) or not record.get("name") or not record.get("unit"):
        raise DeploymentError("deployment record %s has no instance name or unit" % path)
    return record


def checksum(data):
    return hashlib.sha256(data).hexdigest() if data is not None else None


def record_bytes(record):
    return (json.dumps(record, indent=4, sort_keys=True) + "\n").encode("utf-8")


def predates_env_files(unit):
    """A unit of the versions before env files carried the env values inline (Environment=): the diff that
    replaces it would print them, so it is not shown."""
    if unit is None:
        return False
    return not any(line.startswith(b"EnvironmentFile=") for line in unit.splitlines())


def _text(data):
    return data.decode("utf-8", "replace") if data is not None else ""


# --- the steps: each one reads, decides and returns {path: (new bytes or None to remove, mode)} ----------

def plan_deploy(paths, unit, env):
    """The new unit and env file (bytes; env None: not managed). The live files they replace are kept
    as before.* unless a change that never passed its gate already kept older ones there (those are still
    the last deployment that ran before it)."""
    live_unit, live_env = read_file(paths.unit_file), read_file(paths.env_file)
    unit_changed = live_unit != unit
    env_changed = env is not None and live_env != env
    # every kept file as it is (apply repairs a mode or owner that is not the slot's), then the live files:
    # written when their content differs, their mode and owner repaired when only those do
    writes = repair_slots(paths)
    writes[paths.unit_file] = (unit, UNIT_MODE)
    if unit_changed and live_unit is not None and read_file(paths.slot("before.service")) is None:
        writes[paths.slot("before.service")] = (live_unit, UNIT_MODE)
    if env is not None:
        writes[paths.env_file] = (env, ENV_MODE)
    if env_changed and live_env is not None and read_file(paths.slot("before.env")) is None:
        writes[paths.slot("before.env")] = (live_env, ENV_MODE)
    content_changed = unit_changed
    # Files kept by a change that never passed its gate (the run stopped before it): that change is still
    # unproven, so it counts as this run's change - restarted, gated, rolled back or committed now.
    unit_changed = unit_changed or read_file(paths.slot("before.service")) is not None
    env_changed = env_changed or (env is not None and read_file(paths.slot("before.env")) is not None)
    rollback = [kind for kind, slot in ((UNIT, "before.service"), (ENV, "before.env"))
                if writes.get(paths.slot(slot), (None,))[0] is not None]
    return {"writes": writes, "unit_changed": unit_changed, "env_changed": env_changed,
            "rollback": rollback if (unit_changed or env_changed) else [],
            # commit has something to do: a change (a pending one included) or no record yet (a deployment
            # made before records); otherwise a healthy instance needs no commit and the role skips it
            "commit_needed": bool(unit_changed or env_changed
                                  or read_file(paths.slot("current.json")) is None),
            "previous": read_file(paths.slot("previous.service")) is not None,
            "diff": None if predates_env_files(live_unit) or not content_changed else {
                "before": _text(live_unit), "after": _text(unit),
                "before_header": paths.unit_file, "after_header": paths.unit_file}}


def repair_slots(paths):
    """{slot: (its content, its mode)} of every slot there is: written as it is, apply repairs only a mode or
    an owner that is not the slot's (a previous.env left 0644 holds secrets)."""
    writes = {}
    for slot, mode in SLOT_MODES:
        data = read_file(paths.slot(slot))
        if data is not None:
            writes[paths.slot(slot)] = (data, mode)
    return writes


def plan_restore(paths, keep_failed_unit=None):
    """before.* back in place; the live (failed) unit copied to `keep_failed_unit`. The failed env file is
    not kept: it holds secrets, and the inventory has its values."""
    before_unit, before_env = read_file(paths.slot("before.service")), read_file(paths.slot("before.env"))
    writes, restored = {}, []
    if before_unit is None and before_env is None:
        return {"writes": writes, "restored": restored}
    live_unit = read_file(paths.unit_file)
    if keep_failed_unit and live_unit is not None:
        writes[keep_failed_unit] = (live_unit, UNIT_MODE)
    if before_unit is not None:
        writes[paths.unit_file] = (before_unit, UNIT_MODE)
        writes[paths.slot("before.service")] = (None, UNIT_MODE)
        restored.append(UNIT)
    if before_env is not None:
        writes[paths.env_file] = (before_env, ENV_MODE)
        writes[paths.slot("before.env")] = (None, ENV_MODE)
        restored.append(ENV)
    return {"writes": writes, "restored": restored}


def plan_commit(paths, record, unrecorded_record=None, unit_changed=False, env_changed=False):
    """The change is healthy. When the unit or env file changed in this run, the deployment before it
    becomes previous.*: the unit and env file it replaced (before.*), or the live one that did not change;
    the former current.json, or for a deployment made before records `unrecorded_record` with its unit's
    checksum. A first deployment (a new unit, nothing replaced) has no previous. current.json is written
    when something changed or there is none yet; otherwise nothing is written."""
    if not isinstance(record, dict):
        raise DeploymentError("commit needs the record of what runs now (a dict), got %r" % (record,))
    changed = bool(unit_changed or env_changed)
    before_unit, before_env = read_file(paths.slot("before.service")), read_file(paths.slot("before.env"))
    live_unit, live_env = read_file(paths.unit_file), read_file(paths.env_file)
    current = read_file(paths.slot("current.json"))
    writes = {}
    has_previous = changed and (before_unit is not None or not unit_changed)
    if has_previous:
        previous_unit = before_unit if before_unit is not None else live_unit
        previous_env = before_env if before_env is not None else live_env
        writes[paths.slot("previous.service")] = (previous_unit, UNIT_MODE)
        writes[paths.slot("previous.env")] = (previous_env, ENV_MODE)
        if current is not None:
            read_record(paths.slot("current.json"))     # refuse a broken record before it becomes previous
            writes[paths.slot("previous.json")] = (current, RECORD_MODE)
        else:
            old = dict(unrecorded_record or record)
            old["unit_checksum"] = checksum(previous_unit)
            writes[paths.slot("previous.json")] = (record_bytes(old), RECORD_MODE)
    for slot, data in (("before.service", before_unit), ("before.env", before_env)):
        if data is not None:
            writes[paths.slot(slot)] = (None, UNIT_MODE)
    if changed or current is None:
        now = dict(record)
        now["unit_checksum"] = checksum(live_unit)
        writes[paths.slot("current.json")] = (record_bytes(now), RECORD_MODE)
    previous = has_previous or (read_file(paths.slot("previous.service")) is not None)
    return {"writes": writes, "previous": previous}


def plan_swap(paths):
    """Exchange the live unit, env file and record with previous.*; refuses when there is no previous
    deployment (nothing is touched then)."""
    current = read_record(paths.slot("current.json"))
    previous = read_record(paths.slot("previous.json"))
    previous_unit = read_file(paths.slot("previous.service"))
    if current is None:
        raise DeploymentError("instance %s has no deployment record (%s): it was never deployed by role "
                              "serving here" % (paths.name, paths.slot("current.json")))
    if previous is None or previous_unit is None:
        raise DeploymentError("instance %s has no previous deployment to roll back to (%s): it was deployed "
                              "once, or never changed since records exist" % (paths.name, paths.dir))
    live_unit = read_file(paths.unit_file)
    if live_unit is None:
        raise DeploymentError("the unit %s of instance %s is gone: deploy the instance again (role serving) "
                              "before rolling it back" % (paths.unit_file, paths.name))
    check_swappable(paths, current, previous, live_unit, previous_unit)
    writes = {paths.unit_file: (previous_unit, UNIT_MODE),
              paths.slot("previous.service"): (live_unit, UNIT_MODE),
              paths.slot("current.json"): (read_file(paths.slot("previous.json")), RECORD_MODE),
              paths.slot("previous.json"): (read_file(paths.slot("current.json")), RECORD_MODE)}
    previous_env = read_file(paths.slot("previous.env"))
    if previous_env is not None:
        live_env = read_file(paths.env_file)
        writes[paths.env_file] = (previous_env, ENV_MODE)
        writes[paths.slot("previous.env")] = (live_env, ENV_MODE)
    return {"writes": writes, "record": previous, "previous_record": current,
            "diff": None if predates_env_files(live_unit) or predates_env_files(previous_unit) else {
                "before": _text(live_unit), "after": _text(previous_unit),
                "before_header": paths.unit_file, "after_header": paths.unit_file}}


def check_swappable(paths, current, previous, live_unit, previous_unit):
    """A swap puts previous.service live only when it is the unit previous.json recorded, and moves the live
    unit into previous.* only when it is the one current.json records: a truncated or altered previous unit,
    a change still waiting for its health gate or a unit edited by hand would otherwise run, or be recorded
    under another deployment's record. Refuses before anything is written: the current unit stays live."""
    pending = [slot for slot in ("before.service", "before.env") if read_file(paths.slot(slot)) is not None]
    if pending:
        raise DeploymentError(
            "instance %s has a change that has not passed its health gate (%s in %s): nothing was swapped, "
            "the current unit stays live. Run role serving for this host (it gates the change, then commits "
            "or restores it), then roll back" % (paths.name, " and ".join(pending), paths.dir))
    for label, slot, record, data in (
            ("previous unit", paths.slot("previous.service"), previous, previous_unit),
            ("live unit", paths.unit_file, current, live_unit)):
        recorded = record.get("unit_checksum")
        if data and checksum(data) == recorded:
            continue
        record_slot = "previous.json" if record is previous else "current.json"
        what = ("is empty (0 bytes)" if not data else "has SHA-256 %s, %s records %s"
                % (checksum(data), record_slot, recorded or "none"))
        fix = ("it was truncated or changed after it was kept: the previous deployment cannot be put back "
               "from it. Deploy the version you want with role serving instead" if record is previous else
               "it was changed outside the deployment lifecycle (by hand, or by a run that never finished): "
               "run role serving for this host so that the unit it runs is recorded, then roll back")
        raise DeploymentError("the %s %s of instance %s %s: %s. Nothing was swapped, the current unit stays "
                              "live" % (label, slot, paths.name, what, fix))


def query(root, name=None):
    """[{name, current, previous, previous_record}] of the instances recorded under `root` (only `name`'s
    when given), sorted by name. `previous`: a previous deployment can be swapped in."""
    if name is not None:
        names = [Paths(root, name).name]
    else:
        try:
            names = sorted(n for n in os.listdir(root) if NAME_RE.match(n))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return []
            raise DeploymentError("cannot list %s: %s" % (root, exc.strerror or exc)) from None
    out = []
    for entry in names:
        paths = Paths(root, entry)
        if instance_dir_stat(paths) is None:
            continue
        current = read_record(paths.slot("current.json"))
        if current is None:
            continue
        previous_record = read_record(paths.slot("previous.json"))
        previous = previous_record is not None and read_file(paths.slot("previous.service")) is not None
        out.append({"name": current["name"], "current": current, "previous": previous,
                    "previous_record": previous_record})
    return out


# --- the lock: which run deploys or swaps the instance now ----------------------------------------------

def check_run(token, holder, timeout, owner=None, takeover=None):
    """The run's token, holder, owner, lock timeout and the token of a gone run's lock, checked (they reach
    lock.json and the messages)."""
    if not isinstance(token, str) or not TOKEN_RE.fullmatch(token):
        raise DeploymentError("lock_token must be 8 to 128 letters, digits, '.', '_', ':' or '-' (one per "
                              "run of a play: role serving passes fleet_deployment_run), got %r" % (token,))
    if takeover is not None and (not isinstance(takeover, str) or not TOKEN_RE.fullmatch(takeover)):
        raise DeploymentError("lock_takeover must be the token of the lock to take over (8 to 128 letters, "
                              "digits, '.', '_', ':' or '-'), got %r" % (takeover,))
    if owner is not None and (not isinstance(owner, str) or not OWNER_RE.fullmatch(owner)):
        raise DeploymentError("lock_owner must read 'host=<name> boot=<boot id> pidns=<inode> pid=<pid> "
                              "start=<ticks>' (role serving passes fleet_deployment_run's owner), got %r"
                              % (owner,))
    if holder is not None and (not isinstance(holder, str) or not HOLDER_RE.fullmatch(holder)):
        raise DeploymentError("lock_holder must be one line of at most 300 characters, got %r" % (holder,))
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 60 <= timeout <= 7 * 86400:
        raise DeploymentError("lock_timeout must be whole seconds from 60 to 604800, got %r" % (timeout,))


def read_lock(paths):
    """The lock record of the instance ({token, holder, step, taken, expires}), or None when it is free."""
    data = read_file(paths.slot(LOCK))
    if data is None:
        return None
    try:
        lock = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeError):
        lock = None
    if not isinstance(lock, dict) or not isinstance(lock.get("token"), str) \
            or not all(isinstance(lock.get(key), (int, float)) for key in ("taken", "expires")):
        raise DeploymentError("the deployment lock %s of instance %s is not one this module wrote: if no "
                              "play is deploying or rolling back this instance now, remove it and run again"
                              % (paths.slot(LOCK), paths.name))
    return lock


def lock_state(lock, token, now, takeover=None):
    """free (no lock), ours (this run's), stale (another run's, past its deadline, or the one the controller
    found gone: `takeover` is its token) or held (another run's, live)."""
    if lock is None:
        return "free"
    if lock["token"] == token:
        return "ours"
    return "stale" if now >= lock["expires"] or lock["token"] == takeover else "held"


def _when(seconds):
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def describe_lock(lock):
    return "%s (run %s), which took it at %s to %s it" % (
        lock.get("holder") or "a run that did not say who it is", lock["token"],
        _when(lock.get("taken") or 0), lock.get("step") or "deploy")


def held_error(paths, lock, state):
    """Another run holds the instance: the refusal that names it and how to clear a lock that is stale."""
    return LockHeld(
        "instance %s is locked by %s: it is deploying, health-gating or rolling back this instance. Nothing "
        "was changed by this %s; wait until that run has finished and run again. If that run is really gone "
        "(killed, its controller lost), remove %s on this node, or wait until %s, when the lock counts as "
        "stale and the next run takes it over"
        % (paths.name, describe_lock(lock), state, paths.slot(LOCK), _when(lock["expires"])), lock)


def new_lock(token, holder, timeout, step, now, owner=None):
    lock = {"token": token, "holder": holder, "step": step, "taken": now, "expires": now + timeout}
    if owner is not None:
        lock["owner"] = owner
    return record_bytes(lock)


def plan_lock(paths, state, token, holder, timeout, lock, now, take, writes, check_mode=False, owner=None,
              takeover=None):
    """{lock path: (new bytes or None, mode)} and the notes for step `state`: deploy and swap take the lock
    (`take`: deploy only when there is a change to gate), commit and restore need it to change anything
    (`writes`: they would) and give it back, release gives it back when it is this run's (run() has refused
    another live run's lock already). `takeover`: the token of a lock whose run's process the controller
    found gone."""
    status = lock_state(lock, token, now, takeover)
    notes = []
    if status == "stale" and state in ("deploy", "swap"):
        why = ("its process %s is gone (killed, or it ended without giving the lock back)" % lock.get("owner")
               if now < lock["expires"] else "and did not commit, restore or release it before %s"
               % _when(lock["expires"]))
        notes.append("%s the stale deployment lock of instance %s: %s, %s" % (
            "took over" if take else "removed", paths.name, describe_lock(lock), why))
    unheld = status != "ours" and not (check_mode and status == "free")
    if state in ("commit", "restore") and writes and unheld:
        why = ("it is free: this run's deploy did not take it, or the lock was removed" if status == "free"
               else "it is held by %s, past its deadline" % describe_lock(lock))
        raise DeploymentError(
            "this run (%s) does not hold the deployment lock of instance %s (%s): the instance's files may "
            "be another run's now. Nothing was changed; the change stays pending (before.* in %s) and the "
            "next run of role serving gates it and commits or restores it"
            % (token, paths.name, why, paths.dir))
    if state == "release" and status == "held":
        notes.append("the deployment lock of instance %s is held by %s, not by this run: left alone"
                     % (paths.name, describe_lock(lock)))
    if take:
        return {paths.slot(LOCK): (new_lock(token, holder, timeout, state, now, owner), RECORD_MODE)}, notes
    if status == "ours" or (status == "stale" and state == "deploy"):   # deploy: nothing to gate
        return {paths.slot(LOCK): (None, RECORD_MODE)}, notes
    return {}, notes


# --- the one mechanism that writes -----------------------------------------------------------------------

def _owner():
    """Root owns what root writes; an unprivileged run (the unit tests) keeps its own user."""
    return (0, 0) if os.geteuid() == 0 else None


def _stage(path, data, mode):
    """`data` written and synced to a temporary name beside `path`; returns that name. (The instance
    directory is there: deploy creates it, open_instance_dir.)"""
    directory = os.path.dirname(path)
    fd, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        owner = _owner()
        if owner:
            os.fchown(fd, owner[0], owner[1])
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    return temp


def apply(writes, check_mode=False, _rename=os.rename):
    """Carry out a step's writes ({path: (bytes or None, mode)}): every new file staged first, then renamed
    into place; removals last. Returns the sorted paths that change. A staging failure removes the staged
    files and leaves everything as it was; a failed rename puts back what it had replaced."""
    changes = {}
    for path, (data, mode) in writes.items():
        old = read_file(path)
        if old != data or (data is not None and not _mode_and_owner_are(path, mode)):
            changes[path] = (data, mode, old)
    if check_mode or not changes:
        return sorted(changes)
    staged = {}
    try:
        for path, (data, mode, _old) in sorted(changes.items()):
            if data is not None:
                staged[path] = _stage(path, data, mode)
    except (OSError, IOError) as exc:
        for temp in staged.values():
            _unlink(temp)
        raise DeploymentError("nothing was changed: cannot write %s (%s)"
                              % (getattr(exc, "filename", None) or "a file", exc.strerror or exc)) from None
    done = []
    failing = None
    try:
        for failing in sorted(staged):
            _rename(staged[failing], failing)
            done.append(failing)
    except (OSError, IOError) as exc:
        for temp in (staged[p] for p in staged if p not in done):
            _unlink(temp)
        for path in done:
            _data, mode, old = changes[path]
            if old is None:
                _unlink(path)
            else:
                try:
                    os.rename(_stage(path, old, mode), path)
                except (OSError, IOError):
                    pass
        raise DeploymentError("nothing was changed: renaming into %s failed (%s); the files it had "
                              "replaced are back" % (failing, exc.strerror or exc)) from None
    for path, (data, _mode, _old) in sorted(changes.items()):
        if data is None:
            _unlink(path)
    return sorted(changes)


def _mode_and_owner_are(path, mode):
    """Whether regular file `path` has `mode` and the owner this run writes with (root: root)."""
    st = os.lstat(path)
    owner = _owner()
    return stat.S_IMODE(st.st_mode) == mode and (owner is None or (st.st_uid, st.st_gid) == owner)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the instance directory: never a link, one step at a time ----------------------------------------------

def instance_dir_stat(paths):
    """lstat of the instance directory (None when there is none); refuses anything but a directory."""
    try:
        st = os.lstat(paths.dir)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise DeploymentError("cannot read %s: %s" % (paths.dir, exc.strerror or exc)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise DeploymentError(
            "the deployment directory of instance %s, %s, is %s: the lifecycle keeps secrets there and never "
            "follows or replaces one. Replace it with a directory (root, 0700) holding the files it pointed "
            "to, and run again" % (paths.name, paths.dir, "a symbolic link" if stat.S_ISLNK(st.st_mode)
                                   else "not a directory"))
    return st


def open_instance_dir(paths, create, check_mode=False):
    """(fd, repaired) of the instance directory, opened without following a link (O_NOFOLLOW: a link put
    there after the check is refused too) and flock'd for this step, so that two steps on one instance
    never interleave their reads and writes; its mode and owner repaired (`repaired`: they were not root's
    0700). (None, False) when there is none and `create` is false."""
    if instance_dir_stat(paths) is None:
        if not create:
            return None, False
        if not os.path.isdir(paths.root):
            os.makedirs(paths.root, 0o755)      # the deployments directory as any other under /var/lib
        try:
            os.mkdir(paths.dir, DIR_MODE)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise DeploymentError("cannot create %s: %s" % (paths.dir, exc.strerror or exc)) from None
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(paths.dir, flags)
    except OSError as exc:
        instance_dir_stat(paths)                # a link or a file put there since: its own message
        raise DeploymentError("cannot open %s: %s" % (paths.dir, exc.strerror or exc)) from None
    try:
        deadline = time.time() + GUARD_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.time() > deadline:
                    raise DeploymentError("another step of the deployment lifecycle on instance %s has held "
                                          "%s for %d s: run again when it has finished"
                                          % (paths.name, paths.dir, GUARD_WAIT)) from None
                time.sleep(0.05)
        st = os.fstat(fd)
        owner = _owner()
        repaired = stat.S_IMODE(st.st_mode) != DIR_MODE or bool(owner and (st.st_uid, st.st_gid) != owner)
        if repaired and not check_mode:
            os.fchmod(fd, DIR_MODE)
            if owner:
                os.fchown(fd, owner[0], owner[1])
    except BaseException:
        os.close(fd)
        raise
    return fd, repaired


# --- the steps, planned and carried out --------------------------------------------------------------------

def run(state, root, name=None, unit_file=None, env_file=None, unit_content=None, env_content=None,
        keep_failed_unit=None, record=None, unrecorded_record=None, unit_changed=False, env_changed=False,
        lock_token=None, lock_holder=None, lock_timeout=LOCK_TIMEOUT, check_mode=False, _now=time.time,
        lock_owner=None, lock_takeover=None):
    """One lifecycle step; returns the module's result (without the content of any env file)."""
    if state not in STATES:
        raise DeploymentError("state must be one of %s, got %r" % (", ".join(STATES), state))
    if not isinstance(root, str) or not os.path.isabs(root):
        raise DeploymentError("dir must be an absolute path, got %r" % (root,))
    if state == "query":
        return {"changed": False, "dir": root, "records": query(root, name)}
    paths = Paths(root, name, unit_file, env_file)
    if state != "release":
        for option in ("unit_file", "env_file"):
            if getattr(paths, option) is None:
                raise DeploymentError("state %s needs %s" % (state, option))
    check_run(lock_token, lock_holder, lock_timeout, lock_owner, lock_takeover)
    run_lock = {"token": lock_token, "holder": lock_holder, "timeout": lock_timeout, "owner": lock_owner,
                "takeover": lock_takeover}
    fd, dir_repaired = open_instance_dir(paths, create=state == "deploy" and not check_mode,
                                         check_mode=check_mode)
    try:
        result = _step(state, paths, unit_content, env_content, keep_failed_unit, record, unrecorded_record,
                       unit_changed, env_changed, run_lock, check_mode,
                       read_lock(paths) if fd is not None else None, _now())
    finally:
        if fd is not None:
            os.close(fd)
    if dir_repaired:
        result["files"] = sorted(result["files"] + [paths.dir])
        result["changed"] = True
    return result


def _step(state, paths, unit_content, env_content, keep_failed_unit, record, unrecorded_record, unit_changed,
          env_changed, run_lock, check_mode, lock, now):
    """run()'s step under the instance directory's flock: `lock` is the lock record as it is now, `run_lock`
    this run's {token, holder, timeout, owner, takeover}."""
    token = run_lock["token"]
    if lock_state(lock, token, now, run_lock["takeover"]) == "held" and state != "release":
        # first: another run's unfinished change would otherwise be the reason given
        raise held_error(paths, lock, state)
    result = {"dir": paths.root, "instance_dir": paths.dir}
    take = state == "swap"
    if state == "deploy":
        if not isinstance(unit_content, str):
            raise DeploymentError("state deploy needs unit_content (the unit's text)")
        plan = plan_deploy(paths, unit_content.encode("utf-8"),
                           None if env_content is None else env_content.encode("utf-8"))
        result.update(unit_changed=plan["unit_changed"], env_changed=plan["env_changed"],
                      rollback=plan["rollback"], commit_needed=plan["commit_needed"],
                      previous=plan["previous"])
        take = plan["commit_needed"]
    elif state == "restore":
        if keep_failed_unit is not None and not os.path.isabs(keep_failed_unit):
            raise DeploymentError("keep_failed_unit must be an absolute path, got %r" % (keep_failed_unit,))
        plan = plan_restore(paths, keep_failed_unit)
        result.update(restored=plan["restored"], failed_unit=keep_failed_unit if plan["restored"] else None)
    elif state == "commit":
        plan = plan_commit(paths, record, unrecorded_record, unit_changed, env_changed)
        result.update(previous=plan["previous"])
    elif state == "swap":
        plan = plan_swap(paths)
        result.update(record=plan["record"], previous_record=plan["previous_record"])
    else:
        plan = {"writes": {}}
    lock_writes, notes = plan_lock(paths, state, token, run_lock["holder"], run_lock["timeout"], lock, now,
                                   take, bool(apply(plan["writes"], check_mode=True)), check_mode,
                                   run_lock["owner"], run_lock["takeover"])
    writes = dict(plan["writes"])
    writes.update(lock_writes)
    changed = [path for path in apply(writes, check_mode=check_mode) if path != paths.slot(LOCK)]
    result["changed"] = bool(changed)
    # which files change, by path; an env file is named, never shown
    result["files"] = changed
    # whether this run holds the instance's lock after the step (deploy and swap: until commit, restore or
    # release); the lock itself is not a change of the instance
    result["locked"] = take
    result["notes"] = notes
    if plan.get("diff") is not None and paths.unit_file in changed:
        result["diff"] = plan["diff"]
    return result
