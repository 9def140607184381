# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way every role of the collection picks its operating-system variables.

    - name: Load the settings of this operating system
      ansible.builtin.include_vars: "{{ role_path | llmops.serving.os_vars_file(ansible_facts) }}"

The first file that exists under ``<role>/vars/`` wins, most specific first (the order of
``ansible.builtin.first_found`` as geerlingguy's roles use it):

    <distribution>-<major>.yml   CentOS-7.yml, Debian-12.yml, Ubuntu-24.yml
    <distribution>.yml           CentOS.yml, Ubuntu.yml
    <os_family>-<major>.yml      RedHat-7.yml
    <os_family>.yml              RedHat.yml, Debian.yml
    default.yml

A role without any of them for the host fails with the list it looked for: the platform is not supported
by that role, which is clearer than a later task failing on an undefined variable.
"""
from __future__ import absolute_import, division, print_function

import os

from ansible.errors import AnsibleFilterError

__metaclass__ = type


def os_vars_candidates(facts):
    """File names to try, most specific first, for a dict of Ansible facts (ansible_facts)."""
    facts = facts or {}
    distribution = facts.get("distribution") or ""
    family = facts.get("os_family") or ""
    major = str(facts.get("distribution_major_version") or "")
    names = []
    for base in (distribution, family):
        if not base:
            continue
        if major:
            names.append("%s-%s.yml" % (base, major))
        names.append("%s.yml" % base)
    names.append("default.yml")
    # CentOS and RedHat share os_family RedHat: drop repeats, keep the order.
    seen = set()
    return [n for n in names if not (n in seen or seen.add(n))]


def os_vars_file(role_path, facts):
    """Path of the first OS variable file of the role at role_path that exists for these facts."""
    if not (facts or {}).get("os_family"):
        raise AnsibleFilterError(
            "role %s picks its settings by operating system, but no facts were gathered: run the play with "
            "gather_facts: true, or ansible.builtin.setup (gather_subset: [min]) before the role"
            % os.path.basename(str(role_path).rstrip("/")))
    names = os_vars_candidates(facts)
    for name in names:
        path = os.path.join(str(role_path), "vars", name)
        if os.path.isfile(path):
            return path
    raise AnsibleFilterError(
        "role %s does not support %s %s (os family %s): none of vars/%s exists. Run it on a supported "
        "platform (see the role's meta/main.yml) or add a variable file for this one."
        % (os.path.basename(str(role_path).rstrip("/")), (facts or {}).get("distribution", "?"),
           (facts or {}).get("distribution_major_version", "?"), (facts or {}).get("os_family", "?"),
           ", vars/".join(names)))


class FilterModule(object):
    """Operating-system variable files of the collection's roles."""

    def filters(self):
        return {"os_vars_file": os_vars_file}
