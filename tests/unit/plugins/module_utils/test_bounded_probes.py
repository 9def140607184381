# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Deadlines and read limits of what the modules run and read on the node (issue 23): an nvidia-smi that never
stops writing, an interpreter probe that hangs, a wheel whose METADATA inflates to hundreds of MB, corrupt,
encrypted and oddly compressed wheels, a 5,000-digit version: each ends in bounded time and memory with a
clear message, never a traceback."""
import os
import stat
import sys
import time
import zipfile

import pytest
from ansible_collections.llmops.serving.plugins.module_utils import bounded_run
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu
from ansible_collections.llmops.serving.plugins.module_utils._software import wheel_tags

from tests.helpers import run_module_file

ENDLESS = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"


def _script(tmp_path, name, code):
    path = tmp_path / name
    path.write_text("#!%s\n%s" % (sys.executable, code))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_command_that_never_stops_writing_is_stopped_at_the_read_limit():
    start = time.monotonic()
    rc, out, err, timed_out, overflowed = bounded_run.run_bounded([sys.executable, "-c", ENDLESS], 30,
                                                                  max_bytes=4 * 1024 * 1024)
    assert overflowed and not timed_out and len(out) <= 4 * 1024 * 1024 and time.monotonic() - start < 10
    rc, out, err, timed_out = gpu.run_command([sys.executable, "-c", ENDLESS], 30)
    assert timed_out and "kept writing" in err and len(out) <= bounded_run.DEFAULT_MAX_BYTES


def test_gpu_facts_under_an_endless_nvidia_smi_fails_clearly_and_fast(tmp_path):
    smi = _script(tmp_path, "nvidia-smi", ENDLESS)
    start = time.monotonic()
    result = run_module_file(tmp_path, "gpu_facts", {"nvidia_smi_path": smi, "timeout": 5, "required": True})
    assert time.monotonic() - start < 30
    assert result["failed"] and result["msg"] and "Traceback" not in str(result)


def test_the_interpreter_probe_has_a_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(wheel_tags, "PROBE_TIMEOUT_S", 1)
    hanging = _script(tmp_path, "python3", "import time\ntime.sleep(60)\n")
    start = time.monotonic()
    found = wheel_tags.probe_python(hanging)
    assert time.monotonic() - start < 10
    assert "does not run" in found["error"] and "did not answer within 1 s" in found["error"]


def _wheel(tmp_path, metadata, name="w-1.0-py3-none-any.whl", method=zipfile.ZIP_DEFLATED):
    path = str(tmp_path / name)
    with zipfile.ZipFile(path, "w", method) as wheel:
        with wheel.open("w-1.0.dist-info/METADATA", "w") as member:
            for chunk in metadata:
                member.write(chunk)
    return path


def test_a_metadata_that_inflates_to_hundreds_of_mb_is_read_to_the_limit(tmp_path):
    big = (b"X" * (1024 * 1024) for _i in range(256))
    path = _wheel(tmp_path, [b"Metadata-Version: 2.1\nRequires-Python: >=3.8\n"] + list(big))
    assert os.path.getsize(path) < 2 * 1024 * 1024
    start = time.monotonic()
    assert wheel_tags.requires_python_from_wheel(path) == ">=3.8"
    assert time.monotonic() - start < 2  # inflating 256 MiB would take longer and that much memory


def _patch(data, local_offset, central_offset, value, size=2):
    """Set a field of the (one) local header and central directory entry of a zip."""
    data = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", local_offset), (b"PK\x01\x02", central_offset)):
        at = data.index(signature) + offset
        data[at:at + size] = value.to_bytes(size, "little")
    return bytes(data)


@pytest.mark.parametrize("kind", ["encrypted", "odd-compression", "truncated", "not-a-zip"])
def test_corrupt_encrypted_or_oddly_compressed_wheels_are_refused_clearly(tmp_path, kind):
    path = _wheel(tmp_path, [b"Metadata-Version: 2.1\nRequires-Python: >=3.8\n"])
    data = open(path, "rb").read()
    if kind == "encrypted":
        data = _patch(data, 6, 8, 0x1)
    elif kind == "odd-compression":
        data = _patch(data, 8, 10, 97)  # WavPack: not supported by zipfile
    elif kind == "truncated":
        data = data[:len(data) // 2]
    else:
        data = b"\x00" * 100
    with open(path, "wb") as handle:
        handle.write(data)
    with pytest.raises(wheel_tags.WheelTagError, match="is not a readable wheel"):
        wheel_tags.requires_python_from_wheel(path)
    result = run_module_file(tmp_path, "wheel_compat_info", {"wheel": path, "python": sys.executable})
    assert result["failed"] and "is not a readable wheel" in result["msg"]


def test_a_5000_digit_version_is_refused_not_a_traceback(tmp_path):
    with pytest.raises(wheel_tags.WheelTagError, match="not a version"):
        wheel_tags.unmet_requires_python(">=" + "9" * 5000, (3, 11, 0))
    for args in ({"tags": ["cp3" + "1" * 5000 + "-abi3-manylinux_2_28_x86_64"], "python": sys.executable},
                 {"requires_python": ">=3." + "1" * 5000, "python": sys.executable}):
        result = run_module_file(tmp_path, "wheel_compat_info", args)
        assert result["failed"] and "not a" in result["msg"] and "Traceback" not in str(result), result
