# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Lint the collection's plugin and role documentation as the community collections do: antsibull-docs.

    python tools/ci/docs_lint.py            # what the lint session runs (exit 1 on a finding)
    python tools/ci/docs_lint.py --rstcheck # also rstcheck the generated RST (slower)

It runs `antsibull-docs lint-collection-docs --plugin-docs` on collections/ansible_collections/llmops/serving
(the checkout laid out as a collection): every module's DOCUMENTATION, EXAMPLES and RETURN and every role's
meta/argument_specs.yml must load against the docs schema, and each markup reference (`M(...)`, `O(...)`,
`RV(...)`) must name a real module, option or return value. That is what a user reads on the doc site, so
a broken reference is a broken page; ansible-test's validate-modules (tests/sanity.sh) checks the spec
against the argument spec, not the references.

Findings that are accepted on purpose are listed, each with its reason, in
tests/sanity/antsibull-docs-ignore.txt: one entry a line, `PATH_GLOB | MESSAGE_PREFIX | REASON`. An entry that
no longer matches any finding is itself an error, as in ansible-test's ignore files, so the list cannot
outlive what it excuses.
"""
import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTION = os.path.join(ROOT, "collections", "ansible_collections", "llmops", "serving")
IGNORE_FILE = os.path.join(ROOT, "tests", "sanity", "antsibull-docs-ignore.txt")


class IgnoreError(ValueError):
    """A line of the ignore file that cannot be read; the message names the line."""


def parse_ignores(text, source="ignore file"):
    """The entries of an ignore file: [(line number, path glob, message prefix)]. A reason is required."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split("|")]
        if len(parts) != 3 or not all(parts):
            raise IgnoreError("%s:%d: expected `PATH_GLOB | MESSAGE_PREFIX | REASON`, got %r"
                              % (source, number, line))
        entries.append((number, parts[0], parts[1]))
    return entries


def apply_ignores(messages, entries):
    """Split antsibull-docs' messages into (kept, unused entries): a message is dropped when an entry's glob
    matches its path and its text starts with the entry's prefix."""
    used = set()
    kept = []
    for message in messages:
        path, text = message.get("path") or "", message.get("message") or ""
        hits = [entry for entry in entries
                if fnmatch.fnmatchcase(path, entry[1]) and text.startswith(entry[2])]
        if hits:
            used.update(entry[0] for entry in hits)
        else:
            kept.append(message)
    return kept, [entry for entry in entries if entry[0] not in used]


def format_message(message):
    where = message.get("path") or "?"
    if message.get("row"):
        where += ":%s" % message["row"]
    return "%s: %s" % (where, message.get("message", "").strip())


def antsibull_docs():
    """The antsibull-docs program of this interpreter's environment (.venv), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "antsibull-docs")
    return beside if os.access(beside, os.X_OK) else shutil.which("antsibull-docs")


def run_lint(program, rstcheck=False):
    """antsibull-docs' messages for the collection; RuntimeError when it produced no report at all."""
    argv = [program, "lint-collection-docs", "--plugin-docs", "--message-format", "json"]
    if not rstcheck:
        argv.append("--skip-rstcheck")
    # Run from the collection path: antsibull-docs reads galaxy.yml there and copies the collection aside.
    argv.append(".")
    result = subprocess.run(argv, cwd=COLLECTION, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True)
    try:
        report = json.loads(result.stdout)
    except ValueError as error:
        raise RuntimeError("antsibull-docs exited %d without a JSON report:\n%s%s"
                           % (result.returncode, result.stdout[-2000:], result.stderr[-4000:])) from error
    return report.get("messages", [])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rstcheck", action="store_true", help="also run rstcheck on the generated RST")
    args = parser.parse_args(argv)
    program = antsibull_docs()
    if not program:
        print("docs_lint: antsibull-docs is not installed: run `bin/llmops-dev setup` (requirements.txt pins "
              "it)", file=sys.stderr)
        return 2
    if not os.path.isdir(COLLECTION):
        print("docs_lint: %s is missing: the checkout must be laid out as a collection there (a symlink to "
              "the repository root, see docs/install.md)" % COLLECTION, file=sys.stderr)
        return 2
    with open(IGNORE_FILE, encoding="utf-8") as handle:
        entries = parse_ignores(handle.read(), os.path.relpath(IGNORE_FILE, ROOT))
    try:
        messages = run_lint(program, rstcheck=args.rstcheck)
    except RuntimeError as error:
        print("docs_lint: %s" % error, file=sys.stderr)
        return 1
    kept, unused = apply_ignores(messages, entries)
    for message in kept:
        print(format_message(message))
    for number, glob, prefix in unused:
        print("%s:%d: ignore entry matches no finding any more, remove it: %s | %s"
              % (os.path.relpath(IGNORE_FILE, ROOT), number, glob, prefix))
    if kept or unused:
        return 1
    print("docs_lint: the plugin and role docs pass antsibull-docs (%d finding(s) ignored on purpose)"
          % (len(messages) - len(kept)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
