# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_facts with one GPU in a bad state, warnings mixed into nvidia-smi's CSV output and bytes that are not
UTF-8 (GitHub issue 9): the faulty GPU is reported as that GPU's fault, the others are still read."""

import json
import os
import subprocess
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import checks
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.fixtures.fake_nvidia_smi import fake_env
from tests.helpers import ROOT  # noqa: E402
from tests.unit.plugins.module_utils.test_gpu_collect import (
    Script,  # the nvidia-smi call table shared with the collect tests
)

CORPUS = os.path.join(ROOT, "tests", "fixtures", "nvidia_smi_corpus")
MODULE = os.path.join(ROOT, "plugins", "modules", "gpu_facts.py")
COLLECTIONS = os.path.join(ROOT, "collections")

RESET = "a100x4_535_requires_reset_query_nounits.csv"
ERR = "l20x4_550_err_query_nounits.csv"
WARN = "l20x4_550_inforom_warning_query_nounits.csv"
NON_UTF8 = "h100x2_550_non_utf8_query_nounits.csv"


def read(name):
    with open(os.path.join(CORPUS, name), "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def is_query(args):
    return bool(args) and args[0].startswith("--query-gpu=")


def script_for(query_text, rc=0):
    return Script([(is_query, (rc, query_text, "", False)),
                   (lambda a: a == ["--version"], (0, read("l20x4_550_version.txt"), "", False))])


# --------------------------------------------------------------------------- one GPU in a bad state


def test_gpu_requiring_reset_is_reported_and_the_others_are_read(smi):
    facts, kind = gpu.collect(smi, runner=script_for(read(RESET)))
    assert kind == gpu.FAULTY
    assert facts["present"] is True and facts["count"] == 3
    assert [g["index"] for g in facts["gpus"]] == [0, 1, 3]
    assert all(g["state"] == "ok" and g["error"] is None for g in facts["gpus"])
    assert all(g["memory_total_mib"] == 81920 for g in facts["gpus"])
    for needle in ("GPU 2", "00000000:47:00.0", "requires a reset", "nvidia-smi -r -i 2", "reboot"):
        assert needle in facts["error"], needle


def test_err_and_unknown_error_fields_are_that_gpus_fault(smi):
    facts, kind = gpu.collect(smi, runner=script_for(read(ERR)))
    assert kind == gpu.FAULTY and facts["count"] == 3
    assert [g["index"] for g in facts["gpus"]] == [0, 2, 3]
    assert "GPU 1" in facts["error"] and "ERR!" in facts["error"] and "[Unknown Error]" in facts["error"]


@pytest.mark.parametrize("field,value", [
    ("memory.total", "[N/A]"),
    ("memory.free", "[Unknown Error]"),
    ("uuid", "[GPU requires reset]"),
    ("temperature.gpu", "ERR!"),
    ("power.limit", "[GPU is lost]"),
    ("memory.used", "garbage"),
])
def test_any_bad_value_in_a_row_marks_only_that_gpu(smi, field, value):
    """[N/A] in a required field, an NVML error text or an unparsable value: GPU 3 is faulty, 0-2 are read
    (today: the GPU silently loses the value, or every GPU is dropped)."""
    lines = read("l20x4_550_query_nounits.csv").splitlines()
    cells = lines[3].split(", ")
    cells[gpu.QUERY_FIELDS.index(field)] = value
    lines[3] = ", ".join(cells)
    facts, kind = gpu.collect(smi, runner=script_for("\n".join(lines) + "\n"))
    assert kind == gpu.FAULTY, facts["error"]
    assert [g["index"] for g in facts["gpus"]] == [0, 1, 2]
    assert "GPU 3" in facts["error"] and field in facts["error"] and value in facts["error"]


def test_collect_all_returns_the_faulty_gpus_with_their_state(smi):
    out = gpu.collect_all(smi, runner=script_for(read(RESET)))
    faulty = out["faulty"]
    assert [(f["index"], f["state"], f["uuid"], f["pci_bus_id"]) for f in faulty] == [
        (2, "reset_required", "GPU-7b1e04d9-3f6a-c258-94d0-e2a5b8c17f63", "00000000:47:00.0")]
    assert faulty[0]["bad_fields"]["memory.total"] == "[GPU requires reset]"
    assert "nvidia-smi -r -i 2" in faulty[0]["error"]
    assert out["node_error"] is None and out["kind"] == gpu.FAULTY
    assert set(out["facts"]) == set(gpu.empty_facts())


def test_nonzero_exit_with_rows_keeps_the_readable_gpus(smi):
    facts, kind = gpu.collect(smi, runner=script_for(read(RESET), rc=255))
    assert facts["count"] == 3 and kind == gpu.FAULTY


def test_every_gpu_faulty_means_none_present(smi):
    row = read(RESET).splitlines()[2]
    facts, kind = gpu.collect(smi, runner=script_for(row + "\n"))
    assert facts["present"] is False and kind == gpu.FAULTY and "nvidia-smi -r -i 2" in facts["error"]


# --------------------------------------------------------------------------- checks with a faulty GPU


def _collected(smi, name=RESET):
    return gpu.collect_all(smi, runner=script_for(read(name)))


def test_checks_fail_naming_a_faulty_gpu_that_is_wanted(smi):
    out = _collected(smi)
    for devices in ([], ["2"], ["GPU-7b1e04d9-3f6a-c258-94d0-e2a5b8c17f63"], ["0", "2"]):
        selected, failures = checks.evaluate(out["facts"], require_arch=["8.0"], min_memory_mib=80000,
                                          devices=devices, faulty=out["faulty"], node_error=out["node_error"])
        text = "\n".join(failures)
        assert "GPU 2 (NVIDIA A100-SXM4-80GB" in text and "nvidia-smi -r -i 2" in text, devices
        assert "not found" not in text
        assert 2 not in [g["index"] for g in selected]


def test_checks_pass_and_only_warn_when_the_faulty_gpu_is_not_wanted(smi):
    out = _collected(smi)
    selected, failures = checks.evaluate(out["facts"], require_arch=["8.0"], min_memory_mib=80000,
                                      devices=["0", "1", "3"], faulty=out["faulty"],
                                      node_error=out["node_error"])
    assert failures == [] and [g["index"] for g in selected] == [0, 1, 3]
    warnings = checks.faulty_warnings(out["faulty"], devices=["0", "1", "3"])
    assert len(warnings) == 1 and "GPU 2" in warnings[0] and "not in devices" in warnings[0]
    assert checks.faulty_warnings(out["faulty"], devices=["2"]) == []


def test_legacy_evaluate_without_faulty_still_refuses_any_error(smi):
    out = _collected(smi)
    _, failures = checks.evaluate(out["facts"], require_arch=["8.0"])
    assert failures and "GPU 2" in failures[0]


# --------------------------------------------------------------------------- warnings and non-UTF-8 bytes


def test_warning_lines_in_the_csv_are_skipped_and_reported(smi):
    out = gpu.collect_all(smi, runner=script_for(read(WARN)))
    assert out["kind"] is None and out["facts"]["error"] is None and out["facts"]["count"] == 4
    assert out["warnings"] == [
        "nvidia-smi printed a line that is not a GPU row, ignored: "
        "WARNING: infoROM is corrupted at gpu 0000:3B:00.0",
        "nvidia-smi printed a line that is not a GPU row, ignored: "
        "WARNING: infoROM is corrupted at gpu 0000:86:00.0"]


def test_plain_collect_reads_gpus_despite_warnings(smi):
    facts, kind = gpu.collect(smi, runner=script_for(read(WARN)))
    assert kind is None and facts["count"] == 4


def test_output_that_has_no_gpu_row_at_all_is_still_a_parse_failure(smi):
    facts, kind = gpu.collect(smi, runner=script_for("WARNING: infoROM is corrupted at gpu 0000:3B:00.0\n"))
    assert kind == gpu.FAILED and "could not parse nvidia-smi output" in facts["error"]


def test_run_command_decodes_bytes_that_are_not_utf8():
    code = ("import sys; sys.stdout.buffer.write(b'name \\xff\\xfe ok\\r\\n'); "
            "sys.stderr.buffer.write(b'\\xe9')")
    rc, out, err, timed_out = gpu.run_command([sys.executable, "-c", code], 10)
    assert (rc, out, err, timed_out) == (0, "name \ufffd\ufffd ok\n", "\ufffd", False)


def _script_smi(tmp_path, query_file, version_file="l20x4_550_version.txt"):
    """An nvidia-smi that prints corpus files byte for byte."""
    path = tmp_path / "nvidia-smi"
    path.write_text(
        "#!/bin/sh\n"
        "case \"$1\" in\n"
        "  --query-gpu=*) cat '%s' ;;\n"
        "  --version) cat '%s' ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n" % (os.path.join(CORPUS, query_file), os.path.join(CORPUS, version_file)))
    path.chmod(0o755)
    return str(path)


def test_collect_survives_non_utf8_output_of_a_real_process(tmp_path):
    facts, kind = gpu.collect(_script_smi(tmp_path, NON_UTF8))
    assert kind is None and facts["count"] == 2
    assert facts["gpus"][1]["name"] == "NVIDIA H100 80GB HBM3\ufffd\ufffd"
    json.dumps(facts, ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- the module end to end


def run_module(tmp_path, args, query_file):
    args = dict(args, nvidia_smi_path=_script_smi(tmp_path, query_file))
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = fake_env(tmp_path / "etc")
    env["PYTHONPATH"] = COLLECTIONS
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=60, check=False)
    assert b"Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.decode("utf-8"))
    result["_rc"] = proc.returncode
    return result


def test_module_reports_the_faulty_gpu_and_keeps_the_others(tmp_path):
    r = run_module(tmp_path, {}, RESET)
    assert r["_rc"] == 0 and r["error_kind"] == "faulty"
    f = r["ansible_facts"]["llmops_gpus"]
    assert f["count"] == 3 and "nvidia-smi -r -i 2" in f["error"]
    assert [(x["index"], x["state"]) for x in r["faulty_gpus"]] == [(2, "reset_required")]
    assert any("GPU 2" in w for w in r.get("warnings", []))


def test_module_fails_a_check_on_a_wanted_faulty_gpu(tmp_path):
    r = run_module(tmp_path, {"require_arch": ["8.0"]}, RESET)
    assert r["_rc"] == 1 and "GPU 2 (NVIDIA A100-SXM4-80GB" in r["msg"] and "nvidia-smi -r -i 2" in r["msg"]
    r = run_module(tmp_path, {"required": True}, RESET)
    assert r["_rc"] == 1 and "nvidia-smi -r -i 2" in r["msg"]


def test_module_only_warns_about_a_faulty_gpu_outside_devices(tmp_path):
    r = run_module(tmp_path, {"require_arch": ["8.0"], "devices": ["0", "1"], "required": True}, RESET)
    assert r["_rc"] == 0, r.get("msg")
    assert [g["index"] for g in r["selected"]] == [0, 1] and r["failures"] == []
    assert any("GPU 2" in w and "nvidia-smi -r -i 2" in w for w in r["warnings"])


def test_module_warns_about_lines_it_skipped_and_survives_non_utf8(tmp_path):
    r = run_module(tmp_path, {"require_arch": ["9.0"]}, NON_UTF8)
    assert r["_rc"] == 0 and r["ansible_facts"]["llmops_gpus"]["count"] == 2
    assert any("infoROM is corrupted at gpu 0000:2A:00.0" in w for w in r["warnings"])
    r = run_module(tmp_path, {}, WARN)
    assert r["_rc"] == 0 and r["ansible_facts"]["llmops_gpus"]["count"] == 4
    assert sum("infoROM" in w for w in r["warnings"]) == 2
