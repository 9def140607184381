# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The offline bundle's manifest: written, read back, every kind of mismatch refused (module_utils/bundle)."""
import hashlib
import json
import os
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._software import bundle

PIN = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def _put(root, rel, data):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


# incompressible content: the gzip is larger than 500 bytes (a test flips byte 500)
_FILLER = b"".join(hashlib.sha256(bytes([i])).digest() for i in range(100))


def git_archive_bytes(commit, filler=_FILLER):
    """A tarball as `git archive --format=tar.gz` writes it: the commit in the pax global header's comment."""
    import io
    import tarfile
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": commit} if commit else {}) as tar:
        info = tarfile.TarInfo("llama.cpp/CMakeLists.txt")
        info.size = len(filler)
        tar.addfile(info, io.BytesIO(filler))
    return out.getvalue()


@pytest.fixture
def made(tmp_path):
    """A bundle with a model, the llama.cpp git bundle and a two-file package repository, and its manifest."""
    _put(tmp_path, "models/tiny/tiny.gguf", b"GGUF" + bytes(range(256)) * 40)
    _put(tmp_path, "git/llama.cpp/llama.cpp.tar.gz", git_archive_bytes(PIN))
    _put(tmp_path, "packages/debian/Packages", b"Package: probe\n")
    _put(tmp_path, "packages/debian/probe_1.0_all.deb", b"!<arch>\n" + b"d" * 500)
    specs = [{"name": "models/tiny", "version": "a" * 40},
             {"name": "git/llama.cpp", "version": PIN},
             {"name": "packages/debian", "version": "2026-12-06", "meta": {"format": "deb"}}]
    entries = [bundle.describe(str(tmp_path), s) for s in specs]
    assert bundle.write_manifest(str(tmp_path), bundle.manifest_text(entries))
    return tmp_path


def _refused(root):
    with pytest.raises(bundle.BundleError) as e:
        bundle.verify(str(root))
    return e.value


def test_round_trip(made):
    entries, notes = bundle.verify(str(made))
    assert notes == []
    got = bundle.by_name(entries)
    assert sorted(got) == ["git/llama.cpp", "models/tiny", "packages/debian"]
    model = got["models/tiny"]
    data = open(os.path.join(str(made), "models/tiny/tiny.gguf"), "rb").read()
    assert model["kind"] == "model" and model["version"] == "a" * 40
    assert model["sha256"] == hashlib.sha256(data).hexdigest() and model["size"] == len(data)
    assert model["files"] == [{"path": "models/tiny/tiny.gguf", "size": len(data),
                               "sha256": hashlib.sha256(data).hexdigest()}]
    repo = got["packages/debian"]
    assert [f["path"] for f in repo["files"]] == ["packages/debian/Packages",
                                                  "packages/debian/probe_1.0_all.deb"]
    assert repo["sha256"] == bundle.listing_sha256(repo["files"]) and repo["meta"] == {"format": "deb"}
    assert repo["abspath"] == os.path.join(str(made), "packages/debian")


def test_manifest_text_is_stable_and_not_rewritten(made):
    entries = bundle.read_manifest(str(made))
    text = bundle.manifest_text(list(reversed(entries)))
    assert text == open(os.path.join(str(made), bundle.MANIFEST)).read()
    assert bundle.write_manifest(str(made), text) is False


@pytest.mark.parametrize("rel", ["models/tiny/tiny.gguf", "packages/debian/Packages"])
def test_missing_file_refused(made, rel):
    os.unlink(os.path.join(str(made), rel))
    err = _refused(made)
    assert "%s is missing" % rel in err.msg and "nothing was changed" in err.msg


@pytest.mark.parametrize("delta", [-1, 1])
def test_size_off_by_one_refused(made, delta):
    path = os.path.join(str(made), "models/tiny/tiny.gguf")
    data = open(path, "rb").read()
    _put(made, "models/tiny/tiny.gguf", data[:-1] if delta < 0 else data + b"\0")
    err = _refused(made)
    word = "truncated" if delta < 0 else "grown"
    assert "models/tiny: models/tiny/tiny.gguf has %d bytes, the manifest lists %d (%s)" % (
        len(data) + delta, len(data), word) in err.msg


def test_one_byte_changed_refused(made):
    path = os.path.join(str(made), "git/llama.cpp/llama.cpp.tar.gz")
    data = bytearray(open(path, "rb").read())
    data[500] ^= 1
    _put(made, "git/llama.cpp/llama.cpp.tar.gz", bytes(data))
    err = _refused(made)
    assert "git/llama.cpp: git/llama.cpp/llama.cpp.tar.gz has sha256 %s" % hashlib.sha256(data).hexdigest() \
        in err.msg and "(altered)" in err.msg
    assert len(err.problems) == 1


def test_unlisted_file_inside_an_entry_refused(made):
    _put(made, "packages/debian/evil_1.0_all.deb", b"x")
    err = _refused(made)
    assert "packages/debian: packages/debian/evil_1.0_all.deb is in the entry's directory but not in the " \
           "manifest" in err.msg


def test_unlisted_file_outside_entries_reported_and_ignored(made):
    _put(made, "README.txt", b"notes")
    _put(made, "other/thing", b"x")
    _entries, notes = bundle.verify(str(made))
    assert notes == ["README.txt is not part of any entry; ignored",
                     "other/thing is not part of any entry; ignored"]


def test_listed_file_replaced_by_a_link_refused(made):
    path = os.path.join(str(made), "models/tiny/tiny.gguf")
    os.rename(path, os.path.join(str(made), "elsewhere.gguf"))
    os.symlink(os.path.join(str(made), "elsewhere.gguf"), path)
    assert "models/tiny/tiny.gguf is not a regular file" in _refused(made).msg


def test_sizes_checked_before_any_hashing(made, monkeypatch):
    """A truncated file is refused without reading a byte of the others (time bounded by stat, not size)."""
    path = os.path.join(str(made), "models/tiny/tiny.gguf")
    os.truncate(path, 10)
    hashed = []
    monkeypatch.setattr(bundle, "sha256_file", lambda *a, **k: hashed.append(a) or ("0" * 64, 0))
    _refused(made)
    assert hashed == []


def test_every_byte_read_once_in_bounded_blocks(tmp_path):
    size = (8 << 20) + 123
    _put(tmp_path, "models/big/big.gguf", os.urandom(1 << 16) * (size >> 16) + b"z" * (size & 0xffff))
    reads = []
    digest, got = bundle.sha256_file(os.path.join(str(tmp_path), "models/big/big.gguf"), block=1 << 20,
                                     reads=reads)
    assert got == size and sum(reads) == size and max(reads) <= 1 << 20
    assert len(reads) == 9  # 8 full blocks and the rest: each byte once
    entry = bundle.describe(str(tmp_path), {"name": "models/big", "version": "v"})
    bundle.write_manifest(str(tmp_path), bundle.manifest_text([entry]))
    t0 = time.monotonic()
    bundle.verify(str(tmp_path))
    assert time.monotonic() - t0 < 5  # ~8 MiB: milliseconds at disk speed; 5 s is the bound on a loaded box
    assert entry["sha256"] == digest


@pytest.mark.parametrize("path", ["/etc/passwd", "models/tiny/../../etc/passwd", "git/llama.cpp/x",
                                  "models/tiny", "models/tinyx/a"])
def test_manifest_paths_outside_the_entry_refused(made, path):
    doc = json.load(open(os.path.join(str(made), bundle.MANIFEST)))
    model = next(e for e in doc["entries"] if e["name"] == "models/tiny")
    model["files"][0]["path"] = path
    _put(made, bundle.MANIFEST, json.dumps(doc).encode())
    assert "is not inside models/tiny/ of the bundle" in _refused(made).msg


@pytest.mark.parametrize("name", ["models", "weights/x", "models/.hidden", "models/a/b", "", None])
def test_bad_entry_names_refused(name):
    with pytest.raises(bundle.BundleError):
        bundle.check_name(name)


def test_entry_name():
    assert bundle.entry_name("images", "cuda-devel") == "images/cuda-devel"
    with pytest.raises(bundle.BundleError):
        bundle.entry_name("images", "nvidia/cuda:12")
    with pytest.raises(bundle.BundleError):
        bundle.entry_name("wheels", "vllm")


def test_unknown_format_refused(made):
    _put(made, bundle.MANIFEST, json.dumps({"format": 2, "entries": []}).encode())
    assert "is not a format-1 bundle manifest" in _refused(made).msg


def test_no_manifest_refused(tmp_path):
    assert "cannot read the bundle's manifest" in _refused(tmp_path).msg


def test_duplicate_entries_refused(made):
    doc = json.load(open(os.path.join(str(made), bundle.MANIFEST)))
    doc["entries"].append(doc["entries"][0])
    _put(made, bundle.MANIFEST, json.dumps(doc).encode())
    assert "named twice" in _refused(made).msg


def test_sources_models_git_and_repos(made):
    entries, _notes = bundle.verify(str(made))
    models = [{"name": "tiny", "repo": "org/tiny", "filename": "tiny.gguf", "dest": "tiny", "token_var": "t"}]
    got = bundle.sources(entries, models, PIN)
    path = os.path.join(str(made), "models/tiny/tiny.gguf")
    assert got["model_models"] == [{"name": "tiny", "dest": "tiny", "url": "file://" + path,
                                    "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
                                    "size": os.path.getsize(path)}]
    tarball = os.path.join(str(made), "git/llama.cpp/llama.cpp.tar.gz")
    assert got["llama_cpp"] == {
        "llama_cpp_source_type": "archive", "llama_cpp_archive_url": "file://" + tarball,
        "llama_cpp_archive_sha256": hashlib.sha256(open(tarball, "rb").read()).hexdigest(),
        # the commit makes the archive's build identity that of a git checkout of it (the bundled image fits)
        "llama_cpp_archive_commit": PIN}
    assert got["packages"] == [{"name": "packages/debian", "repo": "debian", "format": "deb",
                                "path": os.path.join(str(made), "packages/debian")}]


def test_sources_refuses_what_the_bundle_lacks_or_contradicts(made):
    entries, _notes = bundle.verify(str(made))
    with pytest.raises(bundle.BundleError) as e:
        bundle.sources(entries, [{"name": "other", "repo": "o/x", "filename": "x.gguf"},
                                 {"name": "tiny", "repo": "o/t", "filename": "tiny.gguf", "sha256": "b" * 64},
                                 {"name": "snap", "repo": "o/s", "snapshot": True}], "1" * 40, web_ui=True)
    msg = e.value.msg
    assert "model other is not in the bundle" in msg
    assert "model tiny pins sha256 %s" % ("b" * 64) in msg
    assert "model snap is a repo snapshot" in msg
    assert "git/llama.cpp is commit %s in the bundle, llama_cpp_git_ref pins %s" % (PIN, "1" * 40) in msg
    assert "llama_cpp_web_ui is on" in msg


def test_describe_refuses_bytes_other_than_the_verified_ones(tmp_path):
    _put(tmp_path, "models/m/m.gguf", b"what the hub sent")
    with pytest.raises(bundle.BundleError) as e:
        bundle.describe(str(tmp_path), {"name": "models/m", "version": "v", "sha256": "c" * 64})
    assert "is not the verified file (sha256 %s)" % ("c" * 64) in e.value.msg
    good = hashlib.sha256(b"what the hub sent").hexdigest()
    entry = bundle.describe(str(tmp_path), {"name": "models/m", "version": "v", "sha256": good})
    assert entry["sha256"] == good


@pytest.mark.parametrize("bad", ["/srv/my bundle", "/srv/b\nDir::Etc::x", "/srv/b]"])
def test_a_path_that_would_be_syntax_in_a_repository_file_is_refused(bad):
    with pytest.raises(bundle.BundleError) as e:
        bundle.verify(bad)
    assert "goes into apt/yum repository files" in e.value.msg


def _with_git(tmp_path, version, data):
    _put(tmp_path, "git/llama.cpp/llama.cpp.tar.gz", data)
    entries = [bundle.describe(str(tmp_path), {"name": "git/llama.cpp", "version": version})]
    assert bundle.write_manifest(str(tmp_path), bundle.manifest_text(entries))
    return bundle.verify(str(tmp_path))[0]


def test_a_tarball_that_is_not_git_archive_of_the_listed_commit_is_refused(tmp_path):
    entries = _with_git(tmp_path, PIN, git_archive_bytes("1" * 40))
    with pytest.raises(bundle.BundleError) as e:
        bundle.sources(entries, [], PIN)
    assert "is not `git archive` of commit %s (its header names '%s')" % (PIN, "1" * 40) in e.value.msg
    entries = _with_git(tmp_path, PIN, git_archive_bytes(""))
    with pytest.raises(bundle.BundleError):
        bundle.sources(entries, [], PIN)
    # the other direction: the header names the listed commit
    entries = _with_git(tmp_path, PIN, git_archive_bytes(PIN))
    assert bundle.sources(entries, [], PIN)["llama_cpp"]["llama_cpp_archive_commit"] == PIN


def test_a_pin_by_tag_gives_no_commit_to_the_build_identity(tmp_path):
    entries = _with_git(tmp_path, "b4500", git_archive_bytes("1" * 40))
    got = bundle.sources(entries, [], "b4500")
    assert got["llama_cpp"]["llama_cpp_archive_commit"] == ""


def test_packages_the_bundle_left_to_the_os_release_must_be_on_the_node(tmp_path):
    _put(tmp_path, "packages/debian12/Packages", b"Package: probe\n")
    meta = {"format": "deb", "from_the_system": ["libc6", "kmod"]}
    spec = {"name": "packages/debian12", "version": "Debian 12", "meta": meta}
    entries = [bundle.describe(str(tmp_path), spec)]
    assert bundle.write_manifest(str(tmp_path), bundle.manifest_text(entries))
    entries = bundle.verify(str(tmp_path))[0]
    assert bundle.sources(entries, installed=lambda name: True)["packages"][0]["name"] == "packages/debian12"
    with pytest.raises(bundle.BundleError) as e:
        bundle.sources(entries, installed=lambda name: name != "kmod")
    assert "packages/debian12 leaves out kmod as part of the OS release" in e.value.msg
    assert "libc6" not in e.value.msg
