# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA GPU discovery for llmops.serving.gpu_facts: run nvidia-smi, parse it, check it.

Plain Python 3.6, standard library only, importable without Ansible (unit tests import it
directly). The module file only maps options to `collect()` and `evaluate()`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import signal
import subprocess

# The query the product runs, in this order. Other roles depend on the facts built from it.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "compute_cap",
    "memory.total",
    "memory.used",
    "memory.free",
    "driver_version",
    "persistence_mode",
    "mig.mode.current",
    "power.limit",
    "temperature.gpu",
)

# Fields a driver may not know. compute_cap arrived with R510; when a driver rejects it we ask
# for the PCI device id instead and look the compute capability up in COMPUTE_CAP_BY_DEVICE_ID.
OPTIONAL_FIELDS = ("compute_cap", "mig.mode.current", "power.limit", "temperature.gpu", "persistence_mode")
REQUIRED_FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "memory.free",
                   "driver_version")

# Minimum Linux x86_64 driver per CUDA release (the "GA" row of Table 3, "CUDA Toolkit and
# Corresponding Driver Versions", in the NVIDIA CUDA Toolkit release notes).
CUDA_MIN_DRIVER = (
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
)

# PCI device ids (upper 16 bits of nvidia-smi's pci.device_id, e.g. 0x26BA10DE) -> (product, cc).
COMPUTE_CAP_BY_DEVICE_ID = {
    0x26BA: ("L20", "8.9"),
    0x26B9: ("L40S", "8.9"),
    0x26B5: ("L40", "8.9"),
    0x27B8: ("L4", "8.9"),
    0x26B1: ("RTX 6000 Ada Generation", "8.9"),
    0x2684: ("GeForce RTX 4090", "8.9"),
    0x20B0: ("A100 SXM4 40GB", "8.0"),
    0x20B1: ("A100 PCIe 40GB", "8.0"),
    0x20B2: ("A100 SXM4 80GB", "8.0"),
    0x20B3: ("A100 SXM 64GB", "8.0"),
    0x20B5: ("A100 PCIe 80GB", "8.0"),
    0x20F1: ("A100 PCIe 40GB", "8.0"),
    0x20F3: ("A800 SXM4 80GB", "8.0"),
    0x20F5: ("A800 80GB PCIe", "8.0"),
    0x20B7: ("A30", "8.0"),
    0x2236: ("A10", "8.6"),
    0x2237: ("A10G", "8.6"),
    0x2235: ("A40", "8.6"),
    0x2230: ("RTX A6000", "8.6"),
    0x2204: ("GeForce RTX 3090", "8.6"),
    0x2203: ("GeForce RTX 3090 Ti", "8.6"),
    0x2330: ("H100 SXM5 80GB", "9.0"),
    0x2331: ("H100 PCIe", "9.0"),
    0x2321: ("H100 NVL", "9.0"),
    0x2339: ("H100", "9.0"),
    0x2324: ("H800", "9.0"),
    0x2335: ("H200", "9.0"),
    0x233B: ("H200 NVL", "9.0"),
    0x2329: ("H20", "9.0"),
    0x1E04: ("GeForce RTX 2080 Ti", "7.5"),
    0x1E07: ("GeForce RTX 2080 Ti Rev. A", "7.5"),
    0x1EB8: ("Tesla T4", "7.5"),
    0x1DB1: ("Tesla V100 SXM2 16GB", "7.0"),
    0x1DB4: ("Tesla V100 PCIe 16GB", "7.0"),
    0x1DB5: ("Tesla V100 SXM2 32GB", "7.0"),
    0x1DB6: ("Tesla V100 PCIe 32GB", "7.0"),
    0x1DF6: ("Tesla V100S PCIe 32GB", "7.0"),
}

# Product-name patterns (matched against the upper-cased nvidia-smi name), most specific first.
COMPUTE_CAP_BY_NAME = (
    (r"\bH200\b", "9.0"),
    (r"\bH100\b", "9.0"),
    (r"\bH800\b", "9.0"),
    (r"\bH20\b", "9.0"),
    (r"\bL40S\b", "8.9"),
    (r"\bL40\b", "8.9"),
    (r"\bL20\b", "8.9"),
    (r"\bL4\b", "8.9"),
    (r"RTX 6000 ADA", "8.9"),
    (r"RTX 40[5-9]0", "8.9"),
    (r"\bA100\b", "8.0"),
    (r"\bA800\b", "8.0"),
    (r"\bA30\b", "8.0"),
    (r"\bA10G?\b", "8.6"),
    (r"\bA40\b", "8.6"),
    (r"RTX A6000|\bA6000\b", "8.6"),
    (r"RTX 30[5-9]0", "8.6"),
    (r"RTX 20[6-8]0|TITAN RTX|QUADRO RTX [4-8]000", "7.5"),
    (r"\bT4\b", "7.5"),
    (r"\bV100", "7.0"),
)

NA_VALUES = ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]",
             "[Insufficient Permissions]", "[GPU is lost]", "[Requested functionality has been deprecated]",
             "[Not Found]")

_LOST_RE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu) ?"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*:\s*(?P<why>.*)")
_INVALID_FIELD_RE = re.compile(r'Field "(?P<field>[^"]+)" is not a valid field to query')
_BANNER_RE = re.compile(
    r"Driver Version:\s*(?P<driver>[0-9][0-9.]*)\s+CUDA Version:\s*(?P<cuda>[0-9][0-9.]*|N/A)")
_Q_DRIVER_RE = re.compile(r"^\s*Driver Version\s*:\s*(?P<v>\S+)\s*$", re.M)
_Q_CUDA_RE = re.compile(r"^\s*CUDA Version\s*:\s*(?P<v>\S+)\s*$", re.M)
_NVML_LIB_RE = re.compile(r"NVML library version:\s*(?P<v>[0-9][0-9.]*)")
_PROC_VERSION_RE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(?P<v>[0-9]+\.[0-9]+(?:\.[0-9]+)?)")

ABSENT = "absent"
MISMATCH = "mismatch"
NO_DEVICES = "no_devices"
NO_DRIVER = "no_driver"
LOST = "lost"
TIMEOUT = "timeout"
FAILED = "failed"


class GpuError(Exception):
    """A problem reading the GPUs, with a kind (see the constants above) and an actionable message."""

    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message


# --------------------------------------------------------------------------- small parsers

def version_tuple(text):
    """'550.54.14' -> (550, 54, 14); '12.4' -> (12, 4). Raises ValueError on anything else."""
    text = str(text).strip()
    if not re.match(r"^[0-9]+(\.[0-9]+)*$", text):
        raise ValueError("not a version: %r" % (text,))
    return tuple(int(p) for p in text.split("."))


def compare_versions(a, b):
    """-1, 0 or 1, comparing dotted versions numerically (missing parts count as 0)."""
    ta, tb = list(version_tuple(a)), list(version_tuple(b))
    n = max(len(ta), len(tb))
    ta += [0] * (n - len(ta))
    tb += [0] * (n - len(tb))
    return (ta > tb) - (ta < tb)


def driver_branch(version):
    """'550.54.14' -> 'R550'."""
    return "R%d" % version_tuple(version)[0]


def cap_to_arch(cap):
    """'8.9' -> '89', '12.0' -> '120'."""
    major, minor = version_tuple(cap)[:2]
    return "%d%d" % (major, minor)


def _na(value):
    return value is None or value.strip() in NA_VALUES


def _strip_unit(value):
    value = value.strip()
    m = re.match(r"^(-?[0-9]+(?:\.[0-9]+)?)\s*(?:MiB|W|C|%|MHz)?$", value)
    if not m:
        raise ValueError("unexpected value %r" % (value,))
    return m.group(1)


def parse_int(value):
    if _na(value):
        return None
    return int(float(_strip_unit(value)))


def parse_float(value):
    if _na(value):
        return None
    return float(_strip_unit(value))


def parse_enabled(value):
    return (value or "").strip().lower() == "enabled"


def parse_text(value):
    return None if _na(value) else value.strip()


def min_driver_for_cuda(cuda):
    """Minimum Linux driver for a CUDA release ('12.4' -> '550.54.14'), or None if not in the table."""
    key = version_tuple(cuda)[:2]
    for release, driver in CUDA_MIN_DRIVER:
        if version_tuple(release) == key:
            return driver
    return None


def max_cuda_for_driver(driver):
    """The newest CUDA release in the table that this driver supports ('535.161.08' -> '12.2')."""
    best = None
    for release, minimum in CUDA_MIN_DRIVER:
        if compare_versions(driver, minimum) >= 0:
            best = release
    return best


def compute_cap_fallback(name, pci_device_id=None):
    """Compute capability from the PCI device id, else from the product name; None if unknown."""
    if pci_device_id and not _na(pci_device_id):
        try:
            device = (int(pci_device_id.strip(), 16) >> 16) & 0xFFFF
        except ValueError:
            device = None
        if device in COMPUTE_CAP_BY_DEVICE_ID:
            return COMPUTE_CAP_BY_DEVICE_ID[device][1]
    upper = (name or "").upper()
    for pattern, cap in COMPUTE_CAP_BY_NAME:
        if re.search(pattern, upper):
            return cap
    return None


# --------------------------------------------------------------------------- nvidia-smi output

def query_args(fields, header=False, units=False):
    fmt = ["csv"]
    if not header:
        fmt.append("noheader")
    if not units:
        fmt.append("nounits")
    return ["--query-gpu=" + ",".join(fields), "--format=" + ",".join(fmt)]


def lost_gpus(text):
    """[(bus_id, reason)] for every 'Unable to determine the device handle' line."""
    found = []
    for line in (text or "").splitlines():
        m = _LOST_RE.search(line)
        if m:
            found.append((m.group("bus"), m.group("why").strip()))
        elif "fallen off the bus" in line:
            found.append(("unknown", line.strip()))
    return found


def classify_failure(rc, text):
    """Turn a failed nvidia-smi run into a GpuError with an actionable message (None if no failure)."""
    text = (text or "").strip()
    first = text.splitlines()[0].strip() if text else ""
    if "Driver/library version mismatch" in text:
        lib = _NVML_LIB_RE.search(text)
        lib_txt = " (user-space NVML library %s)" % lib.group(1) if lib else ""
        return GpuError(MISMATCH, (
            "NVIDIA driver/library version mismatch%s: the loaded nvidia kernel module and the installed "
            "user-space driver libraries are different versions, which happens after a driver upgrade "
            "without a reboot. Reboot the node (or stop every GPU process and reload the nvidia kernel "
            "modules: rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia; modprobe nvidia) so they match. "
            "nvidia-smi said: %s" % (lib_txt, first)))
    if "couldn't communicate with the NVIDIA driver" in text or "Driver Not Loaded" in text:
        return GpuError(NO_DRIVER, (
            "nvidia-smi is installed but the NVIDIA kernel driver is not loaded: check "
            "`lsmod | grep nvidia`, `dmesg | grep -i nvrm`, that the driver was built for the running "
            "kernel (DKMS) and that Secure Boot is not blocking the module; then load it (modprobe nvidia) "
            "or reinstall the driver. nvidia-smi said: %s" % first))
    if "No devices were found" in text:
        return GpuError(NO_DEVICES, (
            "nvidia-smi found no NVIDIA GPU: the driver is loaded but sees no device. Check "
            "`lspci | grep -i nvidia`, that the GPUs are passed through to this VM/container "
            "(--gpus, NVIDIA_VISIBLE_DEVICES), and `dmesg | grep -i nvrm` for probe errors."))
    lost = lost_gpus(text)
    if lost:
        return lost_error(lost, [])
    if "Failed to initialize NVML" in text:
        return GpuError(FAILED, (
            "nvidia-smi could not initialise NVML: %s. Check that the nvidia kernel module is loaded "
            "(lsmod | grep nvidia), that /dev/nvidia* exist and are readable by this user, and "
            "`dmesg | grep -i nvrm`." % first))
    if rc != 0:
        return GpuError(FAILED, "nvidia-smi failed (exit %s): %s" % (rc, text[:500] or "no output"))
    return None


def lost_error(lost, healthy):
    buses = ", ".join("%s (%s)" % (bus, why) for bus, why in lost)
    return GpuError(LOST, (
        "GPU at PCI %s has fallen off the bus or is lost: the driver cannot reach it%s. Check "
        "`dmesg | grep -i xid` (Xid 79 = fallen off the bus), the card's power cables, seating and "
        "cooling, then reboot the node; replace the card if it recurs."
        % (buses, "; %d other GPU(s) still answer" % len(healthy) if healthy else "")))


def parse_query(text, fields, header=None):
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv[...]` output into a list of dicts.

    Works with or without the header line and with or without units. Lines reporting a lost GPU
    are skipped (see lost_gpus()). Values keep nvidia-smi's text; convert with to_gpu().
    """
    rows = []
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    for lineno, line in enumerate(lines):
        if _LOST_RE.search(line) or "fallen off the bus" in line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if lineno == 0 and (header or (header is None and cells and cells[0].split(" [")[0] == fields[0])):
            names = [c.split(" [")[0] for c in cells]
            if names != list(fields):
                raise ValueError("nvidia-smi header %r does not match the query %r"
                                 % (line, ",".join(fields)))
            continue
        if len(cells) != len(fields):
            raise ValueError("nvidia-smi returned %d values for %d fields in line %r"
                             % (len(cells), len(fields), line))
        rows.append(dict((f, cells[i]) for i, f in enumerate(fields)))
    return rows


def to_gpu(row):
    """One parsed query row -> the fact dict documented in gpu_facts RETURN."""
    cap = parse_text(row.get("compute_cap"))
    if cap is None:
        cap = compute_cap_fallback(row.get("name"), row.get("pci.device_id"))
    return {
        "index": int(row["index"]),
        "uuid": row["uuid"].strip(),
        "name": row["name"].strip(),
        "pci_bus_id": row["pci.bus_id"].strip(),
        "compute_cap": cap,
        "cuda_arch": cap_to_arch(cap) if cap else None,
        "memory_total_mib": parse_int(row.get("memory.total")),
        "memory_used_mib": parse_int(row.get("memory.used")),
        "memory_free_mib": parse_int(row.get("memory.free")),
        "driver_version": parse_text(row.get("driver_version")) or "",
        "persistence_mode": parse_enabled(row.get("persistence_mode")),
        "mig_mode": parse_text(row.get("mig.mode.current")),
        "power_limit_w": parse_float(row.get("power.limit")),
        "temperature_c": parse_int(row.get("temperature.gpu")),
    }


def parse_banner(text):
    """(driver_version, cuda_version) from plain `nvidia-smi`; cuda '' when the driver says N/A."""
    m = _BANNER_RE.search(text or "")
    if not m:
        return None, None
    cuda = m.group("cuda")
    return m.group("driver"), ("" if cuda == "N/A" else cuda)


def parse_q(text):
    """(driver_version, cuda_version) from `nvidia-smi -q`."""
    d = _Q_DRIVER_RE.search(text or "")
    c = _Q_CUDA_RE.search(text or "")
    cuda = c.group("v") if c else None
    if cuda == "N/A":
        cuda = ""
    return (d.group("v") if d else None), cuda


def kernel_module_version(path="/proc/driver/nvidia/version"):
    """Version of the loaded nvidia kernel module, or None."""
    try:
        with open(path) as fh:
            m = _PROC_VERSION_RE.search(fh.read())
    except (IOError, OSError):
        return None
    return m.group("v") if m else None


# --------------------------------------------------------------------------- running nvidia-smi

def find_nvidia_smi(explicit=None, env_path=None, extra_dirs=("/usr/bin", "/usr/local/bin")):
    """Path of nvidia-smi, or None. An explicit path that is not an executable file is an error."""
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise GpuError(FAILED, "nvidia_smi_path %s is not an executable file; fix the path or leave it "
                               "unset to look nvidia-smi up in PATH" % explicit)
    search = env_path if env_path is not None else os.environ.get("PATH", "")
    dirs = [d for d in search.split(os.pathsep) if d]
    for d in list(dirs) + list(extra_dirs):
        cand = os.path.join(d, "nvidia-smi")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def run_command(argv, timeout):
    """Run argv with a hard timeout; kill its whole process group on expiry.

    Returns (rc, stdout, stderr, timed_out).
    """
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            universal_newlines=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return proc.returncode, out, err, True


class NvidiaSmi(object):
    """Runs nvidia-smi with a timeout and turns failures into GpuError."""

    def __init__(self, path, timeout=15, runner=run_command):
        self.path = path
        self.timeout = timeout
        self.runner = runner
        self.commands = []

    def run(self, args):
        argv = [self.path] + list(args)
        self.commands.append(" ".join(argv))
        try:
            rc, out, err, timed_out = self.runner(argv, self.timeout)
        except OSError as exc:
            raise GpuError(FAILED, "could not run %s: %s" % (self.path, exc)) from exc
        if timed_out:
            raise GpuError(TIMEOUT, (
                "`%s` did not answer within %s s and was killed. A hanging nvidia-smi means the driver is "
                "stuck (a GPU in a bad state, a kernel module problem or a GPU reset in progress): check "
                "`dmesg | grep -i -e nvrm -e xid`, and reboot the node if it persists. Raise `timeout` only "
                "for very large systems." % (" ".join(argv), self.timeout)))
        return rc, out or "", err or ""


def query_gpus(smi):
    """Run the product query; retry without fields the driver does not know. Returns (rows, lost)."""
    fields = list(QUERY_FIELDS)
    for _attempt in range(len(OPTIONAL_FIELDS) + 1):
        rc, out, err = smi.run(query_args(fields))
        text = out + ("\n" if out and err else "") + err
        bad = _INVALID_FIELD_RE.search(text)
        if bad:
            field = bad.group("field")
            if field in fields and field in OPTIONAL_FIELDS:
                fields.remove(field)
                if field == "compute_cap" and "pci.device_id" not in fields:
                    fields.append("pci.device_id")
                continue
            raise GpuError(FAILED, "nvidia-smi rejected the query field %r (driver too old?): %s"
                           % (field, text.strip()))
        lost = lost_gpus(text)
        if not lost:
            failure = classify_failure(rc, text)
            if failure is not None:
                raise failure
        try:
            rows = parse_query(out, fields, header=False)
        except ValueError as exc:
            raise GpuError(FAILED, "could not parse nvidia-smi output: %s" % exc) from exc
        if lost and not rows:
            raise lost_error(lost, [])
        return rows, lost
    raise GpuError(FAILED, "nvidia-smi rejected every query")


def empty_facts(error=None):
    return {
        "present": False,
        "count": 0,
        "driver_version": "",
        "cuda_version": "",
        "archs": [],
        "compute_caps": [],
        "homogeneous": False,
        "error": error,
        "gpus": [],
    }


def _sort_caps(caps):
    return sorted(set(caps), key=version_tuple)


def build_facts(gpus, driver_version="", cuda_version="", error=None):
    caps = [g["compute_cap"] for g in gpus if g["compute_cap"]]
    facts = empty_facts(error)
    facts.update({
        "present": bool(gpus),
        "count": len(gpus),
        "driver_version": driver_version or (gpus[0]["driver_version"] if gpus else ""),
        "cuda_version": cuda_version or "",
        "compute_caps": _sort_caps(caps),
        "archs": [cap_to_arch(c) for c in _sort_caps(caps)],
        "homogeneous": bool(gpus) and len(set((g["name"], g["compute_cap"], g["memory_total_mib"])
                                              for g in gpus)) == 1,
        "gpus": sorted(gpus, key=lambda g: g["index"]),
    })
    return facts


def collect(nvidia_smi_path=None, timeout=15, runner=run_command, env_path=None,
            extra_dirs=("/usr/bin", "/usr/local/bin"), proc_version_path="/proc/driver/nvidia/version"):
    """Read the GPUs. Returns (facts, error_kind); facts follow the llmops_gpus contract.

    Never raises for node problems: they land in facts['error'] with error_kind set.
    Raises GpuError only for a wrong nvidia_smi_path (a configuration error).
    """
    path = find_nvidia_smi(nvidia_smi_path, env_path=env_path, extra_dirs=extra_dirs)
    if path is None:
        return empty_facts(
            "nvidia-smi not found in PATH or /usr/bin: the NVIDIA driver is not installed on this host "
            "(install it, e.g. with the llmops.serving driver role, or set nvidia_smi_path)"), ABSENT
    smi = NvidiaSmi(path, timeout=timeout, runner=runner)
    try:
        rows, lost = query_gpus(smi)
    except GpuError as exc:
        message = exc.message
        if exc.kind == MISMATCH:
            loaded = kernel_module_version(proc_version_path)
            if loaded:
                message += " Loaded kernel module: %s." % loaded
        return empty_facts(message), exc.kind
    try:
        gpus = [to_gpu(r) for r in rows]
    except (ValueError, KeyError) as exc:
        return empty_facts("could not parse nvidia-smi output: %s" % exc), FAILED
    error, kind = None, None
    if lost:
        error, kind = lost_error(lost, gpus).message, LOST
    if not gpus and error is None:
        error, kind = classify_failure(6, "No devices were found").message, NO_DEVICES

    driver = gpus[0]["driver_version"] if gpus else ""
    cuda = ""
    if gpus:
        # The CUDA version the driver supports is printed by --version (R525+), the banner and -q.
        for args, parser in ((["--version"], parse_q), ([], parse_banner), (["-q"], parse_q)):
            try:
                rc, out, err = smi.run(args)
            except GpuError as exc:
                error, kind = error or exc.message, kind or exc.kind
                break
            if rc != 0:
                continue
            d, c = parser(out)
            if c:
                driver = driver or d or ""
                cuda = c
                break
    return build_facts(gpus, driver, cuda, error), kind


# --------------------------------------------------------------------------- checks

def _describe(gpu):
    return "GPU %d (%s, %s)" % (gpu["index"], gpu["name"], gpu["uuid"])


def parse_arch_requirement(spec):
    """'8.9' -> ('==', (8, 9)); '>=8.0' -> ('>=', (8, 0)); 'sm_89'/'89' -> ('==', (8, 9))."""
    raw = str(spec).strip()
    op = "=="
    text = raw
    if text.startswith(">="):
        op, text = ">=", text[2:].strip()
    text = text.lower()
    if text.startswith("sm_"):
        text = text[3:]
    if re.match(r"^[0-9]+\.[0-9]+$", text):
        cap = version_tuple(text)
    elif re.match(r"^[0-9]{2,3}$", text):
        cap = (int(text[:-1]), int(text[-1]))
    else:
        raise ValueError("require_arch entry %r is not a compute capability: use '8.9' (exact), "
                         "'>=8.0' (minimum) or 'sm_89'" % (raw,))
    return op, cap


def _cap_text(cap):
    return "%d.%d" % cap


def select_devices(gpus, devices):
    """Resolve `devices` (indices or UUIDs) to GPU dicts. Returns (selected, errors)."""
    if not devices:
        return list(gpus), []
    selected, errors = [], []
    known = ", ".join("%d (%s, %s)" % (g["index"], g["name"], g["uuid"]) for g in gpus) or "none"
    for dev in devices:
        key = str(dev).strip()
        match = None
        for g in gpus:
            if (key.isdigit() and int(key) == g["index"]) or key.lower() == g["uuid"].lower():
                match = g
                break
        if match is None:
            errors.append("device %r not found on this host; GPUs present: %s. Fix `devices` "
                          "(GPU indices or UUIDs from nvidia-smi -L)." % (key, known))
        elif match not in selected:
            selected.append(match)
    return selected, errors


def evaluate(facts, require_arch=None, min_driver_version=None, require_cuda=None,
             min_memory_mib=None, min_free_memory_mib=None, devices=None):
    """Check the facts against the requirements. Returns (selected_gpus, failures).

    Every failure names the GPU, what was found, what was wanted and how to fix it.
    """
    failures = []
    checks_wanted = bool(require_arch or min_driver_version or require_cuda or min_memory_mib is not None
                         or min_free_memory_mib is not None or devices)
    try:
        arch_specs = [parse_arch_requirement(s) for s in (require_arch or [])]
        if min_driver_version:
            version_tuple(min_driver_version)
        if require_cuda:
            version_tuple(require_cuda)
    except ValueError as exc:
        return [], [str(exc).replace("not a version", "invalid version")]

    if not facts["present"]:
        if checks_wanted:
            failures.append("no usable NVIDIA GPU to check: %s" % (facts["error"] or "none found"))
        return [], failures

    if facts["error"] and checks_wanted:
        # Some GPUs answered but not all (one fell off the bus, or a later call hung): do not pass a check
        # on a node with a broken GPU.
        failures.append("not every GPU is healthy: %s" % facts["error"])

    selected, errors = select_devices(facts["gpus"], devices)
    failures.extend(errors)

    for gpu in selected:
        if arch_specs:
            cap = gpu["compute_cap"]
            wanted = " or ".join((">=" if op == ">=" else "") + _cap_text(c) for op, c in arch_specs)
            if not cap:
                failures.append(
                    "%s: compute capability unknown (the driver does not report it and the product is not in "
                    "the built-in table); wanted %s. Upgrade the driver to >= 510 so nvidia-smi reports "
                    "compute_cap, or drop require_arch." % (_describe(gpu), wanted))
            else:
                have = version_tuple(cap)[:2]
                ok = any((have == c) if op == "==" else (have >= c) for op, c in arch_specs)
                if not ok:
                    failures.append(
                        "%s: compute capability %s (sm_%s) found, %s wanted. Run on GPUs with compute "
                        "capability %s, or change require_arch (and the CUDA architectures the engine is "
                        "built for)." % (_describe(gpu), cap, gpu["cuda_arch"], wanted, wanted))
        driver = gpu["driver_version"] or facts["driver_version"]
        if min_driver_version:
            if not driver or compare_versions(driver, min_driver_version) < 0:
                failures.append(
                    "%s: driver %s found, >= %s wanted. Install NVIDIA driver >= %s (%s or newer) and reboot."
                    % (_describe(gpu), driver or "unknown", min_driver_version, min_driver_version,
                       driver_branch(min_driver_version)))
        if require_cuda:
            failure = _check_cuda(gpu, driver, facts["cuda_version"], require_cuda)
            if failure:
                failures.append(failure)
        if min_memory_mib is not None:
            total = gpu["memory_total_mib"]
            if total is None or total < min_memory_mib:
                failures.append(
                    "%s: %s MiB memory found, >= %d MiB wanted. Use GPUs with more memory, spread the "
                    "model over more GPUs, or pick a smaller model/quantisation."
                    % (_describe(gpu), total if total is not None else "unknown", min_memory_mib))
        if min_free_memory_mib is not None:
            free = gpu["memory_free_mib"]
            if free is None or free < min_free_memory_mib:
                failures.append(
                    "%s: %s MiB free memory found, >= %d MiB wanted (%s MiB used). Stop the processes "
                    "using this GPU (nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                    "--format=csv -i %d) or choose another device."
                    % (_describe(gpu), free if free is not None else "unknown", min_free_memory_mib,
                       gpu["memory_used_mib"], gpu["index"]))
    return selected, failures


def _check_cuda(gpu, driver, reported_cuda, require_cuda):
    minimum = min_driver_for_cuda(require_cuda)
    if minimum is not None:
        if driver and compare_versions(driver, minimum) >= 0:
            return None
        supports = max_cuda_for_driver(driver) if driver else None
        return ("%s: driver %s found (supports CUDA %s), CUDA %s wanted. Install driver >= %s (%s or newer) "
                "and reboot; CUDA %s needs at least that driver on Linux."
                % (_describe(gpu), driver or "unknown", supports or reported_cuda or "unknown", require_cuda,
                   minimum, driver_branch(minimum), require_cuda))
    if reported_cuda and compare_versions(reported_cuda, require_cuda) >= 0:
        return None
    known = ", ".join(r for r, _d in CUDA_MIN_DRIVER)
    if reported_cuda:
        return ("%s: driver %s supports CUDA %s, CUDA %s wanted. Install a newer NVIDIA driver "
                "(CUDA %s is not in the built-in table: %s)."
                % (_describe(gpu), driver or "unknown", reported_cuda, require_cuda, require_cuda, known))
    return ("%s: cannot tell whether driver %s supports CUDA %s: nvidia-smi did not report a CUDA version "
            "and %s is not in the built-in table (%s)." % (_describe(gpu), driver or "unknown", require_cuda,
                                                           require_cuda, known))
