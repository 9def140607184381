# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether what node_state_info read is as a role's tasks would leave it (plugins/filter/node_state.py).

A role reads its paths and accounts once (module node_state_info) and runs the task that would change one
(ansible.builtin.file, group, user) only where this says it is not in place: the same attributes the task
sets, compared the way the task compares them. Anything missing or unreadable counts as not in place, so the
task runs and decides for itself.
"""
from __future__ import absolute_import, division, print_function

import hashlib

from ansible_collections.llmops.serving.plugins.module_utils._files.disk_plan import split_present

__metaclass__ = type


def path_in_place(state, path, kind, owner=None, group=None, mode=None):
    """Whether `path` in node_state_info's result `state` exists as `kind` (file, directory) with the owner,
    group (names) and mode ("0750") given; those left None are not compared."""
    entry = path_state(state, path)
    if not entry.get("exists") or entry.get("type") != kind:
        return False
    if owner is not None and entry.get("owner") != owner:
        return False
    if group is not None and entry.get("group") != group:
        return False
    if mode is not None and entry.get("mode") != _octal(mode):
        return False
    return True


def _octal(mode):
    """"0750" for 0o750 (YAML's 0750 is an int), "750" or "0750"; None for a symbolic mode (u=rwx,...), which
    never counts as in place: its task decides."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        return "%04o" % mode
    try:
        return "%04o" % int(str(mode), 8)
    except ValueError:
        return None


def file_in_place(state, path, content, owner=None, group=None, mode=None):
    """Whether `path` is a regular file holding exactly `content` (text, written as UTF-8) with the owner,
    group and mode given: what ansible.builtin.copy with that content would leave. `state` must have read the
    path with its checksum (node_state_info checksums)."""
    checksum = path_state(state, path).get("checksum")
    if not checksum or not path_in_place(state, path, "file", owner, group, mode):
        return False
    data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    return checksum == hashlib.sha1(data).hexdigest()


def account_in_place(state, user, group, home, shell):
    """Whether `group` exists and `user` exists with `group` as its primary group, `home` and `shell`: what
    ansible.builtin.group and ansible.builtin.user (create_home false) would leave."""
    state = state or {}
    found = (state.get("users") or {}).get(user)
    return bool((state.get("groups") or {}).get(group) and found and found.get("group") == group
                and found.get("home") == home and found.get("shell") == shell)


def path_state(state, path):
    """node_state_info's entry for `path` ({"exists": False} when it was not read)."""
    return ((state or {}).get("paths") or {}).get(path) or {"exists": False}


def missing_paths(state, paths):
    """Those of `paths` that node_state_info did not find (each once, in order)."""
    missing = []
    for path in paths or []:
        if not path_state(state, path).get("exists") and path not in missing:
            missing.append(path)
    return missing


def writes_not_present(state, writes):
    """The writes of a disk check (disk_space_info `writes`) that node_state_info's read does not show on the
    node already: one whose unless_exists path the read found (a link: its target too, as the module's
    os.path.exists sees it) is left out by the module's own rule (disk_plan.split_present). A path the read
    did not cover counts: the module decides it."""
    def exists(path):
        if not (isinstance(path, str) and path.startswith("/")):
            return False  # counted: disk_space_info refuses it, saying why
        entry = path_state(state, path)
        return bool(entry.get("exists")) and (entry.get("type") != "link" or bool(entry.get("target_exists")))
    return split_present(list(writes or []), exists=exists)[0]
