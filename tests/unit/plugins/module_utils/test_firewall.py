# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What llmops.serving.firewall_ports wants, reads and changes (plugins/module_utils/_serving/firewall.py)."""

import json
import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._serving import firewall as fw

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
    assert fw.read_record(path) == ({}, None)
    zones = {"public": [("rich", "8003/tcp", "10.0.0.0/8")], "internal": [("port", "8003/tcp", "")]}
    fw.write_record(path, zones)
    assert fw.read_record(path) == (zones, None)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


# --- the owner names a file, never a path (issue 34.8) ------------------------------------------------------

@pytest.mark.parametrize("owner", ["serving", "ray_cluster", "gateway", "gpu-node.7", "A" * 64])
def test_plain_owners_name_a_record_in_the_directory(tmp_path, owner):
    assert fw.record_path(str(tmp_path), owner) == os.path.join(str(tmp_path), owner + ".json")


@pytest.mark.parametrize("owner", ["../../x", "a\n", "a/b", "..", ".hidden", "", "a b", "A" * 65,
                                   "serving\n"])
def test_an_owner_that_is_a_path_or_ends_in_a_newline_is_refused(tmp_path, owner):
    with pytest.raises(fw.FirewallError, match="plain name"):
        fw.record_path(str(tmp_path), owner)


def test_a_record_that_links_out_of_the_directory_is_refused(tmp_path):
    (tmp_path / "record").mkdir()
    (tmp_path / "record" / "serving.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(fw.FirewallError, match="leads out of"):
        fw.record_path(str(tmp_path / "record"), "serving")
    (tmp_path / "link").symlink_to(tmp_path / "record")  # a linked directory itself is fine
    assert fw.record_path(str(tmp_path / "link"), "gateway").endswith("link/gateway.json")


# --- a malformed record is said, never a traceback (issue 34.8) ---------------------------------------------

@pytest.mark.parametrize("text,what", [("[]", "holds a JSON list"),
                                       ('["zone", "public"]', "holds a JSON list"),
                                       ("7", "holds a JSON int"), ("{not json", "cannot be read as JSON"),
                                       ('{"zones": []}', '"zones" is not an object')])
def test_a_malformed_record_is_a_problem_not_a_traceback(tmp_path, text, what):
    path = tmp_path / "serving.json"
    path.write_text(text)
    zones, problem = fw.read_record(str(path))
    assert zones == {} and what in problem and str(path) in problem and "kept as <record>.bad" in problem


def test_a_record_keeps_its_good_rules_and_says_how_many_it_dropped(tmp_path):
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({"zones": {"public": [["port", "8003/tcp", ""], ["port", "99999", ""], "x",
                                                     ["rich", "8004/tcp", "gateway.lan"]],
                                          "bad zone\n": [["port", "8005/tcp", ""]]}}))
    zones, problem = fw.read_record(str(path))
    assert zones == {"public": [("port", "8003/tcp", "")]} and "4 entries" in problem


def test_the_1x_record_is_read(tmp_path):
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({"zone": "public", "rules": [["rich", "8003/tcp", "10.0.0.0/8"]]}))
    assert fw.read_record(str(path)) == ({"public": [("rich", "8003/tcp", "10.0.0.0/8")]}, None)


# --- deadlines on every command (issue 34.8) ----------------------------------------------------------------

def test_a_hung_command_is_stopped_at_its_deadline_and_named(tmp_path):
    import time
    start = time.monotonic()
    with pytest.raises(fw.FirewallError, match=r"`sleep 30` did not answer within 1 s"):
        fw.call(["sleep", "30"], 1)
    assert time.monotonic() - start < 10
    assert fw.call(["echo", "public"], 5) == (0, "public\n", "")
    with pytest.raises(fw.FirewallError, match="cannot run"):
        fw.call([str(tmp_path / "missing")], 5)


def test_a_failed_firewall_cmd_call_is_named(tmp_path):
    with pytest.raises(fw.FirewallError, match=r"`false --list-ports` failed \(rc 1\)"):
        fw.FirewallCmd("false", 5).run(["--list-ports"])


# --- which zone (issue 35.5) --------------------------------------------------------------------------------

IP_ADDR = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
2: eth0    inet6 fe80::fc:ff:fe00:1/64 scope link \\       valid_lft forever preferred_lft forever
3: eth1    inet 10.0.0.5/24 brd 10.0.0.255 scope global noprefixroute eth1\\       valid_lft forever
3: eth1    inet 10.0.0.6/24 scope global secondary eth1:1\\       valid_lft forever preferred_lft forever
4: ib0@if9    inet6 fd00::7/64 scope global \\       valid_lft forever preferred_lft forever
"""
INTERFACES = fw.parse_ip_addr(IP_ADDR)
ZONES = {"eth0": "public", "eth1": "internal"}  # ib0: in no zone


def test_ip_addr_lines_give_interface_and_address():
    assert INTERFACES == [("lo", "127.0.0.1"), ("lo", "::1"), ("eth0", "192.0.2.2"),
                          ("eth0", "fe80::fc:ff:fe00:1"), ("eth1", "10.0.0.5"), ("eth1", "10.0.0.6"),
                          ("ib0", "fd00::7")]


def zones_of(address, default="public"):
    return fw.listener_zones(address, INTERFACES, ZONES.get, default)


def test_an_address_goes_to_the_zone_of_its_interface_not_the_default():
    assert zones_of("10.0.0.5") == [("internal", "10.0.0.5 is on eth1; eth1 is in zone internal")]
    assert zones_of("10.0.0.6")[0][0] == "internal"  # a secondary address
    assert zones_of("192.0.2.2")[0][0] == "public"


def test_an_interface_in_no_zone_and_an_unknown_address_go_to_the_default_zone():
    assert zones_of("fd00::7", default="work") == [
        ("work", "fd00::7 is on ib0; ib0 is in no zone, so in the default zone work")]
    (zone, why), = zones_of("10.9.9.9")
    assert zone == "public" and "on no active interface" in why
    (zone, why), = zones_of("gpu7.lan")
    assert zone == "public" and "is a name" in why


def test_a_wildcard_goes_to_the_zones_of_every_active_interface():
    assert [z for z, _ in zones_of("0.0.0.0")] == ["internal", "public"]  # IPv4 interfaces only
    assert [z for z, _ in zones_of("::", default="drop")] == ["drop", "internal", "public"]  # ib0: default
    assert "every interface: eth1 is in zone internal" in dict(zones_of("0.0.0.0"))["internal"]
    assert fw.listener_zones("0.0.0.0", [("lo", "127.0.0.1")], ZONES.get, "public")[0][0] == "public"


def test_listeners_drop_loopback_and_keep_the_rest():
    assert fw.normal_listeners([{"port": "8003", "host": "127.0.0.1,10.0.0.5"}, {"port": 8000, "host": "::1"},
                                {"port": "8010", "host": "[::]"}, {"port": "8011", "host": ""}]) == [
        ("8003/tcp", ["10.0.0.5"]), ("8010/tcp", ["::"]), ("8011/tcp", ["0.0.0.0"])]
    with pytest.raises(fw.FirewallError):
        fw.normal_listeners([{"port": "http", "host": "0.0.0.0"}])


def test_an_explicit_zone_wins_over_the_interfaces():
    listeners = fw.normal_listeners([{"port": "8003", "host": "10.0.0.5"}])
    wanted, reasons = fw.placement([], listeners, [], "trusted", "", INTERFACES, ZONES.get)
    assert wanted == {"trusted": {("port", "8003/tcp", "")}} and reasons == ["8003/tcp: zone trusted (given)"]
    wanted, reasons = fw.placement([], listeners, ["10.20.0.0/16"], "", "public", INTERFACES, ZONES.get)
    assert wanted == {"internal": {("rich", "8003/tcp", "10.20.0.0/16")}}
    assert reasons == ["8003/tcp: zone internal (10.0.0.5 is on eth1; eth1 is in zone internal)"]


def test_ports_without_an_address_go_to_the_default_zone():
    wanted, reasons = fw.placement(fw.wanted_rules([8080], []), [], [], "", "public", INTERFACES, ZONES.get)
    assert wanted == {"public": {("port", "8080/tcp", "")}}
    assert reasons == ["8080/tcp: zone public (the default zone; no listen address)"]


def test_zones_are_planned_together_old_zones_first():
    layers = {("public", True): {("port", "8003/tcp", "")}, ("public", False): {("port", "8003/tcp", "")}}
    out = fw.plan_zones({"internal": {("port", "8003/tcp", "")}}, {"public": [("port", "8003/tcp", "")]},
                        lambda zone, permanent: layers.get((zone, permanent), set()))
    assert out["steps"] == [["--permanent", "--zone=public", "--remove-port=8003/tcp"],
                            ["--zone=public", "--remove-port=8003/tcp"],
                            ["--permanent", "--zone=internal", "--add-port=8003/tcp"],
                            ["--zone=internal", "--add-port=8003/tcp"]]
    assert out["record"] == {"internal": [("port", "8003/tcp", "")]}
    kept = fw.plan_zones({"internal": {("port", "8003/tcp", "")}}, {"public": [("port", "8003/tcp", "")]},
                         lambda zone, permanent: layers.get((zone, permanent), set()), prune=False)
    assert kept["record"]["public"] == [("port", "8003/tcp", "")] and kept["removed"] == set()
