# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""collect(): running nvidia-smi, fallbacks and every failure (scripted runner and real processes)."""

import os
import sys
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.helpers import FIXTURES

CORPUS = os.path.join(
    FIXTURES, "nvidia_smi_corpus"
)


def read(name):
    with open(os.path.join(CORPUS, name)) as fh:
        return fh.read()


class Script(object):
    """A runner answering nvidia-smi calls from a table: (predicate on args) -> (rc, out, err, timed_out)."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, argv, timeout):
        args = argv[1:]
        self.calls.append(args)
        for match, answer in self.answers:
            if match(args):
                return answer
        raise AssertionError("unexpected nvidia-smi call %r" % (args,))


def is_query(with_field=None, without_field=None):
    def match(args):
        if not args or not args[0].startswith("--query-gpu="):
            return False
        fields = args[0].split("=", 1)[1].split(",")
        return (with_field is None or with_field in fields) and (
            without_field is None or without_field not in fields
        )

    return match


def is_args(*expected):
    return lambda args: list(args) == list(expected)


def ok(text):
    return (0, text, "", False)


def test_reads_gpus_and_cuda_from_version(smi):
    runner = Script(
        [
            (is_query(), ok(read("l20x4_550_query_nounits.csv"))),
            (is_args("--version"), ok(read("l20x4_550_version.txt"))),
        ]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind is None and facts["error"] is None
    assert facts["count"] == 4 and facts["cuda_version"] == "12.4" and facts["driver_version"] == "550.54.14"
    assert runner.calls[0] == ["--query-gpu=" + ",".join(gpu.QUERY_FIELDS), "--format=csv,noheader,nounits"]
    assert len(runner.calls) == 2


def test_cuda_from_banner_when_version_flag_is_unknown(smi):
    runner = Script(
        [
            (is_query(), ok(read("t4_535_query_nounits.csv"))),
            (is_args("--version"), (2, "Invalid combination of input arguments.", "", False)),
            (is_args(), ok(read("t4_535_banner.txt"))),
        ]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind is None and facts["cuda_version"] == "12.2"
    assert runner.calls[1:] == [["--version"], []]


def test_cuda_from_q_when_banner_has_none(smi):
    runner = Script(
        [
            (is_query(), ok(read("h100_80gb_hbm3_550_query_nounits.csv"))),
            (is_args("--version"), (2, "", "", False)),
            (is_args(), ok("something without a version table\n")),
            (is_args("-q"), ok(read("h100_80gb_hbm3_550_q.txt"))),
        ]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert facts["cuda_version"] == "12.4" and facts["compute_caps"] == ["9.0"]
    assert runner.calls[-1] == ["-q"]


def test_old_driver_requery_without_compute_cap(smi):
    runner = Script(
        [
            (is_query(with_field="compute_cap"), (2, read("old_driver_470_query_rejected.txt"), "", False)),
            (is_query(without_field="compute_cap"), ok(read("old_driver_470_query_fallback_nounits.csv"))),
            (is_args("--version"), (2, "", "", False)),
            (is_args(), ok(read("old_driver_470_banner.txt"))),
        ]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind is None
    assert facts["compute_caps"] == ["7.0", "7.5"] and facts["archs"] == ["70", "75"]
    assert facts["cuda_version"] == "11.4" and facts["driver_version"] == "470.182.03"
    retry = runner.calls[1][0]
    assert "compute_cap" not in retry and retry.endswith(",pci.device_id")


def test_unknown_field_that_is_not_optional_is_a_clear_failure(smi):
    runner = Script([(is_query(), (2, 'Field "uuid" is not a valid field to query.\n\n', "", False))])
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind == gpu.FAILED and facts["present"] is False
    assert "rejected the query field 'uuid'" in facts["error"]


@pytest.mark.parametrize(
    "name,rc,kind",
    [
        ("error_mismatch.txt", 18, gpu.MISMATCH),
        ("error_no_devices.txt", 6, gpu.NO_DEVICES),
        ("error_no_driver.txt", 9, gpu.NO_DRIVER),
        ("error_fallen_off_bus_banner.txt", 15, gpu.LOST),
        ("error_nvml_unknown.txt", 255, gpu.FAILED),
    ],
)
def test_query_failures_leave_no_gpus_and_a_reason(smi, name, rc, kind):
    runner = Script([(is_query(), (rc, read(name), "", False))])
    facts, got = gpu.collect(smi, runner=runner)
    assert got == kind
    assert facts == dict(gpu.empty_facts(facts["error"]))
    assert facts["error"]
    assert len(runner.calls) == 1


def test_mismatch_names_the_loaded_kernel_module(smi, tmp_path):
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
        "GCC version:  gcc version 4.8.5 20150623 (Red Hat 4.8.5-44) (GCC)\n"
    )
    runner = Script([(is_query(), (18, read("error_mismatch.txt"), "", False))])
    facts, kind = gpu.collect(smi, runner=runner, proc_version_path=str(proc))
    assert kind == gpu.MISMATCH
    assert "user-space NVML library 550.127" in facts["error"]
    assert "Loaded kernel module: 550.54.14." in facts["error"]
    assert "Reboot the node" in facts["error"]


def test_fallen_gpu_keeps_the_healthy_ones_and_reports_the_lost_one(smi):
    runner = Script(
        [
            (is_query(), (15, read("error_fallen_off_bus_query.txt"), "", False)),
            (is_args("--version"), ok(read("l20x4_550_version.txt"))),
        ]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind == gpu.LOST
    assert facts["present"] is True and facts["count"] == 3
    assert [g["index"] for g in facts["gpus"]] == [0, 1, 3]
    assert "0000:86:00.0" in facts["error"] and "3 other GPU(s) still answer" in facts["error"]
    assert facts["cuda_version"] == "12.4"


def test_lost_line_on_stderr_is_seen_too(smi):
    lines = read("error_fallen_off_bus_query.txt").splitlines()
    out = "\n".join(ln for ln in lines if not ln.startswith("Unable")) + "\n"
    err = "\n".join(ln for ln in lines if ln.startswith("Unable")) + "\n"
    runner = Script(
        [(is_query(), (15, out, err, False)), (is_args("--version"), ok(read("l20x4_550_version.txt")))]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind == gpu.LOST and facts["count"] == 3


def test_timeout_is_a_clear_error(smi):
    runner = Script([(is_query(), (-9, "", "", True))])
    facts, kind = gpu.collect(smi, timeout=7, runner=runner)
    assert kind == gpu.TIMEOUT
    assert "did not answer within 7 s and was killed" in facts["error"] and "dmesg" in facts["error"]


def test_timeout_of_the_cuda_lookup_keeps_the_gpus(smi):
    runner = Script(
        [(is_query(), ok(read("l20x4_550_query_nounits.csv"))), (is_args("--version"), (-9, "", "", True))]
    )
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind == gpu.TIMEOUT and facts["count"] == 4 and facts["cuda_version"] == ""


def test_garbage_output_is_reported_not_raised(smi):
    runner = Script([(is_query(), ok("this is not csv\n"))])
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind == gpu.FAILED and "could not parse nvidia-smi output" in facts["error"]


def test_empty_output_means_no_devices(smi):
    runner = Script([(is_query(), ok(""))])
    facts, kind = gpu.collect(smi, runner=runner)
    assert kind == gpu.NO_DEVICES and facts["present"] is False


def test_absent_nvidia_smi(tmp_path):
    facts, kind = gpu.collect(env_path=str(tmp_path), extra_dirs=(), runner=Script([]))
    assert kind == gpu.ABSENT and facts["present"] is False
    assert "not installed" in facts["error"]


def test_nvidia_smi_found_in_path(tmp_path, smi):
    assert gpu.find_nvidia_smi(env_path=os.path.dirname(smi), extra_dirs=()) == smi
    assert gpu.find_nvidia_smi(env_path=str(tmp_path / "nope"), extra_dirs=(os.path.dirname(smi),)) == smi


def test_wrong_explicit_path_is_a_configuration_error(tmp_path):
    with pytest.raises(gpu.GpuError, match="is not an executable file"):
        gpu.collect(str(tmp_path / "missing-nvidia-smi"))


def _alive(pid):
    try:
        with open("/proc/%d/status" % pid) as fh:
            return "\nState:\tZ" not in fh.read()
    except (IOError, OSError):
        return False


def test_run_command_kills_a_hanging_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "open(%r, 'w').write(str(p.pid)); time.sleep(60)" % str(pidfile)
    )
    start = time.time()
    rc, out, err, timed_out = gpu.run_command([sys.executable, "-c", code], 1)
    assert timed_out is True
    assert time.time() - start < 4
    pid = int(pidfile.read_text())
    deadline = time.time() + 3
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the grandchild of a timed-out nvidia-smi survived"


def test_run_command_returns_output_and_code():
    rc, out, err, timed_out = gpu.run_command(
        [sys.executable, "-c", "import sys; print('out'); sys.stderr.write('err'); sys.exit(3)"], 10
    )
    assert (rc, out, err, timed_out) == (3, "out\n", "err", False)
