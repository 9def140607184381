# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Print the CUDA release the torch of this interpreter was built for, as JSON, without importing torch.

Role vllm runs it with the virtualenv's python (ansible.builtin.script) and publishes the answer as
llmops_vllm.cuda_version / cuda_source; the serving plan checks it against the node's driver. Importing
torch would load the CUDA libraries (and take seconds); instead, in this order:

1. torch/version.py read with `ast`: the `cuda = '13.0'` that torch's build writes (torch.version.cuda);
2. torch's own METADATA: a local version such as 2.14.0+cu126, else its Requires-Dist pins of the CUDA
   runtime (cuda-toolkit[...]==13.0.3 in torch 2.14.0, nvidia-cuda-runtime-cu12==12.8.90 in cu12 builds).

Output: {"torch": "2.14.0" or null, "cuda": "13.0" or null, "source": "..." or null}. null when torch is not
installed or says nothing (a CPU build: torch.version.cuda is None): never guessed.
"""
import ast
import json
import os
import re
import sys

# cuda-toolkit[cudart,...]==13.0.3 (torch 2.14.0), nvidia-cuda-runtime-cu12==12.8.90 (cu12 builds)
RUNTIME_PIN = re.compile(r"^(cuda-toolkit|nvidia-cuda-runtime(?:-cu[0-9]+)?)(\[[^\]]*\])?\s*==\s*([0-9.]+)")


def version_py_cuda(path):
    """The string assigned to `cuda` in torch/version.py, or None (None assigned, or no such file)."""
    try:
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
    except (IOError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "cuda" for t in targets):
            value = node.value
            text = getattr(value, "value", getattr(value, "s", None))
            return text if isinstance(text, str) and text else None
    return None


def release(text):
    parts = re.findall(r"[0-9]+", text)[:2]
    return "%s.%s" % (parts[0], parts[1] if len(parts) > 1 else "0") if parts else None


def metadata_cuda(version, requires):
    """(cuda, source) from torch's version (2.14.0+cu126) and Requires-Dist lines, or (None, None)."""
    match = re.search(r"\+cu([0-9]+)([0-9])\Z", version or "")
    if match:
        return "%s.%s" % (match.group(1), match.group(2)), "torch local version %s" % version
    for line in requires or ():
        line = line.split(";", 1)[0].strip()
        match = RUNTIME_PIN.match(line)
        if match:
            return release(match.group(3)), "torch Requires-Dist %s" % line
    return None, None


def probe(path=None):
    """The JSON-able answer for the interpreter's import path (or `path`, a list of directories)."""
    import importlib.util
    answer = {"torch": None, "cuda": None, "source": None}
    search = path if path is not None else sys.path
    spec = None
    for directory in search:
        candidate = os.path.join(directory, "torch", "__init__.py")
        if os.path.isfile(candidate):
            spec = candidate
            break
    if spec is None and path is None:
        found = importlib.util.find_spec("torch")      # locates the package; does not import it
        spec = found.origin if found is not None else None
    try:
        from importlib import metadata  # novermin (guarded: Python < 3.8 reads version.py only)
    except ImportError:             # Python < 3.8: no metadata reader; version.py only
        metadata = None
    version, requires = None, None
    if metadata is not None:
        try:
            dist = metadata.distribution("torch") if path is None else next(
                iter(metadata.distributions(name="torch", path=list(search))), None)
            if dist is not None:
                version, requires = dist.version, dist.requires
        except Exception:  # noqa: BLE001 - no torch distribution, or unreadable metadata
            pass
    answer["torch"] = version.split("+", 1)[0] if version else None
    if spec:
        cuda = version_py_cuda(os.path.join(os.path.dirname(spec), "version.py"))
        if cuda:
            answer["cuda"], answer["source"] = release(cuda), "torch/version.py cuda = %r" % cuda
            return answer
    answer["cuda"], answer["source"] = metadata_cuda(version, requires)
    return answer


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1:] or None), sort_keys=True))
