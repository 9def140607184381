# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The arithmetic of the preflight disk check (plugins/module_utils/_files/disk_plan.py), on made-up
filesystems."""

import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._files import disk_plan as dp

GIB = 1024 ** 3
TIB = 1024 ** 4
ROOT_FS = {"mount": "/", "free": int(12.3 * GIB), "total": 50 * GIB, "device": 1}
HOME_FS = {"mount": "/home", "free": int(2.4 * TIB), "total": int(2.5 * TIB), "device": 2}
MODEL = {"path": "/var/lib/models/qwen", "bytes": int(19.0 * GIB), "what": "model qwen3.6-27b",
         "variable": "model_dir"}
BUILD = {"path": "/var/cache/llmops/llama.cpp", "bytes": 4 * GIB, "what": "llama.cpp build",
         "variable": "llama_cpp_build_root"}
IMAGES = {"path": "/var/lib/docker", "bytes": 8 * GIB, "what": "CUDA and llama.cpp images",
          "variable": "nvidia_container_toolkit_docker_data_root"}


def filesystems(*writes):
    fss = {w["path"]: (HOME_FS if w["path"].startswith("/home") else ROOT_FS) for w in writes}
    fss["/home"] = HOME_FS
    return fss


@pytest.mark.parametrize("value,size", [(123, 123), ("10G", 10 * 1000 ** 3), ("10GiB", 10 * GIB),
                                        ("3.5 GiB", int(3.5 * GIB)), ("500M", 500 * 1000 ** 2), ("1Ti", TIB)])
def test_sizes(value, size):
    assert dp.parse_size(value) == size


def test_a_bad_size_says_how_to_write_one():
    with pytest.raises(dp.DiskError, match="K, M, G, T"):
        dp.parse_size("lots")


@pytest.mark.parametrize("size,text", [(12.3 * GIB, "12.3 GiB"), (2.4 * TIB, "2.4 TiB"), (512, "512 B"),
                                       (31 * GIB, "31.0 GiB")])
def test_human(size, text):
    assert dp.human(size) == text


def test_the_root_filesystem_is_refused_with_the_numbers_and_where_to_move():
    writes = dp.normal_writes([MODEL, BUILD, IMAGES])
    result = dp.plan(writes, filesystems(MODEL, BUILD, IMAGES), candidates=["/home"])
    assert [g["mount"] for g in result["short"]] == ["/"]
    (message,) = result["messages"]
    assert message == (
        "/ has 12.3 GiB free, the run writes ~31.0 GiB there: "
        "model qwen3.6-27b ~19.0 GiB (/var/lib/models/qwen), "
        "CUDA and llama.cpp images ~8.0 GiB (/var/lib/docker), llama.cpp build ~4.0 GiB "
        "(/var/cache/llmops/llama.cpp); set llama_cpp_build_root, model_dir, "
        "nvidia_container_toolkit_docker_data_root to a path on /home (2.4 TiB free)")


def test_writes_on_home_fit_and_each_filesystem_is_counted_apart():
    home = dict(MODEL, path="/home/models/qwen")
    writes = dp.normal_writes([home, BUILD])
    result = dp.plan(writes, filesystems(home, BUILD), reserve=2 * GIB, candidates=["/home"])
    assert result["short"] == [] and result["messages"] == []
    assert dp.report(result) == ["/: 12.3 GiB free, the run writes ~4.0 GiB (llama.cpp)",
                                 "/home: 2.4 TiB free, the run writes ~19.0 GiB (model)"]


def test_the_reserve_counts():
    writes = dp.normal_writes([dict(BUILD, bytes=11 * GIB)])
    assert dp.plan(writes, filesystems(BUILD))["short"] == []
    (message,) = dp.plan(writes, filesystems(BUILD), reserve=2 * GIB)["messages"]
    assert "(and 2.0 GiB must stay free)" in message


def test_no_candidate_with_room_says_to_free_space():
    writes = dp.normal_writes([MODEL])
    (message,) = dp.plan(writes, {MODEL["path"]: ROOT_FS}, candidates=[])["messages"]
    assert message.endswith("; free space on /, or set model_dir to a path on a larger filesystem")


def test_sizes_as_text_and_bad_writes():
    (write,) = dp.normal_writes([{"path": "/var/cache/ccache", "size": "10G", "what": "ccache"}])
    assert write["bytes"] == 10 * 1000 ** 3 and write["variable"] == ""
    with pytest.raises(dp.DiskError, match="absolute"):
        dp.normal_writes([{"path": "models", "bytes": 1, "what": "model"}])
    with pytest.raises(dp.DiskError, match="needs path, what"):
        dp.normal_writes([{"path": "/x"}])


def test_a_path_not_made_yet_is_on_its_nearest_existing_parent(tmp_path):
    target = tmp_path / "not" / "made" / "yet"
    assert dp.existing_ancestor(str(target)) == str(tmp_path)
    fs = dp.filesystem(str(target))
    assert fs["free"] > 0 and fs["mount"] == dp.mount_point(str(tmp_path))
    assert os.path.ismount(fs["mount"]) or fs["mount"] == "/"


def test_a_write_whose_target_exists_is_left_out_in_the_same_call(tmp_path):
    build = tmp_path / "current"
    writes = dp.normal_writes([
        {"path": "/srv/build", "bytes": 10, "what": "llama.cpp build", "unless_exists": str(build)},
        {"path": "/srv/models", "bytes": 20, "what": "model"}])
    counted, present = dp.split_present(writes)
    assert [w["what"] for w in counted] == ["llama.cpp build", "model"] and present == []
    build.mkdir()
    counted, present = dp.split_present(writes)
    assert [w["what"] for w in counted] == ["model"] and present == ["llama.cpp build"]
    with pytest.raises(dp.DiskError, match="unless_exists 'relative/path' must be absolute"):
        dp.normal_writes([{"path": "/srv", "bytes": 1, "what": "x", "unless_exists": "relative/path"}])


@pytest.mark.parametrize("value,why", [
    (float("nan"), "is not a number of bytes"), (float("inf"), "is not a number of bytes"),
    (10 ** 400, "is over 8 EiB"), ("9" * 400, "is over 8 EiB"), ("9999999T", "is over 8 EiB"),
    (2 ** 63, "is over 8 EiB"),
])
def test_nan_infinite_and_huge_sizes_are_refused(value, why):
    with pytest.raises(dp.DiskError, match=why):
        dp.parse_size(value)


def test_the_largest_file_size_is_a_size():
    assert dp.parse_size(2 ** 63 - 1) == 2 ** 63 - 1 and dp.parse_size("8Ti") == 8 * TIB


def test_the_module_refuses_nan_inf_and_huge_bytes_with_a_message(tmp_path):
    from tests.helpers import run_module_file
    for size in (float("nan"), float("inf"), 10 ** 400):
        out = run_module_file(tmp_path, "disk_space_info",
                              {"writes": [{"path": str(tmp_path / "m"), "bytes": size, "what": "model"}]})
        assert out["failed"] is True and out["msg"].startswith("size "), out
        assert "Error" not in out["msg"], out  # not "disk_space_info failed: ValueError: ..."
    out = run_module_file(tmp_path, "disk_space_info", {"reserve": "9" * 400})
    assert out["failed"] is True and "is over 8 EiB, more than any file or disk holds" in out["msg"], out
