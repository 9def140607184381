# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where role model keeps its models on the node (plugins/plugin_utils/model_paths.py).

    {{ model_models | llmops.serving.model_paths(model_dir) }}   -> [{name, dest, final}, ...]
    {{ model_models | llmops.serving.model_headers_unchanged(model_dir, node_read, llmops_models, keys) }}
        -> {name: the header a past run recorded, for each model whose file is unchanged}
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.plugin_utils.model_paths import model_paths, unchanged_headers

__metaclass__ = type


class FilterModule(object):
    def filters(self):
        return {"model_paths": model_paths, "model_headers_unchanged": unchanged_headers}
