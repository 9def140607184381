# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU collector of role monitoring (plugins/module_utils/_gpu/metrics.py) against the fake nvidia-smi's
profiles, and XID errors from a kernel log in /dev/kmsg's format."""
import os
import shutil
import subprocess

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import metrics as gpu_metrics
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.fixtures.fake_nvidia_smi import SCRIPT, fake_env


def smi_for(tmp_path, profile="l20x4", state=None):
    """A gpu.NvidiaSmi that runs the fake with `profile` and state.json overrides."""
    env = fake_env(tmp_path / "smi", profile=profile, state=state)

    def runner(argv, timeout):
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout,
                              check=False)
        return proc.returncode, gpu.to_text(proc.stdout), gpu.to_text(proc.stderr), False

    os.makedirs(str(tmp_path / "smi"), exist_ok=True)
    return gpu.NvidiaSmi(SCRIPT, timeout=20, runner=runner)


def samples(text):
    """{(name, frozenset(labels)): value} of Prometheus text."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, rest = series.partition("{")
        labels = frozenset(tuple(item.split("=", 1)) for item in rest.rstrip("}").replace('"', "").split(",")
                           if item)
        found[(name, labels)] = float(value)
    return found


def pick(found, metric, **labels):
    want = set((k, str(v)) for k, v in labels.items())
    return {key: value for key, value in found.items() if key[0] == metric and want <= key[1]}


def one(found, metric, **labels):
    matches = pick(found, metric, **labels)
    assert len(matches) == 1, (metric, labels, matches)
    return next(iter(matches.values()))


def test_l20_box_memory_power_clocks_throttle_and_ecc(tmp_path):
    text, state = gpu_metrics.collect(smi_for(tmp_path), {}, records=[], boot_id="b1", now=1000.0)
    found = samples(text)
    assert len(pick(found, "llmops_gpu_info")) == 4
    assert one(found, "llmops_gpu_info", gpu=2, name="NVIDIA L20", pci_bus_id="00000000:86:00.0",
               driver_version="550.54.14") == 1
    assert one(found, "llmops_gpu_memory_total_bytes", gpu=0) == 46068 * 1024 * 1024
    assert one(found, "llmops_gpu_power_draw_watts", gpu=3) == pytest.approx(36.51)
    assert one(found, "llmops_gpu_sm_clock_max_hertz", gpu=1) == 2520e6
    assert one(found, "llmops_gpu_ecc_errors_total", gpu=0, type="uncorrected", scope="volatile") == 0
    assert one(found, "llmops_gpu_throttled", gpu=0, reason="hw_thermal_slowdown") == 0
    assert one(found, "llmops_gpu_healthy", gpu=1, state="ok") == 1
    assert one(found, "llmops_gpu_performance_state", gpu=0) == 8
    # GDDR6: no memory temperature; row remapping (Ada): no page retirement. Left out, never written as 0.
    assert pick(found, "llmops_gpu_memory_temperature_celsius") == {}
    assert pick(found, "llmops_gpu_retired_pages_pending") == {}
    assert one(found, "llmops_gpu_remapped_rows_pending", gpu=0) == 0
    assert one(found, "llmops_gpu_collector_success") == 1
    assert one(found, "llmops_gpu_collector_last_run_timestamp_seconds") == 1000.0
    assert "clocks_event_reasons.active" in state["fields"]


def test_faults_reported_by_the_driver_become_series(tmp_path):
    overrides = {"gpus": {"1": {"ecc_uncorrected": 2, "throttle_reasons": 0x40 | 0x20 | 0x1,
                                "pending_remap": True, "temperature": 91},
                          "3": {"ecc_uncorrected": None}}}
    found = samples(gpu_metrics.collect(smi_for(tmp_path, state=overrides), {}, records=[])[0])
    assert one(found, "llmops_gpu_ecc_errors_total", gpu=1, type="uncorrected", scope="volatile") == 2
    assert one(found, "llmops_gpu_clocks_event_reasons", gpu=1) == 0x61
    throttled = {dict(k[1])["reason"] for k, v in pick(found, "llmops_gpu_throttled", gpu=1).items() if v}
    assert throttled == {"gpu_idle", "sw_thermal_slowdown", "hw_thermal_slowdown"}
    assert one(found, "llmops_gpu_remapped_rows_pending", gpu=1) == 1
    assert one(found, "llmops_gpu_temperature_celsius", gpu=1) == 91
    # [N/A] (no ECC on the card) is left out, never reported as 0 errors.
    assert pick(found, "llmops_gpu_ecc_errors_total", gpu=3, type="uncorrected") == {}
    assert len(pick(found, "llmops_gpu_ecc_errors_total", gpu=3, type="corrected")) == 2


def test_h200_reports_its_hbm_temperature(tmp_path):
    found = samples(gpu_metrics.collect(smi_for(tmp_path, "h200"), {}, records=[])[0])
    assert one(found, "llmops_gpu_memory_temperature_celsius", gpu=0) == 31
    assert one(found, "llmops_gpu_memory_clock_hertz", gpu=0) == 2619e6


def test_an_old_driver_gets_the_old_throttle_field_and_the_choice_is_remembered(tmp_path):
    log = tmp_path / "argv.log"
    smi = smi_for(tmp_path, "old_driver")
    text, state = gpu_metrics.collect(smi, {}, records=[])
    found = samples(text)
    assert "clocks_throttle_reasons.active" in state["fields"]
    assert "clocks_event_reasons.active" not in state["fields"]
    assert one(found, "llmops_gpu_throttled", gpu=0, reason="sw_power_cap") == 0
    assert one(found, "llmops_gpu_retired_pages_pending", gpu=1) == 0       # Volta retires pages
    runs = len(smi.commands)
    assert runs >= 2
    gpu_metrics.collect(smi, state, records=[])
    assert len(smi.commands) == runs + 1, "the next run asks with the fields that worked"
    assert not log.exists()


def test_a_gpu_off_the_bus_is_unhealthy_and_the_others_are_read(tmp_path):
    found = samples(gpu_metrics.collect(smi_for(tmp_path, "fallen"), {}, records=[])[0])
    assert one(found, "llmops_gpu_healthy", state="lost", pci_bus_id="0000:86:00.0") == 0
    assert len(pick(found, "llmops_gpu_info")) == 3
    assert one(found, "llmops_gpu_collector_success") == 1


@pytest.mark.parametrize("profile, kind", [("mismatch", "mismatch"), ("nodevices", "no_devices")])
def test_a_driver_that_cannot_answer_is_a_collector_error(tmp_path, profile, kind):
    text, state = gpu_metrics.collect(smi_for(tmp_path, profile), {"fields": ["index"]}, records=None)
    found = samples(text)
    assert one(found, "llmops_gpu_collector_success") == 0
    assert one(found, "llmops_gpu_collector_error", kind=kind) == 1
    assert one(found, "llmops_gpu_collector_kernel_log_readable") == 0
    assert pick(found, "llmops_gpu_info") == {} and state["fields"] is None


def kmsg(*records):
    return "".join("%d,%d,%d,-;%s\n" % (prio, seq, seq * 1000, message) for prio, seq, message in records)


XID_79 = "NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python3, An uncorrectable double bit error (DBE)."


def test_xid_errors_are_counted_once_per_message_and_keep_counting_across_reboots(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text(kmsg((6, 1, "Linux version 6.1"), (3, 2, XID_79), (4, 3, " SUBSYSTEM=pci"),
                         (3, 4, XID_48), (3, 5, XID_79)) + " DEVICE=+pci:0000:86:00.0\n")
    records = gpu_metrics.kmsg_records(str(path))
    assert [seq for seq, _m in records] == [1, 2, 3, 4, 5]
    smi = smi_for(tmp_path)
    text, state = gpu_metrics.collect(smi, {}, records=records, boot_id="boot-1")
    found = samples(text)
    assert one(found, "llmops_gpu_xid_errors_total", xid=79) == 2
    assert one(found, "llmops_gpu_xid_errors_total", xid=79, gpu=2,
               uuid="GPU-a9d41f07-3c5e-b826-4e1d-7f0a92c6b3e5", pci_bus_id="0000:86:00") == 2
    assert one(found, "llmops_gpu_xid_errors_total", xid=48, gpu=1) == 1
    # The same buffer read again adds nothing; a new record adds one.
    text, state = gpu_metrics.collect(smi, state, records=records + [(6, XID_48)], boot_id="boot-1")
    assert one(samples(text), "llmops_gpu_xid_errors_total", xid=48) == 2
    # After a reboot the buffer starts again at 1: its messages are new, the counts go on.
    text, state = gpu_metrics.collect(smi, state, records=[(1, XID_79)], boot_id="boot-2")
    assert one(samples(text), "llmops_gpu_xid_errors_total", xid=79) == 3
    assert state["boot_id"] == "boot-2" and state["kmsg_seq"] == 1


def test_main_writes_the_textfile_and_state_atomically(tmp_path):
    out, state_file = tmp_path / "llmops_gpu.prom", tmp_path / "state.json"
    (tmp_path / "kmsg").write_text(kmsg((3, 7, XID_79)))
    (tmp_path / "boot_id").write_text("abc\n")
    smi = smi_for(tmp_path)
    argv = ["--output", str(out), "--state", str(state_file), "--kmsg", str(tmp_path / "kmsg"),
            "--nvidia-smi", SCRIPT, "--boot-id", str(tmp_path / "boot_id")]
    assert gpu_metrics.main(argv, runner=smi.runner) == 0
    assert one(samples(out.read_text()), "llmops_gpu_xid_errors_total", xid=79) == 1
    assert oct(state_file.stat().st_mode & 0o777) == "0o600"
    assert gpu_metrics.main(argv, runner=smi.runner) == 0
    assert one(samples(out.read_text()), "llmops_gpu_xid_errors_total", xid=79) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(SystemExit):
        gpu_metrics.main(["--output", str(out)])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus) is not installed")
def test_the_output_is_valid_prometheus_text(tmp_path):
    overrides = {"gpus": {"2": {"ecc_uncorrected": 1}}}
    text, _state = gpu_metrics.collect(smi_for(tmp_path, state=overrides), {}, records=[(1, XID_79)],
                                       boot_id="b")
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout
