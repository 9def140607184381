# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The galaxy artifact of this checkout, built once per session, and an installed copy of it."""
import os

import pytest

from tests.helpers import ROOT
from tests.unit.packaging.artifact import galaxy_version, isolated_env, run, venv_tool


@pytest.fixture(scope="session")
def collection_artifact(tmp_path_factory):
    """llmops-serving-<version>.tar.gz, built from the checkout by `ansible-galaxy collection build`."""
    out = tmp_path_factory.mktemp("artifact")
    run([venv_tool("ansible-galaxy"), "collection", "build", ROOT, "--output-path", str(out)], cwd=str(out))
    artifact = out / ("llmops-serving-%s.tar.gz" % galaxy_version())
    assert artifact.is_file(), sorted(os.listdir(out))
    return artifact


@pytest.fixture(scope="session")
def installed_collections(tmp_path_factory, collection_artifact):
    """A collections path holding only the installed artifact (offline: no dependency is downloaded)."""
    base = tmp_path_factory.mktemp("installed")
    collections_dir = base / "collections"
    run([venv_tool("ansible-galaxy"), "collection", "install", "--offline", "--no-deps",
         "-p", str(collections_dir), str(collection_artifact)],
        cwd=str(base), env=isolated_env(str(collections_dir)))
    return collections_dir
