# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The yum repository set of a CentOS 7.9 host, checked the way yum reads it.

tests/fixtures/el7/yum.repos.d holds the files a CentOS 7.9 minimal install leaves (see its README). The tests
copy that set, run the real el7_bootstrap role over the copy (raw tasks, fake rpm/yum), and run the
enabled-repository check of nvidia_driver (roles/nvidia_driver/files/el7_enabled_repos.py, executed by the
host's /usr/bin/python) over the result: only ENABLED repositories in *.repo files count, and a repository
that still points at mirrorlist.centos.org is named by file and section."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.roles.test_el7_bootstrap import el7_tree, run_role  # noqa: F401 (el7_tree is a fixture)
from tests.roles.test_nvidia_driver import EL7_FACTS, ROOT, RoleRenderer, flat_tasks

STOCK = os.path.join(ROOT, "tests", "fixtures", "el7", "yum.repos.d")
SCRIPT = os.path.join(ROOT, "roles", "nvidia_driver", "files", "el7_enabled_repos.py")
DEAD = ["mirrorlist.centos.org", "mirror.centos.org"]
PYENV = os.path.expanduser("~/.pyenv/versions")
# CentOS 7 runs the check with /usr/bin/python (2.7.5); ansible-core 2.16 manages it with python 3.6.
OLD_PYTHONS = [os.path.join(PYENV, "2.7.18", "bin", "python2.7"),
               os.path.join(PYENV, "3.6.15", "bin", "python3.6")]


def el7(**extra):
    return RoleRenderer("nvidia_driver", EL7_FACTS, "RedHat.yml", **extra)


def check(reposdir, python=sys.executable, yum_conf=None, hosts=DEAD):
    argv = [python, SCRIPT, "--yum-conf", yum_conf or os.devnull, "--reposdir", str(reposdir)]
    for host in hosts:
        argv += ["--dead-host", host]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(proc.stdout)


def named(report):
    return [(d["file"].rsplit("/", 1)[-1], d["section"]) for d in report["dead"]]


def stock_copy(directory):
    directory.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(STOCK):
        shutil.copy2(os.path.join(STOCK, name), str(directory / name))
    return directory


def bootstrap(tree, **role_vars):
    stock_copy(tree / "repos")
    result, stats = run_role(tree, **role_vars)
    assert result.returncode == 0, result.stdout + result.stderr
    return stats


# --- the stock set --------------------------------------------------------------------------------------


def test_fixture_is_the_complete_centos_79_minimal_set():
    assert sorted(os.listdir(STOCK)) == [
        "CentOS-Base.repo", "CentOS-CR.repo", "CentOS-Debuginfo.repo", "CentOS-Media.repo",
        "CentOS-Sources.repo", "CentOS-Vault.repo", "CentOS-fasttrack.repo", "CentOS-x86_64-kernel.repo"]
    with open(os.path.join(STOCK, "CentOS-Base.repo")) as fh:
        base = fh.read()
    stock = "mirrorlist=http://mirrorlist.centos.org/?release=$releasever&arch=$basearch&repo=os&infra=$infra\n"
    assert stock in base
    assert "# If the mirrorlist= does not work for you, as a fall back you can try the \n" in base
    with open(os.path.join(STOCK, "CentOS-fasttrack.repo")) as fh:
        assert "mirrorlist=http://mirrorlist.centos.org/" in fh.read()  # disabled, but a grep finds it


def test_stock_set_fails_on_exactly_the_enabled_base_repositories(tmp_path):
    _, report = check(STOCK)
    assert named(report) == [("CentOS-Base.repo", "base"), ("CentOS-Base.repo", "updates"),
                             ("CentOS-Base.repo", "extras")]
    assert report["dead"][0]["option"] == "mirrorlist"
    assert "mirrorlist.centos.org" in report["dead"][0]["value"]
    assert report["errors"] == []
    assert len(report["files"]) == 8
    # 52 sections, 3 enabled: fasttrack, centos-kernel and CR are disabled and do not count.
    assert report["enabled"] == ["base", "updates", "extras"]


@pytest.mark.parametrize("python", OLD_PYTHONS)
def test_check_runs_under_python_27_and_36(python):
    if not os.path.exists(python):
        pytest.skip("no %s" % python)
    out_old, _ = check(STOCK, python=python)
    out_new, _ = check(STOCK)
    assert json.loads(out_old) == json.loads(out_new)


# --- the bootstrapped set ---------------------------------------------------------------------------------


def test_bootstrapped_set_passes_and_keeps_backups_out_of_the_repo_dir(el7_tree):  # noqa: F811
    bootstrap(el7_tree)
    repos = el7_tree / "repos"
    names = sorted(os.listdir(str(repos)))
    assert names == sorted(os.listdir(STOCK) + ["epel.repo"])  # no backup left where yum (or a grep) reads
    _, report = check(repos)
    assert report["dead"] == [] and report["errors"] == []
    assert report["enabled"] == ["base", "updates", "extras", "epel"]
    backup = el7_tree / "backup"
    assert sorted(os.listdir(str(backup))) == ["CentOS-Base.repo"]
    with open(os.path.join(STOCK, "CentOS-Base.repo")) as fh:
        assert (backup / "CentOS-Base.repo").read_text() == fh.read()


def test_enabled_repository_on_the_dead_mirrorlist_is_named_by_file_and_section(el7_tree):  # noqa: F811
    bootstrap(el7_tree)
    fasttrack = el7_tree / "repos" / "CentOS-fasttrack.repo"
    fasttrack.write_text(fasttrack.read_text().replace("enabled=0", "enabled=1"))
    stdout, report = check(el7_tree / "repos")
    assert named(report) == [("CentOS-fasttrack.repo", "fasttrack")]
    r = el7(_nvidia_driver_repo_check={"stdout": stdout, "rc": 0})
    fail = next(t for t in flat_tasks(r.tasks("setup-RedHat.yml")) if "ansible.builtin.fail" in t)
    assert r.expr("{{ %s }}" % fail["when"]) is True
    msg = " ".join(r.expr(fail["ansible.builtin.fail"]["msg"]).split())
    assert "%s [fasttrack] mirrorlist=http://mirrorlist.centos.org/" % fasttrack in msg
    assert "llmops.serving.el7_bootstrap" in msg
    clean = el7(_nvidia_driver_repo_check={"stdout": check(STOCK, hosts=[])[0], "rc": 0})
    assert clean.expr("{{ %s }}" % fail["when"]) is False


def test_old_backups_in_the_repo_dir_are_moved_out(el7_tree):  # noqa: F811
    repos = stock_copy(el7_tree / "repos")
    # What earlier versions of el7_bootstrap left behind.
    shutil.copy2(os.path.join(STOCK, "CentOS-Base.repo"), str(repos / "CentOS-Base.repo.llmops-orig"))
    (repos / "epel.repo.llmops-orig").write_text("[epel]\nmetalink=https://mirrors.fedoraproject.org/x\n")
    first, stats = run_role(el7_tree)
    assert first.returncode == 0, first.stdout
    assert not [n for n in os.listdir(str(repos)) if "llmops-orig" in n]
    backup = el7_tree / "backup"
    assert sorted(os.listdir(str(backup))) == ["CentOS-Base.repo", "epel.repo"]
    assert (backup / "epel.repo").read_text().startswith("[epel]\nmetalink=")
    second, stats = run_role(el7_tree)
    assert second.returncode == 0 and stats["changed"] == 0


# --- how yum reads repository files -----------------------------------------------------------------------


def test_only_enabled_sections_of_repo_files_count(tmp_path):
    d = tmp_path / "repos"
    d.mkdir()
    dead = "mirrorlist=http://mirrorlist.centos.org/?release=7&repo=os\n"
    (d / "default-enabled.repo").write_text("[no-enabled-line]\nname=x\n" + dead)
    (d / "off.repo").write_text(
        "[zero]\nenabled=0\n" + dead + "[no]\nenabled = no\n" + dead + "[false]\nenabled=False\n" + dead)
    (d / "on.repo").write_text("[yes]\nenabled=yes\n" + dead + "[one]\nenabled=1\n"
                               "baseurl=http://mirror.centos.org/centos/7/os/x86_64/\n")
    (d / "optional.repo").write_text("[skippable]\nskip_if_unavailable=1\n" + dead)
    (d / "ignored.repo.rpmnew").write_text("[rpmnew]\n" + dead)
    (d / "ignored.repo.llmops-orig").write_text("[backup]\n" + dead)
    (d / "main.repo").write_text("[main]\n" + dead)
    _, report = check(d)
    assert sorted(named(report)) == [("default-enabled.repo", "no-enabled-line"), ("on.repo", "one"),
                                     ("on.repo", "yes")]
    assert report["skipped_if_unavailable"] == ["skippable"]
    assert all(not f.endswith(("rpmnew", "llmops-orig")) for f in report["files"])


def test_yum_conf_reposdir_and_sections_are_read(tmp_path):
    other = tmp_path / "other.d"
    other.mkdir()
    (other / "x.repo").write_text("[x]\nmirrorlist=http://mirrorlist.centos.org/?repo=x\n")
    conf = tmp_path / "yum.conf"
    conf.write_text("[main]\nreposdir=%s\n\n[inline]\nmirrorlist=http://mirrorlist.centos.org/?repo=y\n"
                    % other)
    argv = [sys.executable, SCRIPT, "--yum-conf", str(conf), "--dead-host", "mirrorlist.centos.org"]
    report = json.loads(subprocess.check_output(argv, universal_newlines=True))
    assert sorted(named(report)) == [("x.repo", "x"), ("yum.conf", "inline")]


def test_unparsable_repo_file_is_reported(tmp_path):
    d = tmp_path / "repos"
    d.mkdir()
    (d / "broken.repo").write_text("baseurl=http://x/\n")  # no section header: yum refuses to run
    _, report = check(d)
    assert report["dead"] == [] and len(report["errors"]) == 1 and "broken.repo" in report["errors"][0]
    r = el7(_nvidia_driver_repo_check={"stdout": json.dumps(report), "rc": 0})
    fail = next(t for t in flat_tasks(r.tasks("setup-RedHat.yml")) if "ansible.builtin.fail" in t)
    assert r.expr("{{ %s }}" % fail["when"]) is True
    assert "broken.repo" in r.expr(fail["ansible.builtin.fail"]["msg"])


# --- wiring in nvidia_driver ------------------------------------------------------------------------------


def test_check_runs_with_the_hosts_python_before_any_yum_call():
    r = el7()
    tasks = list(flat_tasks(r.tasks("setup-RedHat.yml")))
    first = tasks[0]
    assert "ansible.builtin.script" in first and first["check_mode"] is False
    args = r.expr(first["ansible.builtin.script"])
    assert args["executable"] == "/usr/bin/python"  # always there on EL 7 (yum is a python2 program)
    assert args["cmd"].split()[0] == "el7_enabled_repos.py"
    assert "--dead-host mirrorlist.centos.org" in args["cmd"] and "--yum-conf /etc/yum.conf" in args["cmd"]
    assert os.path.exists(os.path.join(ROOT, "roles", "nvidia_driver", "files", args["cmd"].split()[0]))
    fail_at = next(i for i, t in enumerate(tasks) if "ansible.builtin.fail" in t)
    yum_at = next(i for i, t in enumerate(tasks) if "ansible.builtin.yum" in t)
    assert 0 < fail_at < yum_at
    commands = [t["ansible.builtin.command"] for t in tasks if "ansible.builtin.command" in t]
    assert not [c for c in commands if "grep" in c.get("argv", [])]
