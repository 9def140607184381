# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""GPU metrics that need nothing but the NVIDIA driver, for node_exporter's textfile collector.

Role monitoring runs this on a systemd timer (roles/monitoring/templates/llmops-gpu-metrics.j2 is the entry
point, with this file and gpu.py copied beside it): one `nvidia-smi --query-gpu=... --format=csv` per run,
parsed with gpu_facts' own code (gpu.py: field errors, [N/A], fault markers such as "[GPU is lost]", GPUs
fallen off the bus), plus the NVIDIA XID errors the kernel logged since the last run (/dev/kmsg, "NVRM: Xid
(PCI:0000:86:00): 79, ..."), written atomically as Prometheus text:

    llmops_gpu_info{gpu, uuid, name, pci_bus_id, driver_version} 1
    llmops_gpu_healthy{gpu, uuid, state}                        1 ok, 0 in a bad state (state: lost, ...)
    llmops_gpu_memory_{total,used}_bytes, llmops_gpu_{,memory_}utilization_ratio,
    llmops_gpu_{,memory_}temperature_celsius, llmops_gpu_power_{draw,limit}_watts,
    llmops_gpu_{sm,sm_max,memory}_clock_hertz, llmops_gpu_performance_state,
    llmops_gpu_clocks_event_reasons (NVML's bitmask), llmops_gpu_throttled{reason} 0/1,
    llmops_gpu_ecc_errors_total{type=corrected|uncorrected, scope=volatile|aggregate},
    llmops_gpu_retired_pages_pending, llmops_gpu_remapped_rows_{pending,failure},
    llmops_gpu_xid_errors_total{gpu, uuid, pci_bus_id, xid}
    llmops_gpu_collector_success, llmops_gpu_collector_error{kind},
    llmops_gpu_collector_last_run_timestamp_seconds, llmops_gpu_collector_kernel_log_readable

A value nvidia-smi does not report ([N/A], a field this driver does not know) is left out, never written as
0: an ECC count of 0 on a card without ECC would claim it is clean. Plain Python 3.6, standard library only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import re
import time

from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

# Labels of every per-GPU series; the rest of a GPU's identity is in llmops_gpu_info.
IDENTITY_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version")
REQUIRED = ("index", "uuid", "pci.bus_id")

MIB = 1024 * 1024
MHZ = 1000000.0

# query field -> (metric, help, scale). A field may name alternates: the first the driver accepts is used
# (R535 renamed clocks_throttle_reasons.* to clocks_event_reasons.*; older drivers know only the old name).
VALUE_FIELDS = (
    ("memory.total", "llmops_gpu_memory_total_bytes", "Framebuffer memory of the GPU.", MIB),
    ("memory.used", "llmops_gpu_memory_used_bytes", "Framebuffer memory in use.", MIB),
    ("utilization.gpu", "llmops_gpu_utilization_ratio",
     "Share of the last sample period a kernel was running (0-1).", 0.01),
    ("utilization.memory", "llmops_gpu_memory_utilization_ratio",
     "Share of the last sample period device memory was read or written (0-1).", 0.01),
    ("temperature.gpu", "llmops_gpu_temperature_celsius", "GPU core temperature.", 1),
    ("temperature.memory", "llmops_gpu_memory_temperature_celsius", "HBM temperature (HBM GPUs only).", 1),
    ("power.draw", "llmops_gpu_power_draw_watts", "Power draw of the board.", 1),
    ("power.limit", "llmops_gpu_power_limit_watts", "Power limit the driver enforces.", 1),
    ("clocks.current.sm", "llmops_gpu_sm_clock_hertz", "Current SM clock.", MHZ),
    ("clocks.max.sm", "llmops_gpu_sm_clock_max_hertz", "Highest SM clock of the GPU.", MHZ),
    ("clocks.current.memory", "llmops_gpu_memory_clock_hertz", "Current memory clock.", MHZ),
    ("retired_pages.pending", "llmops_gpu_retired_pages_pending",
     "1 when retired pages wait for a GPU reset or reboot (pre-Ampere).", None),
    ("remapped_rows.pending", "llmops_gpu_remapped_rows_pending",
     "1 when remapped memory rows wait for a GPU reset or reboot (Ampere and later).", None),
    ("remapped_rows.failure", "llmops_gpu_remapped_rows_failure",
     "1 when a row remapping failed: the GPU should be replaced.", None),
)
ECC_FIELDS = (
    ("ecc.errors.corrected.volatile.total", "corrected", "volatile"),
    ("ecc.errors.uncorrected.volatile.total", "uncorrected", "volatile"),
    ("ecc.errors.corrected.aggregate.total", "corrected", "aggregate"),
    ("ecc.errors.uncorrected.aggregate.total", "uncorrected", "aggregate"),
)
THROTTLE_FIELD = "clocks_event_reasons.active"
ALTERNATES = {THROTTLE_FIELD: ("clocks_throttle_reasons.active",)}
OTHER_FIELDS = ("pstate",)

# NVML's clocks event (throttle) reasons: bit -> label (nvmlClocksEventReason*).
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

# "NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
_XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\):\s*"
                     r"(?P<xid>\d+)\b")
_BUS_RE = re.compile(r"^(?P<domain>[0-9A-Fa-f]{4,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<device>[0-9A-Fa-f]{2})")
_PSTATE_RE = whole(r"P(\d+)")

HEALTHY_HELP = "1 when nvidia-smi reads the GPU, 0 when it reports it lost, needing a reset or in error."
BOOT_ID = "/proc/sys/kernel/random/boot_id"
KMSG = "/dev/kmsg"


def query_fields():
    """The fields asked for, in order (alternates excluded)."""
    fields = list(IDENTITY_FIELDS)
    fields += [f for f, _metric, _help, _scale in VALUE_FIELDS]
    fields += [f for f, _type, _scope in ECC_FIELDS]
    fields += [THROTTLE_FIELD] + list(OTHER_FIELDS)
    return fields


def bus_key(bus_id):
    """(domain, bus, device) as integers of a PCI address in nvidia-smi's (00000000:86:00.0) or the kernel's
    (0000:86:00) spelling; None when it is not one."""
    match = _BUS_RE.match((bus_id or "").strip())
    if not match:
        return None
    return tuple(int(match.group(k), 16) for k in ("domain", "bus", "device"))


def escape_label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels_text(labels):
    return ",".join('%s="%s"' % (k, escape_label(v)) for k, v in labels)


class Exposition(object):
    """Prometheus text, one HELP/TYPE header per family, families in the order first written."""

    def __init__(self):
        self.families = []
        self.by_name = {}

    def add(self, name, kind, help_text, labels, value):
        if name not in self.by_name:
            self.by_name[name] = (kind, help_text, [])
            self.families.append(name)
        sample = "%s{%s}" % (name, labels_text(labels)) if labels else name
        self.by_name[name][2].append("%s %s" % (sample, _number(value)))

    def text(self):
        lines = []
        for name in self.families:
            kind, help_text, samples = self.by_name[name]
            lines.append("# HELP %s %s" % (name, help_text))
            lines.append("# TYPE %s %s" % (name, kind))
            lines.extend(samples)
        return "\n".join(lines) + "\n"


def _number(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _value(text):
    """A number from nvidia-smi's text (units stripped), None when not reported."""
    if text is None or gpu._na(text):
        return None
    return float(gpu._strip_unit(text))


def _flag(text):
    """Yes/No, Active/Not Active, Enabled/Disabled, or a count -> 0/1 (None when not reported)."""
    if text is None or gpu._na(text):
        return None
    word = text.strip().lower()
    if word in ("yes", "active", "enabled", "true"):
        return 1
    if word in ("no", "not active", "disabled", "false"):
        return 0
    return 1 if _value(text) else 0


def run_query(smi, fields):
    """(rc, text, fields) of one query; a field the driver rejects is replaced by its alternate or dropped,
    then the query runs again (an old driver costs a few runs, recorded in the state for the next time)."""
    fields = list(fields)
    for _attempt in range(len(fields)):
        rc, out, err = smi.run(gpu.query_args(fields))
        text = out + ("\n" if out and err else "") + err
        bad = gpu._INVALID_FIELD_RE.search(text)
        if not bad:
            return rc, out, text, fields
        field = bad.group("field")
        if field not in fields or field in REQUIRED:
            raise gpu.GpuError(gpu.FAILED, "nvidia-smi rejected the query field %r: %s"
                               % (field, text.strip()))
        position = fields.index(field)
        original = next((f for f, alts in ALTERNATES.items() if field == f or field in alts), None)
        options = [original] + list(ALTERNATES.get(original, ())) if original else []
        later = options[options.index(field) + 1:] if field in options else []
        if later:
            fields[position] = later[0]
        else:
            del fields[position]
    raise gpu.GpuError(gpu.FAILED, "nvidia-smi rejected every query")


def gpu_samples(exposition, row):
    """The series of one GPU row (a dict field -> nvidia-smi text). Returns (labels, bus key)."""
    values, bad = gpu.read_row(row)
    state = gpu._worst_state(bad)
    index = values.get("index")
    index = str(index) if index is not None else row.get("index", "").strip()
    uuid = values.get("uuid") or ""
    labels = (("gpu", index), ("uuid", uuid))
    exposition.add("llmops_gpu_info", "gauge", "One series per GPU with its name, PCI address and driver.",
                   labels + (("name", values.get("name") or ""),
                             ("pci_bus_id", row.get("pci.bus_id", "").strip()),
                             ("driver_version", values.get("driver_version") or "")), 1)
    exposition.add("llmops_gpu_healthy", "gauge", HEALTHY_HELP, labels + (("state", state),),
                   1 if state == "ok" else 0)
    broken = set(field for field, _text, _state in bad)
    for field, metric, help_text, scale in VALUE_FIELDS:
        if field in broken or field not in row:
            continue
        text = row[field]
        number = _flag(text) if scale is None else _value(text)
        if number is not None:
            exposition.add(metric, "gauge", help_text, labels, number * scale if scale else number)
    for field, kind, scope in ECC_FIELDS:
        if field in row and field not in broken:
            number = _value(row[field])
            if number is not None:
                exposition.add("llmops_gpu_ecc_errors_total", "counter",
                               "ECC errors: volatile since the driver loaded, aggregate over the GPU's life.",
                               labels + (("type", kind), ("scope", scope)), int(number))
    reasons = next((row[f] for f in (THROTTLE_FIELD,) + ALTERNATES[THROTTLE_FIELD] if f in row), None)
    if reasons is not None and not gpu._na(reasons) and THROTTLE_FIELD not in broken:
        try:
            mask = int(reasons.strip(), 16)
        except ValueError:
            mask = None
        if mask is not None:
            exposition.add("llmops_gpu_clocks_event_reasons", "gauge",
                           "NVML's clocks event (throttle) reasons bitmask.", labels, mask)
            for bit, reason in THROTTLE_REASONS:
                exposition.add("llmops_gpu_throttled", "gauge",
                               "1 while the clocks are held down for this reason.",
                               labels + (("reason", reason),), 1 if mask & bit else 0)
    pstate = _PSTATE_RE.match((row.get("pstate") or "").strip())
    if pstate:
        exposition.add("llmops_gpu_performance_state", "gauge", "Performance state (0 = P0, the fastest).",
                       labels, int(pstate.group(1)))
    return labels, bus_key(row.get("pci.bus_id"))


# --------------------------------------------------------------------------- XID errors from the kernel log

def xid_events(lines):
    """[(bus key, pci text, xid)] of the NVRM Xid lines among kernel log messages."""
    found = []
    for line in lines:
        match = _XID_RE.search(line)
        if match:
            found.append((bus_key(match.group("bus")), match.group("bus").lower(), int(match.group("xid"))))
    return found


def kmsg_records(path):
    """[(sequence number, message)] of the kernel ring buffer in /dev/kmsg's format
    ("prio,seq,usec,flags;msg", continuation lines start with a space). /dev/kmsg returns one record per
    read and EAGAIN at the end (opened non-blocking); a record overwritten while reading gives EPIPE, and
    reading goes on. A regular file in the same format (tests) reads the same way."""
    records = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:
                    continue
                raise
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            records.extend(_kmsg_record(line) for line in complete)
        if pending:
            records.append(_kmsg_record(pending))
    finally:
        os.close(fd)
    return [r for r in records if r is not None]


def _kmsg_record(raw):
    line = raw.decode("utf-8", "replace")
    if not line or line.startswith(" ") or ";" not in line:
        return None
    prefix, message = line.split(";", 1)
    fields = prefix.split(",")
    try:
        return int(fields[1]), message
    except (IndexError, ValueError):
        return None


def read_boot_id(path=BOOT_ID):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return ""


def count_xids(state, records, boot_id):
    """Add the Xid events of `records` newer than the state's last sequence number (of this boot) to the
    state's counts {"<pci>|<xid>": n}. The counts outlive reboots, so the counter never goes back."""
    counts = dict(state.get("xid") or {})
    last = state.get("kmsg_seq", -1) if state.get("boot_id") == boot_id else -1
    newest = last
    for seq, message in records:
        if seq <= last:
            continue
        newest = max(newest, seq)
        for _key, pci, xid in xid_events([message]):
            name = "%s|%d" % (pci, xid)
            counts[name] = counts.get(name, 0) + 1
    return dict(state, xid=counts, kmsg_seq=newest, boot_id=boot_id)


# --------------------------------------------------------------------------- one run

def collect(smi, state, records=None, boot_id="", now=None):
    """(exposition text, new state). `smi` is a gpu.NvidiaSmi; `records` the kernel log (None: unreadable)."""
    exposition = Exposition()
    now = time.time() if now is None else now
    error_kind = None
    fields = state.get("fields") or query_fields()
    by_bus = {}
    try:
        rc, out, text, fields = run_query(smi, fields)
        rows, malformed, _skipped = gpu._split_rows(out, fields, header=False)
        for row in rows:
            labels, key = gpu_samples(exposition, row)
            by_bus[key] = labels
        for index, _why in malformed:
            exposition.add("llmops_gpu_healthy", "gauge", HEALTHY_HELP,
                           (("gpu", index), ("uuid", ""), ("state", "error")), 0)
        for bus, _why in gpu.lost_gpus(text):
            # A GPU fallen off the bus has no index or UUID left, only its PCI address.
            exposition.add("llmops_gpu_healthy", "gauge", HEALTHY_HELP,
                           (("gpu", ""), ("uuid", ""), ("state", "lost"), ("pci_bus_id", bus)), 0)
        failure = None if rows or malformed else gpu.classify_failure(rc, text)
        if failure is not None:
            raise failure
        state = dict(state, fields=fields)
    except gpu.GpuError as exc:
        error_kind = exc.kind
        state = dict(state, fields=None)
    if records is not None:
        state = count_xids(state, records, boot_id)
    for name, count in sorted((state.get("xid") or {}).items()):
        pci, xid = name.rsplit("|", 1)
        labels = by_bus.get(bus_key(pci), (("gpu", ""), ("uuid", "")))
        exposition.add("llmops_gpu_xid_errors_total", "counter",
                       "NVIDIA XID errors the kernel logged for this GPU (since the collector's first run).",
                       labels + (("pci_bus_id", pci), ("xid", xid)), count)
    exposition.add("llmops_gpu_collector_success", "gauge", "1 when the last nvidia-smi query succeeded.", (),
                   0 if error_kind else 1)
    if error_kind:
        exposition.add("llmops_gpu_collector_error", "gauge", "Why the last query failed (gpu_facts' kinds).",
                       (("kind", error_kind),), 1)
    exposition.add("llmops_gpu_collector_kernel_log_readable", "gauge",
                   "1 when the kernel log (XID errors) could be read.", (), 0 if records is None else 1)
    exposition.add("llmops_gpu_collector_last_run_timestamp_seconds", "gauge",
                   "When the collector last ran (a stale value: the timer stopped).", (), now)
    return exposition.text(), state


def load_state(path):
    try:
        with open(path) as handle:
            state = json.load(handle)
        return state if isinstance(state, dict) else {}
    except (IOError, OSError, ValueError):
        return {}


def write_atomic(path, text, mode=0o644):
    """Write next to `path` and rename: node_exporter never reads half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def main(argv, runner=gpu.run_command):
    """llmops-gpu-metrics --output FILE --state FILE [--kmsg /dev/kmsg] [--nvidia-smi PATH] [--timeout S]"""
    options = {"--output": None, "--state": None, "--kmsg": KMSG, "--nvidia-smi": None, "--timeout": "10",
               "--boot-id": BOOT_ID}
    args = list(argv)
    while args:
        name = args.pop(0)
        if name not in options or not args:
            raise SystemExit("usage: %s" % main.__doc__)
        options[name] = args.pop(0)
    if not options["--output"] or not options["--state"]:
        raise SystemExit("usage: %s" % main.__doc__)
    state = load_state(options["--state"])
    smi_path = gpu.find_nvidia_smi(options["--nvidia-smi"]) or options["--nvidia-smi"] or "nvidia-smi"
    smi = gpu.NvidiaSmi(smi_path, timeout=float(options["--timeout"]), runner=runner)
    try:
        records = kmsg_records(options["--kmsg"]) if options["--kmsg"] else None
    except (IOError, OSError):
        records = None
    text, state = collect(smi, state, records, read_boot_id(options["--boot-id"]))
    write_atomic(options["--output"], text)
    write_atomic(options["--state"], json.dumps(state, sort_keys=True), mode=0o600)
    return 0
