# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stat identity (module_utils/_files/identity.py): the one rule by which the model sidecar, the snapshot
manifest and preflight's header reuse trust that a file has not changed. Every way to change a file, even
one that keeps its size and restores its mtime, makes it another file."""
import os
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import sidecar as model_sidecar
from ansible_collections.llmops.serving.plugins.module_utils._files import identity as file_identity
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf

from tests.fixtures.gguf.builder import tiny_qwen35


def _model(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_qwen35().build().data)
    return path


def _rewrite_same_size_restore_mtime(path):
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    time.sleep(0.01)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replace(path):
    other = path.parent / "other"
    other.write_bytes(path.read_bytes())
    os.replace(other, path)


@pytest.mark.parametrize("change, same", [
    (lambda p: None, True),
    (_rewrite_same_size_restore_mtime, False),
    (lambda p: (time.sleep(0.01), os.chmod(p, 0o600)), False),
    (lambda p: (time.sleep(0.01), os.utime(p)), False),
    (_replace, False),
], ids=["unchanged", "rewritten, mtime restored", "chmod", "touch", "replaced"])
def test_only_an_untouched_file_keeps_its_identity(tmp_path, change, same):
    path = _model(tmp_path)
    record = file_identity.identity(os.stat(path))
    assert sorted(record) == sorted(file_identity.FIELDS)
    change(path)
    assert file_identity.same_file(record, os.stat(path)) is same


def test_unchanged_file_matches_and_nothing_else_does(tmp_path):
    path = _model(tmp_path)
    record = file_identity.identity(os.stat(path))
    assert file_identity.same_file(record, os.stat(path))
    assert file_identity.same_file(dict(record, sha256="ab"), os.stat(path))  # other keys are the caller's
    assert not file_identity.same_file(record, None)                          # gone
    assert not file_identity.same_file(record, os.stat(tmp_path))             # not a regular file
    assert not file_identity.same_file(dict(record, inode=None), os.stat(path))
    assert not file_identity.same_file({k: v for k, v in record.items() if k != "ctime_ns"}, os.stat(path))
    assert not file_identity.same_file("not a record", os.stat(path))


class _Later(object):
    """gguf's clock, `seconds` ahead: the file was written that long before the read."""
    def __init__(self, seconds):
        self.seconds = seconds

    def time(self):
        return time.time() + self.seconds


class _At(object):
    """gguf's clock, stopped at `when`."""
    def __init__(self, when):
        self.when = when

    def time(self):
        return self.when


def test_gguf_records_the_identity_of_the_file_it_read(tmp_path, monkeypatch):
    path = _model(tmp_path)
    monkeypatch.setattr(gguf, "time", _Later(file_identity.SETTLED_WHOLE_S + 1))
    info = gguf.inspect(str(path))
    assert info["identity"] == file_identity.identity(os.stat(path))
    assert info["summary_version"] == gguf.SUMMARY_VERSION
    os.chmod(path, 0o600)
    assert not file_identity.same_file(info["identity"], os.stat(path))


def test_a_file_changed_just_before_its_read_gets_no_identity(tmp_path, monkeypatch):
    """Within the same timestamp granule a second write would keep the identity: such a read records none,
    so a later run reads the file again rather than trust a header of bytes that may be gone."""
    path = _model(tmp_path)
    changed = os.stat(path).st_ctime_ns / 1e9
    monkeypatch.setattr(gguf, "time", _At(changed + 0.05))     # read 50 ms after the write
    assert "identity" not in gguf.inspect(str(path))
    monkeypatch.setattr(gguf, "time", _At(changed + file_identity.SETTLED_WHOLE_S + 0.1))
    assert "identity" in gguf.inspect(str(path))


class _Stat(object):
    def __init__(self, ctime_ns):
        self.st_ctime_ns = ctime_ns


@pytest.mark.parametrize("ctime_s, now_s, settled", [
    (100.5, 100.55, False), (100.5, 100.7, True),              # sub-second times: a tenth of a second
    (100.0, 100.5, False), (100.0, 101.0, False), (100.0, 101.01, True),   # whole seconds: the second
])
def test_a_change_is_settled_after_its_timestamp_granule(ctime_s, now_s, settled):
    assert file_identity.settled(_Stat(int(ctime_s * 1e9)), now_s) is settled


def test_the_sidecar_and_the_header_use_the_same_identity(tmp_path, monkeypatch):
    path = _model(tmp_path)
    monkeypatch.setattr(gguf, "time", _Later(file_identity.SETTLED_WHOLE_S + 1))
    record = model_sidecar.write_sidecar_record(str(path), "0" * 64)
    assert {k: record[k] for k in file_identity.FIELDS} == gguf.inspect(str(path))["identity"]
    assert model_sidecar.sidecar_matches_file(record, str(path))
    _rewrite_same_size_restore_mtime(path)
    assert not model_sidecar.sidecar_matches_file(record, str(path))
