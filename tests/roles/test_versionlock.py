# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""EL 7 version locks: `yum versionlock` exists only with yum-plugin-versionlock, so the shared entry point
installs it before it locks anything. A node whose driver is already right (or came from the runfile) never
runs the driver's package install, and the container toolkit still locks Docker and the toolkit."""

from tests.roles.test_nvidia_driver import EL7_FACTS, RoleRenderer, el7, flat_tasks, packages_common


def module_of(task):
    return next(k for k in task if k.startswith(("ansible.", "community.")))


def lock_entry_point(r):
    """The tasks of versionlock-RedHat as the caller renders them (module names in order, the renderer)."""
    tasks = list(flat_tasks(r.tasks("versionlock-RedHat.yml")))
    return [module_of(t) for t in tasks], tasks


def test_the_plugin_is_installed_before_any_lock():
    r = packages_common(el7(), "install.yml", "versionlock-RedHat")
    modules, tasks = lock_entry_point(r)
    lock_at = modules.index("community.general.yum_versionlock")
    installers = ("ansible.builtin.yum", "ansible.builtin.package")
    installs = [t for t in tasks[:lock_at] if module_of(t) in installers]
    assert installs, "nothing installs yum-plugin-versionlock before community.general.yum_versionlock"
    assert r.expr(installs[0][module_of(installs[0])]["name"]) == "yum-plugin-versionlock"
    assert installs[0][module_of(installs[0])]["state"] == "present"
    # Check mode cannot run `yum versionlock` when this run would install the plugin.
    assert "ansible_check_mode" in str(tasks[lock_at]["when"])


def test_the_container_toolkit_locks_through_that_entry_point_on_a_node_without_a_driver_install():
    toolkit = RoleRenderer("nvidia_container_toolkit", EL7_FACTS, "RedHat.yml")
    main = toolkit.tasks("main.yml")
    call = next(t for t in main
                if t.get("ansible.builtin.include_role", {}).get("name") == "llmops.serving.packages_common")
    assert call["ansible.builtin.include_role"]["tasks_from"] == "versionlock-{{ ansible_os_family }}"
    # Nothing in the toolkit role's own EL 7 install brings the plugin: the entry point has to.
    setup = " ".join(str(t) for t in flat_tasks(toolkit.tasks("setup-RedHat.yml")))
    assert "yum-plugin-versionlock" not in setup
    r = packages_common(toolkit, "main.yml", "versionlock-RedHat")
    modules, _ = lock_entry_point(r)
    assert modules.index("ansible.builtin.yum") < modules.index("community.general.yum_versionlock")


def test_the_driver_packages_no_longer_carry_the_plugin_themselves():
    # One place: the entry point installs it; the driver's package list names only what the driver needs.
    packages = el7().var("_nvidia_driver_el7_packages")
    assert "yum-plugin-versionlock" not in packages["dkms"] + packages["kmod"]
