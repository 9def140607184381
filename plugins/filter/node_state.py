# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether what node_state_info read is as a role's tasks would leave it (plugins/plugin_utils/node_state.py).

    {{ _read | llmops.serving.node_path_in_place('/etc/llama-server', 'directory', 'root', 'llama',
                                                 '0750') }}
    {{ _read | llmops.serving.node_account_in_place('llama', 'llama', '/var/lib/llama-server',
                                                    '/sbin/nologin') }}
    {{ _read | llmops.serving.node_file_in_place('/etc/llama-server/q.key', key ~ '\n', 'llama', 'llama',
                                                 '0600') }}
    {{ _read | llmops.serving.node_path_state('/srv/models/m.gguf') }}   -> {exists, type, mode, ...}
    {{ _read | llmops.serving.node_missing_paths(['/a', '/b']) }}        -> those not on the node
    {{ _read | llmops.serving.node_disk_writes_left(llmops_disk_writes) }} -> the writes not on the node yet
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.plugin_utils import node_state
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import filter_errors

__metaclass__ = type

_wrap = filter_errors("node_state")


class FilterModule(object):
    def filters(self):
        return {
            "node_path_in_place": _wrap(node_state.path_in_place),
            "node_account_in_place": _wrap(node_state.account_in_place),
            "node_file_in_place": _wrap(node_state.file_in_place),
            "node_path_state": _wrap(node_state.path_state),
            "node_missing_paths": _wrap(node_state.missing_paths),
            "node_disk_writes_left": _wrap(node_state.writes_not_present),
        }
