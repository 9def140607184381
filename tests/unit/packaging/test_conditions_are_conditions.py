# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every condition in the collection's YAML is a condition, not a mapping.

A plain YAML scalar that contains ": " is a mapping: `- out is search('Check mode: would install x')` in an
assert's `that` list is the dict {"out is search('Check mode": "would install x')"}, which Ansible 2.16 only
warns about and takes as true - a check that can never fail (two such lines were found in Molecule
scenarios). This walks every playbook, task file and scenario and refuses any `that`, `when`,
`failed_when`, `changed_when` or `until` entry that YAML did not read as a string or a boolean.
"""
import glob
import os

import pytest
import yaml

from tests.helpers import ROOT

CONDITION_KEYS = ("when", "failed_when", "changed_when", "until")
ASSERTS = ("ansible.builtin.assert", "assert")
PATTERNS = ("site.yml", "playbooks/**/*.yml", "roles/**/*.yml", "molecule/**/*.yml", "tests/**/*.yml",
            "awx/**/*.yml")


def yaml_files():
    found = set()
    for pattern in PATTERNS:
        found.update(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(f for f in found if "/.cache/" not in f and "/collections/" not in f)


def not_conditions(node):
    """(where, what) of every condition in `node` that is not a string or a boolean."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ASSERTS and isinstance(value, dict):
                items = value.get("that") if isinstance(value.get("that"), list) else [value.get("that")]
                found.extend(("that", item) for item in items if not isinstance(item, (str, bool)))
            if key in CONDITION_KEYS:
                items = value if isinstance(value, list) else [value]
                found.extend((key, item) for item in items if not isinstance(item, (str, bool, int)))
            found.extend(not_conditions(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(not_conditions(item))
    return found


def test_the_walk_finds_a_condition_that_yaml_read_as_a_mapping():
    text = "- ansible.builtin.assert:\n    that:\n      - out is search('Check mode: would install x')\n"
    mapping = {"out is search('Check mode": "would install x')"}
    assert not_conditions(yaml.safe_load(text)) == [("that", mapping)]
    assert not_conditions(yaml.safe_load("- debug: {}\n  when: \"out is search('a: b')\"\n")) == []


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_condition_is_a_string(path):
    with open(path) as handle:
        try:
            documents = list(yaml.safe_load_all(handle))
        except yaml.YAMLError:
            pytest.skip("not plain YAML (a Jinja template)")
    bad = [item for document in documents for item in not_conditions(document)]
    assert not bad, "%s: conditions YAML reads as mappings (quote them, or write ':\\s' for ': '): %s" % (
        os.path.relpath(path, ROOT), bad)
