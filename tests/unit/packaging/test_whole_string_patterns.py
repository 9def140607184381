# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""No check in the collection ends its pattern with `$` (issue 34).

Python's `$` (and Jinja's `match`/`search` tests, which are Python's re) also match just before a final
newline: `re.match(r"^[a-z]+$", "qwen\\n")` accepts it, and the checked value then starts a new line of the
file it reaches. This walks every Python file of plugins/ and roles/ and every task file, and refuses a
pattern literal with an unescaped `$` outside a character class: Python checks use
plugins/module_utils/validators.py (`whole`, `matches`: `\\A...\\Z`), YAML checks end their pattern with
`\\Z`.
A pattern that scans many lines (re.M / (?m)) is a parser, not a check, and may keep `$`.
"""
import ast
import glob
import os
import re

import pytest
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole

from tests.helpers import ROOT

RE_FUNCTIONS = ("compile", "match", "search", "fullmatch")
# Jinja tests and filters that take a pattern: `x is match('...')`, `select('match', '...')`.
YAML_PATTERN = re.compile(r"""(?:is\s+(?:not\s+)?(?:match|search|regex)\s*\(\s*"""
                          r"""|\(\s*['"](?:match|search|regex)['"]\s*,\s*)"""
                          r"""(?P<q>['"])(?P<pattern>(?:(?!(?P=q)).)*)(?P=q)""")


def dollar_anchored(pattern):
    """True when `pattern` has a `$` that is not escaped nor inside a character class."""
    escaped = in_class = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            return True
    return False


def _multiline(call):
    flags = list(call.args[1:]) + [k.value for k in call.keywords if k.arg == "flags"]
    return any(isinstance(node, ast.Attribute) and node.attr in ("M", "MULTILINE")
               for flag in flags for node in ast.walk(flag))


def python_offenders(source, path="<text>"):
    """(path:line, pattern) of every re.compile/match/search/fullmatch literal anchored with `$`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in RE_FUNCTIONS and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re" and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and dollar_anchored(first.value) \
                and not _multiline(node) and "(?m)" not in first.value:
            found.append(("%s:%d" % (path, node.lineno), first.value))
    return found


def yaml_offenders(text, path="<text>"):
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in YAML_PATTERN.finditer(line):
            if dollar_anchored(match.group("pattern")) and "(?m)" not in match.group("pattern"):
                found.append(("%s:%d" % (path, number), match.group("pattern")))
    return found


def python_files():
    files = glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "roles", "**", "*.py"), recursive=True)
    return sorted(files)


def yaml_files():
    files = []
    for pattern in ("roles/**/*.yml", "playbooks/**/*.yml", "site.yml"):
        files += glob.glob(os.path.join(ROOT, pattern), recursive=True)
    return sorted(files)


def test_the_helper_refuses_a_final_newline_that_dollar_lets_through():
    assert re.match(r"^[0-9a-f]{64}$", "a" * 64 + "\n")  # the cause
    hex64 = whole(r"[0-9a-f]{64}")
    assert hex64.match("a" * 64) and hex64.search("a" * 64) and hex64.fullmatch("a" * 64)
    for bad in ("a" * 64 + "\n", "\n" + "a" * 64, "a" * 65, "x" + "a" * 64):
        assert not hex64.match(bad) and not hex64.search(bad)
    assert matches(r"[a-z]+(\.[a-z]+)?", "ab.cd").group(1) == ".cd"  # groups keep their numbers
    assert matches(r"[a-z]+", "qwen\n") is None and matches(r"[a-z]+", None) is None
    assert matches(r"[a-z]+", "QWEN", re.I)


def test_the_walk_finds_a_dollar_anchored_check_and_passes_the_others():
    source = ('import re\nA = re.compile(r"^[a-z]+$")\nB = re.match("^x$", y)\nC = re.compile(r"[$]\\$")\n'
              'D = re.compile(r"^v: (\\S+)$", re.M)\nE = re.search(r"(?m)^x$", t)\n')
    assert python_offenders(source) == [("<text>:2", "^[a-z]+$"), ("<text>:3", "^x$")]
    text = ("that:\n  - x is match('^[0-9]+$')\n  - y is not search(\"a$|b\")\n  - z is match('^[0-9]+\\Z')\n"
            "  when: a | select('match', '^b$') | list\n  w: \"{{ v | regex_replace('/+$', '') }}\"\n")
    assert [where for where, _ in yaml_offenders(text)] == ["<text>:2", "<text>:3", "<text>:5"]


@pytest.mark.parametrize("path", python_files() + yaml_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_check_is_anchored_with_dollar(path):
    offenders = python_offenders if path.endswith(".py") else yaml_offenders
    with open(path) as handle:
        found = offenders(handle.read(), os.path.relpath(path, ROOT))
    assert not found, ("a pattern ending in `$` lets a final newline through; in Python use "
                       "plugins/module_utils/validators.py (whole / matches), in YAML end it with \\Z: %s"
                       % found)
