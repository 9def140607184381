# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of role el7_bootstrap (the node has no Python yet: it prints, the controller decides).

    el7_repo_probe_urls: the baseurls of the enabled sections of the files the node printed
    el7_repo_plan: per managed repository file, whether to rewrite it and why

The rules are in plugins/module_utils/_software/repo_config.py.
"""
from __future__ import absolute_import, division, print_function

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.llmops.serving.plugins.module_utils._software import repo_config

__metaclass__ = type


def el7_repo_probe_urls(read_stdout):
    return repo_config.probe_urls(repo_config.parse_node_output(read_stdout)[0])


def el7_repo_plan(read_stdout, probe_stdout, managed):
    """managed: the role's [{file, mode, when}] in its order; a file whose `when` is false is not managed."""
    files = repo_config.parse_node_output(read_stdout)[0]         # (files, answers): the files
    answers = repo_config.parse_node_output(probe_stdout)[1]      # the answers of the probe
    modes = [(m["file"], m["mode"]) for m in managed if boolean(m.get("when", True), strict=False)]
    return repo_config.plan(files, modes, answers)


class FilterModule(object):
    def filters(self):
        return {"el7_repo_probe_urls": el7_repo_probe_urls, "el7_repo_plan": el7_repo_plan}
