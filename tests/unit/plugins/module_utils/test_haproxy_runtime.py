# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""haproxy_runtime against the fake runtime socket (tests/fixtures/fake_haproxy.py): CSV parsed by header
names, admin state from srv_admin_state, drain waits for sessions, DOWN servers fail fast, clear errors."""
import os
import socket

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._serving import haproxy_runtime as hr

from tests.fixtures.fake_haproxy import FakeHaproxy
from tests.helpers import FIXTURES


@pytest.fixture
def fake(tmp_path):
    double = FakeHaproxy(str(tmp_path / "admin.sock")).start()
    yield double
    double.stop()


def api(fake):
    return hr.RuntimeApi(fake.socket_path)


def no_sleep(_seconds):
    pass


def test_parses_real_csv_by_header_names():
    with open(os.path.join(FIXTURES, "haproxy", "show_stat_2.6_drain_busy.csv")) as handle:
        rows = hr.parse_stat_csv(handle.read())
    by_name = {(r["pxname"], r["svname"]): r for r in rows}
    assert by_name[("llm_qwen", "qwen-a")]["status"] == "DRAIN"
    assert by_name[("llm_qwen", "qwen-b")]["scur"] == "2"
    assert by_name[("llm_qwen", "qwen-b")]["addr"] == "127.0.0.1:18232"
    # Reordered columns still parse by name.
    text = "# svname,status,pxname,scur\nqwen-a,UP,llm_qwen,3\n"
    assert hr.parse_stat_csv(text) == [
        {"svname": "qwen-a", "status": "UP", "pxname": "llm_qwen", "scur": "3"}]
    with pytest.raises(hr.RuntimeApiError, match="header"):
        hr.parse_stat_csv("Unknown command\n")


def test_drain_waits_for_sessions_then_ready(fake):
    fake.set_sessions("llm_qwen", "qwen-a", 3)
    result = hr.apply_state(api(fake), "llm_qwen", "qwen-a", "drain", poll_interval=0.01)
    assert result["previous_state"] == "ready" and result["changed"] is True
    assert result["status"] == "DRAIN" and result["sessions"] == 0
    assert fake.state("llm_qwen", "qwen-a")["admin"] == "drain"
    assert "set server llm_qwen/qwen-a state drain" in fake.commands
    # Idempotent: already drained.
    again = hr.apply_state(api(fake), "llm_qwen", "qwen-a", "drain", poll_interval=0.01)
    assert again["changed"] is False and again["previous_state"] == "drain"
    assert fake.commands.count("set server llm_qwen/qwen-a state drain") == 1
    ready = hr.apply_state(api(fake), "llm_qwen", "qwen-a", "ready", poll_interval=0.01)
    assert ready["previous_state"] == "drain" and ready["changed"] is True and ready["status"] == "UP"


def test_check_mode_changes_nothing(fake):
    result = hr.apply_state(api(fake), "llm_qwen", "qwen-b", "maint", check_mode=True)
    assert result["changed"] is True and result["state"] == "maint" and result["previous_state"] == "ready"
    assert fake.state("llm_qwen", "qwen-b")["admin"] == "ready"
    assert not [c for c in fake.commands if c.startswith("set ")]


def test_drain_timeout_names_server_and_sessions_left(fake):
    fake.set_sessions("llm_qwen", "qwen-a", 1000)
    ticks = iter(range(0, 1000, 30))
    with pytest.raises(hr.RuntimeApiError) as err:
        hr.apply_state(api(fake), "llm_qwen", "qwen-a", "drain", drain_timeout=60, poll_interval=0.01,
                       clock=lambda: next(ticks), sleep=no_sleep)
    msg = str(err.value)
    assert "llm_qwen/qwen-a" in msg and "session(s) after 60s" in msg and "drain_timeout" in msg
    assert err.value.result["sessions"] > 0 and err.value.result["changed"] is True


def test_down_server_fails_fast_or_drains_at_once(fake):
    fake.set_health("llm_qwen", "qwen-a", "DOWN")
    fake.set_sessions("llm_qwen", "qwen-a", 2)
    with pytest.raises(hr.RuntimeApiError, match="is DOWN with 2 session"):
        hr.apply_state(api(fake), "llm_qwen", "qwen-a", "drain", drain_timeout=3600, poll_interval=0.01,
                       sleep=no_sleep)
    fake.set_sessions("llm_qwen", "qwen-a", 0)
    result = hr.apply_state(api(fake), "llm_qwen", "qwen-a", "maint", drain_timeout=3600)
    assert result["sessions"] == 0 and result["waited"] < 5 and result["status"] == "MAINT"


def test_ready_waits_for_health_and_times_out(fake):
    fake.set_health("llm_qwen", "qwen-b", "DOWN")
    ticks = iter(range(0, 1000, 10))
    with pytest.raises(hr.RuntimeApiError) as err:
        hr.apply_state(api(fake), "llm_qwen", "qwen-b", "ready", healthy_timeout=30,
                       clock=lambda: next(ticks), sleep=no_sleep)
    assert "llm_qwen/qwen-b is not UP after 30s" in str(err.value) and "127.0.0.1:18232" in str(err.value)
    result = hr.apply_state(api(fake), "llm_qwen", "qwen-b", "ready", wait_healthy=False)
    assert result["status"] == "DOWN" and result["changed"] is False


def test_unknown_backend_and_server(fake):
    with pytest.raises(hr.RuntimeApiError, match="no backend 'nope'.*llm_qwen.*llmops_gateway"):
        hr.apply_state(api(fake), "nope", "qwen-a", "drain")
    with pytest.raises(hr.RuntimeApiError, match="no server 'qwen-z'.*qwen-a, qwen-b"):
        hr.apply_state(api(fake), "llm_qwen", "qwen-z", "drain")
    # HAProxy's own answers to set server.
    with pytest.raises(hr.RuntimeApiError, match="no server"):
        api(fake).set_state("llm_qwen", "qwen-z", "drain")
    with pytest.raises(hr.RuntimeApiError, match="no backend"):
        api(fake).set_state("nope", "qwen-a", "drain")


def test_socket_missing_refused_and_denied(tmp_path):
    with pytest.raises(hr.RuntimeApiError, match="does not exist.*gateway role"):
        hr.RuntimeApi(str(tmp_path / "missing.sock")).command("show stat")
    stale = str(tmp_path / "stale.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(stale)
    sock.close()
    with pytest.raises(hr.RuntimeApiError, match="refuses connections"):
        hr.RuntimeApi(stale).command("show stat")

    def denied(path, command):
        raise hr.RuntimeApiError(hr._connect_message(path, PermissionError(13, "Permission denied")))

    with pytest.raises(hr.RuntimeApiError, match="permission denied.*become"):
        hr.RuntimeApi("/run/haproxy/x.sock", send=denied).command("show stat")


@pytest.mark.parametrize("option,value,message", [
    ("poll_interval", -1, "poll_interval must be a number of seconds above 0"),
    ("poll_interval", 0, "poll_interval must be"),
    ("poll_interval", float("nan"), "poll_interval must be"),
    ("poll_interval", float("inf"), "poll_interval must be"),
    ("drain_timeout", -5, "drain_timeout must be a number of seconds from 0"),
    ("healthy_timeout", 10 ** 12, "healthy_timeout must be"),
    ("backend", "llm_qwen; disable frontend llmops_gateway", "backend .* HAProxy names hold only"),
    ("server", "qwen-a\nshutdown sessions server llm_qwen/qwen-b", "server .* HAProxy names hold only"),
    ("server", "", "server '': HAProxy names"),
    ("state", "up", "state must be one of ready, drain, maint"),
])
def test_bad_arguments_refused_before_any_command(fake, option, value, message):
    args = {"backend": "llm_qwen", "server": "qwen-a", "state": "drain", "poll_interval": 0.5}
    args[option] = value
    with pytest.raises(hr.RuntimeApiError, match=message):
        hr.apply_state(api(fake), **args)
    assert fake.commands == []  # nothing reached HAProxy


def test_socket_path_with_nul_refused():
    with pytest.raises(hr.RuntimeApiError, match="socket must be the path"):
        hr.apply_state(hr.RuntimeApi("/run/x\0.sock"), "b", "s", "drain")
