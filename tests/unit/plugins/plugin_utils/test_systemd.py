# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""systemd spellings of a unit: ExecStart= quoting, hardening and restart policy by systemd version."""
import shlex

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import systemd


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
        for mode in ("host", "container"):
            names = dict(systemd.hardening(version, mode=mode))
            assert "PrivateDevices" not in names and "DevicePolicy" not in names
            assert "MemoryDenyWriteExecute" not in names
    assert dict(systemd.hardening(252, mode="container")) == {"PrivateTmp": "yes"}


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
