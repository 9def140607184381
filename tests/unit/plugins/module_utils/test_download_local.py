# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download from a file:// URL (an offline bundle's model, issue 33): the same verification as a
download (size, sha256, quarantine, sidecar), so bundle bytes that do not match never reach the final path and
never replace a verified model; and the local "server" answers ranges like an HTTP one (download_local)."""
import hashlib
import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import local as download_local
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError

from tests.fixtures.fake_hub.helpers import dl, quarantined, sha256_of

DATA = bytes(range(256)) * 8192 + b"tail"  # 2 MiB + 4: chunked and ranged


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "bundle" / "models" / "tiny"
    d.mkdir(parents=True)
    path = d / "tiny.gguf"
    path.write_bytes(DATA)
    return path


def _params(src, dest, **kw):
    p = dict(url="file://%s" % src, sha256=hashlib.sha256(DATA).hexdigest(), size=len(DATA), dest=str(dest),
             retry_delay=0.01, timeout=2, retries=2, free_space_margin=0)
    p.update(kw)
    return p


def test_a_bundle_file_is_copied_verified_and_kept_on_the_second_run(src, tmp_path):
    dest = tmp_path / "models"
    r = dl.run(_params(src, dest))
    final = os.path.join(str(dest), "tiny.gguf")
    assert r["changed"] and r["verified"] == "download" and r["path"] == final
    assert sha256_of(final) == hashlib.sha256(DATA).hexdigest()
    again = dl.run(_params(src, dest))
    assert not again["changed"] and again["verified"] == "sidecar"


@pytest.mark.parametrize("change", ["one byte", "one byte less", "one byte more"])
def test_bundle_bytes_that_do_not_match_never_replace_a_verified_model(src, tmp_path, change):
    dest = tmp_path / "models"
    dl.run(_params(src, dest))
    final = os.path.join(str(dest), "tiny.gguf")
    os.unlink(os.path.join(str(dest), ".tiny.gguf.llmops.json"))  # no record: the file is judged again
    bad = bytearray(DATA)
    if change == "one byte":
        bad[1000] ^= 1
    elif change == "one byte less":
        bad = bad[:-1]
    else:
        bad += b"\0"
    other = tmp_path / "other" / "tiny.gguf"
    other.parent.mkdir()
    other.write_bytes(bytes(bad))
    # the verified file stays (hashed against the pinned sha256, kept): the bad copy is never read into it
    r = dl.run(_params(other, dest))
    assert not r["changed"] and sha256_of(final) == hashlib.sha256(DATA).hexdigest()
    # with nothing in place, the bad copy is refused and nothing reaches the final path
    os.unlink(final)
    with pytest.raises(DownloadError) as e:
        dl.run(_params(other, dest))
    assert not os.path.exists(final)
    if change == "one byte":
        assert "checksum mismatch" in e.value.msg and quarantined(dest)
    else:
        assert "tiny.gguf" in e.value.msg


def test_a_missing_bundle_file_fails_with_404(tmp_path):
    with pytest.raises(DownloadError) as e:
        dl.run(_params(tmp_path / "nope.gguf", tmp_path / "models", retries=0))
    assert "404" in e.value.msg


def test_file_urls_are_for_url_only(tmp_path):
    with pytest.raises(DownloadError) as e:
        dl.run(dict(repo="org/m", filename="m.gguf", endpoint="file:///srv/hub", dest=str(tmp_path)))
    assert "endpoint must be an http(s) URL" in e.value.msg
    with pytest.raises(DownloadError):
        dl.run(dict(url="file://host/srv/m.gguf", sha256="a" * 64, dest=str(tmp_path)))


def test_a_file_url_needs_the_sha256(src, tmp_path):
    """Root copies what the URL names: without a digest the caller knows, /etc/shadow would be disclosed."""
    with pytest.raises(DownloadError) as e:
        dl.run(dict(url="file://%s" % src, dest=str(tmp_path / "models")))
    assert "file:///absolute/path/model.gguf with its sha256" in e.value.msg
    assert not (tmp_path / "models" / "tiny.gguf").exists()


def test_local_answers(src, tmp_path):
    size = len(DATA)
    r = download_local.answer("GET", str(src), {"Range": "bytes=10-19"})
    assert r.status == 206 and r.getheader("Content-Range") == "bytes 10-19/%d" % size
    assert r.read() == DATA[10:20] and r.isclosed()
    r = download_local.answer("GET", str(src), {"Range": "bytes=%d-" % (size - 3)})
    assert r.status == 206 and r.read(100) == DATA[-3:]
    r = download_local.answer("GET", str(src), {"Range": "bytes=%d-" % size})
    assert r.status == 416 and r.getheader("Content-Range") == "bytes */%d" % size
    head = download_local.answer("HEAD", str(src), {})
    assert head.status == 200 and head.getheader("Content-Length") == str(size) and head.read() == b""
    # a changed file (If-Range no longer matches): the whole file, 200
    stale = "Thu, 01 Jan 1970 00:00:00 GMT"
    r = download_local.answer("GET", str(src), {"Range": "bytes=0-1", "If-Range": stale})
    assert r.status == 200 and r.getheader("Content-Length") == str(size)
    r.close()
    link = tmp_path / "link.gguf"
    link.symlink_to(src)
    assert download_local.answer("GET", str(link), {}).status == 403
    assert download_local.answer("GET", str(tmp_path), {}).status == 403
    assert download_local.answer("GET", str(tmp_path / "absent"), {}).status == 404


def test_gguf_info_reads_the_header_of_a_bundle_file_without_a_sha256(tmp_path):
    """Preflight reads each model's header before the download (roles/model/tasks/headers.yml): for a bundle's
    model that is a file:// url, read like a remote one (gguf_info writes nothing, so no sha256 is needed)."""
    from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf, gguf_remote

    from tests.fixtures.gguf.builder import tiny_qwen35
    path = tmp_path / "bundle" / "models" / "m" / "m.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(tiny_qwen35().build().data)
    remote = gguf_remote.inspect_remote({"url": "file://%s" % path, "timeout": 5})
    local = gguf.inspect(str(path))
    assert remote["architecture"] == local["architecture"] == "qwen35"
    assert remote["block_count"] == local["block_count"] and remote["remote"]["size"] == path.stat().st_size
