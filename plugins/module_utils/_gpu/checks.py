# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""GPU checks for llmops.serving.gpu_facts: the GPUs nvidia-smi listed (smi.py) against what a run requires.

Which GPUs a run selects (by index or UUID), and whether each has the compute capability, memory, driver and
CUDA the run asks for. Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.llmops.serving.plugins.module_utils._gpu.cuda_compat import (
    FAMILY_MIN_DRIVER,
    compare_versions,
    cuda_release,
    driver_branch,
    max_cuda_for_driver,
    minimum_driver,
    version_tuple,
)
from ansible_collections.llmops.serving.plugins.module_utils._gpu.names import matches_gpu
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches


def _describe(gpu):
    return "GPU %d (%s, %s)" % (gpu["index"], gpu["name"], gpu["uuid"])


def parse_arch_requirement(spec):
    """'8.9' -> ('==', (8, 9)); '>=8.0' -> ('>=', (8, 0)); 'sm_89'/'89' -> ('==', (8, 9))."""
    raw = str(spec).strip()
    op = "=="
    text = raw
    if text.startswith(">="):
        op, text = ">=", text[2:].strip()
    text = text.lower()
    if text.startswith("sm_"):
        text = text[3:]
    if matches(r"[0-9]+\.[0-9]+", text):
        cap = version_tuple(text)
    elif matches(r"[0-9]{2,3}", text):
        cap = (int(text[:-1]), int(text[-1]))
    else:
        raise ValueError("require_arch entry %r is not a compute capability: use '8.9' (exact), "
                         "'>=8.0' (minimum) or 'sm_89'" % (raw,))
    return op, cap


def _cap_text(cap):
    return "%d.%d" % cap


def is_wanted(gpu, devices):
    """Whether the checks apply to this GPU (or faulty_entry()): every GPU when `devices` is empty."""
    return not devices or any(matches_gpu(dev, gpu) for dev in devices)


def select_devices(gpus, devices, faulty=()):
    """Resolve `devices` (indices or UUIDs) to GPU dicts. Returns (selected, errors). A device that is one of
    the `faulty` GPUs is not "not found": the caller reports it as faulty."""
    if not devices:
        return list(gpus), []
    selected, errors = [], []
    known = ", ".join("%d (%s, %s)" % (g["index"], g["name"], g["uuid"]) for g in gpus) or "none"
    for dev in devices:
        key = str(dev).strip()
        match = None
        for g in gpus:
            if matches_gpu(key, g):
                match = g
                break
        if match is None and any(matches_gpu(key, f) for f in faulty):
            continue
        if match is None:
            errors.append("device %r not found on this host; GPUs present: %s. Fix `devices` "
                          "(GPU indices or UUIDs from nvidia-smi -L)." % (key, known))
        elif match not in selected:
            selected.append(match)
    return selected, errors


def faulty_warnings(faulty, devices):
    """Messages for the faulty GPUs the checks do not apply to (not in `devices`): warnings, not failures."""
    return ["%s (not in devices, so no check fails on it)" % f["error"] for f in faulty or ()
            if not is_wanted(f, devices)]


def evaluate(facts, require_arch=None, min_driver_version=None, require_cuda=None,
             min_memory_mib=None, min_free_memory_mib=None, devices=None, faulty=None, node_error=None):
    """Check the facts against the requirements. Returns (selected_gpus, failures).

    Every failure names the GPU, what was found, what was wanted and how to fix it. With `faulty` and
    `node_error` from collect_all(), a GPU in a bad state fails the checks only when it is wanted (in
    `devices`, or `devices` is empty), naming it and how to reset it; one outside `devices` is left to
    faulty_warnings(). Without them, any facts['error'] fails the checks (a node with a broken GPU).
    """
    failures = []
    checks_wanted = bool(require_arch or min_driver_version or require_cuda or min_memory_mib is not None
                         or min_free_memory_mib is not None or devices)
    try:
        arch_specs = [parse_arch_requirement(s) for s in (require_arch or [])]
        if min_driver_version:
            version_tuple(min_driver_version)
        if require_cuda:
            version_tuple(require_cuda)
    except ValueError as exc:
        return [], [str(exc).replace("not a version", "invalid version")]

    if not facts["present"] and not faulty:
        if checks_wanted:
            failures.append("no usable NVIDIA GPU to check: %s" % (facts["error"] or "none found"))
        return [], failures

    if faulty is None:
        host_error = facts["error"]
    else:
        host_error = node_error
    if host_error and checks_wanted:
        # Some GPUs answered but not all (one fell off the bus, or a later call hung): do not pass a check
        # on a node with a broken GPU.
        failures.append("not every GPU is healthy: %s" % host_error)
    if checks_wanted:
        for f in faulty or ():
            if is_wanted(f, devices):
                failures.append(f["error"])

    selected, errors = select_devices(facts["gpus"], devices, faulty or ())
    failures.extend(errors)

    for gpu in selected:
        if arch_specs:
            cap = gpu["compute_cap"]
            wanted = " or ".join((">=" if op == ">=" else "") + _cap_text(c) for op, c in arch_specs)
            if not cap:
                failures.append(
                    "%s: compute capability unknown (the driver does not report it and the product is not in "
                    "the built-in table); wanted %s. Upgrade the driver to >= 510 so nvidia-smi reports "
                    "compute_cap, or drop require_arch." % (_describe(gpu), wanted))
            else:
                have = version_tuple(cap)[:2]
                ok = any((have == c) if op == "==" else (have >= c) for op, c in arch_specs)
                if not ok:
                    failures.append(
                        "%s: compute capability %s (sm_%s) found, %s wanted. Run on GPUs with compute "
                        "capability %s, or change require_arch (and the CUDA architectures the engine is "
                        "built for)." % (_describe(gpu), cap, gpu["cuda_arch"], wanted, wanted))
        driver = gpu["driver_version"] or facts["driver_version"]
        if min_driver_version:
            if not driver or compare_versions(driver, min_driver_version) < 0:
                failures.append(
                    "%s: driver %s found, >= %s wanted. Install NVIDIA driver >= %s (%s or newer) and reboot."
                    % (_describe(gpu), driver or "unknown", min_driver_version, min_driver_version,
                       driver_branch(min_driver_version)))
        if require_cuda:
            failure = _check_cuda(gpu, driver, facts["cuda_version"], require_cuda)
            if failure:
                failures.append(failure)
        memory_checks = (
            ("memory_total_mib", "memory", min_memory_mib,
             ". Use GPUs with more memory, spread the model over more GPUs, or pick a smaller "
             "model/quantisation."),
            ("memory_free_mib", "free memory", min_free_memory_mib,
             " (%s MiB used). Stop the processes using this GPU (nvidia-smi --query-compute-apps=pid,"
             "process_name,used_memory --format=csv -i %d) or choose another device."
             % (gpu["memory_used_mib"], gpu["index"])),
        )
        for field, what, minimum, advice in memory_checks:
            failure = _check_memory(gpu, field, what, minimum, advice)
            if failure:
                failures.append(failure)
    return selected, failures


def _check_memory(gpu, field, what, minimum, advice):
    """The failure when gpu[field] (MiB) is unknown or below minimum; None when it passes or is not asked."""
    if minimum is None:
        return None
    have = gpu[field]
    if have is not None and have >= minimum:
        return None
    return "%s: %s MiB %s found, >= %d MiB wanted%s" % (
        _describe(gpu), have if have is not None else "unknown", what, minimum, advice)


def _check_cuda(gpu, driver, reported_cuda, require_cuda):
    """CUDA's compatibility rules (cuda_compat): a program built with CUDA X.Y runs on every driver at or
    above its major family's minimum (12.x: 525.60.13, 13.x: 580.65.06), not only on X.Y's own driver."""
    minimum = minimum_driver(require_cuda)
    if minimum is not None:
        if driver and compare_versions(driver, minimum) >= 0:
            return None
        supports = max_cuda_for_driver(driver) if driver else None
        return ("%s: driver %s found (supports CUDA %s), CUDA %s wanted. Install driver >= %s (%s or newer) "
                "and reboot; programs built with CUDA %d.x run on any driver from %s on (CUDA minor-version "
                "compatibility)."
                % (_describe(gpu), driver or "unknown", supports or reported_cuda or "unknown", require_cuda,
                   minimum, driver_branch(minimum), version_tuple(cuda_release(require_cuda))[0], minimum))
    if reported_cuda and version_tuple(cuda_release(reported_cuda))[0] >= version_tuple(cuda_release(
            require_cuda))[0]:
        return None
    known = ", ".join("%d.x" % major for major in sorted(FAMILY_MIN_DRIVER))
    if reported_cuda:
        return ("%s: driver %s supports CUDA %s, CUDA %s wanted. Install a newer NVIDIA driver "
                "(CUDA %s is not a major release the built-in rules know: %s)."
                % (_describe(gpu), driver or "unknown", reported_cuda, require_cuda, require_cuda, known))
    return ("%s: cannot tell whether driver %s supports CUDA %s: nvidia-smi did not report a CUDA version "
            "and %s is not a major release the built-in rules know (%s)."
            % (_describe(gpu), driver or "unknown", require_cuda, require_cuda, known))
