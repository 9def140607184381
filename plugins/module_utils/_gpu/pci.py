# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""NVIDIA GPUs as the PCI bus shows them, with or without a driver: llmops.serving.gpu_pci_info.

nvidia-smi needs a working driver; a bare node has none (or nouveau holds the GPUs). The kernel lists every
PCI function under ``<sysfs>/bus/pci/devices/<domain:bus:dev.fn>/`` with ``vendor``, ``device`` and ``class``
files (``0x10de``, ``0x26ba``, ``0x030200``) and, when a driver is bound, a ``driver`` link to
``<sysfs>/bus/pci/drivers/<name>``. That is enough to say which NVIDIA GPUs are there, whether nouveau holds
them, and to refuse a box that is not the one the inventory describes before a 1 GB driver install.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import math
import os
import re

from ansible_collections.llmops.serving.plugins.module_utils._files.local_read import read_text
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

NVIDIA_VENDOR = "10de"
# PCI base class 0x03 (display controller): subclass 0x00 VGA compatible controller (workstation and consumer
# cards), 0x02 3D controller (data-center cards without a display engine, the L20 among them). NVIDIA's audio
# (0x0403), USB (0x0c03) and NVSwitch bridge (0x0680) functions are not GPUs.
GPU_CLASSES = ("0300", "0302")

# Device ids -> product, only those an inventory names. From the PCI ID Repository as Debian ships it:
# /usr/share/misc/pci.ids of Debian's package pci.ids 0.0~2025.06.09-1 (trixie; "Version: 2025.06.09"),
# under line 10081 "10de  NVIDIA Corporation": line 13386 "26b7  AD102GL [L20]" and line 13389
# "26ba  AD102GL [L20]". (Debian 12's pci.ids 0.0~2023.04.11-1, version 2023.04.10, predates the L20.)
PCI_PRODUCTS = {
    "26b7": "L20",
    "26ba": "L20",
}

# A sysfs attribute is at most one page (the kernel's show() fills a PAGE_SIZE buffer; stat says 4096).
SYSFS_MAX_BYTES = 4096
# More NVIDIA GPUs than any box holds: bounds llmops_gpu_expected.count.
MAX_GPUS = 1024
_HEX_RE = whole(r"(?:0x)?([0-9a-fA-F]+)")
_DEVICE_ID_RE = whole(r"(?:(?:0x)?([0-9a-fA-F]{4})[:.])?(?:0x)?([0-9a-fA-F]{4})")


class PciError(Exception):
    """Bad input to the expectation check, with what to write instead."""


def _read(path):
    """The text of a sysfs attribute, '' when the function has no such file. Anything but a small regular
    UTF-8 file there (a FIFO, a link to /dev/zero, bytes that are not text) is not a kernel attribute:
    PciError naming it (local_read: never blocks, never reads past SYSFS_MAX_BYTES)."""
    try:
        return read_text(path, SYSFS_MAX_BYTES, "the PCI attribute").strip()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return ""
        raise PciError(str(exc)) from None


def _hex(text, width):
    match = _HEX_RE.match(text or "")
    if not match:
        return ""
    return match.group(1).lower().rjust(width, "0")[-width:]


def product_name(device_id):
    """The product of an NVIDIA device id ("26ba" -> "L20"); unknown ids read "NVIDIA 10de:<id>"."""
    return PCI_PRODUCTS.get(device_id, "NVIDIA %s:%s" % (NVIDIA_VENDOR, device_id))


def bound_driver(device_dir):
    """Name of the driver bound to a PCI function (the basename of its ``driver`` link), '' when none.

    A link that no longer resolves counts as no driver: the kernel removes the link with the binding, and a
    test tree may point it at a stand-in module that a reboot removed."""
    link = os.path.join(device_dir, "driver")
    if not os.path.exists(link):
        return ""
    return os.path.basename(os.path.realpath(link))


def read_pci_gpus(sysfs_root="/sys"):
    """The NVIDIA GPUs under <sysfs_root>/bus/pci/devices, by PCI address.

    Each: address, vendor_id, device_id (4 lowercase hex digits), class_id ("0302"), name, driver ('' when
    none is bound). Raises PciError when the directory cannot be listed (no sysfs there)."""
    devices = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(devices))
    except (IOError, OSError) as exc:
        raise PciError("cannot list %s (%s): no PCI bus to read there" % (devices, exc)) from None
    gpus = []
    for address in names:
        path = os.path.join(devices, address)
        vendor = _hex(_read(os.path.join(path, "vendor")), 4)
        klass = _hex(_read(os.path.join(path, "class")), 6)[:4]
        if vendor != NVIDIA_VENDOR or klass not in GPU_CLASSES:
            continue
        device = _hex(_read(os.path.join(path, "device")), 4)
        gpus.append(dict(address=address, vendor_id=vendor, device_id=device, class_id=klass,
                         name=product_name(device), driver=bound_driver(path)))
    return gpus


def _normal_name(name):
    """'NVIDIA L20' (nvidia-smi), 'L20' (pci.ids), 'nvidia l20' -> 'L20'."""
    name = " ".join(str(name).split())
    return re.sub(r"^NVIDIA\s+", "", name, flags=re.I).upper()


def normal_device_id(text):
    """'10de:26ba', '0x26BA', '26ba' -> '26ba'; another vendor's id is refused."""
    match = _DEVICE_ID_RE.match(str(text).strip())
    if not match or (match.group(1) and match.group(1).lower() != NVIDIA_VENDOR):
        raise PciError("device id %r: write an NVIDIA PCI device id as 10de:26ba or 26ba" % (text,))
    return match.group(2).lower()


def normal_expected(expected):
    """Check and normalize the expectation {count, names, device_ids} (any of them); None when empty."""
    if not expected:
        return None
    if not isinstance(expected, dict):
        raise PciError("llmops_gpu_expected must be a mapping such as {count: 4, names: [L20]}, got %r"
                       % (expected,))
    unknown = sorted(set(expected) - set(("count", "names", "device_ids")))
    if unknown:
        raise PciError("llmops_gpu_expected has unknown keys %s: use count, names and device_ids"
                       % ", ".join(unknown))
    count = expected.get("count")
    if count is not None:
        count = _gpu_count(count)
    names = expected.get("names") or []
    ids = expected.get("device_ids") or []
    for key, value in (("names", names), ("device_ids", ids)):
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                  for v in value):
            raise PciError("llmops_gpu_expected.names and .device_ids are lists, e.g. names: [L20] and "
                           "device_ids: ['10de:26ba']; %s is %r" % (key, value))
    return dict(count=count, names=[_normal_name(n) for n in names],
                device_ids=[normal_device_id(i) for i in ids])


def _gpu_count(value):
    """llmops_gpu_expected.count as a whole number from 0 to MAX_GPUS (4, 4.0 or "4"); PciError otherwise."""
    count = None
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, float) and math.isfinite(value) and value == int(value):
        count = int(value)
    elif isinstance(value, str) and re.match(r"\s*[0-9]{1,6}\s*\Z", value):
        count = int(value)
    if count is None or not 0 <= count <= MAX_GPUS:
        raise PciError("llmops_gpu_expected.count must be a number of GPUs (a whole number from 0 to %d), "
                       "got %r" % (MAX_GPUS, value))
    return count


def describe(gpu):
    return "%s %s [%s:%s] (%s)" % (gpu["address"], gpu["name"], gpu["vendor_id"], gpu["device_id"],
                                   "driver " + gpu["driver"] if gpu["driver"] else "no driver bound")


def check_expected(gpus, expected):
    """Failures (sentences) of the PCI GPUs against the normalized expectation; [] when it holds.

    count: exactly that many NVIDIA GPUs; names / device_ids: every GPU is one of them."""
    if not expected:
        return []
    failures = []
    found = "; ".join(describe(g) for g in gpus) or "none"
    wanted = " or ".join(expected["names"] + ["10de:%s" % i for i in expected["device_ids"]])
    if expected["count"] is not None and len(gpus) != expected["count"]:
        failures.append("the inventory expects %d NVIDIA GPU(s)%s (llmops_gpu_expected), the PCI bus shows "
                        "%d: %s" % (expected["count"], " " + wanted if wanted else "", len(gpus), found))
    if wanted:
        others = [g for g in gpus if _normal_name(g["name"]) not in expected["names"]
                  and g["device_id"] not in expected["device_ids"]]
        if others:
            failures.append("%d GPU(s) are not %s (llmops_gpu_expected): %s"
                            % (len(others), wanted, "; ".join(describe(g) for g in others)))
    return failures


def summary(gpus):
    """The fact llmops_pci_gpus: count, the GPUs, their products and which addresses nouveau holds."""
    names = {}
    for gpu in gpus:
        names[gpu["name"]] = names.get(gpu["name"], 0) + 1
    return dict(
        count=len(gpus),
        gpus=gpus,
        names=names,
        nouveau=[g["address"] for g in gpus if g["driver"] == "nouveau"],
        nvidia=[g["address"] for g in gpus if g["driver"] == "nvidia"],
        unbound=[g["address"] for g in gpus if not g["driver"]],
    )


def report(facts):
    """One line for the preflight report."""
    if not facts["count"]:
        return "No NVIDIA GPU on the PCI bus."
    kinds = ", ".join("%dx %s" % (n, name) for name, n in sorted(facts["names"].items()))
    drivers = []
    for key, label in (("nvidia", "nvidia"), ("nouveau", "nouveau"), ("unbound", "no driver")):
        if facts[key]:
            drivers.append("%s on %d" % (label, len(facts[key])))
    return "PCI: %s (%s)." % (kinds, ", ".join(drivers))
