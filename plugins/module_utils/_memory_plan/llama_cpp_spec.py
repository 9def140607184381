# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""llama-server's speculative decoding settings, read the same way by the command line and by the planner.

The flag table (plugins/plugin_utils/llama_server_flags.py, controller) renders the draft context's cache
types from these rules and the memory planner (plugins/module_utils/_memory_plan/llama_cpp.py, node) counts
the draft KV cache from them, so the plan is of the command line the role writes.

What the pinned llama.cpp does (common/speculative.cpp common_base_params_to_speculative and
common_speculative_init_result): a draft context (draft-mtp on the target model, or a draft model for
draft-simple, draft-eagle3, ...) takes its KV cache types from --spec-draft-type-k/-v (-ctkd/-ctvd) only,
default f16 (common/common.h), whatever --cache-type-k/-v the main context has.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# llama.cpp's default KV cache type, for the main context and (common.h speculative.draft) the draft one.
DEFAULT_CACHE_TYPE = "f16"
# Speculative types named draft-* run a draft context (draft-mtp, draft-simple, draft-eagle3, ...).
DRAFT_TYPE_PREFIX = "draft-"
# (main setting, the draft context's setting) for K and V.
DRAFT_CACHE_SETTINGS = (("cache_type_k", "spec_draft_cache_type_k"),
                        ("cache_type_v", "spec_draft_cache_type_v"))


def spec_types(settings):
    """The setting spec_type (a comma-separated string or a list) as a list of names."""
    value = settings.get("spec_type")
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def uses_draft_context(settings):
    """True when a speculative type runs a draft context (its own KV cache)."""
    return any(t.startswith(DRAFT_TYPE_PREFIX) for t in spec_types(settings))


def draft_cache_settings(settings):
    """The draft cache settings the serving role adds: with a draft context, each of K and V follows the main
    cache type when that is set and the draft's is not.

    The pinned llama-server alone would give the draft context f16; with a 256K context an f16 MTP cache next
    to a q8_0 main cache would cost twice the memory the seed line planned for."""
    if not uses_draft_context(settings):
        return {}
    return dict((draft, settings[main]) for main, draft in DRAFT_CACHE_SETTINGS
                if settings.get(main) is not None and settings.get(draft) is None)


def draft_cache_types(settings):
    """(K, V): the cache types of the draft context on the command line the role renders (its settings plus
    draft_cache_settings()), llama.cpp's default f16 where that sets none."""
    rendered = dict(settings)
    rendered.update(draft_cache_settings(settings))
    return tuple(str(rendered.get(draft) or DEFAULT_CACHE_TYPE).lower()
                 for _main, draft in DRAFT_CACHE_SETTINGS)
