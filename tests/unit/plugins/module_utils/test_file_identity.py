# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stat identity (module_utils/file_identity.py): the one rule by which the model sidecar, the snapshot
manifest and preflight's header reuse trust that a file has not changed. Every way to change a file, even
one that keeps its size and restores its mtime, makes it another file."""
import os
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils import file_identity, gguf, model_sidecar

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


def test_gguf_records_the_identity_of_the_file_it_read(tmp_path):
    path = _model(tmp_path)
    info = gguf.inspect(str(path))
    assert info["identity"] == file_identity.identity(os.stat(path))
    os.chmod(path, 0o600)
    assert not file_identity.same_file(info["identity"], os.stat(path))


def test_the_sidecar_and_the_header_use_the_same_identity(tmp_path):
    path = _model(tmp_path)
    record = model_sidecar.write_sidecar_record(str(path), "0" * 64)
    assert {k: record[k] for k in file_identity.FIELDS} == gguf.inspect(str(path))["identity"]
    assert model_sidecar.sidecar_matches_file(record, str(path))
    _rewrite_same_size_restore_mtime(path)
    assert not model_sidecar.sidecar_matches_file(record, str(path))
