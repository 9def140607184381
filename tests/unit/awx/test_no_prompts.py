# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Everything runs without a terminal (AWX jobs have none): no play prompts (vars_prompt), no task waits for
a key (pause with a prompt or without a duration), and ansible.cfg asks for no password."""
import configparser
import glob
import os

import pytest
import yaml

from tests.helpers import ROOT

PAUSE_MODULES = {"pause", "ansible.builtin.pause", "ansible.legacy.pause"}
ASK_SETTINGS = {"ask_pass", "ask_vault_pass", "become_ask_pass", "ask_sudo_pass", "ask_su_pass"}


def ansible_yaml_files():
    patterns = ["site.yml", "playbooks/*.yml", "roles/*/tasks/**/*.yml", "roles/*/handlers/**/*.yml"]
    paths = []
    for pattern in patterns:
        paths.extend(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(set(paths))


def prompts_in(node, where):
    """Descriptions of every prompt in a parsed playbook or task file (blocks and nested plays included)."""
    found = []
    if isinstance(node, list):
        for item in node:
            found.extend(prompts_in(item, where))
    elif isinstance(node, dict):
        if node.get("vars_prompt"):
            found.append("%s: vars_prompt in %r" % (where, node.get("name")))
        for module in PAUSE_MODULES & set(node):
            args = node[module] or {}
            if not isinstance(args, dict) or "prompt" in args or not {"seconds", "minutes"} & set(args):
                found.append("%s: %s waits for a key in %r" % (where, module, node.get("name")))
        for value in node.values():
            if isinstance(value, (list, dict)):
                found.extend(prompts_in(value, where))
    return found


def test_the_scan_covers_the_roles_and_the_playbooks():
    paths = [os.path.relpath(path, ROOT) for path in ansible_yaml_files()]
    assert "site.yml" in paths and "playbooks/awx.yml" in paths
    assert len([path for path in paths if path.startswith("roles/")]) >= 10


@pytest.mark.parametrize("snippet, prompts", [
    ("- hosts: all\n  vars_prompt: [{name: x, prompt: Name}]\n", 1),
    ("- name: t\n  block:\n    - ansible.builtin.pause: {prompt: Continue}\n", 1),
    ("- pause:\n", 1),
    ("- ansible.builtin.pause: {seconds: 5}\n", 0),
])
def test_prompts_are_found_wherever_they_hide(snippet, prompts):
    assert len(prompts_in(yaml.safe_load(snippet), "snippet")) == prompts


def test_no_play_or_task_prompts():
    found = []
    for path in ansible_yaml_files():
        with open(path) as handle:
            found.extend(prompts_in(yaml.safe_load(handle), os.path.relpath(path, ROOT)))
    assert found == []


def test_ansible_cfg_asks_for_no_password():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "ansible.cfg"))
    asked = [(section, key) for section in config.sections() for key, value in config.items(section)
             if key in ASK_SETTINGS and value.strip().lower() in {"true", "yes", "1"}]
    assert asked == []
