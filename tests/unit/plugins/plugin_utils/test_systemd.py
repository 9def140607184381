# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""systemd spellings of a unit: ExecStart= quoting, hardening and restart policy by systemd version."""
import shlex

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import systemd
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError


@pytest.mark.parametrize("arg", ['{"a": "b c"}', "50%", "$HOME", "back\\slash", "plain-1.0", 'say "hi"'])
def test_systemd_quote_roundtrip(arg):
    quoted = systemd.systemd_quote(arg)
    # systemd: %% -> %, $$ -> $ after unquoting (shlex posix follows the same quote/backslash rules)
    assert shlex.split(quoted)[0].replace("%%", "%").replace("$$", "$") == arg


def test_hardening_by_systemd_version():
    old = dict(systemd.hardening(219, read_paths=["/home/models/x.gguf"]))
    new = dict(systemd.hardening(252, read_paths=["/srv/models/x.gguf"]))
    assert old["ProtectSystem"] == "full" and old["ProtectHome"] == "read-only"
    for directive in ("ProtectKernelTunables", "ProtectControlGroups", "RestrictNamespaces", "ProtectClock",
                      "LockPersonality"):
        assert directive not in old
        assert directive in new
    assert new["ProtectSystem"] == "strict" and new["ProtectHome"] == "yes"
    assert dict(systemd.hardening(252, read_paths=["/home/models/x.gguf"]))["ProtectHome"] == "read-only"
    for version in (219, 252, 999):
        # a GPU instance on the host: its GPUs (never PrivateDevices: they would vanish), no W^X (CUDA JIT)
        gpu = systemd.hardening(version, mode="host", gpus=[1])
        assert "PrivateDevices" not in dict(gpu) and dict(gpu)["DevicePolicy"] == "closed"
        assert ("DeviceAllow", "/dev/nvidia1 rw") in gpu and ("DeviceAllow", "/dev/nvidia0 rw") not in gpu
        assert "MemoryDenyWriteExecute" not in dict(gpu)
        # container mode runs the docker CLI: no device (but the GPU check's), the docker socket only
        container = systemd.hardening(version, mode="container")
        assert "DeviceAllow" not in dict(container) and dict(container)["PrivateDevices"] == "yes"
        assert dict(container)["RestrictAddressFamilies"] == "AF_UNIX"
    assert dict(systemd.hardening(252, mode="container"))["MemoryDenyWriteExecute"] == "yes"
    assert "MemoryDenyWriteExecute" not in dict(systemd.hardening(219, mode="container"))


def test_restart_policy_spellings():
    old = systemd.restart_policy(219, restart_sec=10, interval=600, burst=5)
    assert ("StartLimitInterval", "600") in old["service"] and ("StartLimitBurst", "5") in old["service"]
    assert old["unit"] == []
    new = systemd.restart_policy(252)
    assert ("StartLimitIntervalSec", "600") in new["unit"]
    assert not any(k.startswith("StartLimit") for k, _ in new["service"])
    assert ("Restart", "on-failure") in new["service"]
    assert ("RestartMaxDelaySec", "300") in systemd.restart_policy(254)["service"]


def test_parse_systemd_version():
    assert systemd.parse_systemd_version("systemd 219\n+PAM +AUDIT") == 219
    assert systemd.parse_systemd_version("systemd 252 (252.38-1~deb12u1)\n") == 252
    assert systemd.parse_systemd_version("") == 0


def _pid1(capeff, hard):
    """/proc/1/status and /proc/1/limits as the serving role reads them (cat of both)."""
    return ("Name:\tsystemd\nCapInh:\t0000000000000000\nCapPrm:\t%s\nCapEff:\t%s\nCapBnd:\t%s\n"
            "Limit                     Soft Limit           Hard Limit           Units\n"
            "Max locked files          unlimited            unlimited            files\n"
            "Max locked memory         8388608              %s              bytes\n"
            "Max address space         unlimited            unlimited            bytes\n"
            % (capeff, capeff, capeff, hard))


@pytest.mark.parametrize("capeff, hard, granted", [
    ("000001ffffffffff", "8388608", "infinity"),      # a host: full capabilities
    ("0000000001000000", "8388608", "infinity"),      # CAP_SYS_RESOURCE (bit 24) alone
    ("00000000a80425fb", "8388608", "8388608"),       # docker's default set: no CAP_SYS_RESOURCE
    ("00000000a80425fb", "unlimited", "infinity"),    # no capability needed under an unlimited hard limit
    ("0000000000ffffff", "65536", "65536"),           # every capability below 24, not 24
])
def test_memlock_limit_is_what_pid1_can_grant(capeff, hard, granted):
    assert systemd.memlock_limit(_pid1(capeff, hard), "infinity") == granted


def test_memlock_limit_refuses_to_guess():
    with pytest.raises(ServingError, match="no CapEff line"):
        systemd.memlock_limit("Max locked memory 1 2 bytes", "infinity")
    with pytest.raises(ServingError, match="no Max locked memory line"):
        systemd.memlock_limit("CapEff:\t0000000000000000\n", "infinity")
