# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""What happens when the NVIDIA driver is the wrong version: the driver plan of llmops.serving.nvidia_driver.

The role ``nvidia_driver`` asks ``llmops.serving.nvidia_driver_info`` (which calls ``driver_plan()`` below)
at three moments, and only carries out the answer: ``action`` is ``none``, ``install`` or ``reboot``, and
``reasons`` are the sentences the role prints.

1. ``detect`` (tasks/detect.yml, at the start). gpu_facts has read nvidia-smi into ``llmops_gpus``. When it
   reports exactly the wanted version (``nvidia_driver_version``) the action is ``none`` and the role
   changes nothing. Anything else (another version, no nvidia-smi, a broken driver) is ``install``: kernel
   headers, nouveau blacklist, packages or runfile, version locks, nvidia-persistenced (tasks/install.yml).
   Packages are never installed over a driver that NVIDIA's .run installer put on the node: the install plan
   also carries ``runfile_action`` (module_utils/_gpu/runfile.py, by nvidia_driver_runfile_policy).
2. ``before_installer`` (tasks/runfile.yml, runfile method only). The NVIDIA installer refuses to run while
   nouveau is loaded: ``reboot`` (nouveau is blacklisted by then, so it stays away after the reboot).
   When ``modinfo`` already finds the wanted module on disk the runfile was installed earlier: ``none``.
   Otherwise ``install``: the installer runs now.
3. ``final`` (tasks/activate.yml, after the install). A first install with no driver module loaded and no
   nouveau needs no reboot: ``load_module`` tells the role to ``modprobe nvidia``; gpu_facts reads
   nvidia-smi again and the role asks once more. The wanted driver is usable when nvidia-smi reports it,
   nouveau is gone and the loaded module (``<sysfs>/nvidia/version``) is the wanted one or none. Each thing
   that stands in the way is one reason, and any reason means ``reboot`` (a loaded module cannot be
   replaced while in use; nouveau leaves only at a boot):

   - ``nvidia-smi reports driver 535.104.05`` or ``nvidia-smi reports no usable driver (<its error>)``;
   - ``the nouveau module is loaded (now blacklisted ...)``;
   - ``the loaded nvidia kernel module is 535.104.05, not 550.54.14 (...)``.

Whether the play may carry out a ``reboot`` plan itself is ``reboot_decision()`` below, by the reboot policy
``nvidia_driver_allow_reboot``:

- ``true``: it reboots (tasks/reboot.yml);
- ``false``: it never does;
- ``auto`` (the default): it reboots only a node that serves nothing, which is what a bare node is and a box
  in production is not. "Serves nothing" is read without the driver's help, since on such a node nvidia-smi
  cannot answer (nouveau, no driver, or the new user space next to the old loaded module: a "library version
  mismatch"): no process holds an NVIDIA device node open (``/proc/<pid>/fd`` pointing at ``/dev/nvidia0``,
  ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ...: every CUDA program does, containers included; the daemons in
  ``ignore_processes`` such as nvidia-persistenced do not count), and no unit of ours runs (the running units
  matching ``busy_units``: role serving's llama-server-*/vllm-* instances, Ray).

When the play may not reboot, it stops the node with templates/reboot-pending-message.j2: "REBOOT PENDING on
<node>: ... because <reasons>", what kept ``auto`` from rebooting, and the command that resumes after a
reboot. After the reboot the same run (or the next one) confirms that nvidia-smi reports exactly the pinned
version.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import os

from ansible_collections.llmops.serving.plugins.module_utils.module_guard import brief
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

STAGES = ("detect", "before_installer", "final")
REBOOT_POLICIES = ("auto", "true", "false")
# Device nodes a program opens to use an NVIDIA GPU (CUDA: nvidiactl, nvidia-uvm and nvidia<N>; an X server:
# nvidia-modeset). nvidia-caps (MIG) and the DRM nodes are not among them.
GPU_DEVICE_RE = whole(r"/dev/nvidia([0-9]+|ctl|-uvm|-uvm-tools|-modeset)")

NOUVEAU_REASON = ("the nouveau module is loaded (now blacklisted and the initramfs rebuilt, so it will not "
                  "load after a reboot)")
NOUVEAU_BLOCKS_INSTALLER = "the nouveau module is loaded and the NVIDIA installer refuses to run next to it"


def _text(value):
    return "" if value is None else str(value)


# An NVIDIA driver version as the packages and /sys/module/nvidia/version spell it (570.133.20, 535.54.03).
DRIVER_VERSION_RE = whole(r"[0-9]{2,4}(\.[0-9]{1,4}){1,3}")


def wanted_driver_version(value):
    """nvidia_driver_version as the node spells its driver: surrounding whitespace dropped (a trailing
    newline from a file lookup asked to install the driver that was already loaded), then it must look like
    a driver version; ValueError names the setting otherwise."""
    text = _text(value).strip()
    if not DRIVER_VERSION_RE.match(text):
        raise ValueError("nvidia_driver_version must be a driver version such as 570.133.20, got %s"
                         % brief(value))
    return text


def _true(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)


def read_loaded_module(sysfs_module_dir):
    """Version of the nvidia kernel module the kernel has loaded ('' when none is loaded)."""
    try:
        with open(os.path.join(sysfs_module_dir, "nvidia", "version")) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return ""


def read_nouveau_loaded(sysfs_module_dir):
    """True while the kernel has the nouveau module loaded."""
    return os.path.exists(os.path.join(sysfs_module_dir, "nouveau"))


def wanted_driver_loaded(wanted_version, gpus):
    """nvidia-smi (as gpu_facts read it into llmops_gpus) works and reports exactly the wanted driver."""
    gpus = gpus or {}
    return bool(gpus) and _true(gpus.get("present", False)) and \
        _text(gpus.get("driver_version")) == _text(wanted_version)


def nvidia_smi_reason(gpus):
    """What nvidia-smi says instead of the wanted driver."""
    gpus = gpus or {}
    if gpus.get("driver_version"):
        return "nvidia-smi reports driver %s" % gpus["driver_version"]
    return "nvidia-smi reports no usable driver (%s)" % (gpus.get("error") or "no output")


def reboot_reasons(wanted_version, gpus, loaded_module, nouveau_loaded):
    """Why the wanted driver is not in use yet; empty means it is."""
    reasons = []
    if not wanted_driver_loaded(wanted_version, gpus):
        reasons.append(nvidia_smi_reason(gpus))
    if nouveau_loaded:
        reasons.append(NOUVEAU_REASON)
    if loaded_module not in ("", _text(wanted_version)):
        reasons.append("the loaded nvidia kernel module is %s, not %s (a loaded module cannot be replaced "
                       "while in use)" % (loaded_module, wanted_version))
    return reasons


def driver_plan(wanted_version, stage, gpus=None, loaded_module="", nouveau_loaded=False,
                installed_module=""):
    """The plan for one stage (see the module docstring): a dict with action, reasons and the state read.

    gpus: the llmops_gpus fact; loaded_module: content of <sysfs>/nvidia/version; nouveau_loaded: whether
    <sysfs>/nouveau exists; installed_module: `modinfo -F version nvidia` (before_installer only).
    """
    if stage not in STAGES:
        raise ValueError("stage must be one of %s, got %r" % (", ".join(STAGES), stage))
    wanted_version = wanted_driver_version(wanted_version)
    loaded_module = _text(loaded_module).strip()
    installed_module = _text(installed_module).strip()
    wanted_loaded = wanted_driver_loaded(wanted_version, gpus)
    if stage == "detect":
        reasons = [] if wanted_loaded else reboot_reasons(wanted_version, gpus, loaded_module, nouveau_loaded)
        action = "install" if reasons else "none"
    elif stage == "before_installer":
        already_installed = installed_module == wanted_version
        reasons = [NOUVEAU_BLOCKS_INSTALLER] if nouveau_loaded and not already_installed else []
        action = "none" if already_installed else ("reboot" if reasons else "install")
    else:
        reasons = reboot_reasons(wanted_version, gpus, loaded_module, nouveau_loaded)
        action = "reboot" if reasons else "none"
    return dict(
        stage=stage,
        action=action,
        reasons=reasons,
        wanted_version=wanted_version,
        wanted_loaded=wanted_loaded,
        loaded_module=loaded_module,
        nouveau_loaded=bool(nouveau_loaded),
        installed_module=installed_module,
        # A first install with nothing in the way needs no reboot: loading the fresh module is enough.
        load_module=stage == "final" and not nouveau_loaded and loaded_module == "",
    )


def detect_plan_without_node(wanted_version, gpus):
    """The ``detect`` plan when nvidia-smi (llmops_gpus, read earlier in the run) already reports the wanted
    driver: ``none``, and nothing on the node can change that answer (the sysfs state only matters for the
    reasons of an install), so the role needs no module call. None when the node must be asked."""
    if not wanted_driver_loaded(wanted_driver_version(wanted_version), gpus):
        return None
    return driver_plan(wanted_version, "detect", gpus=gpus)


def preflight_summary(wanted_version, gpus, reboot_policy="auto", managed=True):
    """What preflight says the GPU host stage will do with the driver, before it runs: the ``detect`` plan
    from the GPUs preflight read (the node's sysfs is read by the stage itself), worded with the reboot
    policy. One sentence; the decision is driver_plan()'s, not a second rule.

    wanted_version: nvidia_driver_version ('' when the inventory leaves the role's default); gpus: the
    llmops_gpus fact; reboot_policy: nvidia_driver_allow_reboot; managed: llmops_manage_driver."""
    if not _true(managed):
        return ("Driver: not managed here (llmops_manage_driver is false); the GPU gates after the GPU host "
                "stage decide.")
    wanted = _text(wanted_version).strip()
    gpus = gpus or {}
    if wanted and driver_plan(wanted, "detect", gpus=gpus)["action"] == "none":
        return "Driver: the pinned %s is loaded, nothing to change." % wanted
    current = _text(gpus.get("driver_version")).strip()
    policy = normal_reboot_policy(reboot_policy)
    if policy == "true":
        reboot = "the play reboots the node when the new driver needs it"
    elif policy == "auto":
        reboot = ("if the new driver needs a reboot (nouveau holds the GPUs, or an old module is loaded) "
                  "the play reboots the node only when no process uses the GPUs and no serving unit runs "
                  "(nvidia_driver_allow_reboot: auto), else it stops there and says how to resume")
    else:
        reboot = ("if the new driver needs a reboot the run stops there and says how to resume "
                  "(nvidia_driver_allow_reboot: true or auto lets the play reboot)")
    return "Driver: the GPU host stage installs NVIDIA %s%s; %s." % (
        wanted or "driver (role default)", " (replacing %s)" % current if current else "", reboot)


def headers_needed(install_method, os_family, el7_flavor):
    """Whether the install compiles against the running kernel and so needs its headers: DKMS and runfile
    builds do; the precompiled EL 7 kmods (nvidia_driver_el7_flavor kmod, repo method) do not."""
    return install_method == "runfile" or os_family != "RedHat" or el7_flavor == "dkms"


def normal_reboot_policy(value):
    """nvidia_driver_allow_reboot as one of REBOOT_POLICIES (YAML booleans and their spellings accepted)."""
    text = _text(value).strip().lower()
    if text in ("auto",):
        return "auto"
    if text in ("1", "true", "yes", "on", "y", "t"):
        return "true"
    if text in ("0", "false", "no", "off", "n", "f"):
        return "false"
    raise ValueError("nvidia_driver_allow_reboot must be auto, true or false, got %s" % brief(value))


def read_gpu_processes(proc_root="/proc", ignore=()):
    """Processes holding an NVIDIA device node open: [{pid, name, device}] by pid, the ignored names left out.

    Read from <proc_root>/<pid>/fd, so it works whatever driver is loaded and whether nvidia-smi answers.
    A process that ends or cannot be read while the list is made is skipped."""
    try:
        pids = sorted((int(p) for p in os.listdir(proc_root) if p.isdigit()))
    except (IOError, OSError):
        return []
    ignore = set(ignore or ())
    found = []
    for pid in pids:
        base = os.path.join(proc_root, str(pid))
        try:
            with open(os.path.join(base, "comm")) as handle:
                name = handle.read().strip()
        except (IOError, OSError):
            continue
        if name in ignore:
            continue
        try:
            fds = sorted(os.listdir(os.path.join(base, "fd")), key=lambda fd: (len(fd), fd))
        except (IOError, OSError):
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(base, "fd", fd))
            except (IOError, OSError):
                continue
            if GPU_DEVICE_RE.match(target):
                found.append(dict(pid=pid, name=name, device=target))
                break
    return found


def busy_units(running_units, patterns):
    """The running units that are ours (match one of the shell patterns), sorted."""
    patterns = list(patterns or ())
    return sorted(u for u in set(running_units or ()) if any(fnmatch.fnmatchcase(u, p) for p in patterns))


def reboot_decision(action, policy, gpu_processes=(), running_units=(), unit_patterns=()):
    """Whether the play reboots the node for a ``reboot`` plan, by the policy; and, when not, why.

    Returns reboot (bool), reboot_policy, reboot_blockers (sentences; empty when it reboots or nothing is
    pending) and busy_units (ours among running_units)."""
    policy = normal_reboot_policy(policy)
    units = busy_units(running_units, unit_patterns)
    blockers = []
    if action == "reboot":
        if policy == "false":
            blockers.append("nvidia_driver_allow_reboot is false")
        elif policy == "auto":
            if gpu_processes:
                blockers.append("%d process(es) use the GPUs: %s" % (len(gpu_processes), ", ".join(
                    "%s (pid %d, %s)" % (p["name"], p["pid"], p["device"]) for p in gpu_processes)))
            if units:
                blockers.append("serving units run: %s" % ", ".join(units))
    return dict(reboot=action == "reboot" and not blockers, reboot_policy=policy, reboot_blockers=blockers,
                busy_units=units)
