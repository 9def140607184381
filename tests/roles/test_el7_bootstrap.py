# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role llmops.serving.el7_bootstrap: templates rendered against their variables, and the raw-only role
run for real with ansible-playbook (connection local) against a fake EL 7 tree: a temp repo directory,
a fake os-release, and rpm/yum test doubles first on PATH (the raw scripts call them by name)."""

import os
import textwrap

import pytest

from tests.helpers import run_local_playbook
from tests.roles.test_nvidia_driver import ROOT, RoleRenderer

MIRROR = "http://mirror.lan/centos-vault/7.9.2009"


def render(**extra):
    return RoleRenderer("el7_bootstrap", {}, None, **extra)


def repo_sections(text):
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif current is not None and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            current[key] = value
    return sections


def test_centos_base_points_every_repository_at_the_mirror_variable():
    sections = repo_sections(render(el7_bootstrap_mirror=MIRROR).template("CentOS-Base.repo.j2"))
    assert set(sections) == {"base", "updates", "extras", "centosplus"}
    assert sections["base"]["baseurl"] == MIRROR + "/os/$basearch/"
    assert sections["updates"]["baseurl"] == MIRROR + "/updates/$basearch/"
    assert sections["extras"]["baseurl"] == MIRROR + "/extras/$basearch/"
    for name, section in sections.items():
        assert "mirrorlist" not in section
        assert section["gpgcheck"] == "1"
        assert section["enabled"] == ("0" if name == "centosplus" else "1")
    assert render().var("el7_bootstrap_base_baseurl") == "https://vault.centos.org/7.9.2009/os/$basearch/"


def test_each_base_url_has_its_own_variable():
    r = render(el7_bootstrap_updates_baseurl="http://other.lan/updates/")
    sections = repo_sections(r.template("CentOS-Base.repo.j2"))
    assert sections["updates"]["baseurl"] == "http://other.lan/updates/"
    assert sections["base"]["baseurl"].startswith("https://vault.centos.org/")


def test_scl_and_epel_templates_use_archive_variables():
    r = render(el7_bootstrap_mirror=MIRROR, el7_bootstrap_epel_baseurl="http://mirror.lan/epel/7/$basearch/")
    rh = repo_sections(r.template("CentOS-SCLo-scl-rh.repo.j2"))["centos-sclo-rh"]
    sclo = repo_sections(r.template("CentOS-SCLo-scl.repo.j2"))["centos-sclo-sclo"]
    epel = repo_sections(r.template("epel.repo.j2"))["epel"]
    assert rh["baseurl"] == MIRROR + "/sclo/$basearch/rh/"
    assert sclo["baseurl"] == MIRROR + "/sclo/$basearch/sclo/"
    assert epel["baseurl"] == "http://mirror.lan/epel/7/$basearch/"
    assert (
        render()
        .var("el7_bootstrap_epel_baseurl")
        .startswith("https://archives.fedoraproject.org/pub/archive/epel/7/")
    )
    for section in (rh, sclo, epel):
        assert "mirrorlist" not in section and "metalink" not in section and section["gpgcheck"] == "1"
        # Optional repositories: yum skips them when unreachable instead of failing every transaction.
        assert section["skip_if_unavailable"] == "1"
    base = repo_sections(r.template("CentOS-Base.repo.j2"))
    assert not [s for s in base.values() if "skip_if_unavailable" in s]  # base/updates are required


def test_every_task_is_raw_or_runs_on_the_controller():
    role = os.path.join(ROOT, "roles", "el7_bootstrap", "tasks")
    import yaml

    allowed = {
        "ansible.builtin.raw",
        "ansible.builtin.set_fact",
        "ansible.builtin.assert",  # an action of the controller alone, like set_fact
        "ansible.builtin.debug",  # likewise (which repository files are kept, which rewritten, and why)
        "ansible.builtin.import_tasks",
        "ansible.builtin.include_tasks",
    }
    for name in os.listdir(role):
        with open(os.path.join(role, name)) as fh:
            for task in yaml.safe_load(fh):
                modules = {k for k in task if k.startswith("ansible.")}
                assert modules and modules <= allowed, (name, task.get("name"))
                if "ansible.builtin.raw" in modules:
                    assert "changed_when" in task, task["name"]


# --- the role, run for real against a fake EL 7 tree --------------------------------------------------


@pytest.fixture
def el7_tree(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "repos").mkdir()
    (tmp_path / "installed").write_text("")
    (tmp_path / "os-release").write_text('NAME="CentOS Linux"\nID="centos"\nVERSION_ID="7"\n')
    (bin_dir / "rpm").write_text(
        textwrap.dedent(
            """\
        #!/bin/sh
        # rpm -q NAME: installed when listed in the state file
        [ "$1" = -q ] && grep -qx "$2" "%s/installed" && { echo "$2-1.el7.x86_64"; exit 0; }
        echo "package $2 is not installed"; exit 1
        """
            % tmp_path
        )
    )
    (bin_dir / "yum").write_text(
        textwrap.dedent(
            """\
        #!/bin/sh
        echo "$*" >> "%(d)s/yum.log"
        [ -e "%(d)s/yum-fails" ] && { echo "Cannot find a valid baseurl for repo: base/7/x86_64"; exit 1; }
        # EL 7 yum fails the whole transaction when one enabled repository is unreachable.
        if [ -e "%(d)s/epel-unreachable" ] && [ -e "%(d)s/repos/epel.repo" ] &&
           ! echo "$*" | grep -q -- '--disablerepo=[*]'; then
          echo "One of the configured repositories failed (Extra Packages for Enterprise Linux 7 - x86_64)"
          exit 1
        fi
        # --setopt=reposdir=DIR: keep what yum would read there (the directory is gone after the run)
        for a; do case "$a" in --setopt=reposdir=*)
          for f in "${a#--setopt=reposdir=}"/*; do echo "== $f"; cat "$f"; done >> "%(d)s/yum-reposdir.log";;
        esac; done
        # yum [-y] [--disablerepo=X] [--enablerepo=Y] install PKG...: record PKG as installed
        while [ $# -gt 0 ] && [ "$1" != install ]; do shift; done
        if [ "$1" = install ]; then
          shift; for p; do echo "$p" >> "%(d)s/installed"; done
        fi
        exit 0
        """
            % {"d": tmp_path}
        )
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return tmp_path


def run_role(tree, check=False, **role_vars):
    play = tree / "play.yml"
    params = {
        "el7_bootstrap_repo_dir": str(tree / "repos"),
        "el7_bootstrap_backup_dir": str(tree / "backup"),
        "el7_bootstrap_os_release_file": str(tree / "os-release"),
        "el7_bootstrap_mirror": MIRROR,
    }
    params.update(role_vars)
    lines = [
        "- hosts: localhost",
        "  gather_facts: false",
        "  connection: local",
        "  roles:",
        "    - role: llmops.serving.el7_bootstrap",
    ]
    lines += [
        "      %s: %s" % (k, v if not isinstance(v, bool) else str(v).lower()) for k, v in params.items()
    ]
    play.write_text("\n".join(lines) + "\n")
    return run_local_playbook(play, tree / "bin", extra_args=["--check"] if check else [])


# Without a bundle (llmops_bundle unset or empty): repositories probed and rewritten, python3 from the mirror.
@pytest.mark.parametrize("no_bundle", [{}, {"el7_bootstrap_bundle": '""'}])
def test_role_rewrites_repos_installs_python_then_changes_nothing(el7_tree, no_bundle):
    base = el7_tree / "repos" / "CentOS-Base.repo"
    base.write_text("[base]\nmirrorlist=http://mirrorlist.centos.org/?release=$releasever&arch=$basearch\n")
    scl = el7_tree / "repos" / "CentOS-SCLo-scl-rh.repo"
    scl.write_text("[centos-sclo-rh]\nmirrorlist=http://mirrorlist.centos.org?arch=$basearch&repo=sclo-rh\n")
    custom_scl = el7_tree / "repos" / "CentOS-SCLo-scl.repo"
    custom_scl.write_text("[centos-sclo-sclo]\nbaseurl=http://my.lan/sclo/\n")

    first, stats = run_role(el7_tree, **no_bundle)
    assert first.returncode == 0, first.stdout + first.stderr
    assert stats["changed"] == 2 and stats["failed"] == 0
    sections = repo_sections(base.read_text())
    assert sections["base"]["baseurl"] == MIRROR + "/os/$basearch/"
    # The original is kept once, outside the directory yum reads.
    assert (el7_tree / "backup" / "CentOS-Base.repo").read_text().startswith("[base]\nmirrorlist=")
    assert sorted(os.listdir(str(el7_tree / "repos"))) == [
        "CentOS-Base.repo", "CentOS-SCLo-scl-rh.repo", "CentOS-SCLo-scl.repo", "epel.repo"]
    assert repo_sections(scl.read_text())["centos-sclo-rh"]["baseurl"] == MIRROR + "/sclo/$basearch/rh/"
    assert custom_scl.read_text() == "[centos-sclo-sclo]\nbaseurl=http://my.lan/sclo/\n"  # not a stock file
    assert (el7_tree / "repos" / "epel.repo").exists()
    rendered = render(el7_bootstrap_mirror=MIRROR, ansible_managed="Ansible managed").template(
        "CentOS-Base.repo.j2"
    )
    assert base.read_text().strip() == rendered.strip()
    assert (el7_tree / "installed").read_text().split() == ["python3", "libselinux-python3"]
    yum_log = (el7_tree / "yum.log").read_text().splitlines()
    # Only base and updates: an unreachable optional repository (EPEL, SCLo) cannot break the install.
    assert yum_log[-1] == "-y --disablerepo=* --enablerepo=base,updates install python3 libselinux-python3"

    second, stats = run_role(el7_tree, **no_bundle)
    assert second.returncode == 0, second.stdout
    assert stats["changed"] == 0
    assert (el7_tree / "yum.log").read_text().splitlines() == yum_log  # no yum call at all


def test_role_leaves_non_el7_hosts_alone(el7_tree):
    (el7_tree / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    result, stats = run_role(el7_tree)
    assert result.returncode == 0, result.stdout
    assert stats["changed"] == 0 and stats["skipped"] >= 1
    assert list((el7_tree / "repos").iterdir()) == []
    assert not (el7_tree / "yum.log").exists()


def test_role_fails_clearly_when_yum_cannot_reach_the_mirror(el7_tree):
    (el7_tree / "yum-fails").write_text("")
    result, stats = run_role(el7_tree, el7_bootstrap_epel_enabled=False)
    assert result.returncode != 0 and stats["failed"] == 1
    assert "LLMOPS_FAILED: yum could not install python3 libselinux-python3" in result.stdout
    assert MIRROR + "/os/$basearch/" in result.stdout
    assert not (el7_tree / "repos" / "epel.repo").exists()


def test_python_install_survives_an_unreachable_epel(el7_tree):
    (el7_tree / "epel-unreachable").write_text("")
    result, stats = run_role(el7_tree)
    assert result.returncode == 0, result.stdout
    assert (el7_tree / "installed").read_text().split() == ["python3", "libselinux-python3"]
    assert (el7_tree / "repos" / "epel.repo").exists()


def test_other_el7_rebuilds_install_python_from_their_own_enabled_repositories(el7_tree):
    # RHEL 7 has no [base]/[updates] (subscription repositories): no repository restriction there.
    (el7_tree / "os-release").write_text('NAME="Red Hat Enterprise Linux Server"\nID="rhel"\n'
                                         'VERSION_ID="7.9"\n')
    result, stats = run_role(el7_tree, el7_bootstrap_epel_enabled=False)
    assert result.returncode == 0, result.stdout
    assert (el7_tree / "yum.log").read_text().splitlines()[-1] == "-y install python3 libselinux-python3"
    assert not (el7_tree / "repos" / "CentOS-Base.repo").exists()


def test_a_working_repository_file_is_left_alone_and_a_failing_one_is_rewritten(el7_tree):
    from tests.fixtures.source_servers import SourceServer, closed_port

    with SourceServer() as server:
        working = "[base]\nbaseurl=%s/repo/\n\n[updates]\nbaseurl=%s/repo/\n" % (server.url, server.url)
        base = el7_tree / "repos" / "CentOS-Base.repo"
        base.write_text(working)
        epel = el7_tree / "repos" / "epel.repo"
        epel.write_text("[epel]\nbaseurl=http://127.0.0.1:%d/epel/7/$basearch/\n" % closed_port())
        result, stats = run_role(el7_tree)
        seen = list(server.seen)
    assert result.returncode == 0, result.stdout + result.stderr
    assert base.read_text() == working                      # answers from the node: kept, no backup
    assert not (el7_tree / "backup" / "CentOS-Base.repo").exists()
    assert "/repo/repodata/repomd.xml" in seen
    assert "CentOS-Base.repo answers from the node (base, updates): left as it is" in result.stdout
    assert "epel.repo [epel] baseurl http://127.0.0.1:" in result.stdout and "(no answer)" in result.stdout
    assert repo_sections(epel.read_text())["epel"]["baseurl"].startswith("https://archives.fedoraproject.org")


def test_epel_is_added_only_while_a_package_needs_it(el7_tree):
    (el7_tree / "installed").write_text("python3\nlibselinux-python3\ndkms\nocl-icd\nopencl-filesystem\n")
    result, _ = run_role(el7_tree)
    assert result.returncode == 0, result.stdout
    assert not (el7_tree / "repos" / "epel.repo").exists()
    (el7_tree / "installed").write_text("python3\nlibselinux-python3\ndkms\nocl-icd\n")
    result, _ = run_role(el7_tree)
    assert result.returncode == 0, result.stdout
    assert (el7_tree / "repos" / "epel.repo").exists()


# --- an offline bundle (issue 33): python3 from its package repository, repository files left alone --------

SCRIPT = os.path.join(ROOT, "roles", "el7_bootstrap", "files", "bundle_python_repo.py")
RPMS = ("python3-3.6.8-21.el7_9.x86_64.rpm", "python3-libs-3.6.8-21.el7_9.x86_64.rpm",
        "libselinux-python3-2.5-15.el7.x86_64.rpm")
PYTHON3_RPM = "packages/centos7/python3-3.6.8-21.el7_9.x86_64.rpm"


def make_bundle(root, repos=("centos7",), rpms=RPMS):
    """A bundle as playbooks/bundle.yml lays it out: packages/<repo> (fake rpms, repodata) and a model, with
    the manifest written by the collection's own code (bundle.describe, manifest_text)."""
    from ansible_collections.llmops.serving.plugins.module_utils._software import bundle

    entries = []
    for repo in repos:
        top = root / "packages" / repo
        (top / "repodata").mkdir(parents=True)
        (top / "repodata" / "repomd.xml").write_text("<repomd>%s</repomd>\n" % repo)
        for rpm in rpms:
            (top / rpm).write_bytes(("rpm payload of %s\n" % rpm).encode() * 50)
        entries.append(bundle.describe(str(root), {"name": "packages/" + repo, "version": "CentOS 7.9.2009",
                                                   "meta": {"format": "rpm", "packages": ["python3"]}}))
    (root / "models" / "tiny").mkdir(parents=True)
    (root / "models" / "tiny" / "tiny.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    entries.append(bundle.describe(str(root), {"name": "models/tiny", "version": "abc"}))
    (root / "manifest.json").write_text(bundle.manifest_text(entries))
    return root


def python2():
    """A Python 2.7 to run the check under, as EL 7's /usr/bin/python (None where this machine has none)."""
    import glob
    import subprocess

    for cand in ["/usr/bin/python2.7", "/usr/bin/python2"] + sorted(
            glob.glob(os.path.expanduser("~/.pyenv/versions/2.7*/bin/python2.7"))):
        if os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import sys; sys.exit(sys.version_info[0] != 2)"], check=False).returncode == 0:
            return cand
    return None


# EL 7's /usr/bin/python is 2.7: the role runs below use a 2.7 where this machine has one, else this Python 3
# (the script is written for both; test_the_check_runs_under_python_2_and_3 runs each it can).
NODE_PYTHON = python2() or "/usr/bin/python3"


@pytest.fixture
def offline(el7_tree):
    """The EL 7 tree with repository files that a run without a bundle would rewrite (a dead mirror list, an
    unreachable EPEL, an earlier version's backup), a curl that records any probe, and a bundle."""
    repos = el7_tree / "repos"
    (repos / "CentOS-Base.repo").write_text(
        "[base]\nmirrorlist=http://mirrorlist.centos.org/?release=$releasever&arch=$basearch\n")
    (repos / "epel.repo").write_text("[epel]\nbaseurl=http://download.example/epel/7/$basearch/\n")
    (repos / "CentOS-Base.repo.llmops-orig").write_text("[base]\n")
    curl = el7_tree / "bin" / "curl"
    curl.write_text('#!/bin/sh\necho "$*" >> "%s/curl.log"\nexit 7\n' % el7_tree)
    curl.chmod(0o755)
    make_bundle(el7_tree / "bundle")
    return el7_tree


def repo_dir_bytes(tree):
    return {p.name: p.read_bytes() for p in sorted((tree / "repos").iterdir())}


def run_offline(tree, **role_vars):
    return run_role(tree, el7_bootstrap_bundle=str(tree / "bundle"), el7_bootstrap_bundle_python=NODE_PYTHON,
                    **role_vars)


def test_with_a_bundle_python3_comes_from_its_repository_only_and_repository_files_stay(offline):
    before = repo_dir_bytes(offline)
    result, stats = run_offline(offline)
    assert result.returncode == 0, result.stdout + result.stderr
    assert repo_dir_bytes(offline) == before                    # byte for byte, the old backup included
    assert not (offline / "backup").exists() and not (offline / "curl.log").exists()  # no rewrite, no probe
    assert "are left as they are (no probe, no rewrite" in result.stdout
    assert "LLMOPS_BUNDLE_OK packages/centos7: 4 files match the manifest" in result.stdout
    assert (offline / "installed").read_text().split() == ["python3", "libselinux-python3"]
    yum_call = (offline / "yum.log").read_text().splitlines()
    assert len(yum_call) == 1
    reposdir = yum_call[0].split("--setopt=reposdir=")[1].split()[0]
    assert yum_call[0] == ("-y --disablerepo=* --setopt=reposdir=%s --enablerepo=llmops-bundle-* install "
                           "python3 libselinux-python3" % reposdir)
    assert not os.path.exists(reposdir)                          # removed after the install
    seen = (offline / "yum-reposdir.log").read_text()
    assert seen.count("== ") == 1 and "== %s/llmops-bundle.repo\n" % reposdir in seen  # the one repository
    section = repo_sections(seen)
    assert list(section) == ["llmops-bundle-centos7"]
    assert section["llmops-bundle-centos7"]["baseurl"] == "file://%s/packages/centos7/" % (offline / "bundle")
    assert section["llmops-bundle-centos7"]["gpgcheck"] == "0" and stats["changed"] == 1

    second, stats = run_offline(offline)
    assert second.returncode == 0 and stats["changed"] == 0, second.stdout
    assert len((offline / "yum.log").read_text().splitlines()) == 1   # python3 there: the bundle is not read
    assert repo_dir_bytes(offline) == before


def test_check_mode_with_a_bundle_changes_nothing_and_does_not_fail(offline):
    before = repo_dir_bytes(offline)
    installed = (offline / "installed").read_text()
    result, stats = run_offline(offline, check=True)
    assert result.returncode == 0 and stats["failed"] == 0, result.stdout + result.stderr
    assert repo_dir_bytes(offline) == before and (offline / "installed").read_text() == installed
    assert not (offline / "yum.log").exists()


@pytest.mark.parametrize("damage, said", [
    (lambda f: f.write_bytes(b"X" + f.read_bytes()[1:]), "%s has sha256 " % PYTHON3_RPM),
    (lambda f: f.write_bytes(f.read_bytes()[:-1]), "%s has 2449 bytes, the manifest lists 2450 (truncated)"
     % PYTHON3_RPM),
    (lambda f: (f.parent / "evil-1-1.x86_64.rpm").write_text("x"),
     "packages/centos7/evil-1-1.x86_64.rpm is in the entry's directory but not in the manifest"),
])
def test_a_bundle_repository_that_does_not_match_its_manifest_is_refused_before_yum_runs(offline, damage,
                                                                                          said):
    damage(offline / "bundle" / PYTHON3_RPM)
    before = repo_dir_bytes(offline)
    result, stats = run_offline(offline)
    assert result.returncode != 0 and stats["failed"] == 1
    assert "LLMOPS_BUNDLE_REFUSED: the offline bundle %s does not match its manifest" % (offline / "bundle") \
        in result.stdout
    assert said in result.stdout and "Nothing was installed" in result.stdout
    assert not (offline / "yum.log").exists() and (offline / "installed").read_text() == ""
    assert repo_dir_bytes(offline) == before


def test_a_bundle_without_python3_is_refused_clearly(el7_tree):
    make_bundle(el7_tree / "bundle", rpms=RPMS[1:])
    result, stats = run_offline(el7_tree)
    assert result.returncode != 0 and stats["failed"] == 1
    assert "packages/centos7 of the bundle has no python3 (no <name>-<version>-<release>.<arch>.rpm)" \
        in result.stdout
    assert "write the bundle with python3 libselinux-python3 in bundle_packages" in result.stdout
    assert not (el7_tree / "yum.log").exists()


def test_a_bundle_without_a_package_repository_is_refused_clearly(el7_tree):
    make_bundle(el7_tree / "bundle", repos=())
    result, stats = run_offline(el7_tree)
    assert result.returncode != 0 and stats["failed"] == 1
    assert "the bundle has no package repository (no packages/<repo> entry)" in result.stdout
    assert "write the bundle with python3 in bundle_packages" in result.stdout
    assert not (el7_tree / "yum.log").exists()


def test_a_bundle_path_that_is_not_one_word_never_reaches_the_shell(el7_tree):
    result, stats = run_role(el7_tree, el7_bootstrap_bundle='"/srv/b; touch %s/pwned"' % el7_tree)
    assert result.returncode != 0 and stats["failed"] == 1
    assert "assertion: el7_bootstrap_bundle is match(_el7_bootstrap_bundle_path_re)" in result.stdout
    assert not (el7_tree / "pwned").exists() and not (el7_tree / "yum.log").exists()


def test_the_role_takes_the_bundle_from_llmops_bundle_and_an_empty_one_is_none():
    r = render(llmops_bundle="/srv/llmops-bundle")
    assert r.var("el7_bootstrap_bundle") == "/srv/llmops-bundle"
    assert r.var("_el7_bootstrap_bundle_used") is True
    assert render(llmops_bundle="").var("_el7_bootstrap_bundle_used") is False
    assert render().var("_el7_bootstrap_bundle_used") is False


def test_the_shell_value_rules_are_the_bundle_modules_own():
    import re

    from ansible_collections.llmops.serving.plugins.module_utils._software import bundle

    r = render()
    assert r.var("_el7_bootstrap_bundle_path_re") == bundle.SAFE_ROOT.pattern
    assert r.var("_el7_bootstrap_bundle_repo_re") == bundle.PART_RE.pattern
    assert not re.match(r.var("_el7_bootstrap_bundle_path_re"), "/srv/llmops-bundle\n")


@pytest.mark.parametrize("interpreter", ["/usr/bin/python3", "python2.7"])
def test_the_check_runs_under_python_2_and_3(tmp_path, interpreter):
    import subprocess

    if interpreter == "python2.7":
        interpreter = python2()
        if interpreter is None:
            pytest.skip("no Python 2.7 on this machine (EL 7's /usr/bin/python)")
    root = make_bundle(tmp_path / "bundle", repos=("centos7", "ubuntu22.04"))
    reposdir = tmp_path / "reposdir"
    reposdir.mkdir()

    def check(repo="centos7", *packages):
        argv = [interpreter, "-", str(root), repo, str(reposdir)] + list(packages or ["python3"])
        return subprocess.run(argv, input=open(SCRIPT).read(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=60, check=False)

    ok = check()
    assert ok.returncode == 0
    assert ok.stdout == "LLMOPS_BUNDLE_OK packages/centos7: 4 files match the manifest\n"
    assert "baseurl=file://%s/packages/centos7/\n" % root in (reposdir / "llmops-bundle.repo").read_text()
    (reposdir / "llmops-bundle.repo").unlink()
    several = check("debian12")
    assert several.returncode == 1
    assert "several package repositories (packages/centos7, packages/ubuntu22.04) and none is " \
        "packages/debian12: set el7_bootstrap_bundle_repo" in several.stdout
    assert check("centos7", "python3-libs").returncode == 0
    (reposdir / "llmops-bundle.repo").unlink()
    assert "has no python3-devel" in check("centos7", "python3-devel").stdout  # python3-devel is not python3
    (root / PYTHON3_RPM).write_bytes(b"Y" + (root / PYTHON3_RPM).read_bytes()[1:])
    bad = check()
    assert bad.returncode == 1 and "%s has sha256 " % PYTHON3_RPM in bad.stdout
    assert os.listdir(str(reposdir)) == []                       # nothing for yum to read
