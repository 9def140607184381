# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Running the toolchain of the .venv against an installed copy of the collection only: not the checkout's
collections/ symlink, not the checkout's ansible.cfg."""
import os
import subprocess
import sys
import sysconfig

import yaml

from tests.helpers import ROOT

# The console scripts of the interpreter running the tests: the project's .venv.
VENV_BIN = os.path.dirname(sys.executable)
# Where the `ansible` package's collections (community.general, ...) live: the dependencies an offline
# install of the artifact relies on.
SITE_PACKAGES = sysconfig.get_paths()["purelib"]


def venv_tool(name):
    return os.path.join(VENV_BIN, name)


def galaxy_version():
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        return yaml.safe_load(handle)["version"]


def isolated_env(collections_dir, **extra):
    """os.environ without ANSIBLE_* and PYTHONPATH, with collections_dir then the `ansible` package's
    collections as the only collections path; run from a directory with no ansible.cfg."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("ANSIBLE_") and key != "PYTHONPATH"}
    env.update(ANSIBLE_COLLECTIONS_PATH=os.pathsep.join([collections_dir, SITE_PACKAGES]),
               ANSIBLE_LOCAL_TEMP=os.path.join(os.path.dirname(collections_dir), "ansible-tmp"),
               ANSIBLE_NOCOLOR="1", **extra)
    return env


def run(argv, cwd, env=None, timeout=300):
    """Run a command, returning the CompletedProcess; a failure shows its whole output."""
    completed = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, "%s exited %d\n--- stdout\n%s\n--- stderr\n%s" % (
        " ".join(argv), completed.returncode, completed.stdout, completed.stderr)
    return completed
