# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role model: the SELinux label of model_dir per OS version.

EL 7 has no python3 semanage bindings (policycoreutils-python is python2 only) and
community.general.sefcontext imports them into the module's interpreter (/usr/bin/python3 on EL 7, the
interpreter ansible-core 2.16 uses there) without respawning, so on EL 7 the role runs the semanage CLI (a
python2 program) and restorecon as commands; EL 8+ and Debian keep sefcontext."""

import os

import pytest
from ansible_collections.llmops.serving.plugins.filter.os_vars import os_vars_file

from tests.roles.test_nvidia_driver import ROOT, RoleRenderer, flat_tasks

TARGET = "/home/models(/.*)?"
HEADER = "SELinux fcontext                                   type               Context\n\n"


def facts(family, major, distribution):
    return {"ansible_facts": {"os_family": family, "distribution_major_version": major,
                              "distribution": distribution, "selinux": {"status": "enabled"}}}


EL7 = ("RedHat", "7", "CentOS")
EL8 = ("RedHat", "8", "Rocky")
EL9 = ("RedHat", "9", "AlmaLinux")
DEBIAN = ("Debian", "12", "Debian")


def model(platform, **extra):
    """The role's variables for a platform, with the OS variable file tasks/main.yml loads for it."""
    host = facts(*platform)
    chosen = os_vars_file(os.path.join(ROOT, "roles", "model"), host["ansible_facts"])
    return RoleRenderer("model", host, os.path.basename(chosen), **extra)


def selinux_tasks(r):
    block = next(t for t in r.tasks("directory.yml") if "block" in t)
    return block, list(flat_tasks(block["block"]))


def runs(r, task):
    """Whether a task of the SELinux block runs (its own when, all conditions true)."""
    when = task.get("when", [])
    conditions = when if isinstance(when, list) else [when]
    return all(r.expr("{{ %s }}" % c) for c in conditions)


def modules(task):
    return {k for k in task if k.startswith(("ansible.", "community."))}


def running_modules(r):
    _, tasks = selinux_tasks(r)
    return [(m, t) for t in tasks for m in modules(t) if runs(r, t)]


# --- what is installed and what runs, per OS version ----------------------------------------------------


def test_main_loads_the_os_variables_with_the_collection_filter():
    tasks = RoleRenderer("model", facts(*EL7)).tasks("main.yml")
    loads = [t for t in tasks if "ansible.builtin.include_vars" in t]
    assert loads and tasks.index(loads[0]) <= 1  # right after the fact gathering it depends on
    assert "llmops.serving.os_vars_file(ansible_facts)" in loads[0]["ansible.builtin.include_vars"]
    role = os.path.join(ROOT, "roles", "model")
    chosen = {p: os.path.basename(os_vars_file(role, facts(*p)["ansible_facts"]))
              for p in (EL7, EL8, EL9, DEBIAN, ("Debian", "22", "Ubuntu"))}
    assert chosen == {EL7: "RedHat-7.yml", EL8: "RedHat.yml", EL9: "RedHat.yml", DEBIAN: "Debian.yml",
                      ("Debian", "22", "Ubuntu"): "Debian.yml"}


def test_el7_uses_the_python2_semanage_cli_never_python3_bindings():
    r = model(EL7)
    selinux = r.var("_model_selinux")
    assert selinux["method"] == "semanage"
    # policycoreutils-python: semanage + python2 seobject (EL 7 has no policycoreutils-python3).
    assert selinux["packages"] == ["policycoreutils", "policycoreutils-python"]
    used = {m for m, _ in running_modules(r)}
    # Only external programs (plus the package install, whose yum module respawns under python2).
    assert used == {"ansible.builtin.command", "ansible.builtin.include_tasks"}
    assert "community.general.sefcontext" not in used


@pytest.mark.parametrize("platform,packages", [
    (EL8, ["policycoreutils", "python3-policycoreutils", "python3-libselinux"]),
    (EL9, ["policycoreutils", "python3-policycoreutils", "python3-libselinux"]),
    (DEBIAN, ["policycoreutils", "selinux-utils", "python3-selinux", "python3-semanage"]),
])
def test_el8_and_debian_keep_sefcontext_with_python3_bindings(platform, packages):
    r = model(platform)
    assert r.var("_model_selinux") == {"method": "sefcontext", "packages": packages}
    used = running_modules(r)
    sefcontext = [t for m, t in used if m == "community.general.sefcontext"]
    assert len(sefcontext) == 1
    args = r.expr(sefcontext[0]["community.general.sefcontext"])
    assert args == {"target": TARGET, "setype": "container_file_t", "state": "present"}
    # No semanage command where the module runs.
    assert not [t for m, t in used if m == "ansible.builtin.command" and "semanage" in str(t)]


def test_label_is_skipped_without_selinux_or_with_an_empty_type():
    block, _ = selinux_tasks(model(EL7))
    assert runs(model(EL7), block) is True
    assert runs(model(EL7, model_selinux_setype=""), block) is False
    disabled = dict(facts(*EL7)["ansible_facts"], selinux={"status": "disabled"})
    off = RoleRenderer("model", {"ansible_facts": disabled}, "RedHat-7.yml")
    assert runs(off, block) is False


# --- EL 7 commands and changed reporting ------------------------------------------------------------------


def el7_with_local(listing, **extra):
    local = {"stdout": listing, "stdout_lines": listing.splitlines(), "rc": 0}
    return model(EL7, _model_semanage_local=local, **extra)


def semanage_task(r, text):
    _, tasks = selinux_tasks(r)
    return next(t for t in tasks
                if "ansible.builtin.command" in t and text in str(t["ansible.builtin.command"]))


def test_el7_reads_the_local_file_contexts_first():
    r = model(EL7)
    query = semanage_task(r, "-C")
    assert r.expr(query["ansible.builtin.command"]["argv"]) == ["semanage", "fcontext", "-l", "-C"]
    assert query["changed_when"] is False and query["check_mode"] is False
    _, tasks = selinux_tasks(r)
    assert tasks.index(query) < tasks.index(semanage_task(r, "_model_semanage_argv"))


@pytest.mark.parametrize("listing,action,argv", [
    ("", "add", ["semanage", "fcontext", "-a", "-t", "container_file_t", TARGET]),
    (HEADER + "/srv/other(/.*)?                                   all files          "
              "system_u:object_r:container_file_t:s0 \n", "add",
     ["semanage", "fcontext", "-a", "-t", "container_file_t", TARGET]),
    # A rule for directories only is another entry: "all files" is still missing.
    (HEADER + "/home/models(/.*)?                                 directory          "
              "system_u:object_r:httpd_sys_content_t:s0 \n", "add",
     ["semanage", "fcontext", "-a", "-t", "container_file_t", TARGET]),
    (HEADER + "/home/models(/.*)?                                 all files          "
              "system_u:object_r:container_file_t:s0 \n", "none", None),
    (HEADER + "/home/models(/.*)?                                 all files          "
              "system_u:object_r:svirt_sandbox_file_t:s0 \n", "modify",
     ["semanage", "fcontext", "-m", "-t", "container_file_t", TARGET]),
    # Without MLS (no level field) and after an equivalence section.
    (HEADER + "/home/models(/.*)?                                 all files          "
              "system_u:object_r:httpd_sys_content_t \n\nSELinux Local fcontext Equivalence \n\n/a = /b\n",
     "modify", ["semanage", "fcontext", "-m", "-t", "container_file_t", TARGET]),
])
def test_el7_adds_or_modifies_only_when_needed(listing, action, argv):
    r = el7_with_local(listing)
    assert r.var("_model_semanage_action") == action
    change = semanage_task(r, "_model_semanage_argv")
    assert runs(r, change) is (action != "none")
    assert change["changed_when"] is True  # reported changed exactly when it ran
    if argv:
        assert r.expr(change["ansible.builtin.command"]["argv"]) == argv


def test_trailing_slash_and_other_types_follow_the_variables():
    r = el7_with_local("", model_dir="/data/llm/", model_selinux_setype="httpd_sys_content_t")
    assert r.var("_model_selinux_target") == "/data/llm(/.*)?"
    assert r.var("_model_semanage_argv") == ["semanage", "fcontext", "-a", "-t", "httpd_sys_content_t",
                                             "/data/llm(/.*)?"]


def test_relabel_runs_after_either_path_changed():
    r = model(EL7)
    _, tasks = selinux_tasks(r)
    relabel = next(t for t in tasks if "restorecon" in str(t.get("ansible.builtin.command", "")))
    assert r.expr(relabel["ansible.builtin.command"]["argv"]) == ["restorecon", "-R", "-F", "/home/models"]
    changed, unchanged, skipped = {"changed": True}, {"changed": False}, {"changed": False, "skipped": True}
    for semanage, sefcontext, expect in ((changed, skipped, True), (unchanged, skipped, False),
                                         (skipped, changed, True), (skipped, skipped, False)):
        r = model(EL7, _model_semanage=semanage, _model_sefcontext=sefcontext)
        assert runs(r, relabel) is expect


def test_el7_semanage_failure_names_container_selinux():
    r = el7_with_local("", _model_semanage={"rc": 1, "changed": True,
                                            "stderr": "ValueError: Type container_file_t is invalid, must be "
                                                      "a file or device type"})
    _, tasks = selinux_tasks(r)
    fail = next(t for t in tasks if "ansible.builtin.fail" in t)
    assert runs(r, fail) is True
    msg = " ".join(r.expr(fail["ansible.builtin.fail"]["msg"]).split())
    assert "Type container_file_t is invalid" in msg and "container-selinux" in msg
    assert "model_selinux_setype" in msg
