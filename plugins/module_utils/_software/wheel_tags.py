# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Can this node install that wheel? Decided before pip downloads gigabytes.

A wheel says what it needs in its file name (PEP 427/425 tags: ``cp38-abi3-manylinux_2_28_x86_64`` = CPython
3.8 or newer through the stable ABI, glibc 2.28 or newer, x86_64) and in its METADATA (``Requires-Python``).
:func:`check` compares them with what the node has: its glibc (:func:`glibc_version`), its machine and the
interpreter the virtualenv will be made with (:func:`probe_python`). It returns ``compatible`` and one
sentence per unmet need, with numbers, so the caller can say what to do instead (a container, a newer Python).

Only the rules pip applies to the tags above are followed (no PyPy, macOS or Windows wheels: those are simply
reported as not for this node). Python 3.6, standard library only; used by the module wheel_compat_info and
unit-tested by tests/unit/plugins/module_utils/test_wheel_tags.py.
"""
from __future__ import absolute_import, division, print_function

import json
import os
import re
import zipfile
from zlib import error as zlib_error

from ansible_collections.llmops.serving.plugins.module_utils.bounded_run import run_bounded
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches

__metaclass__ = type

# Legacy manylinux names and the glibc they stand for (PEP 600).
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
# Runs under the interpreter being checked, whatever its version (Python 2 included): no f-strings.
PROBE_CODE = ("import json, platform, sys; print(json.dumps({'implementation': "
              "platform.python_implementation().lower(), 'version': list(sys.version_info[:3]), "
              "'executable': sys.executable}))")


# Limits (documented in the module): a wheel's METADATA read at most this far (its headers come first; a
# METADATA that inflates to gigabytes is cut there), a version part at most this many digits (Python 3.11+
# refuses int() of 4,300 digits), the interpreter probe at most this long.
MAX_METADATA_BYTES = 1024 * 1024
MAX_VERSION_DIGITS = 64
PROBE_TIMEOUT_S = 30
PROBE_MAX_BYTES = 64 * 1024


class WheelTagError(ValueError):
    """A wheel name or a Requires-Python specifier that cannot be read."""


def version_tuple(text):
    """'3.11.7' -> (3, 11, 7); pre-release and local parts are dropped ('3.13.0rc1' -> (3, 13, 0))."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(text)[:4096])
    if not match:
        raise WheelTagError("not a version: %r" % (str(text)[:80],))
    parts = match.group(1).split(".")
    if len(parts) > 32 or any(len(part) > MAX_VERSION_DIGITS for part in parts):
        raise WheelTagError("not a version (a part of more than %d digits, or more than 32 parts): %r"
                            % (MAX_VERSION_DIGITS, str(text)[:80]))
    return tuple(int(part) for part in parts)


def dotted(version):
    return ".".join(str(part) for part in version)


def expand_tags(tag):
    """A compressed tag set ('py2.py3-none-any') -> its triples (['py2-none-any', 'py3-none-any'])."""
    parts = tag.split("-")
    if len(parts) != 3 or not all(parts):
        raise WheelTagError("not a wheel tag (python-abi-platform): %r" % (tag,))
    return ["-".join((py, abi, plat)) for py in parts[0].split(".") for abi in parts[1].split(".")
            for plat in parts[2].split(".")]


def parse_wheel_filename(path):
    """'.../vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl' -> name, version, tags (triples)."""
    filename = os.path.basename(path)
    if not filename.endswith(".whl"):
        raise WheelTagError("not a wheel file name (no .whl): %r" % (filename,))
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise WheelTagError("not a wheel file name (name-version[-build]-python-abi-platform.whl): %r"
                            % (filename,))
    return {"name": parts[0], "version": parts[1], "tags": expand_tags("-".join(parts[-3:]))}


def requires_python_from_wheel(path):
    """Requires-Python of a wheel on this node (its *.dist-info/METADATA), '' when it has none."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            metadata = None
            if names:
                # bounded: a METADATA that inflates to gigabytes is read to MAX_METADATA_BYTES (the headers,
                # Requires-Python among them, come first)
                with wheel.open(names[0]) as member:
                    metadata = member.read(MAX_METADATA_BYTES).decode("utf-8", "replace")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, OSError,
            ValueError, KeyError, UnicodeError, OverflowError, zlib_error) as error:
        # corrupt, truncated, encrypted (RuntimeError), an unknown compression (NotImplementedError)...
        raise WheelTagError("%s is not a readable wheel (zip): %s: %s"
                            % (path, type(error).__name__, str(error)[:200])) from None
    if metadata is None:
        raise WheelTagError("%s has no .dist-info/METADATA" % path)
    for line in metadata.splitlines():
        if not line.strip():
            break                                     # the headers end at the first empty line
        if line.lower().startswith("requires-python:"):
            return line.split(":", 1)[1].strip()
    return ""


def _clause_holds(operator, wanted, version):
    wildcard = wanted.endswith(".*")
    wanted_version = version_tuple(wanted[:-2] if wildcard else wanted)
    if wildcard:
        prefix_holds = version[:len(wanted_version)] == wanted_version
        return {"==": prefix_holds, "!=": not prefix_holds}.get(operator)
    width = max(len(version), len(wanted_version))
    left = version + (0,) * (width - len(version))
    right = wanted_version + (0,) * (width - len(wanted_version))
    if operator == "~=":
        return left >= right and version[:len(wanted_version) - 1] == wanted_version[:-1]
    return {"==": left == right, "===": left == right, "!=": left != right, ">=": left >= right,
            "<=": left <= right, ">": left > right, "<": left < right}.get(operator)


def unmet_requires_python(specifier, version):
    """The clauses of a Requires-Python specifier ('>=3.11,<3.15') that `version` (a tuple) fails."""
    unmet = []
    for clause in (c.strip() for c in (specifier or "").split(",")):
        if not clause:
            continue
        match = matches(r"(~=|===|==|!=|>=|<=|>|<)\s*([0-9][0-9a-zA-Z.*+!-]*)", clause)
        holds = _clause_holds(match.group(1), match.group(2), version) if match else None
        if holds is None:
            raise WheelTagError("cannot read the Requires-Python clause %r" % (clause,))
        if not holds:
            unmet.append(clause)
    return unmet


def _tag_version(digits):
    """'38' -> (3, 8), '311' -> (3, 11), '3' -> (3,)."""
    if len(digits) > MAX_VERSION_DIGITS:
        raise WheelTagError("not a python tag version (more than %d digits): %r"
                            % (MAX_VERSION_DIGITS, digits[:80]))
    return (int(digits[0]),) + ((int(digits[1:]),) if len(digits) > 1 else ())


def python_tag_problem(python_tag, abi_tag, python):
    """None when the interpreter (probe_python's dict) runs wheels tagged python_tag-abi_tag, else why not."""
    version, implementation = tuple(python["version"]), python["implementation"]
    label = "%s is %s %s" % (python["executable"], {"cpython": "CPython"}.get(implementation, implementation),
                             dotted(version))
    match = matches(r"(py|cp)(\d+)", python_tag)
    if not match:
        return "%s-%s is for another Python implementation; %s" % (python_tag, abi_tag, label)
    kind, tag_version = match.group(1), _tag_version(match.group(2))
    if kind == "cp" and implementation != "cpython":
        return "%s-%s needs CPython; %s" % (python_tag, abi_tag, label)
    if abi_tag == "abi3" or (kind == "py" and len(tag_version) > 1):
        # stable ABI: this minor version or newer; pyXY: pip accepts it on X.Y and newer X.*
        if version[0] == tag_version[0] and version[1:2] >= tag_version[1:2]:
            return None
        return "%s-%s needs %s %s or newer (same major); %s" % (
            python_tag, abi_tag, "CPython" if kind == "cp" else "Python", dotted(tag_version), label)
    if kind == "py":
        return None if version[0] == tag_version[0] else "%s-%s needs Python %d; %s" % (
            python_tag, abi_tag, tag_version[0], label)
    if version[:2] == tag_version:
        return None
    return "%s-%s needs exactly CPython %s; %s" % (python_tag, abi_tag, dotted(tag_version), label)


def platform_needs(platform_tag):
    """'manylinux_2_28_x86_64' -> {'libc': 'glibc', 'libc_version': (2, 28), 'machine': 'x86_64'}."""
    if platform_tag == "any":
        return {"libc": None, "libc_version": None, "machine": None}
    for legacy, glibc in LEGACY_MANYLINUX.items():
        if platform_tag.startswith(legacy + "_"):
            return {"libc": "glibc", "libc_version": glibc, "machine": platform_tag[len(legacy) + 1:]}
    match = matches(r"(manylinux|musllinux)_(\d+)_(\d+)_(.+)", platform_tag)
    if match:
        libc = "glibc" if match.group(1) == "manylinux" else "musl"
        return {"libc": libc, "libc_version": (int(match.group(2)), int(match.group(3))),
                "machine": match.group(4)}
    if platform_tag.startswith("linux_"):
        return {"libc": None, "libc_version": None, "machine": platform_tag[len("linux_"):]}
    return {"libc": "other", "libc_version": None, "machine": None}


def platform_tag_problems(platform_tag, host):
    """Why a node (glibc tuple or None, machine) cannot run wheels of this platform tag: [(check, reason)],
    check being 'platform', 'glibc' or 'machine'; [] when it can."""
    needs = platform_needs(platform_tag)
    problems = []
    if needs["libc"] == "other":
        return [("platform", "%s is not a Linux platform" % platform_tag)]
    if needs["libc"] == "musl":
        problems.append(("glibc", "%s needs musl libc; this node uses %s" % (
            platform_tag, "glibc" if host["glibc"] else "an unknown libc")))
    elif needs["libc"] == "glibc" and host["glibc"] is None:
        problems.append(("glibc", "%s needs glibc %s or newer; no glibc found on this node" % (
            platform_tag, dotted(needs["libc_version"]))))
    elif needs["libc"] == "glibc" and tuple(host["glibc"]) < needs["libc_version"]:
        problems.append(("glibc", "%s needs glibc %s or newer; this node has glibc %s" % (
            platform_tag, dotted(needs["libc_version"]), dotted(host["glibc"]))))
    machine = MACHINE_ALIASES.get(host["machine"], host["machine"])
    if needs["machine"] and needs["machine"] != machine:
        problems.append(("machine", "%s is built for %s; this node is %s" % (
            platform_tag, needs["machine"], machine)))
    return problems


def check(host, tags, requires_python=""):
    """Decide. host: {'glibc': (2, 28) | None, 'machine': 'x86_64', 'python': probe_python(...)} where python
    may carry an 'error' instead. Compatible when Requires-Python holds and at least one tag fits (or there
    are no tags: a source tree, built for this node). Reasons are listed for every failing tag."""
    python = host["python"]
    result = {"compatible": False, "reasons": [], "failed_checks": [], "matching_tags": []}

    def fail(check_name, reason):
        if reason not in result["reasons"]:
            result["reasons"].append(reason)
        if check_name not in result["failed_checks"]:
            result["failed_checks"].append(check_name)

    if python.get("error"):
        fail("python", python["error"])
        return result
    version = tuple(python["version"])
    unmet = unmet_requires_python(requires_python, version)
    if unmet:
        fail("requires_python", "Requires-Python %s excludes %s (Python %s): %s" % (
            requires_python, python["executable"], dotted(version), ", ".join(unmet)))
    tag_problems = []
    for tag in tags:
        python_tag, abi_tag, platform_tag = tag.split("-")
        problem = python_tag_problem(python_tag, abi_tag, python)
        problems = ([("python", problem)] if problem else []) + platform_tag_problems(platform_tag, host)
        if not problems:
            result["matching_tags"].append(tag)
        tag_problems.extend(problems)
    if tags and not result["matching_tags"]:
        for check_name, reason in tag_problems:
            fail(check_name, reason)
    result["compatible"] = not result["failed_checks"]
    return result


def glibc_version(confstr=None, run=None):
    """The node's glibc version as a tuple, None when it has none (musl) or it cannot be read."""
    confstr = confstr or getattr(os, "confstr", None)
    try:
        text = confstr("CS_GNU_LIBC_VERSION") if confstr else None       # 'glibc 2.17'
    except (ValueError, OSError):
        text = None
    if not text:
        text = (run or _run)(["ldd", "--version"])[1].splitlines()[:1]
        text = text[0] if text and "musl" not in text[0].lower() else ""
    match = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _run(argv):
    """(rc, stdout, stderr) of argv, within PROBE_TIMEOUT_S and PROBE_MAX_BYTES (an interpreter that hangs or
    never stops printing is killed: rc 124 with the reason in stderr)."""
    try:
        rc, out, err, timed_out, overflowed = run_bounded(argv, PROBE_TIMEOUT_S, PROBE_MAX_BYTES)
    except (OSError, ValueError) as error:
        return 127, "", str(error)
    out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if timed_out:
        return 124, out, "did not answer within %d s" % PROBE_TIMEOUT_S
    if overflowed:
        return 124, out[-200:], "printed more than %d bytes" % PROBE_MAX_BYTES
    return rc, out, err


def probe_python(python, run=None):
    """What the interpreter `python` is: {'executable', 'implementation', 'version'} or {'error'}."""
    rc, out, err = (run or _run)([python, "-c", PROBE_CODE])
    if rc != 0:
        detail = (err or out).strip() or "rc=%d" % rc
        return {"error": "the interpreter %s does not run (%s)" % (python, detail)}
    try:
        found = json.loads(out.strip().splitlines()[-1])
        found["version"] = [int(v) for v in found["version"]]
        return found
    except (ValueError, KeyError, IndexError, TypeError):
        return {"error": "the interpreter %s printed no version: %r" % (python, out[-200:])}
