# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""NVIDIA GPU discovery for llmops.serving.gpu_facts: run nvidia-smi and parse it (checks.py checks it).

Plain Python 3.6, standard library only, importable without Ansible (unit tests import it
directly). The module file only maps options to `collect()` and checks.evaluate().
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils._gpu.cuda_compat import version_tuple
from ansible_collections.llmops.serving.plugins.module_utils.bounded_run import DEFAULT_MAX_BYTES, run_bounded
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole

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

# Values meaning "this field does not apply / is not reported": None for an optional field. In a required
# field (REQUIRED_FIELDS) they make the GPU faulty: a GPU without its memory size or UUID cannot be used.
NA_VALUES = ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Insufficient Permissions]",
             "[Requested functionality has been deprecated]", "[Not Found]")

# Values nvidia-smi prints in a field when NVML failed for that GPU (NVML_ERROR_RESET_REQUIRED,
# NVML_ERROR_UNKNOWN, NVML_ERROR_GPU_IS_LOST; "ERR!" where a sensor read failed). Any of them in any field
# makes that GPU faulty, with this state; the other GPUs are still read.
FAULT_MARKERS = (
    ("[GPU is lost]", "lost"),
    ("[GPU requires reset]", "reset_required"),
    ("ERR!", "error"),
    ("[Unknown Error]", "error"),
)
GPU_STATES = ("ok", "reset_required", "error", "lost")  # from healthy to worst

# How each queried field is read: (parser, required).
_CAP_RE = whole(r"[0-9]+\.[0-9]+")
_ROW_START_RE = whole(r"\s*[0-9]+\s*")

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

FAULTY = "faulty"
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

def cap_to_arch(cap):
    """'8.9' -> '89', '12.0' -> '120'."""
    major, minor = version_tuple(cap)[:2]
    return "%d%d" % (major, minor)


def _na(value):
    return value is None or value.strip() in NA_VALUES


def _strip_unit(value):
    value = value.strip()
    m = matches(r"(-?[0-9]+(?:\.[0-9]+)?)\s*(?:MiB|W|C|%|MHz)?", value)
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


def _split_rows(text, fields, header=None):
    """(rows, malformed, skipped) of `--query-gpu` output.

    rows: dicts field -> nvidia-smi's text. malformed: (index, line) of lines that start like a GPU row (the
    index) but do not have one value per field. skipped: lines that are not rows of the query at all, such as
    the "WARNING: infoROM is corrupted at gpu ..." lines nvidia-smi prints on stdout. A header line (with or
    without units) is checked against the query; lines about lost GPUs are left to lost_gpus()."""
    rows, malformed, skipped = [], [], []
    seen_header = False
    by_index = fields and fields[0] == "index"
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if _LOST_RE.search(line) or "fallen off the bus" in line:
            continue
        cells = [c.strip() for c in line.split(",")]
        name0 = cells[0].split(" [")[0]
        if not seen_header and not rows and not malformed and header is not False and name0 == fields[0]:
            names = [c.split(" [")[0] for c in cells]
            if names != list(fields):
                raise ValueError("nvidia-smi header %r does not match the query %r"
                                 % (line, ",".join(fields)))
            seen_header = True
            continue
        looks_like_row = _ROW_START_RE.match(cells[0]) if by_index else len(cells) == len(fields)
        if not looks_like_row:
            skipped.append(line.strip())
            continue
        if len(cells) != len(fields):
            malformed.append((cells[0].strip(), "nvidia-smi returned %d values for %d fields in line %r"
                              % (len(cells), len(fields), line)))
            continue
        rows.append(dict((f, cells[i]) for i, f in enumerate(fields)))
    return rows, malformed, skipped


def parse_query(text, fields, header=None, skipped=None):
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv[...]` output into a list of dicts.

    Works with or without the header line and with or without units. Lines reporting a lost GPU are skipped
    (see lost_gpus()), and so are lines that are not rows of the query (warnings nvidia-smi prints on stdout):
    those are appended to `skipped` when a list is given. A row with the wrong number of values raises
    ValueError (parse_gpus() makes it that GPU's fault instead). Values keep nvidia-smi's text; convert with
    to_gpu()."""
    rows, malformed, lines = _split_rows(text, fields, header)
    if malformed:
        raise ValueError(malformed[0][1])
    if skipped is not None:
        skipped.extend(lines)
    return rows


def _read_int(value):
    return int(float(_strip_unit(value)))


def _read_float(value):
    return float(_strip_unit(value))


def _read_text(value):
    return value


def _read_cap(value):
    if not _CAP_RE.match(value):
        raise ValueError("not a compute capability: %r" % (value,))
    return value


_FIELD_READERS = {
    "index": (_read_int, True),
    "uuid": (_read_text, True),
    "name": (_read_text, True),
    "pci.bus_id": (_read_text, True),
    "compute_cap": (_read_cap, False),
    "memory.total": (_read_int, True),
    "memory.used": (_read_int, True),
    "memory.free": (_read_int, True),
    "driver_version": (_read_text, True),
    "persistence_mode": (_read_text, False),
    "mig.mode.current": (_read_text, False),
    "power.limit": (_read_float, False),
    "temperature.gpu": (_read_int, False),
    "pci.device_id": (_read_text, False),
}


def read_row(row):
    """(values, bad) for one query row: values maps each field to its parsed value (None when not reported);
    bad lists (field, text, state) for every field that says this GPU is in a bad state: an NVML error text
    (FAULT_MARKERS), a required field that is not reported, or a value that cannot be parsed."""
    values, bad = {}, []
    for field, raw in row.items():
        reader, required = _FIELD_READERS.get(field, (_read_text, False))
        text = (raw or "").strip()
        state = None
        for marker, marker_state in FAULT_MARKERS:
            if text == marker:
                state = marker_state
                break
        if state is None and (text in NA_VALUES or (text.startswith("[") and text.endswith("]"))):
            # Not reported. Unknown bracketed texts (a newer driver's wording) count as not reported too.
            state = "error" if required else None
            if state is None:
                values[field] = None
                continue
        if state is None:
            try:
                values[field] = reader(text)
                continue
            except ValueError:
                state = "error"
        values[field] = None
        bad.append((field, text, state))
    return values, bad


def _worst_state(bad):
    states = [GPU_STATES.index(state) for _field, _text, state in bad]
    return GPU_STATES[max(states)] if states else "ok"


def describe_gpu(index, name=None, uuid=None, bus=None):
    parts = [p for p in (name, uuid, bus) if p]
    return "GPU %s (%s)" % (index, ", ".join(parts)) if parts else "GPU %s" % (index,)


def fault_message(index, name, uuid, bus, bad):
    """What is wrong with one GPU and what to do about it."""
    state = _worst_state(bad)
    grouped = []
    for field, text, _state in bad:
        for entry in grouped:
            if entry[0] == text:
                entry[1].append(field)
                break
        else:
            grouped.append((text, [field]))
    seen = "; ".join("%s for %s" % (text or "nothing", ", ".join(fields)) for text, fields in grouped)
    who = describe_gpu(index, name, uuid, bus)
    if state == "lost":
        return ("%s is lost: nvidia-smi reports %s. It has fallen off the bus or stopped answering: check "
                "`dmesg | grep -i xid` (Xid 79 = fallen off the bus), its power cables, seating and cooling, "
                "then reboot the node; replace the card if it recurs." % (who, seen))
    if state == "reset_required":
        return ("%s requires a reset: nvidia-smi reports %s. Stop the processes using it (nvidia-smi "
                "--query-compute-apps=pid,process_name --format=csv -i %s), then reset it as root with "
                "`nvidia-smi -r -i %s`, or reboot the node; `dmesg | grep -i xid` shows what happened."
                % (who, seen, index, index))
    return ("%s is in an error state: nvidia-smi reports %s. Check `dmesg | grep -i -e xid -e nvrm`, then "
            "reset it as root with `nvidia-smi -r -i %s` (after stopping its processes) or reboot the node; "
            "replace the card if it recurs." % (who, seen, index))


def to_gpu(row):
    """One parsed query row -> the fact dict documented in gpu_facts RETURN. A GPU in a bad state gets
    state != 'ok', an error message, and None for the fields it could not report."""
    values, bad = read_row(row)
    cap = values.get("compute_cap")
    if cap is None:
        cap = compute_cap_fallback(values.get("name"), values.get("pci.device_id"))
    index = values.get("index")
    persistence = values.get("persistence_mode")
    gpu = {
        "index": index,
        "uuid": values.get("uuid"),
        "name": values.get("name"),
        "pci_bus_id": values.get("pci.bus_id"),
        "compute_cap": cap,
        "cuda_arch": cap_to_arch(cap) if cap else None,
        "memory_total_mib": values.get("memory.total"),
        "memory_used_mib": values.get("memory.used"),
        "memory_free_mib": values.get("memory.free"),
        "driver_version": values.get("driver_version") or "",
        "persistence_mode": parse_enabled(persistence),
        "mig_mode": values.get("mig.mode.current"),
        "power_limit_w": values.get("power.limit"),
        "temperature_c": values.get("temperature.gpu"),
        "state": _worst_state(bad),
        "error": None,
    }
    if bad:
        gpu["error"] = fault_message(index, gpu["name"], gpu["uuid"], gpu["pci_bus_id"], bad)
        gpu["bad_fields"] = dict((field, text) for field, text, _state in bad)
    return gpu


def faulty_entry(gpu):
    """The compact record of a faulty GPU returned in faulty_gpus."""
    return {
        "index": gpu["index"],
        "uuid": gpu["uuid"],
        "name": gpu["name"],
        "pci_bus_id": gpu["pci_bus_id"],
        "state": gpu["state"],
        "error": gpu["error"],
        "bad_fields": gpu.get("bad_fields", {}),
    }


def parse_gpus(text, fields, header=None):
    """(gpus, faulty, skipped): the working GPUs (to_gpu() dicts), the GPUs in a bad state (faulty_entry()
    records), and the lines that were not rows of the query. One bad GPU never hides the others."""
    rows, malformed, skipped = _split_rows(text, fields, header)
    gpus, faulty = [], []
    for row in rows:
        gpu = to_gpu(row)
        if gpu["state"] == "ok":
            gpus.append(gpu)
        else:
            faulty.append(faulty_entry(gpu))
    for index, why in malformed:
        idx = int(index)
        faulty.append({"index": idx, "uuid": None, "name": None, "pci_bus_id": None, "state": "error",
                       "error": "GPU %d: %s. Check `nvidia-smi -q -i %d` and `dmesg | grep -i -e xid -e "
                                "nvrm`; reset it as root with `nvidia-smi -r -i %d` or reboot the node."
                                % (idx, why, idx, idx),
                       "bad_fields": {"row": why}})
    return gpus, sorted(faulty, key=lambda f: f["index"]), skipped


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
    """Run argv with a hard timeout and a read limit (bounded_run.DEFAULT_MAX_BYTES); kill its whole process
    group on either (an nvidia-smi that never stops writing counts as timed out: its output is no answer).

    Returns (rc, stdout, stderr, timed_out).
    """
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    rc, out, err, timed_out, overflowed = run_bounded(argv, timeout, env=env)
    if overflowed:
        err = to_text(err) + "\n(output stopped after %d bytes: nvidia-smi kept writing)" % DEFAULT_MAX_BYTES
    return rc, to_text(out), to_text(err), timed_out or overflowed


def to_text(data):
    """nvidia-smi output as text: UTF-8 with undecodable bytes replaced (a corrupted infoROM or VBIOS string
    must not turn into a traceback), newlines normalised like universal_newlines."""
    if data is None:
        return ""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return data.replace("\r\n", "\n").replace("\r", "\n")


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
        return rc, to_text(out), to_text(err)


def query_gpus(smi):
    """Run the product query; retry without fields the driver does not know.

    Returns (gpus, faulty, skipped, lost, note): working GPUs, GPUs in a bad state (parse_gpus()), lines that
    were not rows of the query, lost GPUs (lost_gpus()), and a note when nvidia-smi exited non-zero but still
    printed GPU rows (kept: one bad GPU makes it fail while the others answer)."""
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
        try:
            gpus, faulty, skipped = parse_gpus(out, fields, header=False)
        except ValueError as exc:
            raise GpuError(FAILED, "could not parse nvidia-smi output: %s" % exc) from exc
        lost = lost_gpus(text)
        note = None
        if not lost:
            failure = classify_failure(rc, text)
            if failure is not None:
                if failure.kind != FAILED or not (gpus or faulty):
                    raise failure
                note = failure.message
        if not gpus and not faulty:
            if lost:
                raise lost_error(lost, [])
            if skipped:
                raise GpuError(FAILED, "could not parse nvidia-smi output: no line is a GPU row of the query "
                                       "%s; it printed: %s" % (",".join(fields), " / ".join(skipped)[:500]))
        return gpus, faulty, skipped, lost, note
    raise GpuError(FAILED, "nvidia-smi rejected every query")


def faulty_summary(faulty, total):
    """Host-level summary of the GPUs in a bad state (None when there is none)."""
    if not faulty:
        return None
    return "%d of %d GPU(s) in a bad state, the others were read: %s" % (
        len(faulty), total, " ".join(f["error"] for f in faulty))


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


def collect_all(nvidia_smi_path=None, timeout=15, runner=run_command, env_path=None,
                extra_dirs=("/usr/bin", "/usr/local/bin"), proc_version_path="/proc/driver/nvidia/version"):
    """Read the GPUs. Returns a dict:

    facts: the llmops_gpus fact (the contract: only working GPUs in gpus/count; error says what is wrong);
    kind: the error kind (None when all is well); faulty: faulty_entry() records of the GPUs in a bad state;
    node_error: the part of facts['error'] that is not about a faulty GPU (no driver, lost GPU, timeout...);
    warnings: lines nvidia-smi printed that were not GPU rows, and a non-zero exit it had despite rows.

    Never raises for node problems. Raises GpuError only for a wrong nvidia_smi_path (a configuration error).
    """
    out = {"facts": None, "kind": None, "faulty": [], "node_error": None, "warnings": []}
    path = find_nvidia_smi(nvidia_smi_path, env_path=env_path, extra_dirs=extra_dirs)
    if path is None:
        message = ("nvidia-smi not found in PATH or /usr/bin: the NVIDIA driver is not installed on this "
                   "host (install it, e.g. with the llmops.serving driver role, or set nvidia_smi_path)")
        out.update(facts=empty_facts(message), kind=ABSENT, node_error=message)
        return out
    smi = NvidiaSmi(path, timeout=timeout, runner=runner)
    try:
        gpus, faulty, skipped, lost, note = query_gpus(smi)
    except GpuError as exc:
        message = exc.message
        if exc.kind == MISMATCH:
            loaded = kernel_module_version(proc_version_path)
            if loaded:
                message += " Loaded kernel module: %s." % loaded
        out.update(facts=empty_facts(message), kind=exc.kind, node_error=message)
        return out
    out["faulty"] = faulty
    out["warnings"] = ["nvidia-smi printed a line that is not a GPU row, ignored: %s" % line
                       for line in skipped]
    if note:
        out["warnings"].append("nvidia-smi exited with an error but printed the GPU rows, which were read: %s"
                               % note)
    node_error, kind = None, None
    if lost:
        node_error, kind = lost_error(lost, gpus).message, LOST
    if not gpus and not faulty and node_error is None:
        node_error, kind = classify_failure(6, "No devices were found").message, NO_DEVICES

    driver = gpus[0]["driver_version"] if gpus else ""
    cuda = ""
    if gpus:
        # The CUDA version the driver supports is printed by --version (R525+), the banner and -q.
        for args, parser in ((["--version"], parse_q), ([], parse_banner), (["-q"], parse_q)):
            try:
                rc, text, _err = smi.run(args)
            except GpuError as exc:
                node_error, kind = node_error or exc.message, kind or exc.kind
                break
            if rc != 0:
                continue
            d, c = parser(text)
            if c:
                driver = driver or d or ""
                cuda = c
                break
    faulty_text = faulty_summary(faulty, len(gpus) + len(faulty))
    if faulty and kind is None:
        kind = FAULTY
    error = " ".join(e for e in (node_error, faulty_text) if e) or None
    out.update(facts=build_facts(gpus, driver, cuda, error), kind=kind, node_error=node_error)
    return out


def collect(nvidia_smi_path=None, timeout=15, runner=run_command, env_path=None,
            extra_dirs=("/usr/bin", "/usr/local/bin"), proc_version_path="/proc/driver/nvidia/version"):
    """Read the GPUs. Returns (facts, error_kind); facts follow the llmops_gpus contract. See collect_all()
    for the faulty GPUs and warnings as well."""
    out = collect_all(nvidia_smi_path, timeout=timeout, runner=runner, env_path=env_path,
                      extra_dirs=extra_dirs, proc_version_path=proc_version_path)
    return out["facts"], out["kind"]
