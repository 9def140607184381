# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/plan/llama_log.py on a real CPU llama-server log and on synthetic two-GPU CUDA lines."""
import os

import pytest

from bench.plan import llama_log
from tests.helpers import FIXTURES

MIB = 1024 * 1024


def _read(name):
    with open(os.path.join(FIXTURES, "llama_logs", name)) as f:
        return f.read()


def mib(x):
    return int(round(x * MIB))


def test_real_cpu_log_qwen35_with_mtp_draft():
    # llama-server (CPU build) -m tiny-qwen35 -c 16384 -np 2 -kvu -ctk q8_0 -ctv q8_0 --spec-type draft-mtp
    # --spec-draft-n-max 3 -ub 128 -lv 4: the fit step's breakdown table precedes the real load and is not
    # counted; the draft context's KV uses the draft cache types (f16 by default).
    r = llama_log.parse(_read("qwen35_mtp_cpu.log"))
    assert list(r["devices"]) == ["CPU"]
    t = r["totals"]
    assert t["weights"] == mib(5.53)
    assert t["output"] == mib(1.16)
    assert t["kv"] == mib(2.12)
    assert t["recurrent"] == mib(0.45)
    assert t["compute"] == mib(4.70)
    assert t["draft_output"] == mib(1.16)
    assert t["draft_kv"] == mib(4.00)
    assert t["draft_recurrent"] == 0
    # reserved twice (4.32, then 4.32 again after backend sampling is set up): counted once
    assert t["draft_compute"] == mib(4.32)
    assert t["total"] == sum(mib(x) for x in (5.53, 1.16, 2.12, 0.45, 4.70, 1.16, 4.00, 4.32))
    assert r["devices"]["CPU"] == t

    main, draft = r["contexts"]
    assert main["role"] == "main" and draft["role"] == "draft"
    assert main["params"]["n_ctx"] == 16384 and main["params"]["n_ubatch"] == 128
    assert main["params"]["n_rs_seq"] == 3 and draft["params"]["n_rs_seq"] == 0
    assert main["kv"] == {"bytes": mib(2.12), "cells": 16384, "layers": 1, "seqs": 2, "streams": 1,
                          "type_k": "q8_0", "type_v": "q8_0"}
    assert draft["kv"]["type_k"] == "f16" and draft["kv"]["layers"] == 1
    assert main["recurrent"] == {"bytes": mib(0.45), "cells": 2, "layers": 4, "seqs": 2, "rs_seq": 3}
    assert draft["recurrent"] == {}
    assert [b[1:3] for b in r["buffers"]] == [
        ("weights", "CPU_Mapped"), ("output", "CPU"), ("kv", "CPU"), ("recurrent", "CPU"), ("compute", "CPU"),
        ("draft_output", "CPU"), ("draft_kv", "CPU"), ("draft_compute", "CPU")]
    assert llama_log.allocated(_read("qwen35_mtp_cpu.log"))


def test_synthetic_two_cuda_devices_and_pinned_host():
    r = llama_log.parse(_read("synthetic_two_cuda.log"))
    d = r["devices"]
    assert sorted(d) == ["CPU", "CUDA0", "CUDA1"]
    assert d["CPU"]["weights"] == mib(1237.50)
    assert d["CUDA0"]["weights"] == mib(8960.25)
    assert d["CUDA1"]["weights"] == mib(9120.75)
    # output buffers are pinned host memory (CUDA_Host): host, not a GPU
    assert d["CPU"]["output"] == mib(7.58) and d["CPU"]["draft_output"] == mib(1.89)
    assert d["CUDA0"]["output"] == 0
    assert d["CUDA0"]["kv"] == d["CUDA1"]["kv"] == mib(4352.00)
    assert d["CUDA0"]["recurrent"] == d["CUDA1"]["recurrent"] == mib(598.50)
    assert d["CUDA0"]["compute"] == mib(500.13) and d["CUDA1"]["compute"] == mib(682.27)
    assert d["CPU"]["compute"] == mib(259.02)
    # the draft (MTP) layer sits on the last GPU only
    assert d["CUDA0"]["draft_kv"] == 0 and d["CUDA1"]["draft_kv"] == mib(544.00)
    # draft compute reserved twice: the larger size per device counts (CUDA1 310.50, host stays 10.00)
    assert d["CUDA1"]["draft_compute"] == mib(310.50)
    assert d["CPU"]["draft_compute"] == mib(10.00)
    assert d["CUDA1"]["total"] == sum(mib(x) for x in (9120.75, 4352.00, 598.50, 682.27, 544.00, 310.50))
    assert r["totals"]["total"] == sum(dev["total"] for dev in d.values())
    assert r["contexts"][0]["kv"]["cells"] == 262144 and r["contexts"][0]["recurrent"]["rs_seq"] == 3
    assert r["contexts"][1]["role"] == "draft"


@pytest.mark.parametrize("name,device", [
    ("CPU", "CPU"), ("CPU_Mapped", "CPU"), ("CPU_REPACK", "CPU"), ("CUDA_Host", "CPU"),
    ("CUDA0", "CUDA0"), ("CUDA1", "CUDA1"), ("CUDA0_Split", "CUDA0"), ("ROCm1", "ROCm1")])
def test_device_of_buffer_names(name, device):
    assert llama_log.device_of(name) == device


def test_second_context_without_mtp_line_is_a_draft_and_noise_is_ignored():
    text = "\n".join([
        "load_tensors:          CPU model buffer size =    10.00 MiB",
        "sched_reserve:        CPU compute buffer size =     9.00 MiB",  # before any context: ignored
        "llama_context: constructing llama_context",
        "llama_kv_cache:        CPU KV buffer size =     1.00 MiB",
        "some other line: CPU KV buffer size = 99 MiB",
        "load_tensors:          CPU model buffer size =     2.50 MiB",  # the draft model's weights
        "llama_context: constructing llama_context",
        "llama_kv_cache:        CPU KV buffer size =     0.50 MiB",
    ])
    t = llama_log.parse(text)["totals"]
    assert (t["weights"], t["kv"], t["draft_kv"], t["compute"]) == (mib(12.5), mib(1), mib(0.5), 0)
    assert not llama_log.allocated(text)
