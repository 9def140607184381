# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What happens when the NVIDIA driver is the wrong version: the driver plan of llmops.serving.nvidia_driver.

The role ``nvidia_driver`` asks ``llmops.serving.nvidia_driver_info`` (which calls ``driver_plan()`` below)
at three moments, and only carries out the answer: ``action`` is ``none``, ``install`` or ``reboot``, and
``reasons`` are the sentences the role prints.

1. ``detect`` (tasks/detect.yml, at the start). gpu_facts has read nvidia-smi into ``llmops_gpus``. When it
   reports exactly the wanted version (``nvidia_driver_version``) the action is ``none`` and the role
   changes nothing. Anything else (another version, no nvidia-smi, a broken driver) is ``install``: kernel
   headers, nouveau blacklist, packages or runfile, version locks, nvidia-persistenced (tasks/install.yml).
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

A ``reboot`` plan reboots the node when ``nvidia_driver_allow_reboot`` is true (tasks/reboot.yml), and
otherwise stops the node with templates/reboot-pending-message.j2: "REBOOT PENDING on <node>: ... because
<reasons>", plus the command that resumes after a reboot. After the reboot the same run (or the next one)
confirms that nvidia-smi reports exactly the pinned version.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

STAGES = ("detect", "before_installer", "final")

NOUVEAU_REASON = ("the nouveau module is loaded (now blacklisted and the initramfs rebuilt, so it will not "
                  "load after a reboot)")
NOUVEAU_BLOCKS_INSTALLER = "the nouveau module is loaded and the NVIDIA installer refuses to run next to it"


def _text(value):
    return "" if value is None else str(value)


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
    wanted_version = _text(wanted_version)
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
