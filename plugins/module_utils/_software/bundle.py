# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The offline bundle (issue 33): one directory with everything a run needs and ``manifest.json``, its list.

Logic of ``llmops.serving.bundle_manifest`` (write the manifest where the bundle is made) and
``llmops.serving.bundle_verify`` (check it on the node, before any change).

Layout and naming
-----------------
Every entry has a name ``<area>/<name>`` (``images/<name>``, ``git/llama.cpp``, ``models/<name>``,
``packages/<repo>``, ``binaries/<name>``) and lives in the bundle directory of the same path: a file of the
entry is ``<bundle>/<entry name>/<file>``.  ``manifest.json``::

    {"format": 1, "entries": [{"name": "models/qwen", "kind": "model", "version": "<commit or digest>",
      "path": "models/qwen", "size": <bytes, all files>, "sha256": "<see below>",
      "files": [{"path": "models/qwen/qwen.gguf", "size": ..., "sha256": ...}], "meta": {...}}]}

An entry's ``sha256`` is the sha256 of its one file, or for an entry of several files (a package repository)
the sha256 of their ``sha256sum`` listing (``<sha256>  <path>\\n``, sorted by path): one value that names the
whole content either way.

What verification refuses (each with the entry named and what to do)
--------------------------------------------------------------------
* a file the manifest lists that is missing, not a regular file (a link, a directory, a FIFO), or whose size
  or sha256 differs (truncated, grown, altered);
* a file inside an entry's directory that the manifest does not list: whoever reads the entry may read the
  whole directory (a package manager indexes a repository directory), so unlisted bytes there are as
  dangerous as altered ones;
* a manifest that is not this format: unknown format, a name outside the areas above, a path that leaves
  the bundle (absolute, ``..``) or is not under its entry, a duplicate.
A file outside every entry's directory (a README, notes next to the manifest) is reported and ignored.

Cost: every size is checked first (no hashing starts while a file is missing or has the wrong size, so a
truncated 20 GB bundle is refused in milliseconds); then every byte is read once, in fixed-size blocks
(memory stays at one block whatever the file size).

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import hashlib
import json
import os
import re
import stat
import tarfile

__metaclass__ = type

FORMAT = 1
MANIFEST = "manifest.json"
BLOCK = 1 << 20
# the largest manifest read (a bundle of 100,000 package files is ~25 MB of JSON)
MANIFEST_MAX = 64 << 20
AREAS = {"images": "image", "git": "git", "models": "model", "packages": "packages", "binaries": "binary"}
_PART = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"
NAME_RE = re.compile(r"(?:%s)/%s\Z" % ("|".join(sorted(AREAS)), _PART))
PART_RE = re.compile(_PART + r"\Z")
HEX64 = re.compile(r"[0-9a-f]{64}\Z")
# The bundle's path reaches apt's and yum's repository files and file:// URLs: one word, no quoting needed.
SAFE_ROOT = re.compile(r"/[A-Za-z0-9._+/-]*\Z")


class BundleError(Exception):
    """A bundle that cannot be written or used; ``msg`` names the entry and what to do."""

    def __init__(self, msg, problems=None):
        Exception.__init__(self, msg)
        self.msg = msg
        self.problems = problems or []


def entry_name(area, name):
    """``<area>/<name>``, checked: the one place entry names are made."""
    if area not in AREAS:
        raise BundleError("unknown bundle area %r: use one of %s" % (area, ", ".join(sorted(AREAS))))
    if not isinstance(name, str) or not PART_RE.match(name):
        raise BundleError("bundle entry name %r: use letters, digits, '.', '_', '+' or '-' (at most 128, no "
                          "'/', not starting with '.')" % (name,))
    return "%s/%s" % (area, name)


def check_name(name):
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BundleError("bundle entry name %r is not <area>/<name> with area one of %s"
                          % (name, ", ".join(sorted(AREAS))))
    return name


def kind_of(name):
    return AREAS[check_name(name).split("/", 1)[0]]


def _open_regular(path):
    """A read-only fd of the regular file at path: never through a link, never blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def sha256_file(path, block=BLOCK, reads=None):
    """(sha256 hex, size) of the regular file at path, read once in ``block``-byte pieces (bounded memory).
    ``reads``: a list that gets each read's length (the tests count them)."""
    fd, _st = _open_regular(path)
    h = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    size = 0
    try:
        while True:
            n = os.readv(fd, [buf]) if hasattr(os, "readv") else _read_into(fd, buf)
            if not n:
                break
            h.update(view[:n])
            size += n
            if reads is not None:
                reads.append(n)
    finally:
        view.release()
        os.close(fd)
    return h.hexdigest(), size


def _read_into(fd, buf):  # pragma: no cover - every supported Linux Python has os.readv
    data = os.read(fd, len(buf))
    buf[:len(data)] = data
    return len(data)


def listing_sha256(files):
    """The sha256 that names a multi-file entry: of its ``sha256sum`` listing, sorted by path."""
    text = "".join("%s  %s\n" % (f["sha256"], f["path"]) for f in sorted(files, key=lambda f: f["path"]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _walk_files(root, rel):
    """Relative paths (under the bundle root) of every non-directory below ``root/rel``, sorted; a symlink
    (to a file or a directory) is returned as a path, never followed."""
    out = []
    top = os.path.join(root, rel)
    for dirpath, dirnames, filenames in os.walk(top):
        keep = []
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                filenames.append(d)
            else:
                keep.append(d)
        dirnames[:] = sorted(keep)
        for f in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return sorted(out)


def describe(root, entry, block=BLOCK):
    """A manifest entry for the files already in ``root/<entry name>`` (bundle_manifest).  ``entry``: name,
    version, optional kind (default: the area's) and meta (a dict)."""
    name = check_name(entry["name"])
    kind = entry.get("kind") or kind_of(name)
    if kind != kind_of(name):
        raise BundleError("%s: kind %r does not match its area (%s)" % (name, kind, kind_of(name)))
    top = os.path.join(root, name)
    if not os.path.isdir(top) or os.path.islink(top):
        raise BundleError("%s: %s is not a directory of the bundle: put the entry's files there first"
                          % (name, top))
    files = []
    for rel in _walk_files(root, name):
        try:
            digest, size = sha256_file(os.path.join(root, rel), block)
        except OSError as e:
            raise BundleError("%s: %s is not a regular file the bundle can list (%s): remove it"
                              % (name, rel, e.strerror or e)) from None
        files.append({"path": rel, "size": size, "sha256": digest})
    if not files:
        raise BundleError("%s: %s holds no file" % (name, top))
    verified = entry.get("sha256")
    if verified and (len(files) != 1 or files[0]["sha256"] != verified):
        # the digest the source's own verification gave (model_download): the bundle never lists other bytes
        raise BundleError("%s: %s is not the verified file (sha256 %s): %s. Nothing was listed; write the "
                          "entry again" % (name, top, verified, ", ".join(
                              "%s has %s" % (f["path"], f["sha256"]) for f in files)))
    version = entry.get("version")
    if not isinstance(version, str) or not version.strip():
        raise BundleError("%s: give its version (a commit, tag or image digest)" % name)
    return {"name": name, "kind": kind, "version": version.strip(), "path": name,
            "size": sum(f["size"] for f in files),
            "sha256": files[0]["sha256"] if len(files) == 1 else listing_sha256(files),
            "files": files, "meta": dict(entry.get("meta") or {})}


def manifest_text(entries):
    """The manifest's exact bytes for these entries (sorted by name: the same bundle, the same text)."""
    names = [e["name"] for e in entries]
    dup = sorted(set(n for n in names if names.count(n) > 1))
    if dup:
        raise BundleError("bundle entries named twice: %s" % ", ".join(dup))
    doc = {"format": FORMAT, "entries": sorted(entries, key=lambda e: e["name"])}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_manifest(root, text):
    """Write the manifest atomically (a temporary name, then rename); True when it changed."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, "r") as f:
            if f.read(MANIFEST_MAX + 1) == text:
                return False
    except (IOError, OSError):
        pass
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    return True


def read_manifest(root):
    """The manifest's entries, checked for shape (not yet against the files)."""
    path = os.path.join(root, MANIFEST)
    try:
        fd, st = _open_regular(path)
    except OSError as e:
        raise BundleError("%s: cannot read the bundle's manifest (%s). Point llmops_bundle at a directory "
                          "written by playbooks/bundle.yml" % (path, e.strerror or e)) from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MANIFEST_MAX + 1)
    if len(data) > MANIFEST_MAX:
        raise BundleError("%s is larger than %d bytes: not a manifest this collection wrote"
                          % (path, MANIFEST_MAX))
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise BundleError("%s is not valid JSON (%s): write the bundle again with playbooks/bundle.yml"
                          % (path, e)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        raise BundleError("%s is not a format-%d bundle manifest: write the bundle again with this "
                          "collection's playbooks/bundle.yml" % (path, FORMAT))
    entries = [_checked_entry(e) for e in doc["entries"]]
    manifest_text(entries)  # duplicates
    return entries


def _checked_entry(e):
    if not isinstance(e, dict):
        raise BundleError("a manifest entry is not an object: %r" % (e,))
    name = check_name(e.get("name"))
    files = e.get("files")
    if e.get("kind") != kind_of(name) or not isinstance(files, list) or not files:
        raise BundleError("%s: the manifest entry has no files or a kind other than %s: write the bundle "
                          "again" % (name, kind_of(name)))
    out = []
    for f in files:
        rel = f.get("path") if isinstance(f, dict) else None
        if (not isinstance(rel, str) or rel.startswith("/") or not rel.startswith(name + "/")
                or any(p in ("", ".", "..") for p in rel.split("/"))):
            raise BundleError("%s: file path %r is not inside %s/ of the bundle: the manifest was edited or "
                              "corrupted; write the bundle again" % (name, rel, name))
        size, digest = f.get("size"), f.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or not isinstance(digest, str) \
                or not HEX64.match(digest):
            raise BundleError("%s: %s has no valid size and sha256 in the manifest; write the bundle again"
                              % (name, rel))
        out.append({"path": rel, "size": size, "sha256": digest})
    e = dict(e)
    e["files"] = out
    return e


def verify(root, block=BLOCK):
    """Check every file of the manifest against the bundle.  Returns (entries, notes): the entries (each with
    ``abspath``, the entry's directory) and what was ignored (files outside every entry).  Raises
    BundleError naming every problem, before reading further bytes once a size is wrong."""
    if not isinstance(root, str) or not SAFE_ROOT.match(os.path.abspath(root)):
        raise BundleError("the bundle's path %r goes into apt/yum repository files and file:// URLs: use "
                          "an absolute path of letters, digits and . _ + - / (no spaces), e.g. "
                          "/srv/llmops-bundle" % (root,))
    root = os.path.abspath(root)
    entries = read_manifest(root)
    problems = []
    listed = {}
    for e in entries:
        for f in e["files"]:
            listed[f["path"]] = e["name"]
    # 1. presence, type and size of every listed file (no hashing yet)
    for e in entries:
        for f in e["files"]:
            try:
                st = os.lstat(os.path.join(root, f["path"]))
            except OSError as err:
                if err.errno in (errno.ENOENT, errno.ENOTDIR):
                    problems.append("%s: %s is missing" % (e["name"], f["path"]))
                    continue
                problems.append("%s: %s cannot be read (%s)" % (e["name"], f["path"], err.strerror))
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append("%s: %s is not a regular file (a link, directory or device)"
                                % (e["name"], f["path"]))
            elif st.st_size != f["size"]:
                problems.append("%s: %s has %d bytes, the manifest lists %d (%s)"
                                % (e["name"], f["path"], st.st_size, f["size"],
                                   "truncated" if st.st_size < f["size"] else "grown"))
    # 2. unlisted files inside an entry's directory: refused; elsewhere: ignored, reported
    notes = []
    entry_dirs = set(e["name"] for e in entries)
    for rel in _walk_files(root, ""):
        if rel in listed or rel == MANIFEST:
            continue
        owner = next((d for d in entry_dirs if rel.startswith(d + "/")), None)
        if owner:
            problems.append("%s: %s is in the entry's directory but not in the manifest" % (owner, rel))
        else:
            notes.append("%s is not part of any entry; ignored" % rel)
    if problems:
        raise _refusal(root, problems)
    # 3. every byte, once
    for e in entries:
        for f in e["files"]:
            try:
                digest, size = sha256_file(os.path.join(root, f["path"]), block)
            except OSError as err:
                problems.append("%s: %s cannot be read (%s)" % (e["name"], f["path"], err.strerror or err))
                continue
            if size != f["size"]:
                problems.append("%s: %s changed size while it was read (%d bytes, the manifest lists %d)"
                                % (e["name"], f["path"], size, f["size"]))
            elif digest != f["sha256"]:
                problems.append("%s: %s has sha256 %s, the manifest lists %s (altered)"
                                % (e["name"], f["path"], digest, f["sha256"]))
    if problems:
        raise _refusal(root, problems)
    for e in entries:
        e["abspath"] = os.path.join(root, e["name"])
    return entries, notes


def _refusal(root, problems):
    return BundleError(
        "the offline bundle %s does not match its manifest, nothing was changed: %s. Copy the named entries "
        "again from the bundle that playbooks/bundle.yml wrote (or write the bundle again), remove files it "
        "did not write from the entries' directories, then rerun" % (root, "; ".join(problems)), problems)


def by_name(entries):
    """{name: entry} (what the roles look entries up by)."""
    return dict((e["name"], e) for e in entries)


# What a model entry in model_models names its source by: replaced by the bundle's file.
MODEL_SOURCE_KEYS = ("source", "repo", "filename", "revision", "url", "url_query_var", "endpoint",
                     "token_var", "allow_patterns", "ignore_patterns")


_FULL_COMMIT = re.compile(r"[0-9a-f]{40}\Z")


def archive_commit(path):
    """The commit a `git archive` tarball was written from (git stores it as the tar's pax comment), or ''."""
    try:
        with tarfile.open(path, "r:*") as tar:
            return str(tar.pax_headers.get("comment") or "")
    except (tarfile.TarError, OSError, EOFError):
        return ""


def sources(entries, models=(), git_ref=None, web_ui=False, installed=None):
    """What the roles take from a verified bundle (the entries verify() returned): ``model_models`` with each
    model's source replaced by its file in the bundle (``file://`` URL, the manifest's sha256 and size: the
    model role's own verification checks the copy), ``llama_cpp`` (the llama_cpp role's archive source: the
    tarball of the pinned tree, ``git archive``, and its commit) when the bundle has llama.cpp, the ``images``
    to load and the ``packages`` repositories (``installed``: name -> whether the node has that package, to
    check what a repository left out as part of the OS release). Refuses a model the bundle lacks (the run
    would reach out for it), a snapshot (not bundled yet), a pin that differs from the bundle's (a model's
    sha256 or size, llama.cpp's commit), and llama.cpp's web UI (the pinned tree downloads it from Hugging
    Face while it builds)."""
    named = by_name(entries)
    problems = []
    # entries: every entry's name (the source probe leaves out what the bundle stages)
    out = {"images": [], "packages": [], "entries": sorted(e["name"] for e in entries)}
    new_models = []
    for m in models or ():
        name = m.get("name")
        entry = named.get("models/%s" % name) if isinstance(name, str) and PART_RE.match(name) else None
        if m.get("snapshot") is True:
            problems.append("model %s is a repo snapshot (vLLM): snapshots are not in offline bundles "
                            "yet; serve a single-file model from the bundle or run where the hub is "
                            "reachable" % name)
            continue
        if entry is None:
            problems.append("model %s is not in the bundle (no entry models/%s): add it to model_models "
                            "where playbooks/bundle.yml runs and write the bundle again, or leave it out of "
                            "this run" % (name, name))
            continue
        if len(entry["files"]) != 1:
            problems.append("models/%s has %d files: a split GGUF set is not served from a bundle yet"
                            % (name, len(entry["files"])))
            continue
        f = entry["files"][0]
        for key, value in (("sha256", f["sha256"]), ("size", f["size"])):
            pinned = m.get(key)
            if pinned not in (None, "") and str(pinned).lower().replace("sha256:", "") != str(value):
                problems.append("model %s pins %s %s, the bundle's file has %s: write the bundle again from "
                                "the pinned source, or fix the pin" % (name, key, pinned, value))
        item = dict((k, v) for k, v in m.items() if k not in MODEL_SOURCE_KEYS)
        item.update({"url": "file://" + os.path.join(entry["abspath"], os.path.basename(f["path"])),
                     "sha256": f["sha256"], "size": f["size"]})
        new_models.append(item)
    out["model_models"] = new_models
    git = named.get("git/llama.cpp")
    if git is not None:
        if git_ref and git["version"] != git_ref:
            problems.append("git/llama.cpp is commit %s in the bundle, llama_cpp_git_ref pins %s: write "
                            "the bundle again with this pin, or pin the bundle's commit"
                            % (git["version"], git_ref))
        if web_ui:
            problems.append("llama_cpp_web_ui is on, but the pinned llama.cpp downloads its web UI from "
                            "Hugging Face while it builds, which a bundle does not hold yet: set "
                            "llama_cpp_web_ui: false for an offline install")
        tarball = os.path.join(_root_of(git), git["files"][0]["path"])
        # the commit the tarball is a `git archive` of (git wrote it into the tar's header; a pin by tag has
        # no commit in the manifest): the build identity is then that commit's, the same as where the bundle
        # was written, so the built image the bundle carries is used as it is (no compile)
        commit = git["version"] if _FULL_COMMIT.match(str(git["version"])) else ""
        header = archive_commit(tarball) if commit else ""
        if commit and header != commit:
            problems.append("git/llama.cpp: %s is not `git archive` of commit %s (its header names %r): "
                            "write the bundle again" % (git["files"][0]["path"], commit, header))
        out["llama_cpp"] = {"llama_cpp_source_type": "archive", "llama_cpp_archive_url": "file://" + tarball,
                            "llama_cpp_archive_sha256": git["files"][0]["sha256"],
                            "llama_cpp_archive_commit": commit}
    for e in entries:
        if e["kind"] == "image":
            out["images"].append({"name": e["name"], "version": e["version"],
                                  "refs": list((e.get("meta") or {}).get("refs") or []),
                                  "file": os.path.join(_root_of(e), e["files"][0]["path"])})
        elif e["kind"] == "packages":
            out["packages"].append({"name": e["name"], "repo": e["name"].split("/", 1)[1],
                                    "path": e["abspath"], "format": (e.get("meta") or {}).get("format", "")})
            # what the repository left out because the staging host's OS release had it: this node must too
            assumed = (e.get("meta") or {}).get("from_the_system") or []
            lacking = [n for n in assumed if installed is not None and not installed(n)]
            if lacking:
                problems.append("%s leaves out %s as part of the OS release (the staging host had them "
                                "installed), but this node does not have them: install them, or write the "
                                "bundle again with their repository in bundle_apt_sources"
                                % (e["name"], ", ".join(lacking)))
    if problems:
        raise BundleError("the offline bundle cannot serve this run, nothing was changed: %s"
                          % "; ".join(problems), problems)
    return out


def _root_of(entry):
    """The bundle directory of a verified entry (its abspath less its name)."""
    return entry["abspath"][:-len(entry["name"]) - 1]
