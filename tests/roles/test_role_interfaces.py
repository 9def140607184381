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
from ansible_collections.llmops.serving.plugins.module_utils import engines

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


# A play (or another role) enters a role only where the role says it may: an entry point of its
# meta/argument_specs.yml (Ansible validates the inputs there), with the role's public inputs. A variable that
# starts with `_` is the role's own (its registered results, its vars/): no caller sets it.
INCLUDES = ("include_role", "import_role")
OS_FAMILIES = ("RedHat", "Debian")


def _role_entries(tasks):
    """(role, entry point, vars, task name) of each include_role/import_role in tasks, blocks included."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in ("block", "rescue", "always"):
            for found in _role_entries(task.get(key)):
                yield found
        for action in INCLUDES:
            args = task.get("ansible.builtin." + action, task.get(action))
            if isinstance(args, dict):
                entry = args.get("tasks_from", "main")
                entries = [entry.replace("{{ ansible_os_family }}", family) for family in OS_FAMILIES] \
                    if "{{ ansible_os_family }}" in entry else [entry]
                for name in _role_names(args["name"]):
                    for one in entries:
                        yield name, one, task.get("vars") or {}, task.get("name", "")


def _role_names(name):
    """The roles a role name can be: a templated one (playbooks/build.yml, preflight and role fleet loop over
    the build roles of the engines the instances use) is every value the template can take, from the engine
    descriptors."""
    if re.fullmatch(r"llmops\.serving\.\{\{ _[a-z_]*build_role \}\}", name):
        return sorted({engine.build_role for engine in engines.ENGINES.values()})
    assert "{{" not in name, "a templated role name this test cannot resolve: %s" % name
    return [name]


def _play_entries(play):
    for role in play.get("roles") or []:
        role = {"role": role} if isinstance(role, str) else role
        params = {k: v for k, v in role.items() if k not in ("role", "name", "tags", "when", "vars")}
        yield role.get("role", role.get("name")), "main", dict(role.get("vars") or {}, **params), "roles:"
    for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
        for found in _role_entries(play.get(key)):
            yield found


def entries_into_roles(root=ROOT):
    """(caller file, role, entry point, vars, task name) of every play and role task file that enters a role
    of this collection other than its own."""
    playbooks = [os.path.join(root, "site.yml")] + sorted(
        os.path.join(root, "playbooks", name) for name in os.listdir(os.path.join(root, "playbooks"))
        if name.endswith(".yml"))
    callers = [(path, None, entry) for path in playbooks for play in load_yaml(path) or []
               if isinstance(play, dict) for entry in _play_entries(play)]
    for role in sorted(os.listdir(os.path.join(root, "roles"))):
        tasks_dir = os.path.join(root, "roles", role, "tasks")
        for name in sorted(os.listdir(tasks_dir)) if os.path.isdir(tasks_dir) else []:
            path = os.path.join(tasks_dir, name)
            callers += [(path, role, entry) for entry in _role_entries(load_yaml(path) or [])]
    for path, own, (role, entry, variables, task) in callers:
        role = role.split(".")[-1]
        if role != own:
            yield os.path.relpath(path, root), role, entry, variables, task


def interface_breaches(root=ROOT):
    """What a caller does that the role's interface does not allow: an undeclared entry point, a private
    variable passed in."""
    breaches = []
    for caller, role, entry, variables, task in entries_into_roles(root):
        specs = load_yaml(os.path.join(root, "roles", role, "meta", "argument_specs.yml"))["argument_specs"]
        if entry not in specs:
            breaches.append("%s (%s): entry point %s of role %s is not in its argument_specs" %
                            (caller, task, entry, role))
        breaches += ["%s (%s): passes %s, private to role %s" % (caller, task, name, role)
                     for name in variables if name.startswith("_")]
    return breaches


def test_plays_and_roles_enter_a_role_only_by_its_declared_entry_points_with_public_inputs():
    assert interface_breaches() == []


def test_the_entry_points_other_plays_use_are_seen():
    seen = {(role, entry) for _caller, role, entry, _vars, _task in entries_into_roles()}
    assert {("serving", "deployment"), ("serving", "health"), ("serving", "memory_plan"),
            ("serving", "runtime_check"), ("model", "headers"), ("fleet", "rollback"),
            ("packages_common", "source_probe"), ("packages_common", "versionlock-RedHat"),
            ("packages_common", "versionlock-Debian"), ("llama_cpp", "disk")} <= seen


def test_an_undeclared_entry_point_and_a_private_variable_are_breaches(tmp_path):
    """The other direction: the check fails a play that enters a role by a private task file (the name of
    the file, as Ansible would validate no entry point for it) or that sets a role's private variable."""
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "site.yml").write_text("---\n- name: S\n  ansible.builtin.import_playbook: playbooks/p.yml\n")
    (tmp_path / "playbooks" / "p.yml").write_text(
        "---\n- name: P\n  hosts: all\n  tasks:\n"
        "    - name: Enter by a file\n      ansible.builtin.include_role:\n"
        "        name: llmops.serving.demo\n        tasks_from: deployment.yml\n"
        "    - name: Set a private variable\n      ansible.builtin.include_role:\n"
        "        name: llmops.serving.demo\n        tasks_from: deployment\n"
        "      vars:\n        _demo_step: query\n"
        "    - name: Declared\n      ansible.builtin.include_role:\n"
        "        name: llmops.serving.demo\n        tasks_from: deployment\n"
        "      vars:\n        demo_step: query\n")
    (tmp_path / "roles" / "demo" / "meta").mkdir(parents=True)
    (tmp_path / "roles" / "demo" / "meta" / "argument_specs.yml").write_text(
        "---\nargument_specs:\n  deployment:\n    short_description: D.\n    options: {}\n")
    assert interface_breaches(str(tmp_path)) == [
        "playbooks/p.yml (Enter by a file): entry point deployment.yml of role demo is not in its "
        "argument_specs",
        "playbooks/p.yml (Set a private variable): passes _demo_step, private to role demo"]
