# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.firewall_ports run as Ansible runs it, against the fake firewall-cmd
(tests/fixtures/fake_firewalld): reads first, changes only what is missing, check mode, pruning."""

import json
import os
import subprocess
import time

import pytest

from tests.helpers import FIXTURES, run_module_file

FAKE = os.path.join(FIXTURES, "fake_firewalld", "firewall-cmd")
FAKE_IP = os.path.join(FIXTURES, "fake_firewalld", "ip")


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
    args.setdefault("ip_cmd", FAKE_IP)
    args.setdefault("record_dir", str(tmp_path / "record"))
    return run_module_file(tmp_path, "firewall_ports", args, check_mode=check_mode)


def test_opens_to_sources_in_both_layers_then_changes_nothing(tmp_path, firewalld):
    first = run(tmp_path, ports=["8003"], sources=["10.20.0.0/16"])
    assert first["changed"] is True and first["running"] is True and first["zone"] == "public"
    assert first["added"] == ["8003/tcp from 10.20.0.0/16 in zone public"]
    rule = 'rule family="ipv4" source address="10.20.0.0/16" port port="8003" protocol="tcp" accept'
    assert cmd("--permanent", "--list-rich-rules").stdout.strip() == rule
    assert cmd("--list-rich-rules").stdout.strip() == rule
    assert len(changes(firewalld)) == 2
    second = run(tmp_path, ports=["8003"], sources=["10.20.0.0/16"])
    assert second["changed"] is False and second["commands"] == []
    assert len(changes(firewalld)) == 2  # nothing written the second time


def test_check_mode_reads_and_reports_but_changes_nothing(tmp_path, firewalld):
    result = run(tmp_path, check_mode=True, ports=["8003"])
    assert result["changed"] is True and result["added"] == ["8003/tcp from the whole zone in zone public"]
    assert result["commands"][0][1:] == ["--permanent", "--zone=public", "--add-port=8003/tcp"]
    assert changes(firewalld) == [] and cmd("--list-ports").stdout.strip() == ""
    assert not (tmp_path / "record").exists()


def test_a_removed_instance_closes_only_the_port_we_opened(tmp_path, firewalld):
    cmd("--permanent", "--add-port=22/tcp")
    cmd("--permanent", "--add-port=8004/tcp")  # the admin's own rule, same port as a later instance
    cmd("--reload")
    run(tmp_path, ports=["8003", "8004", "8005"])
    result = run(tmp_path, ports=["8003"])
    assert result["removed"] == ["8005/tcp from the whole zone in zone public"]
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
    assert result["zone"] == "internal"
    assert result["removed"] == ["8003/tcp from the whole zone in zone public"]
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


# --- issue 34.8: deadlines, the owner, a malformed record ---------------------------------------------------

@pytest.mark.parametrize("hung", ["--state", "--get-default-zone", "--list-ports", "--add-port"])
def test_a_hung_firewall_cmd_fails_by_its_deadline_naming_the_call(tmp_path, firewalld, monkeypatch, hung):
    monkeypatch.setenv("FAKE_FIREWALLD_HANG", hung)
    start = time.monotonic()
    result = run(tmp_path, ports=["8003"], timeout=1)
    assert time.monotonic() - start < 30
    assert result["failed"] is True and "did not answer within 1 s" in result["msg"], result
    assert "`%s " % FAKE in result["msg"] and hung in result["msg"]
    assert not (tmp_path / "record").exists()


def test_a_hung_ip_fails_by_its_deadline_naming_the_call(tmp_path, firewalld, monkeypatch):
    monkeypatch.setenv("FAKE_IP_HANG", "1")
    result = run(tmp_path, listen=[{"port": "8003", "host": "0.0.0.0"}], timeout=1)
    assert result["failed"] is True
    assert "`%s -o addr show up` did not answer within 1 s" % FAKE_IP in result["msg"]
    given = run(tmp_path, listen=[{"port": "8003", "host": "0.0.0.0"}], zone="internal", timeout=1)
    assert given["changed"] is True  # an explicit zone needs no interface: ip is not asked


@pytest.mark.parametrize("owner", ["../../x", "a\n", "x/../../y"])
def test_an_owner_that_is_a_path_is_refused_and_nothing_is_written(tmp_path, firewalld, owner):
    result = run(tmp_path, owner=owner, ports=["8003"])
    assert result["failed"] is True and "must be a plain name" in result["msg"]
    assert calls(firewalld) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["args.json"]


@pytest.mark.parametrize("zone", ["public\n", "a/b", "x" * 18])
def test_a_zone_that_is_no_zone_name_is_refused(tmp_path, firewalld, zone):
    result = run(tmp_path, ports=["8003"], zone=zone)
    assert result["failed"] is True and "is not a firewalld zone name" in result["msg"]
    assert calls(firewalld) == []


@pytest.mark.parametrize("text", ["[]", '[["port", "8003/tcp", ""]]', "{oops"])
def test_a_malformed_record_is_kept_aside_and_written_anew(tmp_path, firewalld, text):
    (tmp_path / "record").mkdir()
    (tmp_path / "record" / "serving.json").write_text(text)
    result = run(tmp_path, ports=["8003"])
    assert not result.get("failed"), result
    assert result["added"] == ["8003/tcp from the whole zone in zone public"]
    assert any("serving.json" in w and "forgotten" in w for w in result["warnings"])
    assert (tmp_path / "record" / "serving.json.bad").read_text() == text
    record = json.loads((tmp_path / "record" / "serving.json").read_text())
    assert record == {"zones": {"public": [["port", "8003/tcp", ""]]}}
    again = run(tmp_path, ports=["8003"])
    assert again["changed"] is False and "warnings" not in again


def test_a_1x_record_still_lets_the_module_remove_what_it_added(tmp_path, firewalld):
    cmd("--permanent", "--add-port=8005/tcp")
    cmd("--add-port=8005/tcp")
    (tmp_path / "record").mkdir()
    (tmp_path / "record" / "serving.json").write_text(
        json.dumps({"zone": "public", "rules": [["port", "8005/tcp", ""]]}))
    result = run(tmp_path, ports=["8003"])
    assert result["removed"] == ["8005/tcp from the whole zone in zone public"]
    assert cmd("--list-ports").stdout.split() == ["8003/tcp"]


# --- issue 35.5: the zone of the interface that carries the bind address ------------------------------------

@pytest.fixture
def two_nics(firewalld, tmp_path, monkeypatch):
    """eth0 192.0.2.2 in no zone (the default, public), eth1 10.0.0.5 in internal."""
    (firewalld / "permanent").mkdir(parents=True)
    (firewalld / "permanent" / "interfaces.json").write_text(json.dumps({"eth1": "internal"}))
    addresses = tmp_path / "addresses.json"
    addresses.write_text(json.dumps({"lo": ["127.0.0.1/8"], "eth0": ["192.0.2.2/24"],
                                     "eth1": ["10.0.0.5/24", "fe80::1/64"]}))
    monkeypatch.setenv("FAKE_IP_ADDRESSES", str(addresses))
    return firewalld


def test_an_empty_zone_opens_the_port_in_the_zone_of_the_bind_address(tmp_path, two_nics):
    result = run(tmp_path, listen=[{"port": "8003", "host": "10.0.0.5"}])
    assert result["zone"] == "internal"
    assert result["added"] == ["8003/tcp from the whole zone in zone internal"]
    assert result["reasons"] == ["8003/tcp: zone internal (10.0.0.5 is on eth1; eth1 is in zone internal)"]
    assert cmd("--zone=internal", "--list-ports").stdout.split() == ["8003/tcp"]
    assert cmd("--permanent", "--zone=internal", "--list-ports").stdout.split() == ["8003/tcp"]
    assert cmd("--zone=public", "--list-ports").stdout.split() == []
    assert run(tmp_path, listen=[{"port": "8003", "host": "10.0.0.5"}])["changed"] is False


def test_a_wildcard_opens_the_port_in_the_zones_of_all_interfaces(tmp_path, two_nics):
    result = run(tmp_path, listen=[{"port": "8003", "host": "0.0.0.0"}], sources=["10.20.0.0/16"])
    assert result["zone"] == "internal, public"
    assert sorted(result["zones"]) == ["internal", "public"]
    assert "eth0 is in no zone, so in the default zone public" in " ".join(result["reasons"])
    for zone in ("internal", "public"):
        assert cmd("--zone=%s" % zone, "--list-rich-rules").stdout.strip() == (
            'rule family="ipv4" source address="10.20.0.0/16" port port="8003" protocol="tcp" accept')


def test_an_explicit_zone_still_wins_and_moving_back_cleans_up(tmp_path, two_nics):
    first = run(tmp_path, listen=[{"port": "8003", "host": "10.0.0.5"}], zone="trusted")
    assert first["zone"] == "trusted" and first["reasons"] == ["8003/tcp: zone trusted (given)"]
    assert cmd("--zone=trusted", "--list-ports").stdout.split() == ["8003/tcp"]
    assert cmd("--zone=internal", "--list-ports").stdout.split() == []
    second = run(tmp_path, listen=[{"port": "8003", "host": "10.0.0.5"}])
    assert second["removed"] == ["8003/tcp from the whole zone in zone trusted"]
    assert cmd("--zone=trusted", "--list-ports").stdout.split() == []
    assert cmd("--zone=internal", "--list-ports").stdout.split() == ["8003/tcp"]


def test_the_default_zone_is_whatever_firewalld_says(tmp_path, two_nics):
    (two_nics / "permanent" / "default_zone").write_text("work\n")
    result = run(tmp_path, ports=["8080"], listen=[{"port": "8003", "host": "192.0.2.2"}])
    assert result["zone"] == "work"
    assert sorted(cmd("--zone=work", "--list-ports").stdout.split()) == ["8003/tcp", "8080/tcp"]
