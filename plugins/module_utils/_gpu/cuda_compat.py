# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""CUDA's compatibility rules, in one place: can this NVIDIA driver run a program built for CUDA X.Y?

Used on the node by gpu_facts (``require_cuda``, through gpu.py) and on the controller by the serving layer's
instance planner (plugins/plugin_utils/instance_plan.py), which refuses an engine runtime the node's driver
cannot run before any unit changes. Plain Python 3.6, standard library only, importable without Ansible.

The rules, from NVIDIA's CUDA Compatibility guide (https://docs.nvidia.com/deploy/cuda-compatibility/):

* Minor-version compatibility (minor-version-compatibility.html, Table 1 "CUDA Toolkit 11.x, 12.x, and 13.x
  Driver Version Ranges"): from CUDA 11 on, a program built with any toolkit of a major release runs on
  every driver at or above that major family's minimum: CUDA 13.x >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450
  (exact versions below). It runs "with limited feature-set": a driver older than the toolkit cannot
  JIT-compile PTX newer than itself (cudaErrorUnsupportedPtxVersion), so the program must carry machine code
  (SASS) for the GPU. Newer drivers run older programs (backward compatibility).
* Forward compatibility (forward-compatibility.html): a program of a newer major release runs on an older
  driver only with the cuda-compat-<major>-<minor> package's user-mode driver on the library path, and
  "Forward Compatibility is applicable only for systems with NVIDIA Data Center GPUs, select NGC Server Ready
  SKUs of RTX cards, Jetson boards"; the FAQ (frequently-asked-questions.html) limits it to the long-term
  support driver branches, and the data-center driver table (docs.nvidia.com/datacenter/tesla/drivers/615/
  supported-drivers-and-cuda-toolkit-versions.html, Table 2 "CUDA and Drivers") lists R535 as the one branch
  below R580 still supported. A GeForce card under a forward-compatibility package fails with CUDA error 804
  (cudaErrorCompatNotSupportedOnDevice).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.llmops.serving.plugins.module_utils.validators import matches

# Minimum Linux x86_64 driver per CUDA release (the "GA" row of Table 3, "CUDA Toolkit and Corresponding
# Driver Versions", in the NVIDIA CUDA Toolkit release notes): the driver each toolkit ships with. It says
# which CUDA version a driver is (550.54.14 -> 12.4), not which programs it runs: see FAMILY_MIN_DRIVER.
CUDA_MIN_DRIVER = (
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
)

# Minor-version compatibility: the oldest driver that runs programs of every release of a CUDA major
# family (NVIDIA CUDA Compatibility, minor-version-compatibility.html, Table 1: 13.x >= 580, 12.x >= 525,
# 11.x >= 450; the exact versions are the family's first GA driver from the release notes' Table 3, and
# 450.80.02 for 11.x from the note under Table 1).
FAMILY_MIN_DRIVER = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}

# Driver branches below R580 on which NVIDIA still supports a CUDA forward-compatibility package (the
# data-center driver table lists R535 LTSB, R580 LTSB, R595 PB and R610 NFB; only R535 is below the 13.x
# minimum). R550, R560, R570 and R575 are not listed.
FORWARD_COMPAT_BRANCHES = ("R535",)

OK = "ok"
REFUSE = "refuse"
FORWARD_COMPAT = "forward_compat"
UNCHECKED = "unchecked"
DECISIONS = (OK, REFUSE, FORWARD_COMPAT, UNCHECKED)

# GPU classes for forward compatibility, from the product name nvidia-smi prints (upper-cased).
DATACENTER = "datacenter"
WORKSTATION = "workstation"
GEFORCE = "geforce"
UNKNOWN = "unknown"
_GPU_CLASSES = (
    (GEFORCE, r"GEFORCE|\bTITAN\b"),
    (DATACENTER, r"\bTESLA\b|\b(A2|A10G?|A16|A30|A40|A100|A800|H20|H100|H200|H800|GH200|L4|L20|L40S?|"
                 r"B100|B200|GB200|B300|GB300|T4|V100S?|P100|P40|P4)\b"),
    (WORKSTATION, r"\bRTX\b|\bQUADRO\b"),
)


# --------------------------------------------------------------------------- versions

def version_tuple(text):
    """'550.54.14' -> (550, 54, 14); '12.4' -> (12, 4). Raises ValueError on anything else."""
    text = str(text).strip()
    if not matches(r"[0-9]+(\.[0-9]+)*", text):
        raise ValueError("not a version: %r" % (text,))
    return tuple(int(p) for p in text.split("."))


def compare_versions(a, b):
    """-1, 0 or 1, comparing dotted versions numerically (missing parts count as 0)."""
    ta, tb = list(version_tuple(a)), list(version_tuple(b))
    n = max(len(ta), len(tb))
    ta += [0] * (n - len(ta))
    tb += [0] * (n - len(tb))
    return (ta > tb) - (ta < tb)


def driver_branch(version):
    """'550.54.14' -> 'R550'."""
    return "R%d" % version_tuple(version)[0]


def cuda_release(version):
    """'12.9.1' / '12.9' / '13' -> '12.9' / '12.9' / '13.0' (major.minor, what the rules look at)."""
    parts = version_tuple(version) + (0,)
    return "%d.%d" % parts[:2]


def min_driver_for_cuda(cuda):
    """Driver a CUDA release ships with ('12.4' -> '550.54.14'), or None if not in the table."""
    key = version_tuple(cuda_release(cuda))
    for release, driver in CUDA_MIN_DRIVER:
        if version_tuple(release) == key:
            return driver
    return None


def max_cuda_for_driver(driver):
    """The newest CUDA release in the table whose toolkit driver this driver is ('535.161.08' -> '12.2')."""
    best = None
    for release, minimum in CUDA_MIN_DRIVER:
        if compare_versions(driver, minimum) >= 0:
            best = release
    return best


def minimum_driver(cuda):
    """The oldest driver that runs a program built with CUDA `cuda` (minor-version compatibility), or None
    for a major release the table does not know."""
    return FAMILY_MIN_DRIVER.get(version_tuple(cuda_release(cuda))[0])


# --------------------------------------------------------------------------- facts about runtimes and GPUs

def cuda_from_image_env(env):
    """The CUDA release an image was built on, from its Config.Env (a list of NAME=value, or a dict):
    CUDA_VERSION (the nvidia/cuda base images set it, '13.0.2'), else NVIDIA_REQUIRE_CUDA ('cuda>=12.9
    brand=...'). None when the image says neither (a CPU image, or one not built on nvidia/cuda)."""
    if isinstance(env, dict):
        pairs = dict((str(k), str(v)) for k, v in env.items())
    else:
        pairs = {}
        for item in env or ():
            name, sep, value = str(item).partition("=")
            if sep:
                pairs[name] = value
    value = pairs.get("CUDA_VERSION", "").strip()
    if re.match(r"^[0-9]+\.[0-9]+", value):
        return cuda_release(re.match(r"^[0-9]+(\.[0-9]+)*", value).group(0))
    match = re.search(r"\bcuda>=([0-9]+\.[0-9]+)", pairs.get("NVIDIA_REQUIRE_CUDA", ""))
    return cuda_release(match.group(1)) if match else None


def cuda_from_nvcc(text):
    """'Cuda compilation tools, release 12.4, V12.4.131' (nvcc --version) -> '12.4'; None if absent."""
    match = re.search(r"release ([0-9]+\.[0-9]+)", text or "")
    return cuda_release(match.group(1)) if match else None


def gpu_class(name):
    """datacenter / workstation / geforce / unknown, from the product name (forward compatibility)."""
    upper = str(name or "").upper()
    for kind, pattern in _GPU_CLASSES:
        if re.search(pattern, upper):
            return kind
    return UNKNOWN


# --------------------------------------------------------------------------- the decision

def _forward_compat_findings(cuda, driver, gpu_names):
    """Why NVIDIA would not support forward compatibility here: a list of sentences (empty: supported)."""
    findings = []
    branch = driver_branch(driver)
    if branch not in FORWARD_COMPAT_BRANCHES:
        findings.append("NVIDIA supports forward compatibility only on the driver branches it lists (%s), "
                        "not %s" % (", ".join(FORWARD_COMPAT_BRANCHES), branch))
    names = sorted(set(str(n) for n in gpu_names or () if n))
    by_class = {}
    for name in names:
        by_class.setdefault(gpu_class(name), []).append(name)
    if by_class.get(GEFORCE):
        findings.append("NVIDIA does not support forward compatibility on GeForce cards (%s): CUDA fails "
                        "with error 804 (cudaErrorCompatNotSupportedOnDevice)" % ", ".join(by_class[GEFORCE]))
    if by_class.get(WORKSTATION):
        findings.append("NVIDIA supports forward compatibility only on select NGC Server Ready SKUs of RTX "
                        "cards (%s: check yours)" % ", ".join(by_class[WORKSTATION]))
    if by_class.get(UNKNOWN) or not names:
        unknown = ", ".join(by_class.get(UNKNOWN, [])) or "unknown"
        findings.append("the GPU (%s) is not one this check knows as a data-center GPU, the only kind NVIDIA "
                        "supports forward compatibility on" % unknown)
    return findings


def _driver_text(driver):
    own = max_cuda_for_driver(driver)
    return "%s (%s%s)" % (driver, driver_branch(driver), ", CUDA %s" % own if own else "")


def decide(cuda, driver, gpu_names=(), forward_compat=False, ways_out=(), what="the runtime"):
    """Can driver `driver` run `what`, a program built for CUDA `cuda`, on GPUs `gpu_names`?

    Returns {"decision": ok|refuse|forward_compat|unchecked, "runtime_cuda", "driver", "minimum_driver",
    "message", "warnings"}. `forward_compat` is the explicit opt-in to CUDA forward compatibility (it turns a
    refusal into forward_compat, with a warning for each reason NVIDIA would not support it); `ways_out` are
    the engine's own ways round a refusal (another build of the same release, an older release), listed
    before the generic ones. A runtime or driver that is not known is never guessed: unchecked."""
    result = {"decision": UNCHECKED, "runtime_cuda": None, "driver": driver or None, "minimum_driver": None,
              "message": "", "warnings": []}
    if not cuda:
        result["message"] = ("%s does not say which CUDA it was built for (a CPU build, or a runtime that "
                             "publishes no CUDA version): the driver is not checked" % what)
        return result
    release = cuda_release(cuda)
    result["runtime_cuda"] = release
    minimum = minimum_driver(release)
    result["minimum_driver"] = minimum
    if not driver:
        result["message"] = ("the node's NVIDIA driver is not known (no llmops_gpus from gpu_facts): CUDA %s "
                             "of %s is not checked" % (release, what))
        return result
    version_tuple(driver)
    if minimum is None:
        known = ", ".join("%d.x" % m for m in sorted(FAMILY_MIN_DRIVER))
        result["message"] = ("CUDA %s of %s is a major release this check does not know (known: %s): not "
                             "checked" % (release, what, known))
        result["warnings"].append(result["message"])
        return result
    major = version_tuple(release)[0]
    if compare_versions(driver, minimum) >= 0:
        result["decision"] = OK
        own = max_cuda_for_driver(driver)
        text = ("CUDA %s of %s runs on driver %s: CUDA %d.x needs >= %s"
                % (release, what, _driver_text(driver), major, minimum))
        if own and compare_versions(own, release) < 0:
            text += ("; through minor-version compatibility: the GPU code must be prebuilt for the GPU "
                     "(SASS), as PTX newer than CUDA %s cannot be JIT-compiled by this driver" % own)
        result["message"] = text
        return result
    fc_findings = _forward_compat_findings(release, driver, gpu_names)
    package = "cuda-compat-%s" % release.replace(".", "-")
    if forward_compat:
        result["decision"] = FORWARD_COMPAT
        result["message"] = ("CUDA %s of %s on driver %s through CUDA forward compatibility (opted in): the "
                             "%s package's libcuda must come first on the library path (NVIDIA's CUDA "
                             "images install it in /usr/local/cuda-%s/compat)"
                             % (release, what, _driver_text(driver), package, release))
        result["warnings"] = ["forward compatibility for CUDA %s on driver %s: %s"
                              % (release, driver, finding) for finding in fc_findings]
        return result
    result["decision"] = REFUSE
    ways = list(ways_out or ())
    ways.append("install NVIDIA driver >= %s (%s or newer) and reboot" % (minimum, driver_branch(minimum)))
    if fc_findings:
        ways.append("opt in to CUDA forward compatibility (%s), which NVIDIA does not support here: %s"
                    % (package, "; ".join(fc_findings)))
    else:
        ways.append("opt in to CUDA forward compatibility (%s; NVIDIA supports it on this GPU and branch)"
                    % package)
    result["message"] = ("CUDA %s of %s needs NVIDIA driver >= %s (%s or newer: CUDA %d.x minor-version "
                         "compatibility starts there), but the node has %s. Ways out: %s"
                         % (release, what, minimum, driver_branch(minimum), major, _driver_text(driver),
                            " ".join("(%d) %s." % (i + 1, way) for i, way in enumerate(ways))))
    return result
