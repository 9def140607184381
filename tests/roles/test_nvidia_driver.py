# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role llmops.serving.nvidia_driver: every template, variable file and decision expression rendered
with Ansible's own Templar (the EL 7 paths cannot run here: no CentOS repositories are reachable)."""

import os
import re

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.llmops.serving.plugins.filter.os_vars import os_vars_file
from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import driver_plan, reboot_decision

from tests.helpers import ROOT  # noqa: E402

ROLES = os.path.join(ROOT, "roles")

EL7_FACTS = {
    "ansible_os_family": "RedHat",
    "ansible_distribution": "CentOS",
    "ansible_distribution_major_version": "7",
    "ansible_distribution_version": "7.9",
    "ansible_kernel": "3.10.0-1160.119.1.el7.x86_64",
    "inventory_hostname": "gpu1",
}
DEBIAN_FACTS = {
    "ansible_os_family": "Debian",
    "ansible_distribution": "Debian",
    "ansible_distribution_major_version": "12",
    "ansible_distribution_version": "12.7",
    "ansible_kernel": "6.1.0-26-amd64",
    "inventory_hostname": "gpu1",
}


def ubuntu_facts(version):
    return {
        "ansible_os_family": "Debian",
        "ansible_distribution": "Ubuntu",
        "ansible_distribution_major_version": version.split(".")[0],
        "ansible_distribution_version": version,
        "ansible_kernel": "6.8.0-45-generic",
        "inventory_hostname": "gpu1",
    }


class RoleRenderer:
    """Variables of a role as Ansible would see them: defaults < vars/main.yml < vars/<os>.yml < extra."""

    def __init__(self, role, facts, os_vars_file=None, **extra):
        self.role_dir = os.path.join(ROLES, role)
        variables = {}
        variables.update(self.load("defaults/main.yml"))
        variables.update(self.load("vars/main.yml"))
        if os_vars_file:
            variables.update(self.load(os.path.join("vars", os_vars_file)))
        variables.update(facts)
        variables.update(extra)
        variables.setdefault("role_path", self.role_dir)
        variables.setdefault("ansible_search_path", [self.role_dir])
        self.variables = variables
        self.templar = Templar(loader=DataLoader(), variables=variables)

    def load(self, rel):
        path = os.path.join(self.role_dir, rel)
        if not os.path.exists(path):
            return {}
        with open(path) as fh:
            return yaml.safe_load(fh) or {}

    def var(self, name):
        return self.templar.template(self.variables[name])

    def expr(self, text):
        return self.templar.template(text)

    def template(self, name):
        with open(os.path.join(self.role_dir, "templates", name)) as fh:
            return self.templar.template(fh.read(), preserve_trailing_newlines=True)

    def tasks(self, rel):
        with open(os.path.join(self.role_dir, "tasks", rel)) as fh:
            return yaml.safe_load(fh)


def flat_tasks(tasks):
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            if key in task:
                yield from flat_tasks(task[key])


def packages_common(r, tasks_file, entry_point, **extra):
    """packages_common as the include_role task of tasks_file (rendered by role renderer r) calls it."""
    names = (entry_point, "%s-{{ ansible_os_family }}" % entry_point.split("-")[0])
    task = next(t for t in flat_tasks(r.tasks(tasks_file))
                if t.get("ansible.builtin.include_role", {}).get("tasks_from") in names)
    params = {name: r.expr(value) for name, value in task["vars"].items()}
    params.update(extra)
    facts = {k: v for k, v in r.variables.items() if k.startswith("ansible_") or k == "inventory_hostname"}
    return RoleRenderer("packages_common", facts, None, **params)


def el7(**extra):
    return RoleRenderer("nvidia_driver", EL7_FACTS, "RedHat.yml", **extra)


def debian(**extra):
    return RoleRenderer("nvidia_driver", DEBIAN_FACTS, "Debian.yml", **extra)


# --- interface -----------------------------------------------------------------------------------


def test_default_driver_is_the_cuda_12_4_minimum_and_dkms_flavour():
    r = el7()
    assert r.var("nvidia_driver_version") == "550.54.14"
    assert r.var("nvidia_driver_branch") == "550"
    assert r.var("nvidia_driver_el7_flavor") == "dkms"
    assert r.var("nvidia_driver_allow_reboot") == "auto"


# --- EL 7 packages, repository, versionlock ---------------------------------------------------------


def test_el7_dkms_packages_are_the_latest_dkms_stream_pinned_to_the_version():
    packages = el7().var("_nvidia_driver_el7_packages")["dkms"]
    assert "nvidia-driver-latest-dkms-550.54.14" in packages
    assert "kmod-nvidia-latest-dkms-550.54.14" in packages
    assert "dkms" in packages and "gcc" in packages
    assert not [p for p in packages if "branch" in p or p == "yum-plugin-nvidia"]
    nvidia = [p for p in packages if "nvidia" in p and not p.startswith("yum-plugin")]
    assert nvidia and all(p.endswith("-550.54.14") for p in nvidia)


def test_el7_kmod_packages_are_the_branch_stream_with_the_yum_plugin_and_the_kernel_kmod():
    packages = el7().var("_nvidia_driver_el7_packages")["kmod"]
    assert "yum-plugin-nvidia" in packages
    assert "nvidia-driver-branch-550-550.54.14" in packages
    assert "nvidia-driver-branch-550-cuda-550.54.14" in packages
    # EL 7 precompiled name (yum-packaging-precompiled-kmod, rhel7): one package per kernel.
    assert "kmod-nvidia-branch-550-3.10.0-1160.119.1.r550.54.14.el7" in packages
    assert not [p for p in packages if "latest-dkms" in p or p in ("dkms", "gcc")]


def test_el7_packages_follow_another_version_and_branch():
    r = el7(nvidia_driver_version="535.216.03")
    packages = r.var("_nvidia_driver_el7_packages")
    assert "nvidia-driver-branch-535-535.216.03" in packages["kmod"]
    assert "nvidia-driver-latest-dkms-535.216.03" in packages["dkms"]
    assert not [p for p in packages["kmod"] + packages["dkms"] if "550" in p]


@pytest.mark.parametrize("flavor", ["dkms", "kmod"])
def test_el7_versionlock_entries_cover_every_pinned_nvidia_package(flavor):
    r = el7()
    packages = r.var("_nvidia_driver_el7_packages")[flavor]
    locks = r.var("_nvidia_driver_el7_lock_names")[flavor]
    # name-VERSION entries lock by name; the EL 7 kmod (name-kernel version-kernel release.r<driver>.el7)
    # locks by its name, kmod-nvidia-branch-550.
    pinned = sorted(
        p[: -len("-550.54.14")] if p.endswith("-550.54.14") else p.split("-3.10.0-")[0]
        for p in packages if "550.54.14" in p
    )
    assert sorted(locks) == pinned
    assert r.var("_nvidia_driver_kernel_lock_names")[:2] == ["kernel", "kernel-devel"]


def test_el7_versionlock_task_adds_kernel_names_only_when_asked():
    tasks = packages_common(el7(), "install.yml", "versionlock-RedHat").tasks("versionlock-RedHat.yml")
    argv = next(t for t in tasks if "ansible.builtin.command" in t)["ansible.builtin.command"]["argv"]
    for lock_kernel, expect in ((True, True), (False, False)):
        r = packages_common(el7(nvidia_driver_versionlock_kernel=lock_kernel), "install.yml",
                            "versionlock-RedHat")
        rendered = r.expr(argv)
        # rpm expands the \\n escape of --qf itself
        assert rendered[:4] == ["rpm", "-q", "--qf", "%{NAME}\\n"]
        assert ("kernel" in rendered) is expect
        assert "nvidia-driver-latest-dkms" in rendered
    lock_module = "community.general.yum_versionlock"
    lock = next(t for t in tasks if lock_module in t)[lock_module]
    outputs = {
        "stdout_lines": [
            "nvidia-driver-latest-dkms",
            "package nvidia-modprobe-latest-dkms is not installed",
            "kernel",
            "kernel",
        ]
    }
    r = packages_common(el7(), "install.yml", "versionlock-RedHat", _packages_common_rpm_installed=outputs)
    assert r.expr(lock["name"]) == ["nvidia-driver-latest-dkms", "kernel"]


def test_el7_cuda_repository_uses_the_url_variables():
    r = packages_common(el7(nvidia_driver_el7_repo_url="http://mirror.lan/cuda/rhel7/x86_64"),
                        "setup-RedHat.yml", "repo-RedHat")
    repo = next(t for t in flat_tasks(r.tasks("repo-RedHat.yml")) if "ansible.builtin.yum_repository" in t)
    (item,) = r.var("packages_common_yum_repos")
    args = RoleRenderer("packages_common", EL7_FACTS, None, item=item, omit="__omit__").expr(
        repo["ansible.builtin.yum_repository"])
    assert args["baseurl"] == "http://mirror.lan/cuda/rhel7/x86_64"
    assert args["gpgkey"] == "http://mirror.lan/cuda/rhel7/x86_64/D42D0685.pub"
    assert args["gpgcheck"] is True


# The enabled-repository check (replaced the grep for mirrorlist.centos.org): tests/roles/test_el7_repos.py.


# --- nouveau --------------------------------------------------------------------------------------


def test_blacklist_content_and_initramfs_commands():
    text = el7().template("blacklist-nouveau.conf.j2")
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body == ["blacklist nouveau", "options nouveau modeset=0"]
    assert el7().var("_nvidia_driver_initramfs_command") == ["dracut", "--force"]
    assert debian().var("_nvidia_driver_initramfs_command") == ["update-initramfs", "-u", "-k", "all"]
    task = el7().tasks("nouveau.yml")[0]
    assert task["notify"] == "Rebuild the initramfs without nouveau"
    with open(os.path.join(ROLES, "nvidia_driver", "handlers", "main.yml")) as fh:
        handlers = yaml.safe_load(fh)
    assert "Rebuild the initramfs without nouveau" in [h["name"] for h in handlers]


# --- Debian / Ubuntu ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "facts,vars_file,distro",
    [
        (DEBIAN_FACTS, "Debian.yml", "debian12"),
        (ubuntu_facts("22.04"), "Debian.yml", "ubuntu2204"),
        (ubuntu_facts("24.04"), "Debian.yml", "ubuntu2404"),
    ],
)
def test_apt_cuda_repository_per_distribution(facts, vars_file, distro):
    r = RoleRenderer("nvidia_driver", facts, vars_file)
    url = "https://developer.download.nvidia.com/compute/cuda/repos/%s/x86_64" % distro
    assert r.var("nvidia_driver_apt_repo_url") == url
    source = packages_common(r, "setup-Debian.yml", "repo-Debian")
    text = source.template("apt-source.list.j2")
    assert text.startswith("# Managed by Ansible (llmops.serving.nvidia_driver)\n")
    lines = [line for line in text.splitlines() if line.startswith("deb ")]
    assert lines == ["deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] %s/ /" % url]
    assert r.var("_nvidia_driver_apt_packages")["repo"] == ["cuda-drivers-550=550.54.14-*"]


def test_apt_repository_local_unsigned_mirror():
    r = debian(nvidia_driver_apt_repo_url="file:///srv/fake/cuda", nvidia_driver_apt_repo_trusted=True)
    source = packages_common(r, "setup-Debian.yml", "repo-Debian")
    lines = [line for line in source.template("apt-source.list.j2").splitlines() if line.startswith("deb ")]
    assert lines == ["deb [trusted=yes] file:///srv/fake/cuda/ /"]


def test_apt_preferences_pin_driver_packages_to_the_version():
    r = debian()
    text = r.template("nvidia-driver.pref.j2")
    fields = dict(line.split(": ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert fields["Pin"] == "version 550.54.14-*"
    assert fields["Pin-Priority"] == "1001"
    regex = fields["Package"]
    assert regex.startswith("/") and regex.endswith("/")
    matcher = re.compile(regex[1:-1])
    for name in (
        "nvidia-driver",
        "nvidia-kernel-dkms",
        "libcuda1",
        "libnvidia-ml1",
        "cuda-drivers-550",
        "nvidia-driver-550",
        "libnvidia-compute-550",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    ):
        assert matcher.search(name), name
    for name in ("cuda-toolkit-12-4", "docker.io", "linux-image-amd64"):
        assert not matcher.search(name), name


def test_distro_method_packages():
    assert "nvidia-driver" in debian().var("_nvidia_driver_apt_packages")["distro"]
    ubuntu = RoleRenderer("nvidia_driver", ubuntu_facts("22.04"), "Debian.yml")
    assert ubuntu.var("_nvidia_driver_apt_packages")["distro"] == [
        "nvidia-headless-550-server",
        "nvidia-utils-550-server",
    ]


@pytest.mark.parametrize(
    "facts,meta_packages",
    [
        (DEBIAN_FACTS, ["linux-image-amd64", "linux-headers-amd64"]),
        (ubuntu_facts("22.04"), ["linux-generic", "linux-image-generic", "linux-headers-generic"]),
        (ubuntu_facts("24.04"), ["linux-generic", "linux-image-generic", "linux-headers-generic"]),
    ],
)
def test_debian_family_shares_one_vars_file_and_holds_the_kernel_per_distribution(facts, meta_packages):
    role_dir = os.path.join(ROLES, "nvidia_driver")
    assert os_vars_file(role_dir, {k[len("ansible_"):]: v for k, v in facts.items()}) == os.path.join(
        role_dir, "vars", "Debian.yml")
    kernel = facts["ansible_kernel"]
    held = meta_packages + ["linux-image-" + kernel, "linux-headers-" + kernel]
    r = RoleRenderer("nvidia_driver", facts, "Debian.yml")
    assert r.var("_nvidia_driver_kernel_hold_names") == held
    assert r.var("_nvidia_driver_lock_names") == held
    unlocked = RoleRenderer("nvidia_driver", facts, "Debian.yml", nvidia_driver_versionlock_kernel=False)
    assert unlocked.var("_nvidia_driver_lock_names") == []
    assert r.var("_nvidia_driver_headers_package") == "linux-headers-" + kernel
    assert r.var("_nvidia_driver_pkg_manager_hint") == "apt-get"


def test_debian_hold_candidates_from_dpkg_output():
    out = {
        "stdout_lines": [
            "installed cuda-drivers-550 550.54.14-1",
            "installed nvidia-driver 550.54.14-1",
            "installed nvidia-container-toolkit 1.17.8-1",
            "config-files nvidia-old 550.54.14-1",
            "installed linux-image-6.1.0-26-amd64 6.1.112-1",
            "installed linux-image-amd64 6.1.112-1",
        ]
    }
    r = packages_common(debian(), "install.yml", "versionlock-Debian", _packages_common_dpkg_out=out)
    holds = r.var("_packages_common_hold_candidates")
    assert holds[:2] == ["cuda-drivers-550", "nvidia-driver"]
    assert "linux-image-amd64" in holds and "linux-image-6.1.0-26-amd64" in holds
    installed = r.var("_packages_common_installed")
    assert "nvidia-old" not in installed and "linux-headers-amd64" not in installed
    task = r.tasks("versionlock-Debian.yml")[1]
    assert r.expr(task["loop"]) == [
        "cuda-drivers-550",
        "nvidia-driver",
        "linux-image-amd64",
        "linux-image-6.1.0-26-amd64",
    ]
    no_kernel = packages_common(debian(nvidia_driver_versionlock_kernel=False), "install.yml",
                                "versionlock-Debian", _packages_common_dpkg_out=out)
    assert no_kernel.var("_packages_common_hold_candidates") == ["cuda-drivers-550", "nvidia-driver"]


# --- decisions ------------------------------------------------------------------------------------


# The decisions themselves (wanted driver loaded, reboot reasons per stage) are unit-tested in
# tests/unit/plugins/module_utils/test_nvidia_driver_plan.py; here: the role acts on the plan.


def plan(stage, gpus, module="", nouveau=False):
    return driver_plan("550.54.14", stage, gpus=gpus, loaded_module=module, nouveau_loaded=nouveau)


def test_install_path_is_skipped_entirely_when_the_driver_is_right():
    main = el7().tasks("main.yml")
    install = next(t for t in main if t.get("ansible.builtin.include_tasks") == "install.yml")
    assert install["when"] == "_nvidia_driver_plan.action == 'install'"
    assert main[0]["ansible.builtin.include_vars"] == (
        "{{ role_path | llmops.serving.os_vars_file(ansible_facts) }}")
    runs_always = [t for t in main if "when" not in t]
    modules = {k for t in runs_always for k in t if k.startswith(("ansible.", "llmops.", "community."))}
    assert modules == {"ansible.builtin.import_tasks", "ansible.builtin.include_vars"}
    detect = el7().tasks("detect.yml")
    assert [next(k for k in t if "." in k) for t in detect] == ["llmops.serving.gpu_facts",
                                                               "llmops.serving.nvidia_driver_info",
                                                               "ansible.builtin.set_fact"]
    decide, keep = detect[1], detect[2]
    assert decide["register"] == "_nvidia_driver_plan_read"
    assert decide["llmops.serving.nvidia_driver_info"]["stage"] == "detect"
    # nvidia-smi already reports the wanted driver: the plan comes without asking the node, and it is
    # driver_plan()'s own answer
    loaded = {"present": True, "driver_version": "550.54.14"}
    old = {"present": True, "driver_version": "535.104.05"}
    asks = el7(llmops_gpus=loaded, nvidia_driver_version="550.54.14").expr("{{ %s }}" % decide["when"])
    assert asks is False
    assert el7(llmops_gpus=old, nvidia_driver_version="550.54.14").expr("{{ %s }}" % decide["when"]) is True
    keep_expr = keep["ansible.builtin.set_fact"]["_nvidia_driver_plan"]
    kept = el7(llmops_gpus=loaded, nvidia_driver_version="550.54.14",
               _nvidia_driver_plan_read={"skipped": True}).expr(keep_expr)
    assert kept == plan("detect", loaded)
    read = plan("detect", old)
    assert el7(llmops_gpus=old, nvidia_driver_version="550.54.14",
               _nvidia_driver_plan_read=read).expr(keep_expr) == read
    for gpus, action in (({"present": True, "driver_version": "550.54.14"}, "none"),
                         ({"present": True, "driver_version": "535.104.05"}, "install")):
        runs = el7(_nvidia_driver_plan=plan("detect", gpus)).expr("{{ %s }}" % install["when"])
        assert runs is (action == "install")


@pytest.mark.parametrize(
    "os_family,flavor,method,needed",
    [
        ("RedHat", "dkms", "repo", True),
        ("RedHat", "kmod", "repo", False),
        ("RedHat", "kmod", "runfile", True),
        ("Debian", "dkms", "repo", True),
        ("Debian", "dkms", "distro", True),
    ],
)
def test_headers_needed(os_family, flavor, method, needed):
    facts = dict(EL7_FACTS if os_family == "RedHat" else DEBIAN_FACTS)
    r = RoleRenderer(
        "nvidia_driver", facts, None, nvidia_driver_el7_flavor=flavor, nvidia_driver_install_method=method
    )
    assert r.var("_nvidia_driver_headers_needed") is needed


def test_el7_kernel_mismatch_with_newer_kernel_installed_says_reboot_or_install():
    facts = dict(EL7_FACTS, ansible_kernel="3.10.0-1160.el7.x86_64")
    r = RoleRenderer(
        "nvidia_driver",
        facts,
        "RedHat.yml",
        _nvidia_driver_headers_out={"stdout_lines": ["3.10.0-1160.119.1.el7.x86_64"]},
        # as `sort -V` on the host orders them
        _nvidia_driver_kernels_out={
            "stdout_lines": [
                "3.10.0-1160.el7.x86_64",
                "3.10.0-1160.99.1.el7.x86_64",
                "3.10.0-1160.119.1.el7.x86_64",
            ]
        },
    )
    assert r.var("_nvidia_driver_headers_ok") is False
    assert r.var("_nvidia_driver_kernel_newest") == "3.10.0-1160.119.1.el7.x86_64"
    msg = " ".join(r.var("_nvidia_driver_headers_message").split())
    assert "RUNNING kernel 3.10.0-1160.el7.x86_64" in msg
    assert "installed for 3.10.0-1160.119.1.el7.x86_64" in msg
    assert "reboot into it" in msg and "3.10.0-1160.119.1.el7.x86_64 has its headers" in msg
    assert "`yum install kernel-devel-3.10.0-1160.el7.x86_64`" in msg


def test_el7_kernel_headers_missing_on_newest_kernel_says_exactly_what_to_install():
    r = el7(
        _nvidia_driver_headers_out={"stdout_lines": ["package kernel-devel is not installed"]},
        _nvidia_driver_kernels_out={"stdout_lines": ["3.10.0-1160.119.1.el7.x86_64"]},
    )
    assert r.var("_nvidia_driver_headers_versions") == []
    msg = " ".join(r.var("_nvidia_driver_headers_message").split())
    assert "installed for no kernel" in msg
    assert "Install exactly: `yum install kernel-devel-3.10.0-1160.119.1.el7.x86_64`" in msg
    assert "reboot into it" not in msg


def test_el7_kernel_headers_present():
    r = el7(_nvidia_driver_headers_out={"stdout_lines": ["3.10.0-1160.119.1.el7.x86_64"]})
    assert r.var("_nvidia_driver_headers_ok") is True


def test_debian_kernel_headers_parsed_from_dpkg_query():
    r = debian(
        _nvidia_driver_headers_out={
            "stdout_lines": [
                "installed linux-headers-6.1.0-25-amd64",
                "installed linux-headers-6.1.0-25-common",
                "installed linux-headers-amd64",
                "not-installed linux-headers-6.1.0-26-amd64",
            ]
        },
        _nvidia_driver_kernels_out={
            "stdout_lines": [
                "installed linux-image-6.1.0-25-amd64",
                "installed linux-image-6.1.0-26-amd64",
                "installed linux-image-amd64",
            ]
        },
    )
    assert r.var("_nvidia_driver_headers_versions") == ["6.1.0-25-amd64", "6.1.0-25-common"]
    assert r.var("_nvidia_driver_headers_ok") is False
    msg = " ".join(r.var("_nvidia_driver_headers_message").split())
    assert "Install exactly: `apt-get install linux-headers-6.1.0-26-amd64`" in msg


def test_reboot_is_gated_by_allow_reboot_and_failure_names_the_reasons():
    tasks = el7().tasks("reboot.yml")
    fail = next(t for t in tasks if "ansible.builtin.fail" in t)
    reboot = next(t for t in tasks if "ansible.builtin.reboot" in t)
    assert "not (_nvidia_driver_plan.reboot | bool)" in fail["when"]
    assert "_nvidia_driver_plan.reboot | bool" in reboot["when"]
    assert "_nvidia_driver_plan.action == 'reboot'" in fail["when"]
    assert "_nvidia_driver_plan.action == 'reboot'" in reboot["when"]
    pending = plan("final", {"present": False, "error": "Driver/library version mismatch"}, "535.104.05")
    pending.update(reboot_decision("reboot", "false"))
    r = el7(
        _nvidia_driver_plan=pending,
        _nvidia_driver_packages={"changed": True},
        ansible_inventory_sources=["/srv/ansible/inventories/l20"],
    )
    msg = " ".join(r.expr(fail["ansible.builtin.fail"]["msg"]).split())
    # What was installed, why it cannot be used yet, and the command that resumes.
    assert msg.startswith("REBOOT PENDING on gpu1: NVIDIA driver 550.54.14 was installed in this run "
                          "(packages ")
    assert "kmod-nvidia-latest-dkms-550.54.14" in msg and "versions locked" in msg
    assert "the loaded nvidia kernel module is 535.104.05" in msg
    assert "`ansible-playbook site.yml -i /srv/ansible/inventories/l20 --limit gpu1`" in msg
    assert "-e nvidia_driver_allow_reboot=true" in msg
    # A re-run after a reboot that did not happen still says so, without claiming a new install.
    again = el7(
        _nvidia_driver_plan=pending,
        _nvidia_driver_packages={"changed": False},
        ansible_inventory_sources=["/srv/ansible/inventories/l20"],
    )
    again_msg = " ".join(again.expr(fail["ansible.builtin.fail"]["msg"]).split())
    assert "550.54.14 is installed (packages" in again_msg
    confirm = next(t for t in el7().tasks("activate.yml") if "block" in t)
    facts = confirm["block"][0]["llmops.serving.gpu_facts"]
    assert facts["required"] is True and r.expr(facts["min_driver_version"]) == "550.54.14"


def test_runfile_paths_and_arguments():
    r = el7(nvidia_driver_install_method="runfile", nvidia_driver_runfile_src="http://mirror.lan/NVIDIA.run")
    assert (
        r.var("_nvidia_driver_runfile_path")
        == "/var/cache/llmops/nvidia-driver/NVIDIA-Linux-x86_64-550.54.14.run"
    )
    task = next(t for t in r.tasks("runfile.yml") if t["name"] == "Run the NVIDIA installer")
    argv = r.expr(task["ansible.builtin.command"]["argv"])
    assert argv[:2] == ["sh", "/var/cache/llmops/nvidia-driver/NVIDIA-Linux-x86_64-550.54.14.run"]
    assert "--silent" in argv and "--dkms" in argv
    unit = r.template("nvidia-persistenced.service.j2")
    assert "ExecStart=/usr/bin/nvidia-persistenced" in unit and "WantedBy=multi-user.target" in unit


@pytest.mark.parametrize(
    "facts,ok",
    [
        (EL7_FACTS, True),
        (DEBIAN_FACTS, True),
        (ubuntu_facts("22.04"), True),
        (ubuntu_facts("24.04"), True),
        (ubuntu_facts("20.04"), False),
        (dict(EL7_FACTS, ansible_distribution_major_version="8"), False),
        (dict(DEBIAN_FACTS, ansible_distribution_major_version="11"), False),
    ],
)
def test_supported_platforms(facts, ok):
    r = RoleRenderer("nvidia_driver", facts)
    task = r.tasks("validate.yml")[0]
    results = [r.expr("{{ %s }}" % cond) for cond in task["ansible.builtin.assert"]["that"]]
    assert all(results) is ok


def test_headers_reread_after_install_wins_unless_skipped():
    # Every read goes through tasks/kernels-read.yml into the same registers: a re-read that runs replaces
    # the first read, and a re-read skipped by the `when` of its include registers nothing.
    r = el7()
    read = r.tasks("kernels-read.yml")
    assert [t["register"] for t in read] == ["_nvidia_driver_headers_out", "_nvidia_driver_kernels_out"]
    assert "when" not in read[0] and read[1]["when"] == "not (_nvidia_driver_headers_ok | bool)"
    kernel = list(flat_tasks(r.tasks("kernel.yml")))
    includes = [t for t in kernel if "ansible.builtin.include_tasks" in t]
    assert [t["ansible.builtin.include_tasks"] for t in includes] == ["kernels-read.yml", "kernels-read.yml"]
    assert "when" not in includes[0] and includes[1]["when"] == "not ansible_check_mode"
    assert not [t for t in kernel if "register" in t and "headers_out" in t["register"]]
    before = {"stdout_lines": ["package kernel-devel is not installed"]}
    after = {"stdout_lines": ["3.10.0-1160.119.1.el7.x86_64"]}
    assert el7(_nvidia_driver_headers_out=before).var("_nvidia_driver_headers_ok") is False
    assert el7(_nvidia_driver_headers_out=after).var("_nvidia_driver_headers_ok") is True
    noble_headers = {"stdout_lines": ["installed linux-headers-6.8.0-45-generic"]}
    ubuntu = RoleRenderer("nvidia_driver", ubuntu_facts("24.04"), "Debian.yml",
                          _nvidia_driver_headers_out=noble_headers)
    assert ubuntu.var("_nvidia_driver_headers_ok") is True


NO_PACKAGE = "No package kernel-devel-3.10.0-1160.119.1.el7.x86_64 available."


def test_headers_message_reports_a_failed_install():
    r = el7(
        _nvidia_driver_headers_out={"stdout_lines": []},
        _nvidia_driver_kernels_out={"stdout_lines": ["3.10.0-1160.119.1.el7.x86_64"]},
        _nvidia_driver_headers_install_error=NO_PACKAGE,
    )
    msg = " ".join(r.var("_nvidia_driver_headers_message").split())
    assert (
        "(installing it failed here: No package kernel-devel-3.10.0-1160.119.1.el7.x86_64 available.)" in msg
    )
    off = el7(_nvidia_driver_headers_out={"stdout_lines": []}, nvidia_driver_kernel_headers_install=False)
    assert "or set nvidia_driver_kernel_headers_install: true" in " ".join(
        off.var("_nvidia_driver_headers_message").split()
    )


def test_runfile_waits_for_a_reboot_away_from_nouveau():
    tasks = el7().tasks("reboot.yml")
    fail = next(t for t in tasks if "ansible.builtin.fail" in t)
    r = el7(
        _nvidia_driver_plan=plan("before_installer", {"present": False, "error": "nvidia-smi not found"},
                                 "", True),
        ansible_inventory_sources=["inventories/l20"],
    )
    msg = " ".join(r.expr(fail["ansible.builtin.fail"]["msg"]).split())
    assert "the NVIDIA installer for driver 550.54.14 cannot run yet, because the nouveau module is loaded" \
        in msg
    runfile = el7().tasks("runfile.yml")
    order = [t["name"] for t in runfile]
    assert order.index("Reboot away from nouveau before running the installer") < order.index(
        "Run the NVIDIA installer"
    )
    decide = runfile[order.index("Decide whether the NVIDIA installer can run now")]
    assert decide["llmops.serving.nvidia_driver_info"]["stage"] == "before_installer"
    assert decide["register"] == "_nvidia_driver_plan"
