# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""wheel_tags: can a node install a wheel? The tags and Requires-Python of the pinned vLLM wheel against the
nodes this collection supports (CentOS 7.9, EL 8/9, Debian 12, Ubuntu), without Ansible."""

import os
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._software.wheel_tags import (
    WheelTagError,
    check,
    expand_tags,
    glibc_version,
    parse_wheel_filename,
    platform_needs,
    probe_python,
    python_tag_problem,
    requires_python_from_wheel,
    unmet_requires_python,
)

from tests.fixtures.fake_vllm import build_wheel
from tests.helpers import ROOT

PINNED = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
PINNED_TAGS = ["cp38-abi3-manylinux_2_28_x86_64"]
PINNED_REQUIRES = ">=3.11,<3.15"
CACHED_WHEEL = os.path.join(ROOT, ".cache", "vllm-0.33.0", PINNED)


def cpython(*version):
    return {"executable": "/usr/bin/python3", "implementation": "cpython", "version": list(version)}


def node(glibc, python, machine="x86_64"):
    return {"glibc": glibc, "machine": machine, "python": python}


def test_the_pinned_wheel_name_gives_version_and_tags():
    assert parse_wheel_filename("/srv/" + PINNED) == {
        "name": "vllm",
        "version": "0.33.0",
        "tags": PINNED_TAGS,
    }
    assert parse_wheel_filename("x-1.0-7-py2.py3-none-any.whl")["tags"] == ["py2-none-any", "py3-none-any"]
    for bad in ("vllm-0.33.0.tar.gz", "vllm-cp38-abi3.whl"):
        with pytest.raises(WheelTagError):
            parse_wheel_filename(bad)


def test_compressed_tag_sets_expand_to_triples():
    assert expand_tags("cp311.cp312-abi3-manylinux_2_28_x86_64.manylinux2014_x86_64") == [
        "cp311-abi3-manylinux_2_28_x86_64",
        "cp311-abi3-manylinux2014_x86_64",
        "cp312-abi3-manylinux_2_28_x86_64",
        "cp312-abi3-manylinux2014_x86_64",
    ]
    with pytest.raises(WheelTagError):
        expand_tags("cp38-abi3")


def test_centos7_is_refused_for_its_glibc_and_its_python():
    result = check(node((2, 17), cpython(3, 6, 8)), PINNED_TAGS, PINNED_REQUIRES)
    assert result["compatible"] is False and result["matching_tags"] == []
    assert result["failed_checks"] == ["requires_python", "python", "glibc"]
    assert result["reasons"] == [
        "Requires-Python >=3.11,<3.15 excludes /usr/bin/python3 (Python 3.6.8): >=3.11",
        "cp38-abi3 needs CPython 3.8 or newer (same major); /usr/bin/python3 is CPython 3.6.8",
        "manylinux_2_28_x86_64 needs glibc 2.28 or newer; this node has glibc 2.17",
    ]


def test_el9_python39_fits_the_tags_but_not_requires_python():
    result = check(node((2, 34), cpython(3, 9, 18)), PINNED_TAGS, PINNED_REQUIRES)
    assert result["failed_checks"] == ["requires_python"] and result["matching_tags"] == PINNED_TAGS
    assert result["reasons"] == [
        "Requires-Python >=3.11,<3.15 excludes /usr/bin/python3 (Python 3.9.18): >=3.11"
    ]


@pytest.mark.parametrize(
    "glibc,python", [((2, 36), (3, 11, 2)), ((2, 39), (3, 12, 3)), ((2, 28), (3, 14, 0))]
)
def test_modern_nodes_are_compatible(glibc, python):
    result = check(node(glibc, cpython(*python)), PINNED_TAGS, PINNED_REQUIRES)
    assert result == {"compatible": True, "reasons": [], "failed_checks": [], "matching_tags": PINNED_TAGS}


def test_python_315_is_beyond_requires_python():
    assert check(node((2, 36), cpython(3, 15, 0)), PINNED_TAGS, PINNED_REQUIRES)["failed_checks"] == [
        "requires_python"
    ]


def test_machine_and_libc_mismatches_name_what_the_node_has():
    arm = check(node((2, 36), cpython(3, 11, 2), machine="aarch64"), PINNED_TAGS, PINNED_REQUIRES)
    assert arm["reasons"] == ["manylinux_2_28_x86_64 is built for x86_64; this node is aarch64"]
    assert arm["failed_checks"] == ["machine"]
    musl = check(node(None, cpython(3, 12, 1)), PINNED_TAGS, "")
    assert musl["reasons"] == ["manylinux_2_28_x86_64 needs glibc 2.28 or newer; no glibc found on this node"]
    mac = check(node((2, 36), cpython(3, 12, 1)), ["cp312-cp312-macosx_11_0_arm64"], "")
    assert mac["failed_checks"] == ["platform"]


def test_one_fitting_tag_is_enough():
    tags = ["cp312-cp312-manylinux_2_28_x86_64", "cp311-cp311-manylinux2014_x86_64"]
    result = check(node((2, 17), cpython(3, 11, 5)), tags, "")
    assert result["compatible"] is True and result["matching_tags"] == ["cp311-cp311-manylinux2014_x86_64"]


def test_source_tree_checks_only_the_interpreter():
    assert check(node((2, 17), cpython(3, 9, 0)), [], ">=3.9")["compatible"] is True
    assert check(node((2, 17), cpython(3, 8, 0)), [], ">=3.9")["failed_checks"] == ["requires_python"]


def test_a_missing_interpreter_is_the_reason():
    result = check(
        node((2, 36), {"error": "the interpreter python3.11 does not run (not found)"}), PINNED_TAGS
    )
    assert result["compatible"] is False and result["failed_checks"] == ["python"]
    assert result["reasons"] == ["the interpreter python3.11 does not run (not found)"]


@pytest.mark.parametrize(
    "python_tag,abi,version,fits",
    [
        ("cp38", "abi3", (3, 8, 0), True),
        ("cp38", "abi3", (3, 7, 9), False),
        ("cp311", "cp311", (3, 11, 1), True),
        ("cp311", "cp311", (3, 12, 0), False),
        ("py3", "none", (3, 6, 8), True),
        ("py2", "none", (3, 6, 8), False),
        ("py36", "none", (3, 9, 0), True),
        ("py310", "none", (3, 9, 0), False),
        ("pp310", "pypy310_pp73", (3, 10, 0), False),
    ],
)
def test_python_tags_follow_pip(python_tag, abi, version, fits):
    assert (python_tag_problem(python_tag, abi, cpython(*version)) is None) is fits


def test_cpython_tags_refuse_pypy():
    pypy = dict(cpython(3, 11, 0), implementation="pypy")
    assert "needs CPython" in python_tag_problem("cp38", "abi3", pypy)


@pytest.mark.parametrize(
    "tag,needs",
    [
        ("any", (None, None, None)),
        ("manylinux2014_x86_64", ("glibc", (2, 17), "x86_64")),
        ("manylinux1_i686", ("glibc", (2, 5), "i686")),
        ("musllinux_1_2_aarch64", ("musl", (1, 2), "aarch64")),
        ("linux_x86_64", (None, None, "x86_64")),
        ("win_amd64", ("other", None, None)),
    ],
)
def test_platform_tags(tag, needs):
    found = platform_needs(tag)
    assert (found["libc"], found["libc_version"], found["machine"]) == needs


@pytest.mark.parametrize(
    "spec,version,unmet",
    [
        (">=3.11,<3.15", (3, 11, 0), []),
        (">=3.11, <3.15", (3, 15, 0), ["<3.15"]),
        ("~=3.10", (3, 12, 1), []),
        ("~=3.10.2", (3, 11, 0), ["~=3.10.2"]),
        ("==3.11.*", (3, 11, 9), []),
        ("!=3.12.*", (3, 12, 0), ["!=3.12.*"]),
        (">3.11", (3, 11, 0), [">3.11"]),
        ("<=3.11", (3, 11, 0), []),
        ("", (2, 7, 0), []),
    ],
)
def test_requires_python_clauses(spec, version, unmet):
    assert unmet_requires_python(spec, version) == unmet


def test_unreadable_requires_python_is_an_error():
    with pytest.raises(WheelTagError):
        unmet_requires_python(">=three", (3, 11, 0))


def test_requires_python_from_the_fake_wheel(tmp_path):
    path = build_wheel.build(str(tmp_path))
    assert requires_python_from_wheel(path) == build_wheel.REQUIRES_PYTHON
    (tmp_path / "broken.whl").write_bytes(b"not a zip")
    with pytest.raises(WheelTagError):
        requires_python_from_wheel(str(tmp_path / "broken.whl"))


@pytest.mark.skipif(not os.path.exists(CACHED_WHEEL), reason="pinned vLLM wheel not in .cache")
def test_requires_python_and_tags_are_the_pinned_wheels():
    clauses = sorted(requires_python_from_wheel(CACHED_WHEEL).split(","))  # '<3.15,>=3.11'
    assert clauses == sorted(PINNED_REQUIRES.split(","))
    assert parse_wheel_filename(CACHED_WHEEL)["tags"] == PINNED_TAGS


def test_glibc_from_confstr_else_ldd():
    assert glibc_version(confstr=lambda name: "glibc 2.17") == (2, 17)
    ldd = "ldd (GNU libc) 2.28\nCopyright (C) 2018 Free Software Foundation, Inc.\n"
    assert glibc_version(confstr=lambda name: None, run=lambda argv: (0, ldd, "")) == (2, 28)
    musl = (1, "", "musl libc (x86_64)\nVersion 1.2.4\n")
    assert glibc_version(confstr=lambda name: None, run=lambda argv: musl) is None


def test_glibc_of_this_machine():
    assert glibc_version() >= (2, 17)


def test_probe_python_runs_the_interpreter():
    found = probe_python(sys.executable)
    assert found["implementation"] == "cpython" and found["version"] == list(sys.version_info[:3])
    assert "error" in probe_python("/nonexistent/python3.11")
    assert "printed no version" in probe_python("true")["error"]
