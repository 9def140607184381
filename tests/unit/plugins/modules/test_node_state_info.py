# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_state_info run as Ansible runs it, and the controller's rules that read its result
(plugins/plugin_utils/node_state.py): what ansible.builtin.stat, copy, group and user would find."""
import grp
import hashlib
import os
import pwd

import pytest
from ansible_collections.llmops.serving.plugins.modules import node_state_info

from plugins.plugin_utils import node_state
from tests.helpers import assert_docs_match_argument_spec, run_module_file
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs

ME = pwd.getpwuid(os.getuid())
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def test_documentation_matches_argument_spec():
    assert_docs_match_argument_spec(node_state_info, capture_module_kwargs(node_state_info),
                                    {"paths", "users", "groups"})


def test_reads_paths_users_and_groups_in_one_call(tmp_path):
    key = tmp_path / "qwen.key"
    key.write_text("secret\n")
    key.chmod(0o600)
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o750)
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "link").symlink_to(binary)
    args = {"paths": [str(home), str(binary), str(tmp_path / "link"), str(tmp_path / "absent")],
            "checksums": [str(key), str(home)], "users": [ME.pw_name, "no-such-user-llmops"],
            "groups": [MY_GROUP, "no-such-group-llmops"]}
    result = run_module_file(tmp_path, "node_state_info", args, check_mode=True)
    assert result["changed"] is False and not result.get("failed"), result
    paths = result["paths"]
    assert paths[str(home)] == {"exists": True, "type": "directory", "mode": "0750", "uid": os.getuid(),
                                "gid": os.getgid(), "owner": ME.pw_name, "group": MY_GROUP,
                                "executable": False, "checksum": None}
    assert paths[str(key)]["checksum"] == hashlib.sha1(b"secret\n").hexdigest()
    # a regular file carries its stat identity (what gguf_info records of the file it read); a link does not
    st = os.stat(binary)
    assert paths[str(binary)]["identity"] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                              "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}
    assert "identity" not in paths[str(tmp_path / "link")] and "identity" not in paths[str(home)]
    assert paths[str(tmp_path / "link")]["target_exists"] is True
    assert paths[str(key)]["mode"] == "0600" and paths[str(key)]["type"] == "file"
    assert paths[str(binary)]["executable"] is True and "checksum" not in paths[str(binary)]
    # a link is reported as a link (not followed), executable as stat says of its target
    assert paths[str(tmp_path / "link")]["type"] == "link" and paths[str(tmp_path / "link")]["executable"]
    assert paths[str(tmp_path / "absent")] == {"exists": False}
    assert result["users"][ME.pw_name] == {"uid": ME.pw_uid, "gid": ME.pw_gid,
                                           "group": grp.getgrgid(ME.pw_gid).gr_name, "home": ME.pw_dir,
                                           "shell": ME.pw_shell}
    assert result["users"]["no-such-user-llmops"] is None
    assert result["groups"] == {MY_GROUP: {"gid": os.getgid()}, "no-such-group-llmops": None}


def test_a_link_is_not_followed_for_a_checksum(tmp_path):
    target = tmp_path / "target"
    target.write_text("secret\n")
    (tmp_path / "link").symlink_to(target)
    result = run_module_file(tmp_path, "node_state_info", {"checksums": [str(tmp_path / "link")]})
    assert result["paths"][str(tmp_path / "link")]["checksum"] is None


def test_bad_names_are_refused_saying_what(tmp_path):
    result = run_module_file(tmp_path, "node_state_info", {"users": [""]})
    assert result["failed"] and "users: an empty name" in result["msg"]


# --- the controller's rules ---------------------------------------------------------------------------------

STATE = {"paths": {
    "/etc/llama-server": {"exists": True, "type": "directory", "mode": "0750", "owner": "root",
                          "group": "llama"},
    "/etc/llama-server/q.key": {"exists": True, "type": "file", "mode": "0600", "owner": "llama",
                                "group": "llama", "checksum": hashlib.sha1(b"k1\n").hexdigest()},
    "/srv/gone": {"exists": False}},
    "users": {"llama": {"uid": 998, "gid": 997, "group": "llama", "home": "/var/lib/llama-server",
                        "shell": "/usr/sbin/nologin"}},
    "groups": {"llama": {"gid": 997}}}


@pytest.mark.parametrize("args, expected", [
    (("/etc/llama-server", "directory", "root", "llama", "0750"), True),
    (("/etc/llama-server", "directory", "root", "llama", "750"), True),
    (("/etc/llama-server", "directory", "root", "llama", 0o750), True),     # YAML's 0750 is an int
    (("/etc/llama-server", "directory", "root", "llama", "u=rwx,g=rx"), False),  # symbolic: the task decides
    (("/etc/llama-server", "directory", "root", "llama", "0755"), False),   # mode drifted
    (("/etc/llama-server", "directory", "llama", "llama", "0750"), False),  # owner drifted
    (("/etc/llama-server", "directory", "root", "root", "0750"), False),    # group drifted
    (("/etc/llama-server", "file"), False),                                 # a directory is not a file
    (("/srv/gone", "directory"), False),
    (("/never/read", "directory"), False),                                  # not read: the task decides
])
def test_a_path_is_in_place_only_with_every_attribute_the_task_sets(args, expected):
    assert node_state.path_in_place(STATE, *args) is expected


def test_a_file_is_in_place_only_with_the_same_content():
    key = "/etc/llama-server/q.key"
    assert node_state.file_in_place(STATE, key, "k1\n", "llama", "llama", "0600")
    assert not node_state.file_in_place(STATE, key, "k2\n", "llama", "llama", "0600")    # a new key
    assert not node_state.file_in_place(STATE, key, "k1\n", "llama", "llama", "0644")    # mode drifted
    unread = {"paths": {key: dict(STATE["paths"][key], checksum=None)}}
    assert not node_state.file_in_place(unread, key, "k1\n", "llama", "llama", "0600")
    assert not node_state.file_in_place(None, key, "k1\n")


@pytest.mark.parametrize("over, expected", [
    ({}, True),
    ({"groups": {}}, False),
    ({"users": {"llama": None}}, False),
    ({"users": {"llama": dict(STATE["users"]["llama"], group="users")}}, False),
    ({"users": {"llama": dict(STATE["users"]["llama"], shell="/bin/bash")}}, False),
    ({"users": {"llama": dict(STATE["users"]["llama"], home="/home/llama")}}, False),
])
def test_the_account_is_in_place_as_group_and_user_would_leave_it(over, expected):
    state = dict(STATE, **over)
    assert node_state.account_in_place(state, "llama", "llama", "/var/lib/llama-server",
                                       "/usr/sbin/nologin") is expected


def test_missing_paths_are_those_not_found_once_each():
    paths = ["/etc/llama-server", "/srv/gone", "/never/read", "/srv/gone"]
    assert node_state.missing_paths(STATE, paths) == ["/srv/gone", "/never/read"]
    assert node_state.missing_paths(None, ["/a"]) == ["/a"] and node_state.missing_paths(STATE, None) == []


def test_a_dangling_link_says_its_target_is_gone(tmp_path):
    (tmp_path / "current").symlink_to(tmp_path / "builds" / "b1")
    result = run_module_file(tmp_path, "node_state_info", {"paths": [str(tmp_path / "current")]})
    assert result["paths"][str(tmp_path / "current")]["target_exists"] is False


# what a disk check still has to weigh once the node has been read (preflight: nothing left, no call)
BUILD = {"path": "/opt", "what": "llama.cpp build", "bytes": 10, "unless_exists": "/opt/llama.cpp/current"}
CCACHE = {"path": "/var/cache", "what": "ccache", "size": "5G", "unless_exists": "/var/cache/ccache"}
MODEL = {"path": "/srv/models/q", "what": "model q", "bytes": 20}


@pytest.mark.parametrize("paths, left", [
    ({"/opt/llama.cpp/current": {"exists": True, "type": "link", "target_exists": True},
      "/var/cache/ccache": {"exists": True, "type": "directory"}}, [MODEL]),
    # a link whose build is gone counts, as os.path.exists sees it on the node
    ({"/opt/llama.cpp/current": {"exists": True, "type": "link", "target_exists": False},
      "/var/cache/ccache": {"exists": True, "type": "directory"}}, [BUILD, MODEL]),
    ({"/opt/llama.cpp/current": {"exists": False}}, [BUILD, CCACHE, MODEL]),   # ccache not read: counted
    ({}, [BUILD, CCACHE, MODEL]),
])
def test_writes_left_are_those_the_read_does_not_show_on_the_node(paths, left):
    assert node_state.writes_not_present({"paths": paths}, [BUILD, CCACHE, MODEL]) == left
    assert node_state.writes_not_present({"paths": paths}, []) == []
