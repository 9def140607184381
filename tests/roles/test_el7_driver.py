# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia_driver on EL 7: the precompiled-kmod flavour (EL 7 package names, a site-built repository, refused
without one) and the check that DKMS really built the module (its %post ignores build errors)."""

import os
import subprocess

import pytest

from tests.roles.test_nvidia_driver import EL7_FACTS, ROOT, RoleRenderer, debian, flat_tasks

MAKE_LOG = os.path.join(ROOT, "tests", "fixtures", "el7", "dkms-make.log")
KERNEL = EL7_FACTS["ansible_kernel"]


def el7(**extra):
    extra.setdefault("omit", "__omit_place_holder__")
    return RoleRenderer("nvidia_driver", EL7_FACTS, "RedHat.yml", **extra)


def task_named(tasks, text):
    return next(t for t in flat_tasks(tasks) if text in t.get("name", ""))


# --- kmod flavour -----------------------------------------------------------------------------------------


def kmod_assert(r):
    tasks = r.tasks("validate.yml")
    task = next(t for t in tasks
                if "nvidia_driver_el7_kmod_repo_url" in str(t.get("ansible.builtin.assert", "")))
    ok = all(r.expr("{{ %s }}" % cond) for cond in task["ansible.builtin.assert"]["that"])
    return ok, " ".join(r.expr(task["ansible.builtin.assert"]["fail_msg"]).split())


def test_kmod_flavour_is_refused_on_el7_without_a_site_built_kmod_repository():
    ok, msg = kmod_assert(el7(nvidia_driver_el7_flavor="kmod"))
    assert ok is False
    for text in ("yum-packaging-precompiled-kmod", "createrepo", "nvidia_driver_el7_kmod_repo_url",
                 "nvidia_driver_el7_flavor: dkms", "kmod-nvidia-branch-550-3.10.0-1160.119.1.r550.54.14.el7"):
        assert text in msg, text
    assert kmod_assert(el7(nvidia_driver_el7_flavor="kmod",
                           nvidia_driver_el7_kmod_repo_url="http://repo.lan/nvidia-kmod/el7"))[0] is True
    assert kmod_assert(el7())[0] is True  # dkms, the default
    assert kmod_assert(debian(nvidia_driver_el7_flavor="kmod"))[0] is True


@pytest.mark.parametrize("kernel,package", [
    ("3.10.0-1160.119.1.el7.x86_64", "kmod-nvidia-branch-550-3.10.0-1160.119.1.r550.54.14.el7"),
    ("3.10.0-1160.el7.x86_64", "kmod-nvidia-branch-550-3.10.0-1160.r550.54.14.el7"),
])
def test_kmod_packages_use_the_el7_precompiled_names(kernel, package):
    r = RoleRenderer("nvidia_driver", dict(EL7_FACTS, ansible_kernel=kernel), "RedHat.yml",
                     nvidia_driver_el7_flavor="kmod")
    packages = r.var("_nvidia_driver_el7_packages")["kmod"]
    assert package in packages
    # The RHEL 8 name kmod-nvidia-<driver>-<kernel> does not exist for EL 7.
    assert not [p for p in packages if p.startswith("kmod-nvidia-550.54.14")]
    assert "kmod-nvidia-branch-550" in r.var("_nvidia_driver_el7_lock_names")["kmod"]


def test_kmod_repository_is_added_only_for_the_kmod_flavour():
    def kmod_repos(r):
        return [repo for repo in r.var("_nvidia_driver_el7_repos") if "kmod" in repo["name"]]

    r = el7(nvidia_driver_el7_flavor="kmod", nvidia_driver_el7_kmod_repo_url="file:///srv/nvidia-kmod")
    (args,) = kmod_repos(r)
    assert args["baseurl"] == "file:///srv/nvidia-kmod" and args["gpgcheck"] is False
    signed = el7(nvidia_driver_el7_flavor="kmod", nvidia_driver_el7_kmod_repo_url="http://r/",
                 nvidia_driver_el7_kmod_repo_gpgkey="http://r/key.asc")
    (args,) = kmod_repos(signed)
    assert args["gpgcheck"] is True and args["gpgkey"] == "http://r/key.asc"
    assert kmod_repos(el7()) == []
    task = next(t for t in flat_tasks(r.tasks("setup-RedHat.yml")) if "ansible.builtin.include_role" in t)
    assert task["ansible.builtin.include_role"]["tasks_from"] == "repo-RedHat"
    assert task["vars"]["packages_common_yum_repos"] == "{{ _nvidia_driver_el7_repos }}"


# --- DKMS build check -------------------------------------------------------------------------------------


def test_module_check_runs_right_after_the_package_install():
    tasks = el7().tasks("setup-RedHat.yml")
    last = tasks[-1]
    assert last["ansible.builtin.include_tasks"] == "dkms-check.yml"
    assert "not ansible_check_mode" in str(last["when"])
    install_at = next(i for i, t in enumerate(tasks) if "block" in t and "yum" in str(t["block"]))
    assert install_at == len(tasks) - 2
    r = el7()
    check = r.tasks("dkms-check.yml")
    status = task_named(check, "DKMS")
    assert r.expr(status["ansible.builtin.command"]["argv"]) == ["dkms", "status", "nvidia/550.54.14"]
    modinfo = task_named(check, "module of the running kernel")
    assert r.expr(modinfo["ansible.builtin.command"]["argv"]) == [
        "modinfo", "-k", KERNEL, "-F", "version", "nvidia"]
    for t in (status, modinfo):
        assert t["failed_when"] is False and t["changed_when"] is False and t["check_mode"] is False


@pytest.mark.parametrize("status,modinfo,built", [
    # dkms 2.x (EPEL 7) and dkms 3.x formats
    ("nvidia, 550.54.14, %s, x86_64: installed" % KERNEL, "", True),
    ("nvidia/550.54.14, %s, x86_64: installed" % KERNEL, "", True),
    ("nvidia/550.54.14, %s, x86_64: installed (WARNING! Diff between built and installed module!)" % KERNEL,
     "", True),
    ("nvidia/550.54.14: added", "", False),
    ("nvidia/550.54.14, %s, x86_64: built" % KERNEL, "", False),
    ("nvidia/550.54.14, 3.10.0-1160.el7.x86_64, x86_64: installed", "", False),  # another kernel
    ("nvidia/535.104.05, %s, x86_64: installed" % KERNEL, "", False),  # another driver
    ("", "550.54.14\n", True),  # modinfo finds the module (kmod flavour, or a dkms without status)
    ("", "535.104.05\n", False),  # an old module only
])
def test_module_is_built_for_the_running_kernel(status, modinfo, built):
    r = el7(_nvidia_driver_dkms_status={"stdout_lines": status.splitlines(), "stdout": status},
            _nvidia_driver_kernel_module={"stdout": modinfo, "rc": 0 if modinfo else 1})
    assert r.var("_nvidia_driver_module_built") is built


def make_log_tail(r):
    """Run the task's own tail command against the sample make.log, as the host would."""
    task = task_named(r.tasks("dkms-check.yml"), "build log")
    argv = [str(a) for a in r.expr(task["ansible.builtin.command"]["argv"])]  # argv: list of str
    assert argv[:3] == ["tail", "-n", "40"]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                          check=False).stdout


def failed_build(**extra):
    status = "nvidia/550.54.14: added"
    variables = dict(
        _nvidia_driver_dkms_status={"stdout_lines": [status], "stdout": status},
        _nvidia_driver_kernel_module={"stdout": "", "rc": 1,
                                      "stderr": "modinfo: ERROR: Module nvidia not found."},
        _nvidia_driver_dkms_make_log=MAKE_LOG,
        _nvidia_driver_headers_out={"stdout_lines": [KERNEL]},
    )
    variables.update(extra)
    r = el7(**variables)
    return RoleRenderer("nvidia_driver", EL7_FACTS, "RedHat.yml",
                        _nvidia_driver_dkms_log={"stdout": make_log_tail(r), "rc": 0}, **variables)


def test_dkms_failure_message_quotes_the_last_40_lines_of_make_log():
    r = failed_build()
    assert r.var("_nvidia_driver_module_built") is False
    msg = r.var("_nvidia_driver_module_message")
    with open(MAKE_LOG) as fh:
        lines = fh.read().splitlines()
    assert len(lines) == 60
    head, log = msg.split("\nLast 40 lines of %s:\n" % MAKE_LOG)
    assert log.splitlines() == lines[-40:]
    assert lines[19] not in msg and "DKMS make.log for nvidia" not in msg
    assert "No space left on device" in log and log.rstrip().endswith("make: *** [modules] Error 2")
    prose = " ".join(head.split())
    assert "kmod-nvidia-latest-dkms-550.54.14" in prose and KERNEL in prose
    assert 'Module nvidia not found' in prose
    assert "`dkms status nvidia/550.54.14`: nvidia/550.54.14: added" in prose
    assert "kernel-devel-%s is installed" % KERNEL in prose  # so the log, not the headers, has the cause
    assert "dkms install nvidia/550.54.14 -k %s" % KERNEL in prose
    check = el7().tasks("dkms-check.yml")
    fail = task_named(check, "Fail")
    assert fail["ansible.builtin.fail"]["msg"] == "{{ _nvidia_driver_module_message }}"


def test_dkms_failure_message_reuses_the_kernel_headers_message():
    r = failed_build(
        _nvidia_driver_headers_out={"stdout_lines": ["3.10.0-1160.el7.x86_64"]},
        _nvidia_driver_kernels_out={"stdout_lines": ["3.10.0-1160.el7.x86_64", KERNEL]},
    )
    prose = " ".join(r.var("_nvidia_driver_module_message").split("\nLast 40 lines")[0].split())
    headers = " ".join(r.var("_nvidia_driver_headers_message").split())
    assert headers in prose
    assert "Install exactly: `yum install kernel-devel-%s`" % KERNEL in prose
    # The check re-reads the headers with kernel.yml's own query and register names (kernels-read.yml).
    check = el7().tasks("dkms-check.yml")
    reread = task_named(check, "headers")
    assert reread["ansible.builtin.include_tasks"] == "kernels-read.yml"
    assert reread["when"] == "nvidia_driver_el7_flavor == 'dkms'"
    read = task_named(el7().tasks("kernels-read.yml"), "headers")
    assert read["register"] == "_nvidia_driver_headers_out"
    assert "_nvidia_driver_headers_query" in read["ansible.builtin.shell"]["cmd"]


def test_dkms_failure_without_make_log_says_dkms_never_built():
    r = failed_build(_nvidia_driver_dkms_make_log="/nonexistent/make.log")
    msg = r.var("_nvidia_driver_module_message")
    assert "no make.log" in msg and "dkms build nvidia/550.54.14" in msg


def test_kmod_flavour_missing_module_names_the_package_and_kernel():
    r = el7(nvidia_driver_el7_flavor="kmod", nvidia_driver_el7_kmod_repo_url="http://repo.lan/kmod",
            _nvidia_driver_kernel_module={"stdout": "", "rc": 1})
    assert r.var("_nvidia_driver_module_built") is False
    msg = " ".join(r.var("_nvidia_driver_module_message").split())
    assert "kmod-nvidia-branch-550-3.10.0-1160.119.1.r550.54.14.el7" in msg and KERNEL in msg
    assert "make.log" not in msg
