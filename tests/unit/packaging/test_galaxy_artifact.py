# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""`ansible-galaxy collection build` makes an artifact that installs into a plain collections path and runs
from there: `ansible-playbook llmops.serving.site --syntax-check`, and a module with its module_utils.
Nothing here reads the checkout's collections/ symlink or its ansible.cfg (cwd is a temporary directory)."""
import json
import os
import re
import tarfile

from tests.helpers import FIXTURES, ROOT
from tests.unit.packaging.artifact import galaxy_version, isolated_env, run, venv_tool

# The artifact is roles, plugins, playbooks, inventories and docs: about 310 KiB at 0.3.0. A bound well
# above that still catches a model file, a build tree or a virtualenv swept in by a build_ignore gap.
MAX_ARTIFACT_BYTES = 1024 * 1024
# Development files that must never ship (galaxy.yml build_ignore), by their first path component.
DEVELOPMENT_ONLY = frozenset([
    "tests", "molecule", ".cache", ".venv", ".git", "collections", "bench", "tools", ".config", "bin",
    "noxfile.py", "pyproject.toml", "requirements.txt", "execution-environment.yml", ".ansible-lint",
    ".yamllint", "reports",
])
# What runs once installed: every file of these directories of the checkout is in the artifact.
SHIPPED_DIRS = ("roles", "plugins", "playbooks", "meta", "inventories")


def _members(artifact):
    with tarfile.open(str(artifact)) as tar:
        return {member.name for member in tar.getmembers() if member.isfile()}


def _checkout_files(directory):
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, directory)):
        dirnames[:] = [name for name in dirnames if name != "__pycache__"]
        found.update(os.path.relpath(os.path.join(dirpath, name), ROOT) for name in filenames
                     if not name.endswith(".pyc"))
    return found


def test_artifact_leaves_the_development_toolchain_out(collection_artifact):
    members = _members(collection_artifact)
    shipped_dev_files = sorted(name for name in members if name.split("/")[0] in DEVELOPMENT_ONLY
                               or "__pycache__" in name.split("/"))
    assert not shipped_dev_files, "galaxy.yml build_ignore lets these in: %s" % shipped_dev_files[:20]
    size = os.path.getsize(str(collection_artifact))
    assert size < MAX_ARTIFACT_BYTES, "artifact is %d bytes (bound %d): %s" % (
        size, MAX_ARTIFACT_BYTES, sorted(members)[:50])


def test_artifact_carries_everything_that_runs(collection_artifact):
    members = _members(collection_artifact)
    for directory in SHIPPED_DIRS:
        missing = sorted(_checkout_files(directory) - members)
        assert not missing, "%s files missing from the artifact: %s" % (directory, missing)
    assert {"site.yml", "playbooks/site.yml", "MANIFEST.json", "FILES.json", "README.md"} <= members
    with tarfile.open(str(collection_artifact)) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("llmops", "serving",
                                                                             galaxy_version())


def test_installed_artifact_is_the_only_llmops_serving_on_the_path(installed_collections):
    listing = run([venv_tool("ansible-galaxy"), "collection", "list", "llmops.serving", "--format", "json"],
                  cwd=str(installed_collections.parent), env=isolated_env(str(installed_collections)))
    found = {path: collections["llmops.serving"]["version"]
             for path, collections in json.loads(listing.stdout).items() if "llmops.serving" in collections}
    assert found == {str(installed_collections / "ansible_collections"): galaxy_version()}


def test_installed_artifact_passes_site_syntax_check(installed_collections):
    result = run([venv_tool("ansible-playbook"), "llmops.serving.site", "--syntax-check"],
                 cwd=str(installed_collections.parent), env=isolated_env(str(installed_collections)))
    # "playbook: <path>": the collection playbook resolved inside the installed copy.
    playbook = re.search(r"^playbook: (.+)$", result.stdout, re.MULTILINE)
    assert playbook, result.stdout
    assert playbook.group(1) == str(installed_collections / "ansible_collections" / "llmops" / "serving" /
                                    "playbooks" / "site.yml")


def test_installed_artifact_runs_a_module_with_its_module_utils(installed_collections):
    # gpu_facts imports plugins/module_utils/_gpu/smi.py: AnsiballZ must find it in the installed copy.
    fake = os.path.join(FIXTURES, "fake_nvidia_smi", "nvidia-smi")
    result = run([venv_tool("ansible"), "localhost", "-c", "local", "-o", "-m", "llmops.serving.gpu_facts",
                  "-a", "nvidia_smi_path=%s" % fake,
                  "-e", "ansible_python_interpreter=%s" % venv_tool("python")],
                 cwd=str(installed_collections.parent),
                 env=isolated_env(str(installed_collections), FAKE_NVIDIA_SMI_PROFILE="h200"))
    facts = json.loads(result.stdout.split("=>", 1)[1])["ansible_facts"]["llmops_gpus"]
    assert (facts["present"], facts["count"], facts["compute_caps"], facts["driver_version"]) == (
        True, 1, ["9.0"], "570.172.08"), facts
