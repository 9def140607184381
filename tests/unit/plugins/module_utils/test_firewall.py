# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What llmops.serving.firewall_ports wants, reads and changes (plugins/module_utils/firewall.py)."""

import pytest
from ansible_collections.llmops.serving.plugins.module_utils import firewall as fw

# What firewalld 0.6 (CentOS 7.9) prints for --list-rich-rules, with a rule of another shape an admin added.
LISTED = """rule family="ipv4" source address="10.20.0.0/16" port port="8003" protocol="tcp" accept
rule family="ipv4" source address="10.0.0.9" port port="22" protocol="tcp" reject
rule family="ipv4" source NOT address="10.1.0.0/16" port port="8003" protocol="tcp" accept
rule family="ipv6" source address="fd00::/64" port port="10002-10999" protocol="tcp" accept
rule service name="ssh" accept
"""


@pytest.mark.parametrize("spec,port", [(8003, "8003/tcp"), ("8003", "8003/tcp"), ("8003/TCP", "8003/tcp"),
                                       ("10002-10999", "10002-10999/tcp"), ("53/udp", "53/udp")])
def test_ports(spec, port):
    assert fw.normal_port(spec) == port


@pytest.mark.parametrize("spec", ["0", "70000", "9000-8000", "http", "8003/icmp", ""])
def test_bad_ports_say_what_to_write(spec):
    with pytest.raises(fw.FirewallError):
        fw.normal_port(spec)


def test_sources_are_addresses_or_networks_never_names():
    assert fw.normal_source("10.20.1.7/16") == "10.20.0.0/16"
    assert fw.normal_source(" 192.0.2.7 ") == "192.0.2.7"
    with pytest.raises(fw.FirewallError, match="no host names"):
        fw.normal_source("gateway.lan")


def test_wanted_rules_whole_zone_or_per_source():
    assert fw.wanted_rules([8003, "8003/tcp", 8000], []) == [
        ("port", "8000/tcp", ""), ("port", "8003/tcp", "")]
    assert fw.wanted_rules([8003], ["10.20.0.0/16", "fd00::/64"]) == [
        ("rich", "8003/tcp", "10.20.0.0/16"), ("rich", "8003/tcp", "fd00::/64")]


def test_rich_rules_are_spelled_and_read_as_firewalld_lists_them():
    assert fw.rich_rule("8003/tcp", "10.20.0.0/16") == (
        'rule family="ipv4" source address="10.20.0.0/16" port port="8003" protocol="tcp" accept')
    assert fw.current_rules("8000/tcp 9100-9200/udp", LISTED) == {
        ("port", "8000/tcp", ""), ("port", "9100-9200/udp", ""),
        ("rich", "8003/tcp", "10.20.0.0/16"), ("rich", "10002-10999/tcp", "fd00::/64")}


def test_a_first_run_adds_both_layers_and_records_them():
    wanted = fw.wanted_rules([8003], ["10.20.0.0/16"])
    changes = fw.plan(wanted, set(), set(), [])
    assert changes["add_permanent"] == changes["add_runtime"] == wanted and changes["changed"]
    assert changes["record"] == wanted
    assert fw.commands("public", changes) == [
        ["--permanent", "--zone=public", "--add-rich-rule=" + fw.rich_rule("8003/tcp", "10.20.0.0/16")],
        ["--zone=public", "--add-rich-rule=" + fw.rich_rule("8003/tcp", "10.20.0.0/16")]]


def test_a_second_run_changes_nothing():
    wanted = fw.wanted_rules([8003, 8004], [])
    changes = fw.plan(wanted, set(wanted), set(wanted), wanted)
    assert not changes["changed"] and fw.commands("public", changes) == []


def test_only_the_missing_layer_is_fixed():
    wanted = fw.wanted_rules([8003], [])
    changes = fw.plan(wanted, set(wanted), set(), wanted)  # e.g. after a runtime-only removal
    assert changes["add_permanent"] == [] and changes["add_runtime"] == wanted
    assert fw.commands("public", changes) == [["--zone=public", "--add-port=8003/tcp"]]


def test_a_removed_instance_loses_the_port_we_opened_but_never_one_we_did_not():
    ours = [("port", "8003/tcp", ""), ("port", "8004/tcp", "")]
    admins = ("port", "22/tcp", "")
    now = set(ours) | {admins, ("port", "9000/tcp", "")}
    changes = fw.plan([("port", "8003/tcp", "")], now, now, ours)
    assert changes["remove_permanent"] == changes["remove_runtime"] == [("port", "8004/tcp", "")]
    assert changes["record"] == [("port", "8003/tcp", "")]
    kept = fw.plan([("port", "8003/tcp", "")], now, now, ours, prune=False)
    assert kept["remove_runtime"] == [] and ("port", "8004/tcp", "") in kept["record"]


def test_removals_go_before_additions_in_each_layer():
    changes = fw.plan(fw.wanted_rules([8003], ["10.0.0.0/8"]), {("port", "8003/tcp", "")},
                      {("port", "8003/tcp", "")}, [("port", "8003/tcp", "")])
    argv = fw.commands("internal", changes)
    assert [a[:3] for a in argv] == [
        ["--permanent", "--zone=internal", "--remove-port=8003/tcp"],
        ["--permanent", "--zone=internal", "--add-rich-rule=" + fw.rich_rule("8003/tcp", "10.0.0.0/8")],
        ["--zone=internal", "--remove-port=8003/tcp"],
        ["--zone=internal", "--add-rich-rule=" + fw.rich_rule("8003/tcp", "10.0.0.0/8")]]


def test_a_zone_wide_port_not_ours_is_reported_when_sources_are_asked():
    wanted = fw.wanted_rules([8003], ["10.0.0.0/8"])
    (warning,) = fw.shadowing_warnings(wanted, {("port", "8003/tcp", "")}, [])
    assert "8003/tcp is open to the whole zone by a rule llmops.serving did not add" in warning
    assert fw.shadowing_warnings(wanted, {("port", "8003/tcp", "")}, [("port", "8003/tcp", "")]) == []


def test_record_round_trip(tmp_path):
    path = str(tmp_path / "fw" / "serving.json")
    assert fw.read_record(path) == {"zone": "", "rules": []}
    fw.write_record(path, "public", [("rich", "8003/tcp", "10.0.0.0/8")])
    assert fw.read_record(path) == {"zone": "public", "rules": [("rich", "8003/tcp", "10.0.0.0/8")]}
