# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake nvidia-smi behaves like the real tool for everything the product asks it."""

import itertools
import json
import os
import shutil
import subprocess
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.fixtures.fake_nvidia_smi import EXIT_CODES, PROFILES, SCRIPT, fake_env
from tests.helpers import FIXTURES

CORPUS = os.path.join(
    FIXTURES, "nvidia_smi_corpus"
)
PRODUCT_QUERY = "--query-gpu=" + ",".join(gpu.QUERY_FIELDS)
PY36 = shutil.which("python3.6") and os.path.realpath(shutil.which("python3.6"))
PY36_REAL = os.path.expanduser("~/.pyenv/versions/3.6.15/bin/python3.6")


def run(tmp_path, *args, profile=None, state=None, timeout=20, python=None, log=None):
    env = fake_env(tmp_path / "etc", profile=profile, state=state, log=log)
    argv = ([python, SCRIPT] if python else [SCRIPT]) + list(args)
    proc = subprocess.run(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        timeout=timeout,
        universal_newlines=True,
    )
    return proc.returncode, proc.stdout, proc.stderr


def corpus(name):
    with open(os.path.join(CORPUS, name)) as fh:
        return fh.read()


def test_script_is_executable_with_a_python3_shebang():
    assert os.access(SCRIPT, os.X_OK)
    with open(SCRIPT) as fh:
        assert fh.readline().strip() == "#!/usr/bin/env python3"


def test_default_profile_is_the_l20_box_and_matches_the_corpus(tmp_path):
    rc, out, _ = run(tmp_path, PRODUCT_QUERY, "--format=csv,noheader,nounits")
    assert rc == 0 and out == corpus("l20x4_550_query_nounits.csv")
    rc, out, _ = run(tmp_path, PRODUCT_QUERY, "--format=csv")
    assert rc == 0 and out == corpus("l20x4_550_query_units.csv")
    rc, out, _ = run(tmp_path)
    assert rc == 0
    # Same table as the corpus banner, apart from the timestamp line.
    assert out.splitlines()[1:] == corpus("l20x4_550_banner.txt").splitlines()[1:]
    rc, out, _ = run(tmp_path, "--version")
    assert rc == 0 and out == corpus("l20x4_550_version.txt")


def test_profile_from_file_and_env_wins(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "profile").write_text("h200\nignored second line\n")
    rc, out, _ = run(tmp_path, "-L")
    assert rc == 0 and out.startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    rc, out, _ = run(tmp_path, "-L", profile="old_driver")
    assert out.count("Tesla V100-PCIE-32GB") == 2


def test_unknown_profile_is_refused(tmp_path):
    rc, out, err = run(tmp_path, "-L", profile="a100x8")
    assert rc == 255 and "unknown profile 'a100x8'" in err and "l20x4" in err


@pytest.mark.parametrize("profile", [p for p in PROFILES if p != "hang"])
def test_every_profile_exit_code_for_the_product_query(tmp_path, profile):
    rc, out, err = run(tmp_path, PRODUCT_QUERY, "--format=csv,noheader,nounits", profile=profile)
    if profile == "old_driver":
        assert rc == 2 and out == 'Field "compute_cap" is not a valid field to query.\n\n'
    else:
        assert rc == EXIT_CODES[profile]


def test_mismatch_nodevices_and_fallen_outputs(tmp_path):
    assert run(tmp_path, profile="mismatch") == (
        18,
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.127\n",
        "",
    )
    assert run(tmp_path, "-L", profile="nodevices") == (6, "No devices were found\n", "")
    rc, out, _ = run(tmp_path, profile="fallen")
    assert (rc, out) == (15, "Unable to determine the device handle for GPU0000:86:00.0: Unknown Error\n")
    rc, out, _ = run(tmp_path, PRODUCT_QUERY, "--format=csv,noheader,nounits", profile="fallen")
    assert rc == 15 and out == corpus("error_fallen_off_bus_query.txt")
    rc, out, _ = run(tmp_path, "-L", profile="fallen")
    assert rc == 15 and out.count("GPU ") == 3 and "device handle for GPU0000:86:00.0" in out
    # A healthy GPU can still be queried on its own.
    assert run(tmp_path, "-q", "-i", "0", profile="fallen")[0] == 0


def test_state_file_makes_one_gpu_lost_as_the_real_tool_reports_it(tmp_path):
    """state.json {"gpus": {"1": {"lost": true}}}: GPU 1 answers as R535+ reports a GPU fallen off the bus,
    and gpu_facts' parser reads it as lost while the other GPUs are still read; false leaves it healthy."""
    state = {"gpus": {"1": {"lost": True}}}
    line = ("Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to "
            "recover this GPU")
    rc, out, _ = run(tmp_path, PRODUCT_QUERY, "--format=csv,noheader,nounits", state=state)
    assert rc == 15 and line.lower() in out.lower()
    gpus, faulty, _skipped = gpu.parse_gpus(out, list(gpu.QUERY_FIELDS), header=False)
    assert [g["index"] for g in gpus] == [0, 2, 3] and faulty == []
    reason = "GPU is lost.  Reboot the system to recover this GPU"
    assert [why for _bus, why in gpu.lost_gpus(out)] == [reason]
    rc, out, _ = run(tmp_path, "-i", "1", "--query-gpu=index", "--format=csv,noheader", state=state)
    assert rc == 15 and "GPU is lost" in out
    healthy = run(tmp_path, "-i", "0", "--query-gpu=index", "--format=csv,noheader", state=state)
    assert healthy[:2] == (0, "0\n")
    rc, out, _ = run(tmp_path, state=state)
    assert rc == 15 and "GPU is lost" in out
    rc, out, _ = run(tmp_path, "-L", state=state)
    assert rc == 15 and out.count("GPU ") == 4 and "GPU is lost" in out
    rc, out, _ = run(tmp_path, PRODUCT_QUERY, "--format=csv,noheader,nounits",
                     state={"gpus": {"1": {"lost": False}}})
    assert rc == 0 and "lost" not in out


def test_hang_never_answers(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run(tmp_path, PRODUCT_QUERY, "--format=csv", profile="hang", timeout=1.5)


def test_old_driver_rejects_new_fields_but_answers_the_fallback(tmp_path):
    for field in ("compute_cap", "memory.reserved"):
        assert run(tmp_path, "--query-gpu=index," + field, "--format=csv", profile="old_driver") == (
            2,
            'Field "%s" is not a valid field to query.\n\n' % field,
            "",
        )
    rc, out, _ = run(
        tmp_path,
        "--query-gpu=index,name,pci.device_id,mig.mode.current",
        "--format=csv,noheader",
        profile="old_driver",
    )
    assert rc == 0 and out.splitlines()[0] == "0, Tesla V100-PCIE-32GB, 0x1DB610DE, [N/A]"
    rc, out, _ = run(tmp_path, profile="old_driver")
    assert (
        rc == 0 and "| NVIDIA-SMI 470.182.03   Driver Version: 470.182.03   CUDA Version: 11.4     |" in out
    )
    assert run(tmp_path, "--version", profile="old_driver")[0] == 2


@pytest.mark.parametrize("bad", ["id", "gpu_index", "memory", "compute_capability", ""])
def test_unknown_fields_are_rejected_like_the_real_tool(tmp_path, bad):
    rc, out, err = run(tmp_path, "--query-gpu=index,%s,name" % bad, "--format=csv")
    assert (rc, out, err) == (2, 'Field "%s" is not a valid field to query.\n\n' % bad, "")


def test_any_field_order_gives_the_same_values(tmp_path):
    fields = ["index", "uuid", "memory.total", "compute_cap", "power.limit", "mig.mode.current"]
    rc, out, _ = run(tmp_path, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")
    reference = [dict(zip(fields, ln.split(", "))) for ln in out.splitlines()]  # noqa: B905
    for order in list(itertools.permutations(fields))[::97]:
        rc, out, _ = run(tmp_path, "--query-gpu=" + ",".join(order), "--format=csv,noheader,nounits")
        assert rc == 0
        assert [dict(zip(order, ln.split(", "))) for ln in out.splitlines()] == reference  # noqa: B905


def test_aliases_answer_like_their_field(tmp_path):
    rc, out, _ = run(tmp_path, "--query-gpu=gpu_name,gpu_uuid,gpu_bus_id,name", "--format=csv", "-i", "1")
    header, row = out.splitlines()
    assert header == "gpu_name, gpu_uuid, gpu_bus_id, name"
    assert row == "NVIDIA L20, GPU-0e6a9b42-17cd-4f0b-a5e3-9d8c7b6a5f41, 00000000:3B:00.0, NVIDIA L20"


def test_units_follow_the_format_options(tmp_path):
    q = "--query-gpu=memory.total,power.limit,temperature.gpu,utilization.gpu,fan.speed"
    _, units, _ = run(tmp_path, q, "--format=csv", "-i", "0")
    _, nounits, _ = run(tmp_path, q, "--format=csv,nounits", "-i", "0")
    _, bare, _ = run(tmp_path, q, "--format=csv,noheader,nounits", "-i", "0")
    header = "memory.total [MiB], power.limit [W], temperature.gpu, utilization.gpu [%], fan.speed [%]"
    assert units == header + "\n46068 MiB, 350.00 W, 29, 0 %, [N/A]\n"
    assert nounits == header + "\n46068, 350.00, 29, 0, [N/A]\n"
    assert bare == "46068, 350.00, 29, 0, [N/A]\n"


def test_format_is_validated(tmp_path):
    assert run(tmp_path, "--query-gpu=index")[0] == 2
    assert run(tmp_path, "--query-gpu=index", "--format=json")[0] == 2
    assert run(tmp_path, "--bogus")[0] == 2


def test_device_selection(tmp_path):
    rc, out, _ = run(tmp_path, "--query-gpu=index", "--format=csv,noheader", "-i", "3,1")
    assert (rc, out) == (0, "3\n1\n")
    uuid = "GPU-7c2e5d18-94b3-0fa6-d1c8-3e5b7a9f2d06"
    assert run(tmp_path, "--query-gpu=index", "--format=csv,noheader", "--id=" + uuid)[1] == "3\n"
    assert run(tmp_path, "--query-gpu=index", "--format=csv,noheader", "-i", "9") == (
        6,
        "No devices were found\n",
        "",
    )


def test_q_report_has_driver_cuda_and_each_gpu(tmp_path):
    rc, out, _ = run(tmp_path, "-q")
    assert rc == 0
    assert gpu.parse_q(out) == ("550.54.14", "12.4")
    assert out.count("    Product Name                          : NVIDIA L20") == 4
    assert "        Device Id                         : 0x26BA10DE" in out
    assert "        Total                             : 46068 MiB" in out


@pytest.mark.parametrize(
    "profile,driver,width",
    [("l20x4", "550.54.14", 91), ("h200", "570.172.08", 91), ("old_driver", "470.182.03", 79)],
)
def test_banner_layout_per_driver_generation(tmp_path, profile, driver, width):
    rc, out, _ = run(tmp_path, profile=profile)
    lines = out.splitlines()
    assert {len(ln) for ln in lines[1:] if ln.strip()} == {width}
    assert gpu.parse_banner(out)[0] == driver


def test_state_json_overrides_driver_and_gpus(tmp_path):
    state = {
        "driver_version": "535.161.08",
        "cuda_version": "12.2",
        "gpu_count": 2,
        "gpus": {"1": {"memory_used": 30000, "temperature": 61}},
    }
    rc, out, _ = run(
        tmp_path,
        "--query-gpu=index,driver_version,memory.used,memory.free,temperature.gpu",
        "--format=csv,noheader,nounits",
        state=state,
    )
    assert (rc, out) == (0, "0, 535.161.08, 1, 45596, 29\n1, 535.161.08, 30000, 15597, 61\n")
    rc, out, _ = run(tmp_path, state=state)
    lines = out.splitlines()
    assert {len(ln) for ln in lines[1:] if ln.strip()} == {89}  # the R535 layout
    assert gpu.parse_banner(out) == ("535.161.08", "12.2")


@pytest.mark.parametrize(
    "state,needle",
    [
        ({"driver": "1"}, "unknown key 'driver'"),
        ({"gpus": {"7": {"memory_used": 1}}}, "names GPU 7"),
        ({"gpus": {"0": {"vram": 1}}}, "unknown GPU key 'vram'"),
    ],
)
def test_bad_state_json_is_refused(tmp_path, state, needle):
    rc, out, err = run(tmp_path, "-L", state=state)
    assert rc == 255 and needle in err


def test_invocations_can_be_logged(tmp_path):
    log = tmp_path / "calls.log"
    run(tmp_path, "-L", log=log)
    run(tmp_path, "--query-gpu=index", "--format=csv", log=log)
    assert [json.loads(ln) for ln in log.read_text().splitlines()] == [
        ["-L"],
        ["--query-gpu=index", "--format=csv"],
    ]


@pytest.mark.skipif(not os.path.exists(PY36_REAL), reason="python3.6 not installed")
def test_runs_under_python36(tmp_path):
    rc, out, err = run(tmp_path, PRODUCT_QUERY, "--format=csv,noheader,nounits", python=PY36_REAL)
    assert (rc, err) == (0, "") and out == corpus("l20x4_550_query_nounits.csv")
    rc, out, err = run(tmp_path, "-q", profile="h200", python=PY36_REAL)
    assert rc == 0 and gpu.parse_q(out) == ("570.172.08", "12.8")


def test_runs_under_the_test_interpreter(tmp_path):
    rc, out, _ = run(tmp_path, "-L", python=sys.executable)
    assert rc == 0 and out.count("NVIDIA L20") == 4
