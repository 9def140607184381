# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.firewall_ports run as Ansible runs it, against the fake firewall-cmd
(tests/fixtures/fake_firewalld): reads first, changes only what is missing, check mode, pruning."""

import json
import os
import subprocess

import pytest

from tests.helpers import FIXTURES, run_module_file

FAKE = os.path.join(FIXTURES, "fake_firewalld", "firewall-cmd")


@pytest.fixture
def firewalld(tmp_path, monkeypatch):
    state = tmp_path / "firewalld"
    monkeypatch.setenv("FAKE_FIREWALLD_DIR", str(state / "permanent"))
    monkeypatch.setenv("FAKE_FIREWALLD_RUNTIME_DIR", str(state / "runtime"))
    monkeypatch.setenv("FAKE_FIREWALLD_LOG", str(state / "calls.log"))
    return state


def cmd(*args):
    return subprocess.run([FAKE] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)


def calls(state):
    path = state / "calls.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def changes(state):
    return [c for c in calls(state) if any(a.startswith(("--add-", "--remove-")) for a in c)]


def run(tmp_path, check_mode=False, **args):
    args.setdefault("owner", "serving")
    args.setdefault("firewall_cmd", FAKE)
    args.setdefault("record_dir", str(tmp_path / "record"))
    return run_module_file(tmp_path, "firewall_ports", args, check_mode=check_mode)


def test_opens_to_sources_in_both_layers_then_changes_nothing(tmp_path, firewalld):
    first = run(tmp_path, ports=["8003"], sources=["10.20.0.0/16"])
    assert first["changed"] is True and first["running"] is True and first["zone"] == "public"
    assert first["added"] == ["8003/tcp from 10.20.0.0/16"]
    rule = 'rule family="ipv4" source address="10.20.0.0/16" port port="8003" protocol="tcp" accept'
    assert cmd("--permanent", "--list-rich-rules").stdout.strip() == rule
    assert cmd("--list-rich-rules").stdout.strip() == rule
    assert len(changes(firewalld)) == 2
    second = run(tmp_path, ports=["8003"], sources=["10.20.0.0/16"])
    assert second["changed"] is False and second["commands"] == []
    assert len(changes(firewalld)) == 2  # nothing written the second time


def test_check_mode_reads_and_reports_but_changes_nothing(tmp_path, firewalld):
    result = run(tmp_path, check_mode=True, ports=["8003"])
    assert result["changed"] is True and result["added"] == ["8003/tcp from the whole zone"]
    assert result["commands"][0][1:] == ["--permanent", "--zone=public", "--add-port=8003/tcp"]
    assert changes(firewalld) == [] and cmd("--list-ports").stdout.strip() == ""
    assert not (tmp_path / "record").exists()


def test_a_removed_instance_closes_only_the_port_we_opened(tmp_path, firewalld):
    cmd("--permanent", "--add-port=22/tcp")
    cmd("--permanent", "--add-port=8004/tcp")  # the admin's own rule, same port as a later instance
    cmd("--reload")
    run(tmp_path, ports=["8003", "8004", "8005"])
    result = run(tmp_path, ports=["8003"])
    assert result["removed"] == ["8005/tcp from the whole zone"]
    assert cmd("--permanent", "--list-ports").stdout.split() == ["22/tcp", "8004/tcp", "8003/tcp"]
    assert cmd("--list-ports").stdout.split() == ["22/tcp", "8004/tcp", "8003/tcp"]


def test_firewalld_not_running_changes_nothing(tmp_path, firewalld):
    (firewalld / "permanent").mkdir(parents=True)
    (firewalld / "permanent" / "stopped").write_text("")
    result = run(tmp_path, ports=["8003"])
    assert result["changed"] is False and result["running"] is False and result["zone"] == ""
    assert [c for c in calls(firewalld)] == [["--state"]]
    absent = run(tmp_path, ports=["8003"], firewall_cmd=str(tmp_path / "no-firewall-cmd"))
    assert absent["running"] is False


def test_a_zone_change_moves_the_rules(tmp_path, firewalld):
    run(tmp_path, ports=["8003"])
    result = run(tmp_path, ports=["8003"], zone="internal")
    assert result["zone"] == "internal" and result["removed"] == ["8003/tcp from the whole zone"]
    assert cmd("--zone=public", "--list-ports").stdout.strip() == ""
    assert cmd("--zone=internal", "--list-ports").stdout.strip() == "8003/tcp"


def test_bad_input_fails_before_touching_the_firewall(tmp_path, firewalld):
    result = run(tmp_path, ports=["8003"], sources=["gateway.lan"])
    assert result["failed"] is True and "no host names" in result["msg"]
    assert calls(firewalld) == []


def test_the_fake_keeps_runtime_apart_and_reloads_from_permanent(tmp_path, firewalld):
    assert cmd("--state").returncode == 0
    cmd("--add-port=9000/tcp")  # runtime only
    assert cmd("--query-port=9000/tcp").returncode == 0
    assert cmd("--permanent", "--query-port=9000/tcp").returncode == 1
    cmd("--reload")
    assert cmd("--query-port=9000/tcp").returncode == 1
    assert cmd("--bogus").returncode == 2
