# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The nvidia-smi parser over every file of tests/fixtures/nvidia_smi_corpus (real nvidia-smi formats)."""

import json
import os
import re

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.helpers import FIXTURES

CORPUS = os.path.join(
    FIXTURES, "nvidia_smi_corpus"
)
with open(os.path.join(CORPUS, "MANIFEST.json")) as _fh:
    MANIFEST = {k: v for k, v in json.load(_fh).items() if not k.startswith("_")}

FALLBACK_FIELDS = [f for f in gpu.QUERY_FIELDS if f != "compute_cap"] + ["pci.device_id"]


def read(name):
    """The file as gpu.run_command hands nvidia-smi output over: UTF-8, undecodable bytes replaced."""
    with open(os.path.join(CORPUS, name), "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def entries(kind):
    return sorted(name for name, meta in MANIFEST.items() if meta["kind"] == kind)


def test_manifest_lists_every_corpus_file_and_nothing_else():
    files = {f for f in os.listdir(CORPUS) if f != "MANIFEST.json"}
    assert files == set(MANIFEST), "unlisted: %s; missing: %s" % (
        files - set(MANIFEST),
        set(MANIFEST) - files,
    )


@pytest.mark.parametrize("name", entries("query"))
def test_query_file_parses_to_the_expected_facts(name):
    meta = MANIFEST[name]
    fields = list(gpu.QUERY_FIELDS) if meta["fields"] == "product" else FALLBACK_FIELDS
    text = read(name)
    # The header line (if any) carries units in brackets, values carry units unless nounits was given.
    assert text.startswith("index, ") == meta["header"]
    assert (" MiB," in text) == meta["units"]
    skipped = []
    rows = gpu.parse_query(text, fields, skipped=skipped)
    facts = gpu.build_facts([gpu.to_gpu(r) for r in rows])
    exp = meta["expect"]
    assert skipped == exp.get("skipped", [])
    assert ("encoding" in meta) == ("\ufffd" in text)
    assert facts["present"] is True
    assert facts["count"] == exp["count"]
    assert sorted({g["name"] for g in facts["gpus"]}) == exp["names"]
    assert facts["compute_caps"] == exp["compute_caps"]
    assert facts["archs"] == exp["archs"]
    assert facts["driver_version"] == exp["driver_version"]
    assert sorted({g["mig_mode"] for g in facts["gpus"]}, key=str) == exp["mig_modes"]
    assert sorted({g["persistence_mode"] for g in facts["gpus"]}) == exp["persistence"]
    assert facts["homogeneous"] is (len(exp["names"]) == 1)
    for g in facts["gpus"]:
        assert isinstance(g["index"], int)
        assert g["uuid"].startswith("GPU-")
        assert re.match(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$", g["pci_bus_id"]), g["pci_bus_id"]
        assert g["cuda_arch"] == g["compute_cap"].replace(".", "")
        for key in ("memory_total_mib", "memory_used_mib", "memory_free_mib", "temperature_c"):
            assert isinstance(g[key], int), key
        assert g["memory_used_mib"] + g["memory_free_mib"] <= g["memory_total_mib"]
        assert isinstance(g["power_limit_w"], float)
        if "memory_total_mib" in exp:
            assert g["memory_total_mib"] == exp["memory_total_mib"]
        if "power_limit_w" in exp:
            assert g["power_limit_w"] == exp["power_limit_w"]


@pytest.mark.parametrize("name", entries("faulty"))
def test_faulty_gpu_rows_are_that_gpus_fault(name):
    exp = MANIFEST[name]["expect"]
    gpus, faulty, skipped = gpu.parse_gpus(read(name), list(gpu.QUERY_FIELDS))
    assert skipped == []
    assert [g["index"] for g in gpus] == exp["healthy"] and len(gpus) == exp["count"]
    assert all(g["state"] == "ok" and g["error"] is None for g in gpus)
    assert {str(f["index"]): f["state"] for f in faulty} == exp["faulty"]
    assert {str(f["index"]): sorted(f["bad_fields"]) for f in faulty} == {
        k: sorted(v) for k, v in exp["bad_fields"].items()}
    for f in faulty:
        assert f["uuid"].startswith("GPU-") and f["name"] and f["pci_bus_id"]
        for needle in exp["message_has"]:
            assert needle in f["error"], needle
    # to_gpu() on such a row says it is faulty instead of raising or inventing values.
    states = [gpu.to_gpu(r)["state"] for r in gpu.parse_query(read(name), list(gpu.QUERY_FIELDS))]
    assert sorted(s for s in states if s != "ok") == sorted(exp["faulty"].values())


def test_units_and_nounits_files_of_the_same_gpus_parse_identically():
    fields = list(gpu.QUERY_FIELDS)
    units = [gpu.to_gpu(r) for r in gpu.parse_query(read("l20x4_550_query_units.csv"), fields)]
    nounits = [gpu.to_gpu(r) for r in gpu.parse_query(read("l20x4_550_query_nounits.csv"), fields)]
    assert units == nounits


def test_header_of_another_query_is_rejected():
    with pytest.raises(ValueError, match="does not match the query"):
        gpu.parse_query(read("l20x4_550_query_units.csv"), ["index", "name"], header=True)


def test_row_with_wrong_column_count_is_rejected():
    with pytest.raises(ValueError, match="13 fields"):
        gpu.parse_query(
            read("old_driver_470_query_fallback_nounits.csv").replace(", 0x1DB510DE", ""),
            list(gpu.QUERY_FIELDS),
        )


def test_old_driver_fallback_takes_compute_cap_from_the_pci_id_table():
    rows = gpu.parse_query(read("old_driver_470_query_fallback_nounits.csv"), FALLBACK_FIELDS)
    caps = {r["name"]: gpu.to_gpu(r)["compute_cap"] for r in rows}
    assert caps == {"Tesla V100-SXM2-32GB": "7.0", "Tesla T4": "7.5"}


@pytest.mark.parametrize("name", entries("banner"))
def test_banner_gives_driver_and_cuda_version(name):
    exp = MANIFEST[name]["expect"]
    text = read(name)
    assert gpu.parse_banner(text) == (exp["driver_version"], exp["cuda_version"])
    # Every line of the tables has the width of that driver generation's layout.
    table = [ln for ln in text.splitlines()[1:] if ln.strip()]
    assert {len(ln) for ln in table} == {exp["width"]}


@pytest.mark.parametrize("name", entries("q") + entries("version"))
def test_q_and_version_give_the_cuda_version(name):
    exp = MANIFEST[name]["expect"]
    driver, cuda = gpu.parse_q(read(name))
    assert cuda == exp["cuda_version"]
    if "driver_version" in exp:
        assert driver == exp["driver_version"]


@pytest.mark.parametrize("name", entries("error"))
def test_error_outputs_are_classified_with_actionable_messages(name):
    meta = MANIFEST[name]
    exp = meta["expect"]
    text = read(name)
    if "invalid_field" in exp:
        assert gpu._INVALID_FIELD_RE.search(text).group("field") == exp["invalid_field"]
        return
    err = gpu.classify_failure(meta["rc"], text)
    assert err is not None
    assert err.kind == exp["error_kind"]
    for needle in exp["message_has"]:
        assert needle in err.message
    if "healthy_rows" in exp:
        rows = gpu.parse_query(text, list(gpu.QUERY_FIELDS))
        assert len(rows) == exp["healthy_rows"]
        assert [int(r["index"]) for r in rows] == [0, 1, 3]
        assert gpu.lost_gpus(text) == [("0000:86:00.0", "Unknown Error")]


def test_a_good_query_output_is_not_a_failure():
    assert gpu.classify_failure(0, read("l20x4_550_query_nounits.csv")) is None
