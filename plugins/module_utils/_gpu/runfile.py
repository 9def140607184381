# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""A driver installed by hand with NVIDIA's ``.run`` installer: found, and never overwritten by packages.

NVIDIA's runfile (NVIDIA-Linux-x86_64-<version>.run) copies the driver straight into the system directories,
outside the package manager. Installing the driver packages on top (``nvidia-driver-latest-dkms-*`` on EL 7,
``cuda-drivers-<branch>`` on Debian/Ubuntu) mixes two drivers file by file: NVIDIA requires
``nvidia-uninstall`` first. The role used to do exactly that whenever nvidia-smi did not report the wanted
version, and it does not: a kernel update under a runfile driver installed without ``--dkms`` leaves the new
kernel without a module, so nvidia-smi fails although the wanted version is installed.

``read_runfile_install()`` reads the node (module llmops.serving.nvidia_driver_info, ``detect`` stage, only
when the driver plan is an install). A runfile install is what its own files say:

- ``/usr/bin/nvidia-uninstall``: the installer puts it there and only an uninstall removes it;
- driver files that no package owns (``rpm -qf`` / ``dpkg -S`` find no owner): ``libcuda.so.<version>``,
  ``libnvidia-ml.so.<version>`` in the library directories, ``/usr/bin/nvidia-smi``, and the
  ``nvidia.ko`` that the installer builds without DKMS (``/lib/modules/<kernel>/kernel/drivers/video``).

``/var/log/nvidia-installer.log`` ("installer version: 550.54.14") gives the version when no library does, but
counts for nothing alone: the log stays after an uninstall. Whether the runfile registered its module with
DKMS (``--dkms``): ``/var/lib/dkms/nvidia/<version>``.

``runfile_plan()`` decides, by ``nvidia_driver_runfile_policy``, when the role would install packages
(``nvidia_driver_install_method`` repo or distro) over such a driver: ``refuse`` (the default) stops the run
with ``runfile_message`` (re-run the ``.run`` with ``--dkms``, or uninstall it and let the role install the
packages); ``uninstall`` runs ``nvidia-uninstall --silent`` before the packages. The runfile method itself
(``nvidia_driver_install_method: runfile``) replaces an earlier runfile install the NVIDIA way, so nothing is
in its way. A runfile driver of the wanted version that works is never looked at: nvidia-smi reports it and
the plan is ``none``.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

RUNFILE_POLICIES = ("refuse", "uninstall")
INSTALLER_LOG = "/var/log/nvidia-installer.log"
UNINSTALLER = "/usr/bin/nvidia-uninstall"
# Where the runfile puts the 64-bit libraries: the distribution's libdir (EL: lib64; Debian: multiarch).
LIBRARY_DIRS = ("/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib")
LIBRARY_RE = whole(r"lib(?:cuda|nvidia-ml)\.so\.([0-9]+(?:\.[0-9]+)+)")
BINARIES = ("/usr/bin/nvidia-smi",)
# The installer's own module location when it builds without DKMS (DKMS and kmod packages use extra/ or
# updates/).
RUNFILE_MODULE = "kernel/drivers/video/nvidia.ko"
LOG_VERSION_RE = re.compile(r"^installer version:\s*([0-9]+(?:\.[0-9]+)+)\s*$", re.M)


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _is_file(path):
    return os.path.isfile(path) and not os.path.islink(path)


def driver_files(root="/"):
    """The driver files a runfile install leaves, as node paths (without root): the versioned libraries,
    nvidia-smi, and the non-DKMS nvidia.ko of each kernel. Symlinks are left out (their targets count)."""
    found = []
    for directory in LIBRARY_DIRS:
        try:
            names = sorted(os.listdir(_under(root, directory)))
        except (IOError, OSError):
            continue
        found.extend(os.path.join(directory, n) for n in names
                     if LIBRARY_RE.match(n) and _is_file(_under(root, os.path.join(directory, n))))
    found.extend(b for b in BINARIES if _is_file(_under(root, b)))
    found.extend(p for _kernel, p in module_files(root))
    return found


def module_files(root="/"):
    """[(kernel, node path)] of the nvidia.ko the runfile built without DKMS, per kernel."""
    try:
        kernels = sorted(os.listdir(_under(root, "/lib/modules")))
    except (IOError, OSError):
        return []
    return [(k, "/lib/modules/%s/%s" % (k, RUNFILE_MODULE)) for k in kernels
            if _is_file(_under(root, "/lib/modules/%s/%s" % (k, RUNFILE_MODULE)))]


def installer_log_version(root="/"):
    """The version the last run of nvidia-installer wrote in its log ('' when there is no log)."""
    try:
        with open(_under(root, INSTALLER_LOG)) as handle:
            match = LOG_VERSION_RE.search(handle.read(4096))
    except (IOError, OSError, UnicodeDecodeError):
        return ""
    return match.group(1) if match else ""


def read_runfile_install(root="/", owner=None):
    """What the node says about a runfile install: a dict with installed, version, dkms, uninstaller,
    unowned (driver files no package owns), module_kernels (kernels with a non-DKMS runfile module) and
    evidence (sentences).

    owner: a callable, node path -> the owning package, '' when no package owns it, None when that cannot be
    told (no package manager): such files are not counted as the runfile's."""
    uninstaller = os.path.lexists(_under(root, UNINSTALLER))
    unowned = []
    if owner is not None:
        unowned = [path for path in driver_files(root) if owner(path) == ""]
    versions = sorted(set(LIBRARY_RE.match(os.path.basename(p)).group(1) for p in unowned
                          if LIBRARY_RE.match(os.path.basename(p))))
    version = versions[-1] if versions else installer_log_version(root)
    evidence = []
    if uninstaller:
        evidence.append("%s is there (the runfile installs it; an uninstall removes it)" % UNINSTALLER)
    # An nvidia-smi no package owns is no driver by itself (a copied binary, a test double): the runfile
    # always leaves its versioned libraries, or its kernel module, or its uninstaller beside it.
    if [path for path in unowned if path not in BINARIES]:
        evidence.append("no package owns %s" % ", ".join(unowned))
    installed = bool(evidence)
    if installed and version and os.path.isfile(_under(root, INSTALLER_LOG)):
        evidence.append("%s says installer version %s" % (INSTALLER_LOG, installer_log_version(root) or "?"))
    dkms = bool(version) and os.path.isdir(_under(root, "/var/lib/dkms/nvidia/%s" % version))
    kernels = [k for k, path in module_files(root) if path in unowned]
    return dict(installed=installed, version=version, dkms=dkms, uninstaller=uninstaller, unowned=unowned,
                module_kernels=kernels, evidence=evidence)


def package_owner(rc, stdout):
    """The owner that ``rpm -qf <path>`` or ``dpkg -S <path>`` printed: the package, or '' when the command
    says no package owns the path (rpm and dpkg exit 1 then)."""
    if rc != 0:
        return ""
    line = (stdout or "").strip().splitlines()
    if not line:
        return ""
    # dpkg -S: "libnvidia-compute-550:amd64: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"
    return line[0].rsplit(": ", 1)[0].strip()


def normal_runfile_policy(value):
    text = ("" if value is None else str(value)).strip().lower()
    if text not in RUNFILE_POLICIES:
        raise ValueError("nvidia_driver_runfile_policy must be refuse or uninstall, got %r" % (value,))
    return text


def runfile_plan(runfile, install_method, policy, wanted_version, gpus=None, kernel=""):
    """What the role does about a runfile install before it installs the wanted driver: a dict with
    runfile_action (none, refuse or uninstall) and runfile_message (the sentences the role prints)."""
    policy = normal_runfile_policy(policy)
    runfile = runfile or {}
    if not runfile.get("installed") or install_method == "runfile":
        return dict(runfile_action="none", runfile_message="")
    found = runfile.get("version") or "of unknown version"
    action = "uninstall" if policy == "uninstall" and runfile.get("uninstaller") else "refuse"
    text = ["An NVIDIA driver %s installed with NVIDIA's .run installer is on this node (%s)."
            % (found, "; ".join(runfile.get("evidence") or ()))]
    text.append(broken_runfile_note(runfile, wanted_version, gpus, kernel))
    if action == "uninstall":
        text.append("nvidia_driver_runfile_policy is uninstall: the role runs %s --silent, then installs the "
                    "driver %s packages (nvidia_driver_install_method: %s)."
                    % (UNINSTALLER, wanted_version, install_method))
        return dict(runfile_action=action, runfile_message=" ".join(t for t in text if t))
    text.append("The role installs driver packages (nvidia_driver_install_method: %s) and never over a "
                "runfile driver: the two would mix their files, and NVIDIA requires the runfile driver's "
                "uninstall first." % install_method)
    rerun = "NVIDIA-Linux-x86_64-%s.run" % (runfile.get("version") or wanted_version)
    text.append("Either keep a runfile driver: run NVIDIA-Linux-x86_64-%s.run --dkms yourself (the installer "
                "replaces its own earlier install), or let the role run it (nvidia_driver_install_method: "
                "runfile with nvidia_driver_runfile_src)." % wanted_version)
    if runfile.get("uninstaller"):
        text.append("Or remove it and let the role install the packages: set nvidia_driver_runfile_policy: "
                    "uninstall (the role runs %s --silent), or run %s yourself." % (UNINSTALLER, UNINSTALLER))
    else:
        text.append("Or remove it and let the role install the packages: %s is gone%s, so run sh %s "
                    "--uninstall (the runfile of the installed version), then run the play again." % (
                        UNINSTALLER, " (nvidia_driver_runfile_policy uninstall needs it)"
                        if policy == "uninstall" else "", rerun))
    return dict(runfile_action=action, runfile_message=" ".join(t for t in text if t))


def broken_runfile_note(runfile, wanted_version, gpus, kernel):
    """When nvidia-smi fails under a runfile driver built without DKMS: what a kernel update did; the fix."""
    gpus = gpus or {}
    if gpus.get("present") or runfile.get("dkms"):
        return ""
    built = runfile.get("module_kernels") or []
    if kernel and kernel in built:
        where = "its module is built for the running kernel %s" % kernel
    elif built:
        where = "its module is built for kernel %s only, the running kernel is %s" % (
            ", ".join(built), kernel or "another one")
    else:
        where = "it registered no module with DKMS"
    return ("nvidia-smi fails (%s) and the runfile driver was installed without --dkms (%s): after a kernel "
            "update the new kernel has no nvidia module. Re-run NVIDIA-Linux-x86_64-%s.run with --dkms, so "
            "that DKMS rebuilds the module on every kernel update%s." % (
                gpus.get("error") or "no output", where, runfile.get("version") or wanted_version,
                "" if runfile.get("version") in ("", None, wanted_version)
                else ", or install driver %s the same way" % wanted_version))
