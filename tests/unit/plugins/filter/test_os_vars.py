# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The os_vars_file filter: one way every role picks its OS variables (most specific file first)."""
import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmops.serving.plugins.filter.os_vars import os_vars_candidates, os_vars_file

CENTOS7 = {"distribution": "CentOS", "os_family": "RedHat", "distribution_major_version": "7"}
DEBIAN12 = {"distribution": "Debian", "os_family": "Debian", "distribution_major_version": "12"}


def test_candidates_most_specific_first_without_repeats():
    assert os_vars_candidates(CENTOS7) == ["CentOS-7.yml", "CentOS.yml", "RedHat-7.yml", "RedHat.yml",
                                           "default.yml"]
    assert os_vars_candidates(DEBIAN12) == ["Debian-12.yml", "Debian.yml", "default.yml"]
    assert os_vars_candidates({}) == ["default.yml"]


@pytest.mark.parametrize("present, facts, expected", [
    (["RedHat.yml", "RedHat-7.yml"], CENTOS7, "RedHat-7.yml"),
    (["RedHat.yml", "Debian.yml"], CENTOS7, "RedHat.yml"),
    (["CentOS-7.yml", "RedHat-7.yml"], CENTOS7, "CentOS-7.yml"),
    (["Debian.yml", "default.yml"], DEBIAN12, "Debian.yml"),
    (["default.yml"], DEBIAN12, "default.yml"),
])
def test_first_existing_file_wins(tmp_path, present, facts, expected):
    (tmp_path / "vars").mkdir()
    for name in present:
        (tmp_path / "vars" / name).write_text("---\n")
    assert os_vars_file(str(tmp_path), facts) == str(tmp_path / "vars" / expected)


def test_unsupported_platform_names_what_was_looked_for(tmp_path):
    (tmp_path / "vars").mkdir()
    (tmp_path / "vars" / "Debian.yml").write_text("---\n")
    with pytest.raises(AnsibleFilterError) as err:
        os_vars_file(str(tmp_path), CENTOS7)
    message = str(err.value)
    assert "does not support CentOS 7" in message
    assert "vars/RedHat-7.yml" in message and "vars/default.yml" in message


def test_no_facts_says_to_gather_them(tmp_path):
    (tmp_path / "vars").mkdir()
    (tmp_path / "vars" / "default.yml").write_text("---\n")
    with pytest.raises(AnsibleFilterError, match="no facts were gathered"):
        os_vars_file(str(tmp_path), {})
