# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""systemd spellings of a serving unit, for every engine: ExecStart= quoting, hardening, restart policy, all
chosen by the node's systemd version (219 on CentOS 7 up to 25x), and the LimitMEMLOCK= PID 1 can grant.
Tested by tests/unit/plugins/plugin_utils/test_systemd.py and tests/roles/test_serving_unit.py.
"""
from __future__ import absolute_import, division, print_function

import re

from ansible_collections.llmops.serving.plugins.module_utils.validators import whole
from ansible_collections.llmops.serving.plugins.plugin_utils.container import docker_run_args
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import ENV_NAME_RE
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

__metaclass__ = type

_SYSTEMD_SAFE = whole(r"[A-Za-z0-9_@%+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# linux/capability.h: CAP_SYS_RESOURCE, which systemd needs to raise RLIMIT_MEMLOCK above PID 1's hard limit.
CAP_SYS_RESOURCE = 24


def memlock_limit(pid1_status, wanted):
    """LimitMEMLOCK= the node can grant: `wanted` (serving_memlock_limit) when PID 1 has CAP_SYS_RESOURCE in
    its effective set or its hard limit is unlimited, else that hard limit. `pid1_status`: the text of
    /proc/1/status and /proc/1/limits. Without CAP_SYS_RESOURCE (a node that is itself an unprivileged
    container) a LimitMEMLOCK above PID 1's hard limit stops the unit with 205/LIMITS."""
    text = str(pid1_status or "")
    capeff = re.search(r"CapEff:\s*([0-9a-f]+)", text)
    hard = re.search(r"Max locked memory\s+\S+\s+(\S+)", text)
    if not capeff or not hard:
        raise ServingError("cannot tell the locked-memory limit PID 1 allows: no %s in /proc/1/status and "
                           "/proc/1/limits" % ("CapEff line" if not capeff else "Max locked memory line"))
    can_raise = (int(capeff.group(1), 16) >> CAP_SYS_RESOURCE) & 1 == 1
    return wanted if can_raise or hard.group(1) == "unlimited" else hard.group(1)


def systemd_quote(arg):
    """Quote one argument for an ExecStart= line (systemd 219+ rules: "...", \\ escapes, %% and $$).
    A control character is refused: a newline would end the line and start a directive of its own (the
    planner names the setting first; this is the last guard)."""
    if _CONTROL.search(str(arg)):
        raise ServingError("an argument of the unit's command line contains a control character (a "
                           "newline?); the value is not shown here")
    arg = str(arg).replace("%", "%%").replace("$", "$$")
    if arg and _SYSTEMD_SAFE.match(arg):
        return arg
    return '"%s"' % arg.replace("\\", "\\\\").replace('"', '\\"')


def unit_value(value, setting):
    """`value` as the value of a unit's directive or comment (Description=, User=, WorkingDirectory=, ...):
    one line (a control character is refused, naming `setting`: a newline would start a directive of its
    own, which systemd applies while it skips the broken line), with % doubled (systemd's specifiers)."""
    text = str(value)
    if _CONTROL.search(text):
        raise ServingError("%s contains a control character (a newline?); it would become a line of its own "
                           "in the systemd unit. Remove it (the value is not shown here)" % setting)
    return text.replace("%", "%%")


def environment(env, setting, sort=False):
    """The Environment= values of a unit for the mapping `env` (`setting` names it in a refusal), in its
    order (`sort`: by name): each "NAME=value" in double quotes with systemd's escapes. A name is a shell
    variable name (the whole string), a value one line (no control character: a newline would end the
    quotes and the line, and what follows would be a directive of its own); no value is shown in a refusal."""
    if env is None:
        return []
    if not isinstance(env, dict):
        raise ServingError("%s must be a mapping NAME -> value" % setting)
    out = []
    for key in sorted(env, key=str) if sort else env:
        name, value = str(key), env[key]
        if not ENV_NAME_RE.match(name):
            raise ServingError("%s: %r is not a variable name (letters, digits and '_', not starting with a "
                               "digit)" % (setting, name))
        if value is None or isinstance(value, (dict, list, tuple)):
            raise ServingError("%s: %s must be a string or a number" % (setting, name))
        text = unit_value(value, "%s: %s" % (setting, name))
        out.append('"%s=%s"' % (name, text.replace("\\", "\\\\").replace('"', '\\"')))
    return out


# A systemd time span (systemd.time(7)): numbers with a unit, optionally space-separated ("1min 30s"); a bare
# number is seconds.
_TIMESPAN_UNIT = (r"(usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|"
                  r"weeks|week|w|months|month|M|years|year|y)")
_TIMESPAN = whole(r"[0-9]+(\.[0-9]+)?( ?{u}( ?[0-9]+(\.[0-9]+)? ?{u})*)?".format(u=_TIMESPAN_UNIT))


def timespan(value, setting):
    """`value` when it is a systemd time span (15s, 1min 30s, 90), else ServingError naming `setting`."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not _TIMESPAN.match(text):
        raise ServingError("%s: %r is not a systemd time span (e.g. 15s, 1min, 1min 30s)" % (setting, value))
    return text


# `systemd-analyze verify` of a rendered unit, for a template task's validate: (Ansible runs it without a
# shell: the script is sh's argument; no '%' but the path's). The file is copied under the unit's own name
# (verify wants a unit suffix). A node without systemd-analyze, or where it cannot start its manager (some
# containers), skips the check: the checker is missing, not the unit wrong. Besides verify's own errors (an
# unknown executable, a bad section), a line it ignored as "Invalid syntax" or "Missing '='" fails: a
# rendered unit has none, and it is the trace of a value that broke its line. It runs nothing of the unit.
_VERIFY = ('command -v systemd-analyze >/dev/null 2>&1 || exit 0; d=$(mktemp -d) || exit 1; '
           'cp "$1" "$d/$2" && out=$(systemd-analyze verify "$d/$2" 2>&1); rc=$?; rm -rf "$d"; '
           'echo "$out" >&2; '
           'if echo "$out" | grep -E "Invalid syntax|Missing .=." >/dev/null; then exit 1; fi; '
           '[ "$rc" = 0 ] || echo "$out" | grep -E "(initialize|allocate|create) manager" >/dev/null')


def verify_command(unit_name):
    """The validate: command of a template task that writes unit `unit_name` (e.g. ray.service)."""
    name = unit_value(unit_name, "the unit's name")
    if not whole(r"[A-Za-z0-9:_.@-]+\.(service|timer|socket|path|mount|target)").match(name):
        raise ServingError("%r is not a unit file name" % unit_name)
    return "sh -c '%s' systemd-verify %%s %s" % (_VERIFY, name)


def systemd_command(argv):
    """One ExecStart= line from an argv."""
    return " ".join(systemd_quote(a) for a in argv)


def exec_start(plan, user=None, docker="/usr/bin/docker", entrypoint=None, home=None, memlock=None):
    """The ExecStart= command line of one planned instance: its binary, or `docker run` of its image."""
    if plan["mode"] == "container":
        return systemd_command(docker_run_args(plan, user=user, docker=docker, entrypoint=entrypoint,
                                               home=home, memlock=memlock))
    return systemd_command([plan["binary"]] + list(plan.get("subcommand") or ()) + list(plan["argv"]))


# Unit hardening: one table for every unit the collection writes (docs/security.md, "Unit hardening").
# A unit names the profile of what it runs; the profile decides which settings it can take, the node's
# systemd version which of those it knows (an unknown directive is a warning on 219 and the rest of the unit
# still loads, but a later systemd would then apply what the author never tried).
GPU_SERVER = "gpu-server"        # llama-server / vLLM on the host: CUDA (JIT), Python, triton; serving_user
DOCKER_CLIENT = "docker-client"  # only the docker CLI (serving's container mode, the DCGM exporter); root
GPU_COLLECTOR = "gpu-collector"  # python + nvidia-smi + /dev/kmsg (XID errors), no network; root
EXPORTER = "exporter"            # node_exporter, the Prometheus agent: Go, own user, loopback + remote write
PERSISTENCED = "persistenced"    # nvidia-persistenced: root, every GPU, may create their device nodes
RAY = "ray"                      # ray start: Python, vLLM's CUDA workers, the cluster's network; serving_user
PROFILES = (GPU_SERVER, DOCKER_CLIENT, GPU_COLLECTOR, EXPORTER, PERSISTENCED, RAY)
_GPU = (GPU_SERVER, DOCKER_CLIENT, GPU_COLLECTOR, PERSISTENCED, RAY)   # may open /dev/nvidia*


def _every(value, but=()):
    return dict((p, value) for p in PROFILES if p not in but)


# (directive, first systemd version that knows it, {profile: value}: a profile not named goes without it,
#  why it is safe for what the profiles run - and why a profile goes without it).
HARDENING = (
    ("NoNewPrivileges", 187, _every("yes"),
     "Nothing here gains privileges by exec: the driver role loads the modules and creates the device nodes "
     "(the setuid nvidia-modprobe is not needed at run time)."),
    ("CapabilityBoundingSet", 187,
     dict(_every(""), **{GPU_COLLECTOR: "CAP_SYSLOG", PERSISTENCED: "CAP_MKNOD"}),
     "Empty for the servers and the docker CLI (root needs no capability to use root's docker socket and "
     "files). The GPU collector keeps CAP_SYSLOG (dmesg_restrict: /dev/kmsg's XID lines), "
     "nvidia-persistenced CAP_MKNOD (it creates missing /dev/nvidia<N> nodes at boot)."),
    ("PrivateTmp", 1, _every("yes"),
     "A /tmp of its own: Ray keeps its session in ray_cluster_temp_dir and `ray status` is given --address; "
     "the servers' caches live under their home."),
    ("ProtectSystem", 214, _every("full"), "/usr, /boot, /etc read-only (219)."),
    ("ProtectSystem", 232, _every("strict"),
     "The whole tree read-only but the unit's own directories (ReadWritePaths=, RuntimeDirectory=)."),
    ("ProtectHome", 214, dict(_every("yes"), **{DOCKER_CLIENT: "read-only", EXPORTER: "read-only",
                                                RAY: "read-only", GPU_SERVER: "{home}"}),
     "Hidden, or read-only where something is read there: a model or binary under /home (the L20 box keeps "
     "its models in /home/models), root's docker credentials, node_exporter's view of the /home mount."),
    ("PrivateDevices", 209, {DOCKER_CLIENT: "{cpu_only}", EXPORTER: "yes", GPU_SERVER: "{cpu_only}"},
     "Only the pseudo devices for units that open no device (the docker CLI: docker hands the GPUs to the "
     "container; a CPU-only server). Never for a unit that opens /dev/nvidia* (a server, the GPU check "
     "before a container starts): they would vanish."),
    ("DevicePolicy", 208, _every("closed", but=(EXPORTER,)),
     "The pseudo devices plus the DeviceAllow= list (devices()): an instance sees exactly its GPUs. Needed "
     "with ProtectClock= (245+), which adds DeviceAllow=char-rtc and so turns the default policy into an "
     "allow-list that would shut out every GPU."),
    ("SystemCallArchitectures", 209, _every("native"),
     "No 32-bit or x32 system calls (nothing here is 32-bit)."),
    ("SystemCallErrorNumber", 209, _every("EPERM"),
     "A filtered call fails with EPERM (the program logs it) rather than killing the process with SIGSYS."),
    ("RestrictAddressFamilies", 211,
     dict(_every("AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
          **{DOCKER_CLIENT: "AF_UNIX", GPU_COLLECTOR: "AF_UNIX", PERSISTENCED: "AF_UNIX"}),
     "The servers, exporters and Ray listen and connect over IP; AF_NETLINK for the interface list "
     "(getifaddrs: NCCL, gloo, Ray, node_exporter). The docker CLI needs only /run/docker.sock; the "
     "collector and nvidia-persistenced only local sockets (syslog, persistenced's own)."),
    ("PrivateNetwork", 33, {GPU_COLLECTOR: "yes"},
     "The collector runs nvidia-smi and writes a file: no network at all. Every other unit serves or "
     "connects (the docker CLI's socket is a file, but docker run's published ports are the daemon's)."),
    ("UMask", 1, _every("0077", but=(PERSISTENCED,)),
     "Files the unit creates are its own (the collector sets 0644 on what node_exporter reads). "
     "nvidia-persistenced keeps 0022: its socket is for every user's NVML."),
    ("RestrictRealtime", 231, _every("yes"), "No realtime scheduling (CUDA, NCCL and Ray do not use it)."),
    ("MemoryDenyWriteExecute", 231, {DOCKER_CLIENT: "yes", EXPORTER: "yes"},
     "Go programs (docker CLI, node_exporter, Prometheus) need no W+X memory. Withheld where CUDA or Python "
     "JIT code runs - CUDA's PTX JIT, triton and vLLM's compiled kernels need writable executable pages - "
     "and for the units that load the driver's closed libraries (NVML, libnvidia-cfg); the system call "
     "filter, the empty capability set and NoNewPrivileges stand in."),
    ("ProtectKernelTunables", 232, _every("yes"),
     "/proc/sys, /sys read-only: nothing here tunes the kernel."),
    ("ProtectKernelModules", 232, _every("yes"),
     "No module loading: the driver role loads nvidia and nvidia_uvm (udev loads nvidia at boot)."),
    ("ProtectControlGroups", 232, _every("yes"),
     "The cgroup tree read-only (dockerd, not its CLI, writes it)."),
    ("RemoveIPC", 232, _every("yes", but=(DOCKER_CLIENT, GPU_COLLECTOR, PERSISTENCED)),
     "IPC objects of the unit's user go when its last unit stops (systemd counts the units per user, so a "
     "server restarting beside ray.service keeps Ray's shared memory). No effect for root units."),
    ("RestrictNamespaces", 233, _every("yes"),
     "No namespaces: containers are dockerd's; the programs make none."),
    ("LockPersonality", 235, _every("yes"), "The execution domain stays Linux (no READ_IMPLIES_EXEC)."),
    ("PrivateMounts", 239, _every("yes"), "Mounts stay in the unit's namespace (it makes none)."),
    ("SystemCallFilter", 239, _every("@system-service"),
     "The calls of an ordinary service (CUDA's ioctls and mmap, Python, Go, Ray's sockets) and no more."),
    ("SystemCallFilter", 239, _every("~@privileged", but=(PERSISTENCED,)),
     "Not even root's calls (chown, setuid, chroot, ...). nvidia-persistenced keeps them: creating a device "
     "node chowns it. @resources stays allowed: OpenMP and NCCL pin threads (sched_setaffinity), CUDA uses "
     "mbind, Python sets rlimits."),
    ("RestrictSUIDSGID", 242, _every("yes"), "No setuid or setgid files made."),
    ("ProtectHostname", 242, _every("yes"), "The host name stays."),
    ("ProtectKernelLogs", 244, _every("yes", but=(GPU_COLLECTOR,)),
     "No kernel log. The GPU collector reads /dev/kmsg for XID errors: it goes without."),
    ("ProtectClock", 245, _every("yes"),
     "The clock stays (implies DeviceAllow=char-rtc r; see DevicePolicy)."),
    ("ProtectProc", 247, _every("invisible"), "Other users' processes are invisible in /proc."),
    ("ProcSubset", 247, {DOCKER_CLIENT: "pid"},
     "Only the docker CLI can do without /proc's system files: CUDA and nvidia-smi read /proc/driver/nvidia, "
     "node_exporter and Ray /proc/stat and /proc/meminfo."),
)

# PrivateUsers= is withheld everywhere: a user namespace fails the unit (226/NAMESPACE) where they are
# switched off (user.max_user_namespaces=0, a common hardening of GPU hosts) or nested (a node that is itself
# a container). IPAddressDeny= is withheld: the servers' clients, Ray's peers and the remote-write host are
# the inventory's, not the unit's, to name.

# Device nodes of an NVIDIA GPU besides /dev/nvidia<N>: every CUDA program opens nvidiactl and nvidia-uvm
# (uvm-tools for profilers), nvidia-modeset where the modeset module is loaded; MIG instances read their
# capability nodes. The groups (char-<name> of /proc/devices) cover nodes created after the unit started.
GPU_CONTROL_DEVICES = (("/dev/nvidiactl", "rw"), ("/dev/nvidia-uvm", "rw"), ("/dev/nvidia-uvm-tools", "rw"),
                       ("/dev/nvidia-modeset", "rw"), ("char-nvidia-caps", "r"))
# A unit that serves every GPU of the node (the collector, nvidia-persistenced, Ray's workers): all NVIDIA
# character devices, also those of a GPU added later ("char-" + a glob of /proc/devices' names).
ALL_GPUS = "all"
_PROFILE_DEVICES = {GPU_COLLECTOR: (("/dev/kmsg", "r"),), PERSISTENCED: ()}


def devices(profile, gpus=None):
    """DeviceAllow= entries of a unit: `gpus` the GPU indexes it uses (a list), ALL_GPUS, or None/[] (none).
    An instance on GPUs [2, 3] gets /dev/nvidia2, /dev/nvidia3 and the control nodes, never /dev/nvidia0."""
    if profile not in _GPU:
        return []
    out = list(_PROFILE_DEVICES.get(profile, ()))
    if gpus == ALL_GPUS:
        # persistenced creates the nodes it finds missing: mknod (m) on them
        out.append(("char-nvidia*", "rwm" if profile == PERSISTENCED else "rw"))
    elif gpus:
        for index in gpus:
            if isinstance(index, bool) or not str(index).isdigit():
                raise ServingError("GPU index %r is not a number (the unit's DeviceAllow= is "
                                   "/dev/nvidia<index>)" % (index,))
        out.extend(("/dev/nvidia%d" % int(i), "rw") for i in sorted(set(int(i) for i in gpus)))
        out.extend(GPU_CONTROL_DEVICES)
    return out


def unit_hardening(systemd_version, profile, gpus=None, read_paths=(), write_paths=()):
    """The sandboxing directives of a unit of `profile` for the node's systemd version, as an ordered list of
    (directive, value) (a directive may repeat: DeviceAllow=, SystemCallFilter=).

    `gpus`: see devices(). `read_paths`: what the unit reads (a path under /home, /root or /run/user makes
    ProtectHome read-only for a server). `write_paths`: its own directories, writable under
    ProtectSystem=strict ("-" before a path that may not exist yet)."""
    if profile not in PROFILES:
        raise ServingError("unknown hardening profile %r (one of %s)" % (profile, ", ".join(PROFILES)))
    version = int(systemd_version or 0)
    under_home = any(str(p).startswith(("/home/", "/root/", "/run/user/")) for p in read_paths or ())
    placeholders = {"{home}": "read-only" if under_home else "yes",
                    "{cpu_only}": None if gpus else "yes"}
    chosen = []
    for directive, since, values, _why in HARDENING:
        value = values.get(profile)
        if version < since or value is None:
            continue
        value = placeholders.get(value, value)
        if value is None:
            continue
        # a later row of the same directive replaces the earlier (ProtectSystem full -> strict), except the
        # ones that add up (SystemCallFilter= lines)
        if directive != "SystemCallFilter":
            chosen = [item for item in chosen if item[0] != directive]
        chosen.append((directive, value))
    if any(item[0] == "DevicePolicy" for item in chosen):
        chosen.extend(("DeviceAllow", "%s %s" % item) for item in devices(profile, gpus))
    if version >= 232 and write_paths:
        chosen.append(("ReadWritePaths", " ".join(_writable_path(p) for p in write_paths)))
    return chosen


_WRITABLE_PATH = whole(r"-?/[^\s\x00-\x1f\x7f\\\"']*")


def _writable_path(path):
    """One ReadWritePaths= entry: an absolute path (a leading "-": it may not exist), no blank or quote (the
    list is blank-separated), % doubled (specifiers)."""
    if not _WRITABLE_PATH.match(str(path)):
        raise ServingError("%r cannot be a ReadWritePaths= entry: use an absolute path without blanks, "
                           "quotes or control characters" % (path,))
    return str(path).replace("%", "%%")


def sandboxed_gpus(plan, hardening=True, gpu_check=True, isolate=False):
    """An instance's GPUs as its unit sees them: {"opened": the node's indexes the unit's own processes open
    (its DeviceAllow=), "gpus": their indexes inside the unit (nvidia-smi -i), "env": the instance's env
    with CUDA_VISIBLE_DEVICES spelled in those}.

    The unit opens its GPUs in host mode, and in container mode only for the GPU check before docker run
    (docker hands the GPUs to the container). DeviceAllow= lets it open only those /dev/nvidia<N>; the driver
    then lists only them, numbered from 0 in the node's order - as under Slurm's ConstrainDevices, which is
    why Slurm sets CUDA_VISIBLE_DEVICES to job-local indexes. GPUs [2, 3] are 0 and 1 inside the unit (CUDA,
    NVML, nvidia-smi -i), [3, 2] are 1 and 0. Without the sandbox (hardening off) the node's indexes stay.

    That renumbering is what Slurm documents; it has not been checked on this collection's GPUs (no GPU in
    CI), so it is opt-in (`isolate`, serving_gpu_isolation). By default a sandboxed unit may open every NVIDIA
    GPU node ("opened" is ALL_GPUS: char-nvidia*, no other device) and keeps the node's numbers: the
    instance's GPUs are still chosen by CUDA_VISIBLE_DEVICES, as before the sandbox."""
    gpus = [int(g) for g in plan.get("gpus") or ()]
    env = dict(plan.get("env") or {})
    opened = gpus if plan.get("mode") == "host" or gpu_check else []
    if not (hardening and opened):
        return {"opened": opened if hardening else [], "gpus": gpus, "env": env}
    if not isolate:
        return {"opened": ALL_GPUS, "gpus": gpus, "env": env}
    order = sorted(set(gpus))
    local = [order.index(g) for g in gpus]
    if "CUDA_VISIBLE_DEVICES" in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in local)
    return {"opened": gpus, "gpus": local, "env": env}


def hardening(systemd_version, read_paths=(), mode="host", gpus=None, write_paths=()):
    """A serving instance's directives: host mode runs CUDA (GPU_SERVER), container mode only the docker CLI
    (DOCKER_CLIENT: docker hands the GPUs to the container, the unit needs /run/docker.sock). `gpus`: those
    the unit's own processes open (sandboxed_gpus()["opened"])."""
    profile = GPU_SERVER if mode == "host" else DOCKER_CLIENT
    return unit_hardening(systemd_version, profile, gpus=gpus, read_paths=read_paths,
                          write_paths=write_paths if profile == GPU_SERVER else ())


def restart_policy(systemd_version, restart_sec=10, interval=600, burst=5, max_delay=300,
                   restart="on-failure"):
    """Bounded restart backoff, spelled for the node's systemd. Returns {"unit": [...], "service": [...]}.

    `restart`: the role's per-engine choice (llama.cpp: on-failure; vLLM: always, as the seed's production
    unit).

    systemd < 230 (CentOS 7: 219) only knows StartLimitInterval/StartLimitBurst in [Service]; newer ones
    want StartLimitIntervalSec/StartLimitBurst in [Unit]. systemd >= 254 also grows RestartSec
    exponentially up to RestartMaxDelaySec.
    """
    version = int(systemd_version or 0)
    unit, service = [], [("Restart", restart), ("RestartSec", str(restart_sec))]
    if version >= 230:
        unit += [("StartLimitIntervalSec", str(interval)), ("StartLimitBurst", str(burst))]
    else:
        service += [("StartLimitInterval", str(interval)), ("StartLimitBurst", str(burst))]
    if version >= 254:
        service += [("RestartSteps", "5"), ("RestartMaxDelaySec", str(max_delay))]
    return {"unit": unit, "service": service}


def parse_systemd_version(text):
    """`systemctl --version` output -> 219 / 252 (0 when unreadable)."""
    match = re.search(r"systemd\s+(\d+)", text or "")
    return int(match.group(1)) if match else 0
