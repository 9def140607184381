# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/ci/docs_lint.py: which antsibull-docs findings its ignore file excuses, and that an entry which
excuses nothing fails the lint. (The lint itself runs in the lint session.)"""
import pytest

from tools.ci import docs_lint


def message(path, text):
    return {"path": path, "row": None, "column": None, "message": text}


def test_an_entry_drops_the_findings_it_names_and_no_other():
    entries = docs_lint.parse_ignores(
        "# comment\n\nplugins/filter/*.py | Missing documentation | internal filters\n")
    findings = [message("plugins/filter/fleet_summary.py", "Missing documentation or could not parse: x"),
                message("plugins/modules/gpu_facts.py", "Missing documentation or could not parse: y"),
                message("plugins/filter/fleet_summary.py", "DOCUMENTATION -> options: bad")]
    kept, unused = docs_lint.apply_ignores(findings, entries)
    assert kept == findings[1:]
    assert unused == []


def test_an_entry_that_excuses_nothing_is_reported():
    entries = docs_lint.parse_ignores("roles/gone/meta/argument_specs.yml | Did not return | role removed\n")
    kept, unused = docs_lint.apply_ignores([], entries)
    assert kept == [] and unused == [(1, "roles/gone/meta/argument_specs.yml", "Did not return")]


@pytest.mark.parametrize("line", ["plugins/filter/*.py | Missing documentation",
                                  "plugins/filter/*.py | Missing documentation | ",
                                  "plugins/filter/*.py Missing documentation internal"])
def test_an_entry_without_a_reason_is_refused(line):
    with pytest.raises(docs_lint.IgnoreError, match="ignore file:1: expected"):
        docs_lint.parse_ignores(line)


def test_the_collections_ignore_file_excuses_only_the_filters():
    with open(docs_lint.IGNORE_FILE, encoding="utf-8") as handle:
        entries = docs_lint.parse_ignores(handle.read())
    assert entries and all(glob == "plugins/filter/*.py" for _, glob, _ in entries)


def test_a_finding_is_printed_with_its_place():
    assert docs_lint.format_message(message("plugins/modules/x.py", " bad \n")) == "plugins/modules/x.py: bad"
    assert docs_lint.format_message(dict(message("a.yml", "bad"), row=3)) == "a.yml:3: bad"
