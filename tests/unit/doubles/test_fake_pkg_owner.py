# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake rpm -qf / dpkg -S (tests/fixtures/fake_pkg_owner) answer as the real tools do, and what they say
is what module_utils/nvidia_runfile.package_owner reads."""

import os
import subprocess

from ansible_collections.llmops.serving.plugins.module_utils._gpu.runfile import package_owner

from tests.fixtures.fake_pkg_owner import HERE, owner_db


def ask(tmp_path, tool, path):
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        os.symlink(os.path.join(HERE, "rpm"), str(bin_dir / "dpkg"))
    exe = os.path.join(HERE, "rpm") if tool == "rpm" else str(bin_dir / "dpkg")
    flag = "-qf" if tool == "rpm" else "-S"
    db = owner_db(tmp_path / "db", {"/usr/lib64/libcuda.so.550.54.14": "nvidia-driver-latest-dkms-cuda-libs"})
    proc = subprocess.run([exe, flag, "/fake" + path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(os.environ, FAKE_PKG_DB=db, FAKE_PKG_ROOT="/fake"), timeout=30,
                          universal_newlines=True)
    return proc


def test_rpm_and_dpkg_answers(tmp_path):
    owned = ask(tmp_path, "rpm", "/usr/lib64/libcuda.so.550.54.14")
    assert owned.returncode == 0 and package_owner(owned.returncode, owned.stdout) == \
        "nvidia-driver-latest-dkms-cuda-libs"
    free = ask(tmp_path, "rpm", "/usr/bin/nvidia-smi")
    assert free.returncode == 1
    assert free.stdout == "file /fake/usr/bin/nvidia-smi is not owned by any package\n"
    assert package_owner(free.returncode, free.stdout) == ""
    deb = ask(tmp_path, "dpkg", "/usr/lib64/libcuda.so.550.54.14")
    assert deb.stdout == "nvidia-driver-latest-dkms-cuda-libs: /fake/usr/lib64/libcuda.so.550.54.14\n"
    assert package_owner(deb.returncode, deb.stdout) == "nvidia-driver-latest-dkms-cuda-libs"
    none = ask(tmp_path, "dpkg", "/usr/bin/nvidia-smi")
    assert none.returncode == 1 and "no path found matching pattern" in none.stderr
