# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.systemd_info run as Ansible runs it, with stand-in systemctl programs."""

import os
import stat

import pytest

from plugins.module_utils._serving.systemd_units import (
    LIST_ARGV,
    SHOW_ENABLED_ARGV,
    enabled_units,
    read_enabled_units,
    running_units,
)
from plugins.plugin_utils import systemd
from tests.helpers import run_module_file

# What systemd 252 (Debian 12) prints for `systemctl list-units --type=service --state=running --no-legend
# --plain --no-pager --full`; systemd 219 (EL7) prints the same columns.
LISTING = """\
cron.service                  loaded active running Regular background program processing daemon
dbus.service                  loaded active running D-Bus System Message Bus
llama-server-qwen.service     loaded active running llama-server qwen (llmops.serving)
vllm-qwen36-27b-fp8.service   loaded active running vLLM qwen36-27b-fp8 (llmops.serving)
"""
# `systemctl show --property=Id --property=UnitFileState --no-pager <units>` (systemd 252 and 219 alike): a
# unit systemd does not know has an empty state.
SHOWN = """\
Id=llama-server-qwen.service
UnitFileState=enabled

Id=vllm-qwen36-27b-fp8.service
UnitFileState=disabled

Id=gone.service
UnitFileState=
"""


def fake_systemctl(tmp_path, body):
    path = tmp_path / "systemctl"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def proc(tmp_path, capeff="000001ffffffffff", hard="unlimited"):
    root = tmp_path / "proc"
    (root / "1").mkdir(parents=True)
    (root / "1" / "status").write_text("Name:\tsystemd\nCapEff:\t%s\n" % capeff)
    (root / "1" / "limits").write_text("Limit  Soft Limit  Hard Limit  Units\n"
                                       "Max locked memory  8388608  %s  bytes\n" % hard)
    return str(root)


def listing_systemctl(tmp_path, argv_file):
    return fake_systemctl(tmp_path, 'if [ "$1" = --version ]; then echo "systemd 252 (252.36-1~deb12u1)"; '
                                    'echo "+PAM +AUDIT"; exit 0; fi\n'
                                    'echo "$@" >> %s\n'
                                    'if [ "$1" = show ]; then cat <<"EOF"\n%sEOF\nexit 0; fi\n'
                                    'cat <<"EOF"\n%sEOF' % (argv_file, SHOWN, LISTING))


def test_lists_the_running_services(tmp_path):
    argv_file = tmp_path / "argv"
    systemctl = listing_systemctl(tmp_path, argv_file)
    units = ["llama-server-qwen.service", "vllm-qwen36-27b-fp8.service", "gone.service"]
    result = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "proc_root": proc(tmp_path),
                                                        "units": units}, check_mode=True)
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    assert result["running_units"] == ["cron.service", "dbus.service", "llama-server-qwen.service",
                                       "vllm-qwen36-27b-fp8.service"]
    # vllm-qwen36-27b-fp8 runs but is not enabled at boot: a run would enable it
    assert result["enabled_units"] == ["llama-server-qwen.service"]
    # The running services, then the named units' state, each asked once: no unit-file scan, no SysV status.
    calls = [line.split() for line in argv_file.read_text().splitlines()]
    assert calls == [LIST_ARGV, SHOW_ENABLED_ARGV + units]
    # no units named: no show call
    argv_file.unlink()
    plain = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl,
                                                       "proc_root": str(tmp_path / "proc")})
    assert plain["enabled_units"] == [] and [line.split() for line in argv_file.read_text().splitlines()] == [
        LIST_ARGV]
    # The version and PID 1's grant, in the shapes the controller's rules read.
    assert systemd.parse_systemd_version(result["version_text"]) == 252
    assert systemd.memlock_limit(result["pid1_status_limits"], "infinity") == "infinity"


def test_pid1_without_cap_sys_resource_is_read_as_it_is(tmp_path):
    systemctl = listing_systemctl(tmp_path, tmp_path / "argv")
    no_cap = proc(tmp_path, "00000000a80425fb", "8388608")
    result = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "proc_root": no_cap})
    assert systemd.memlock_limit(result["pid1_status_limits"], "infinity") == "8388608"


def test_an_unreadable_proc_is_named(tmp_path):
    systemctl = listing_systemctl(tmp_path, tmp_path / "argv")
    result = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl,
                                                        "proc_root": str(tmp_path / "none")})
    assert result["failed"] is True and "cannot read %s/1/status" % (tmp_path / "none") in result["msg"]


def test_a_failing_systemctl_says_what_the_node_needs(tmp_path):
    systemctl = fake_systemctl(tmp_path, 'echo "System has not been booted with systemd as init system '
                                         '(PID 1)." >&2\nexit 1')
    result = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl})
    assert result["failed"] is True
    assert "list-units failed (rc 1): System has not been booted with systemd" in result["msg"]
    assert "must run systemd as PID 1" in result["msg"]


def test_a_hung_systemctl_is_stopped_at_the_timeout(tmp_path):
    systemctl = fake_systemctl(tmp_path, "sleep 30")
    result = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "timeout": 1})
    assert result["failed"] is True and "did not answer within 1 s" in result["msg"]


def test_a_missing_systemctl_is_named(tmp_path):
    missing = os.path.join(str(tmp_path), "no", "systemctl")
    result = run_module_file(tmp_path, "systemd_info", {"systemctl": missing})
    assert result["failed"] is True and "cannot run %s" % missing in result["msg"]


def test_parsing_ignores_what_is_not_a_service_line():
    text = "\u25cf failed-thing.service loaded failed failed x\n" + LISTING + "\n0 loaded units listed.\n"
    assert running_units(text)[:2] == ["cron.service", "dbus.service"]
    assert "failed-thing.service" in running_units(text)
    assert running_units("") == [] and running_units(None) == []


def test_only_enabled_unit_files_count_as_enabled():
    text = SHOWN + ("\nId=static-thing.service\nUnitFileState=static\n"
                    "\nId=sshd.service\nUnitFileState=enabled\n")
    assert enabled_units(text) == ["llama-server-qwen.service", "sshd.service"]
    assert enabled_units("") == [] and enabled_units(None) == []


def test_unit_names_are_never_options_and_must_be_unit_names(tmp_path):
    argv_file = tmp_path / "argv"
    systemctl = listing_systemctl(tmp_path, argv_file)
    root = proc(tmp_path)
    # a unit named --help was taken as systemctl's option: refused before any call, naming it
    out = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "proc_root": root,
                                                     "units": ["--help", "llama-server-qwen.service"]})
    assert out["failed"] is True and "'--help' is not a systemd unit name" in out["msg"], out
    assert "show" not in argv_file.read_text()
    # a real unit name that starts with "-" (the root slice) reaches systemctl after "--", as a name
    argv_file.unlink()
    ok = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "proc_root": root,
                                                    "units": ["-.slice", "llama-server-qwen.service"]})
    assert ok.get("failed") is not True, ok
    show = [line.split() for line in argv_file.read_text().splitlines() if line.startswith("show")]
    assert show == [["show", "--property=Id", "--property=UnitFileState", "--no-pager", "--", "-.slice",
                     "llama-server-qwen.service"]]


@pytest.mark.parametrize("name", ["--help", "llama server.service", "x.service\n", "foo", "a@b@c.service",
                                  "x" * 250 + ".service", ".service"])
def test_what_is_not_a_unit_name_is_refused(name):
    units, error = read_enabled_units("/nonexistent/systemctl", [name])
    assert units == [] and "not a systemd unit name" in error


def test_a_fifo_or_device_link_in_proc_is_refused_not_read(tmp_path):
    systemctl = listing_systemctl(tmp_path, tmp_path / "argv")
    root = proc(tmp_path)
    status = os.path.join(root, "1", "status")
    for make, what in ((os.mkfifo, "a FIFO (named pipe)"), (lambda p: os.symlink("/dev/zero", p),
                                                             "a symbolic link (to /dev/zero)")):
        os.unlink(status)
        make(status)
        out = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "proc_root": root},
                              timeout=20)  # the FIFO hung the module before
        assert out["failed"] is True and "%s is %s" % (status, what) in out["msg"], out
    os.unlink(status)
    (tmp_path / "proc" / "1" / "status").write_text("Name:\tsystemd\n")
    os.mkfifo(os.path.join(root, "meminfo"))
    out = run_module_file(tmp_path, "systemd_info", {"systemctl": systemctl, "proc_root": root}, timeout=20)
    assert out.get("failed") is not True and out["memtotal_mib"] is None, out
