# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""execution-environment.yml: its pins are the ones CI tests with, `ansible-builder create` writes a build
context whose Containerfile installs the pinned ansible-core and the collection, and that context's galaxy
requirements install this checkout's artifact. No image is built (no registry here)."""
import filecmp
import json
import os
import re
import shutil

import pytest
import yaml
from ansible.galaxy.dependency_resolution.versioning import meets_requirements

from tests.helpers import ROOT
from tests.unit.packaging.artifact import SITE_PACKAGES, galaxy_version, isolated_env, run, venv_tool

EE_FILE = os.path.join(ROOT, "execution-environment.yml")
# The galaxy stage of the Containerfile runs in /build, a copy of the context's _build directory.
IMAGE_BUILD_DIR = "/build/"


def _load(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def _toolchain_pins():
    """{distribution: version} of requirements.txt (the .venv CI runs)."""
    pins = {}
    with open(os.path.join(ROOT, "requirements.txt")) as handle:
        for line in handle:
            match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s#]+)", line)
            if match:
                pins[match.group(1).lower()] = match.group(2)
    return pins


def _pip_pin(requirement):
    name, _, version = requirement.partition("==")
    assert version, "not pinned with ==: %s" % requirement
    return name.strip().lower(), version.strip()


def _tested_collection_version(fqcn):
    """The version of a collection in the `ansible` package of the .venv: what the roles are tested with."""
    namespace, name = fqcn.split(".")
    manifest = os.path.join(SITE_PACKAGES, "ansible_collections", namespace, name, "MANIFEST.json")
    with open(manifest) as handle:
        return json.load(handle)["collection_info"]["version"]


def _artifact_name():
    return "llmops-serving-%s.tar.gz" % galaxy_version()


@pytest.fixture(scope="module")
def definition():
    return _load(EE_FILE)


@pytest.fixture(scope="module")
def build_context(tmp_path_factory, collection_artifact):
    """`ansible-builder create` on a copy of execution-environment.yml next to the freshly built artifact
    (where `ansible-galaxy collection build` leaves it in a checkout)."""
    workdir = tmp_path_factory.mktemp("ee")
    shutil.copy(EE_FILE, str(workdir))
    shutil.copy(str(collection_artifact), str(workdir))
    context = workdir / "context"
    run([venv_tool("ansible-builder"), "create", "--file", "execution-environment.yml", "--context",
         str(context), "--output-filename", "Containerfile"], cwd=str(workdir))
    return context


def test_definition_pins_ansible_core_and_python_packages_as_the_toolchain(definition):
    assert definition["version"] == 3
    pins = _toolchain_pins()
    dependencies = definition["dependencies"]
    assert _pip_pin(dependencies["ansible_core"]["package_pip"]) == ("ansible-core", pins["ansible-core"])
    assert dependencies["python_interpreter"]["python_path"].endswith("python3.11")
    for requirement in dependencies["python"]:
        name, version = _pip_pin(requirement)
        assert pins.get(name) == version, "%s: the EE pins %s, requirements.txt %s" % (
            name, version, pins.get(name))


def test_definition_pins_collection_dependencies_to_the_tested_versions(definition):
    entries = definition["dependencies"]["galaxy"]["collections"]
    pinned = {entry["name"]: entry["version"] for entry in entries if entry.get("type") != "file"}
    required = _load(os.path.join(ROOT, "galaxy.yml"))["dependencies"]
    # galaxy.yml's dependencies and awx.awx (the AWX-as-code playbook), nothing unpinned.
    assert set(pinned) == set(required) | {"awx.awx"}
    for fqcn, version in pinned.items():
        assert version == _tested_collection_version(fqcn), fqcn
        if fqcn in required:
            assert meets_requirements(version, required[fqcn]), (fqcn, version, required[fqcn])


def test_definition_installs_the_artifact_of_this_version(definition):
    files = [entry["name"] for entry in definition["dependencies"]["galaxy"]["collections"]
             if entry.get("type") == "file"]
    build_files = definition["additional_build_files"]
    assert [os.path.basename(name) for name in files] == [_artifact_name()], \
        "bump the artifact name in execution-environment.yml with galaxy.yml's version"
    assert [(entry["src"], entry["dest"]) for entry in build_files] == [(_artifact_name(), "collections")]
    assert files == [IMAGE_BUILD_DIR + "collections/" + _artifact_name()]


def test_containerfile_installs_pinned_ansible_core_and_the_collection(definition, build_context,
                                                                       collection_artifact):
    containerfile = (build_context / "Containerfile").read_text()
    build_args = dict(re.findall(r'^ARG (\w+)="(.*)"$', containerfile, re.MULTILINE))
    assert build_args["EE_BASE_IMAGE"] == definition["images"]["base_image"]["name"]
    assert build_args["PYCMD"] == "/usr/bin/python3.11"
    install_refs = build_args["ANSIBLE_INSTALL_REFS"].split()
    assert "ansible-core==%s" % _toolchain_pins()["ansible-core"] in install_refs
    assert any(ref.startswith("ansible-runner==") for ref in install_refs)
    steps = containerfile.splitlines()
    assert "RUN $PYCMD -m pip install --no-cache-dir $ANSIBLE_INSTALL_REFS" in steps
    galaxy_install = re.compile(r"RUN .*ansible-galaxy collection install .*-r requirements\.yml")
    assert any(galaxy_install.match(step) for step in steps)
    assert "RUN /output/scripts/check_ansible $PYCMD" in steps
    # The artifact travels in the context, byte for byte.
    shipped = build_context / "_build" / "collections" / _artifact_name()
    assert filecmp.cmp(str(shipped), str(collection_artifact), shallow=False)
    requirements = _load(str(build_context / "_build" / "requirements.yml"))
    assert {"name": IMAGE_BUILD_DIR + "collections/" + _artifact_name(), "type": "file"} in \
        requirements["collections"]
    pip_requirements = (build_context / "_build" / "requirements.txt").read_text().split()
    assert pip_requirements == definition["dependencies"]["python"]
    bindep = (build_context / "_build" / "bindep.txt").read_text().splitlines()
    for package in ("git", "openssh-clients", "rsync"):
        assert any(line.split()[0] == package and "platform:rpm" in line for line in bindep), package


def test_context_requirements_install_the_artifact_and_add_no_toolchain(build_context, tmp_path):
    """The galaxy stage's file entry, read from the context as the image reads /build, installs the
    collection; ansible-builder's introspection (the builder stage) then finds no Python or system
    requirement in it: the control node's requirements.txt (molecule, numpy, ...) is not shipped."""
    context_build = str(build_context / "_build") + "/"
    requirements = _load(str(build_context / "_build" / "requirements.yml"))
    local = {"collections": [dict(entry, name=entry["name"].replace(IMAGE_BUILD_DIR, context_build, 1))
                             for entry in requirements["collections"] if entry.get("type") == "file"]}
    requirements_file = tmp_path / "requirements.yml"
    requirements_file.write_text(yaml.safe_dump(local))
    collections_dir = tmp_path / "collections"
    env = isolated_env(str(collections_dir))
    run([venv_tool("ansible-galaxy"), "collection", "install", "--offline", "--no-deps", "-r",
         str(requirements_file), "-p", str(collections_dir)], cwd=str(tmp_path), env=env)
    manifest = collections_dir / "ansible_collections" / "llmops" / "serving" / "MANIFEST.json"
    assert json.loads(manifest.read_text())["collection_info"]["version"] == galaxy_version()

    introspected = run([venv_tool("ansible-builder"), "introspect", str(collections_dir)], cwd=str(tmp_path))
    found = yaml.safe_load(introspected.stdout.split("---", 1)[1])
    assert found == {"python": [], "system": []}, introspected.stdout
