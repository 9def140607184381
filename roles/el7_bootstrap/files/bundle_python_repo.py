# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Check an offline bundle's package repository before python3 is installed from it (role el7_bootstrap).

Runs on the node under the interpreter EL 7 always has, /usr/bin/python 2.7 (yum's own), because python3 is
what it is about to install: so Python 2.7 and 3 alike, standard library only, no f-strings. The same rules as
the bundle_verify module (plugins/module_utils/_software/bundle.py), for the one entry the bootstrap reads:

    python bundle_python_repo.py BUNDLE REPO REPOSDIR PACKAGE...

BUNDLE: the bundle directory (manifest.json); REPO: the packages/<REPO> entry to use when the manifest
has several (one is used whatever its name); REPOSDIR: an empty directory where, when every check passes,
the one yum repository file of that entry is written (yum --setopt=reposdir=REPOSDIR); PACKAGE: the
packages to install, each must be in the entry as <name>-<version>-<release>.<arch>.rpm.  Every file of the
entry is checked: listed with its size and sha256 (all sizes first, then every byte once), a regular file
(no link), and no unlisted file inside the entry's directory.  Prints LLMOPS_BUNDLE_OK, or
LLMOPS_BUNDLE_REFUSED with the reasons (exit 1): nothing is written then.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import json
import os
import re
import stat
import sys

__metaclass__ = type

FORMAT = 1
MANIFEST = "manifest.json"
BLOCK = 1 << 20
HEX64 = re.compile(r"[0-9a-f]{64}\Z")
WRITE_AGAIN = "write the bundle again with playbooks/bundle.yml (docs/mirrors.md, \"Bundle\")"
try:
    TEXT, INTEGERS = (str, unicode), (int, long)  # noqa: F821 - Python 2.7 (the node's /usr/bin/python)
except NameError:
    TEXT, INTEGERS = (str,), (int,)


class Refused(Exception):
    pass


def sha256_of(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    digest = hashlib.sha256()
    size = 0
    try:
        while True:
            data = os.read(fd, BLOCK)
            if not data:
                break
            digest.update(data)
            size += len(data)
    finally:
        os.close(fd)
    return digest.hexdigest(), size


def read_manifest(root):
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, "rb") as handle:
            doc = json.loads(handle.read().decode("utf-8"))
    except (IOError, OSError, ValueError) as err:
        doc = err  # raised below, outside the handler (Python 2.7 has no "raise ... from None")
    if isinstance(doc, Exception):
        raise Refused("%s cannot be read as a bundle manifest (%s): point llmops_bundle at a directory that "
                      "playbooks/bundle.yml wrote" % (path, doc))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        raise Refused("%s is not a format-%d bundle manifest: %s" % (path, FORMAT, WRITE_AGAIN))
    return [e for e in doc["entries"] if isinstance(e, dict)]


def choose_entry(entries, wanted):
    """The packages/* entry: the only one, else packages/<wanted>."""
    repos = [e for e in entries if isinstance(e.get("name"), TEXT) and e["name"].startswith("packages/")]
    if len(repos) == 1:
        return repos[0]
    named = [e for e in repos if e["name"] == "packages/" + wanted]
    if named:
        return named[0]
    if not repos:
        raise Refused("the bundle has no package repository (no packages/<repo> entry), so python3 cannot be "
                      "installed from it: write the bundle with python3 in bundle_packages")
    raise Refused("the bundle has several package repositories (%s) and none is packages/%s: set "
                  "el7_bootstrap_bundle_repo to the one for this node"
                  % (", ".join(sorted(e["name"] for e in repos)), wanted))


def listed_files(entry):
    name = entry["name"]
    files = entry.get("files")
    if not isinstance(files, list) or not files:
        raise Refused("%s lists no files in the manifest: %s" % (name, WRITE_AGAIN))
    out = []
    for f in files:
        rel = f.get("path") if isinstance(f, dict) else None
        if (not isinstance(rel, TEXT) or rel.startswith("/") or not rel.startswith(name + "/")
                or [p for p in rel.split("/") if p in ("", ".", "..")]):
            raise Refused("%s: file path %r is not inside %s/ of the bundle: the manifest was edited or "
                          "corrupted; %s" % (name, rel, name, WRITE_AGAIN))
        size, digest = f.get("size"), f.get("sha256")
        if isinstance(size, bool) or not isinstance(size, INTEGERS) or size < 0 \
                or not isinstance(digest, TEXT) or not HEX64.match(digest):
            raise Refused("%s: %s has no valid size and sha256 in the manifest; %s"
                          % (name, rel, WRITE_AGAIN))
        out.append((rel, size, digest))
    return out


def missing_packages(name, files, packages):
    """The packages of `packages` with no <name>-<version>-<release>.<arch>.rpm in the entry (rpm allows no
    '-' in a version or release, so python3 never matches python3-libs)."""
    names = [os.path.basename(rel) for rel, _size, _digest in files]
    return [p for p in packages
            if not [n for n in names if re.match(re.escape(p) + r"-[^-/]+-[^-/]+\.[^-/.]+\.rpm\Z", n)]]


def check_files(root, name, files):
    problems = []
    for rel, size, _digest in files:  # every size first: no hashing while a file is missing or truncated
        try:
            st = os.lstat(os.path.join(root, rel))
        except OSError:
            problems.append("%s is missing" % rel)
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append("%s is not a regular file (a link, directory or device)" % rel)
        elif st.st_size != size:
            problems.append("%s has %d bytes, the manifest lists %d (%s)"
                            % (rel, st.st_size, size, "truncated" if st.st_size < size else "grown"))
    listed = set(rel for rel, _size, _digest in files)
    for top, dirs, names in os.walk(os.path.join(root, name)):
        for base in sorted(names + [d for d in dirs if os.path.islink(os.path.join(top, d))]):
            rel = os.path.relpath(os.path.join(top, base), root).replace(os.sep, "/")
            if rel not in listed:
                problems.append("%s is in the entry's directory but not in the manifest" % rel)
    if not problems:
        for rel, size, digest in files:  # then every byte, once
            try:
                got, got_size = sha256_of(os.path.join(root, rel))
            except OSError as err:
                problems.append("%s cannot be read (%s)" % (rel, err))
                continue
            if got_size != size or got != digest:
                problems.append("%s has sha256 %s, the manifest lists %s (altered)" % (rel, got, digest))
    if problems:
        raise Refused("the offline bundle %s does not match its manifest: %s: %s. Nothing was installed; "
                      "copy %s again from the bundle that playbooks/bundle.yml wrote, then rerun"
                      % (root, name, "; ".join(problems), name))


def main(argv):
    if len(argv) < 5:
        raise Refused("usage: bundle_python_repo.py BUNDLE REPO REPOSDIR PACKAGE...")
    root, wanted, reposdir, packages = os.path.abspath(argv[1]), argv[2], argv[3], argv[4:]
    entry = choose_entry(read_manifest(root), wanted)
    name = entry["name"]
    files = listed_files(entry)
    if name + "/repodata/repomd.xml" not in [rel for rel, _size, _digest in files]:
        raise Refused("%s is not a yum repository (no repodata/repomd.xml listed): write the bundle with "
                      "python3 in bundle_packages (createrepo indexes it)" % name)
    absent = missing_packages(name, files, packages)
    if absent:
        raise Refused("%s of the bundle has no %s (no <name>-<version>-<release>.<arch>.rpm), which this "
                      "node lacks: write the bundle with %s in bundle_packages (yumdownloader --resolve on a "
                      "CentOS 7 staging host brings their dependencies)"
                      % (name, ", ".join(absent), " ".join(packages)))
    check_files(root, name, files)
    repo = name.split("/", 1)[1]
    with open(os.path.join(reposdir, "llmops-bundle.repo"), "w") as handle:
        handle.write("# llmops.serving el7_bootstrap: python3 from the offline bundle %s only\n"
                     "[llmops-bundle-%s]\nname=llmops.serving offline bundle %s\nbaseurl=file://%s/\n"
                     "enabled=1\ngpgcheck=0\nmetadata_expire=0\n"
                     % (root, repo, repo, os.path.join(root, name)))
    print("LLMOPS_BUNDLE_OK %s: %d files match the manifest" % (name, len(files)))


if __name__ == "__main__":
    try:
        main(sys.argv)
    except Refused as err:
        print("LLMOPS_BUNDLE_REFUSED: %s" % err)
        sys.exit(1)
