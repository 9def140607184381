# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host ports each Molecule scenario listens on, and who holds one before a scenario starts.

The scenarios run on the host network (the units under test reach the fake hub and each other over
loopback, and container-mode instances are started by the host's docker daemon), so a port that another
process holds (a developer's own llama-server, the demo, a second checkout's test) would fail a scenario
far from its cause with "Address already in use". Each scenario owns the ports listed here, the blocks do
not overlap (so scenarios can run side by side), and `check()` runs before a scenario starts: it names the
process that holds one of them, and the container it runs in.

    python -m tools.ci.ports check SCENARIO...   # exit 1 with the holders, 0 when every port is free
    python -m tools.ci.ports table               # the table

tests/unit/tools/test_ci_ports.py checks that every port number written in a scenario's files is in that
scenario's block. Ports chosen at run time (the model scenario's hub binds port 0) need no entry.
"""
import glob
import os
import re
import sys

# scenario -> ports it listens on (inclusive ranges). The L20 twin serves on the shipped inventory's own ports
# (8000 and 8003; inside its node's network namespace, but a developer's own server there is the user's
# setup, so they are checked like any other); its block holds the site's mirrors it serves to the node with no
# route out (docs/ci.md): 18300 the fake hub, 18301 the registry, 18302 git, 18303 apt.
SCENARIO_PORTS = {
    "default": ((18003, 18004), (18080, 18080)),
    "serving_llama_cpp": ((18005, 18005),),
    "vllm": ((18020, 18022),),
    "fleet": ((18200, 18229),),
    "ray": ((18250, 18290),),
    "l20": ((8000, 8000), (8003, 8003), (18300, 18309)),
    # instances a and b, the gateway and its metrics; 18344-18349 kept for more faults.
    "faults": ((18340, 18349),),
    "gpu_host": (),
    "model": (),
    "llama_cpp": (),
    # the offline bundle's node has no route out and listens on nothing; the block is reserved for it
    "bundle": ((18400, 18409),),
}

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def ports_of(scenario):
    """Every port of a scenario, as a sorted list."""
    return sorted(p for low, high in SCENARIO_PORTS.get(scenario, ()) for p in range(low, high + 1))


def overlaps():
    """Pairs of scenarios whose blocks share a port (must be empty: scenarios run side by side)."""
    seen, found = {}, []
    for scenario in sorted(SCENARIO_PORTS):
        for port in ports_of(scenario):
            if port in seen and seen[port] != scenario:
                found.append((seen[port], scenario, port))
            seen.setdefault(port, scenario)
    return found


def listening(proc="/proc"):
    """{port: [socket inode, ...]} of every TCP socket listening in this network namespace (v4 and v6)."""
    found = {}
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(os.path.join(proc, table)) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            found.setdefault(port, []).append(fields[9])
    return found


def _read(path, limit=4096):
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return b""


def _container_of(pid, proc):
    """The docker container id a process runs in, from its cgroup path (cgroup v1 and v2), or ''."""
    text = _read(os.path.join(proc, str(pid), "cgroup")).decode("utf-8", "replace")
    match = re.search(r"(?:docker[-/]|/docker/)([0-9a-f]{64})", text)
    return match.group(1) if match else ""


def socket_owners(inodes, proc="/proc"):
    """{inode: (pid, command line, container id)} for the processes that hold those socket inodes."""
    wanted = {"socket:[%s]" % inode: inode for inode in inodes}
    owners = {}
    for fd_dir in glob.glob(os.path.join(proc, "[0-9]*", "fd")):
        pid = int(fd_dir.split(os.sep)[-2])
        try:
            entries = os.listdir(fd_dir)
        except OSError:
            continue
        for entry in entries:
            try:
                target = os.readlink(os.path.join(fd_dir, entry))
            except OSError:
                continue
            if target in wanted and wanted[target] not in owners:
                cmdline = _read(os.path.join(proc, str(pid), "cmdline")).replace(b"\0", b" ")
                owners[wanted[target]] = (pid, cmdline.decode("utf-8", "replace").strip()[:200],
                                          _container_of(pid, proc))
    return owners


def holders(ports, proc="/proc"):
    """[(port, pid or None, command line, container id)] for each of `ports` that something listens on."""
    table = listening(proc)
    busy = [(port, table[port]) for port in sorted(set(ports)) if port in table]
    owners = socket_owners([inode for _, inodes in busy for inode in inodes], proc)
    found = []
    for port, inodes in busy:
        owner = next((owners[i] for i in inodes if i in owners), None)
        found.append((port,) + (owner if owner else (None, "", "")))
    return found


def _container_name(container_id):
    """docker's name of a container id, or the short id when docker cannot say."""
    import subprocess
    try:
        out = subprocess.run(["docker", "inspect", "--format", "{{.Name}}", container_id],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10, check=False)
        name = out.stdout.decode().strip().lstrip("/")
    except (OSError, subprocess.SubprocessError):
        name = ""
    return name or container_id[:12]


def describe(scenario, found, name_of=_container_name):
    """One message that names every held port, its holder and what to do."""
    lines = ["molecule scenario %s needs these host ports, which are in use:" % scenario]
    for port, pid, cmdline, container in found:
        if pid is None:
            who = "a process this user cannot see (another user's, or another network namespace's)"
        else:
            who = "pid %d (%s)" % (pid, cmdline or "?")
            if container:
                who += " in container %s" % name_of(container)
        lines.append("  port %d: held by %s" % (port, who))
    lines.append("Stop it (a demo left running: bin/llmops-dev demo-destroy; a scenario left behind: "
                 "molecule destroy -s <scenario>) and run again. The ports of every scenario are in "
                 "tools/ci/ports.py.")
    return "\n".join(lines)


def check(scenarios, proc="/proc"):
    """None when every port of `scenarios` is free, else the message that names the holders."""
    messages = []
    for scenario in scenarios:
        found = holders(ports_of(scenario), proc)
        if found:
            messages.append(describe(scenario, found))
    return "\n".join(messages) or None


def main(argv):
    if argv[:1] == ["table"]:
        for scenario in sorted(SCENARIO_PORTS):
            blocks = ", ".join("%d" % lo if lo == hi else "%d-%d" % (lo, hi)
                               for lo, hi in SCENARIO_PORTS[scenario])
            print("%-14s %s" % (scenario, blocks or "(none fixed)"))
        return 0
    if argv[:1] == ["check"] and argv[1:]:
        unknown = [s for s in argv[1:] if s not in SCENARIO_PORTS]
        if unknown:
            print("unknown scenario(s): %s" % ", ".join(unknown), file=sys.stderr)
            return 2
        message = check(argv[1:])
        if message:
            print(message, file=sys.stderr)
            return 1
        return 0
    print(__doc__.strip().splitlines()[0], file=sys.stderr)
    print("usage: python -m tools.ci.ports check SCENARIO... | table", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
