# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/ci/ports.py: each scenario's host ports are declared, disjoint, and a held one is named."""
import glob
import os
import re
import socket
import subprocess
import sys

import pytest

from tools.ci import ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCENARIOS = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(ROOT, "molecule", "*", "molecule.yml")))
PORT_LIKE = re.compile(r"(?<![\d.])(1[789]\d{3}|80\d\d)(?![\d.])")


def test_every_scenario_has_an_entry_and_the_blocks_do_not_overlap():
    assert sorted(ports.SCENARIO_PORTS) == SCENARIOS
    assert ports.overlaps() == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_port_a_scenario_writes_is_in_its_block(scenario):
    """Port-like numbers (8000-8099, 17000-19999) in the scenario's files must be declared for it. A number
    of that size that is no port (a model's intermediate size) is listed in NOT_PORTS."""
    not_ports = {17408}  # Qwen3.6-27B's intermediate_size in the fake model configs
    found = set()
    for path in glob.glob(os.path.join(ROOT, "molecule", scenario, "**", "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                found |= {int(n) for n in PORT_LIKE.findall(handle.read())}
    undeclared = found - not_ports - set(ports.ports_of(scenario))
    assert undeclared == set(), "declare them in tools/ci/ports.py SCENARIO_PORTS[%r]" % scenario


def test_a_held_port_is_named_with_its_process():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        found = ports.holders([port])
        assert [(p, pid) for p, pid, _, _ in found] == [(port, os.getpid())]
        message = ports.describe("demo", found, name_of=lambda cid: "never called")
        assert "port %d: held by pid %d" % (port, os.getpid()) in message
        assert "bin/llmops-dev demo-destroy" in message
    finally:
        server.close()
    assert ports.holders([port]) == []


def test_the_container_of_a_holder_is_named(tmp_path):
    found = [(18003, 42, "llama-server --port 18003", "ab" * 32)]
    message = ports.describe("default", found, name_of=lambda cid: "llmops-local-node")
    assert "port 18003: held by pid 42 (llama-server --port 18003) in container llmops-local-node" in message


def test_check_exits_1_and_names_the_holder():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        ports.SCENARIO_PORTS["_probe"] = ((port, port),)
        assert "port %d" % port in ports.check(["_probe"])
    finally:
        del ports.SCENARIO_PORTS["_probe"]
        server.close()
    out = subprocess.run([sys.executable, "-m", "tools.ci.ports", "check", "no-such"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    assert out.returncode == 2 and b"unknown scenario" in out.stdout
