# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every relative link of the project's Markdown resolves: the file or directory exists in the checkout, and a
`#fragment` names a heading of the target as GitHub renders it. The README is a landing page whose depth is in
docs/, so a page moved or a heading renamed must not leave a link behind. What the pages say is not tested
here: behaviour is, by the tests of the code they describe."""
import glob
import os
import re

import pytest

from tests.helpers import ROOT

# The Markdown a reader follows links through: the landing pages, docs/, each role's and tool's README.
PAGES = sorted(set(
    ["README.md", "README.zh-CN.md", "CHANGELOG.md", "awx/README.md", "bench/README.md"]
    + [os.path.relpath(path, ROOT) for pattern in ("docs/*.md", "roles/*/README.md")
       for path in glob.glob(os.path.join(ROOT, pattern))]))

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose_lines(text):
    """The lines of a Markdown text outside fenced code blocks, as (line number, line)."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


def links(text):
    """[(line number, target)] of the inline links and images of a Markdown text (not those in code)."""
    found = []
    for number, line in prose_lines(text):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, match.group(1)))
    return found


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces become hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor of a Markdown text: its headings' slugs (a repeated one gets -1, -2, ... as on GitHub)."""
    seen = {}
    result = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else "%s-%d" % (base, count))
    return result


def broken_links(page, root=ROOT):
    """The relative links of `page` (a path under root) that do not resolve, each as a sentence."""
    with open(os.path.join(root, page), encoding="utf-8") as handle:
        text = handle.read()
    problems = []
    for number, target in links(text):
        if EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(root, os.path.dirname(page), path)) if path else \
            os.path.join(root, page)
        where = "%s:%d: %s" % (page, number, target)
        if not os.path.realpath(resolved).startswith(os.path.realpath(root)):
            problems.append("%s points outside the checkout" % where)
        elif not os.path.exists(resolved):
            problems.append("%s: no such file or directory" % where)
        elif fragment and resolved.endswith(".md"):
            with open(resolved, encoding="utf-8") as handle:
                if fragment not in anchors(handle.read()):
                    problems.append("%s: no heading with that anchor in %s"
                                    % (where, os.path.relpath(resolved, root)))
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page():
    # A page nobody links to is a page a newcomer never finds; variables.md and CONVENTIONS.md included.
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        targets = {os.path.normpath(target.partition("#")[0]) for _, target in links(handle.read())}
    pages = {os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
    assert sorted(pages - targets) == []


def test_a_broken_link_and_a_wrong_anchor_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# A page\n\n## Where `code` lives: here\n\n## Twice\n\n## Twice\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/page.md) [ok](docs/page.md#where-code-lives-here) [ok](docs/page.md#twice-1)\n"
        "[ok](https://example.org/missing.md) `[in code](nowhere.md)`\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "[gone](docs/missing.md)\n[bad anchor](docs/page.md#nowhere)\n[outside](../../etc/passwd)\n")
    problems = broken_links("README.md", root=str(tmp_path))
    assert len(problems) == 3, problems
    assert "README.md:6: docs/missing.md: no such file" in problems[0]
    assert "no heading with that anchor in docs/page.md" in problems[1]
    assert "points outside the checkout" in problems[2]
