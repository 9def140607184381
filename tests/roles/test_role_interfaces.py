# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every role's interface, one rule set for all (the geerlingguy layout the README promises):
defaults/main.yml declares exactly the optional inputs of meta/argument_specs.yml, every name carries the
role's prefix, a default given in both places is the same value (and one of its choices), and every variable
has a comment above it or above its group."""
import os
import re

import pytest

from tests.helpers import ROOT, load_yaml

ROLES = os.path.join(ROOT, "roles")
ROLE_NAMES = sorted(name for name in os.listdir(ROLES) if os.path.isdir(os.path.join(ROLES, name)))


def interface(role):
    """(defaults, options of every entry point, the lines of defaults/main.yml)."""
    path = os.path.join(ROLES, role, "defaults", "main.yml")
    with open(path) as handle:
        lines = handle.read().splitlines()
    specs = load_yaml(os.path.join(ROLES, role, "meta", "argument_specs.yml"))["argument_specs"]
    options = {}
    for entry_point in specs.values():
        options.update(entry_point.get("options") or {})
    return load_yaml(path) or {}, options, lines


def test_every_role_is_checked():
    assert {"serving", "gateway", "fleet", "ray_cluster", "vllm", "llama_cpp", "model"} <= set(ROLE_NAMES)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_defaults_are_the_optional_inputs_of_the_argument_specs(role):
    defaults, options, _lines = interface(role)
    optional = set(name for name, option in options.items() if not option.get("required"))
    assert set(defaults) == optional, set(defaults) ^ optional


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_input_carries_the_role_prefix(role):
    _defaults, options, _lines = interface(role)
    assert [name for name in options if not name.startswith(role + "_")] == []


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_a_default_in_both_places_is_the_same_value_and_one_of_its_choices(role):
    defaults, options, _lines = interface(role)
    for name, option in options.items():
        if "default" in option:
            assert option["default"] == defaults[name], name
        literal = name in defaults and "{{" not in str(defaults[name])
        if "choices" in option and literal and not isinstance(defaults[name], list):
            assert defaults[name] in option["choices"], name


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_has_a_comment_above_it_or_its_group(role):
    _defaults, _options, lines = interface(role)
    for index, line in enumerate(lines):
        if not re.match(r"^%s_\w+:" % re.escape(role), line):
            continue
        above = index - 1
        while above >= 0 and lines[above].strip() and not lines[above].startswith("#"):
            above -= 1      # the group's other variables and their continuation lines
        assert above >= 0 and lines[above].startswith("#"), "%s: %s has no comment" % (role, line)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_registered_results_and_role_vars_carry_the_private_prefix(role):
    """`_<role>_`: what a role registers or sets in vars/ shadows no other role's variable and no input."""
    private = "_%s_" % role
    for base, _dirs, files in os.walk(os.path.join(ROLES, role)):
        for name in files:
            path = os.path.join(base, name)
            with open(path) as handle:
                text = handle.read()
            for register in re.findall(r"register: (\S+)", text):
                assert register.startswith(private), (path, register)
            if os.path.basename(base) == "vars" and name.endswith(".yml"):
                assert [key for key in load_yaml(path) or {} if not key.startswith(private)] == [], path
