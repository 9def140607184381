# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Make the checkout importable as ansible_collections.llmops.serving for unit tests."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Load the collection loader once for every test module, with the checkout on the collections path:
# tests that use Ansible's templar/loader and tests that import the collection directly then agree.
from ansible.plugins.loader import init_plugin_loader  # noqa: E402

init_plugin_loader([COLLECTIONS])

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _own_fact_cache(tmp_path_factory, monkeypatch):
    """Each test's playbooks get a fact cache of their own. ansible.cfg keeps one under ~/.cache for the
    stages (a stage run alone reads what the earlier ones published); shared, the tests that run playbooks
    on localhost would read each other's published facts (llmops_models, llmops_vllm, ...) in whatever order
    the workers ran them, and the user's own cache would fill with test facts."""
    monkeypatch.setenv("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(tmp_path_factory.mktemp("facts")))
