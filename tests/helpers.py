# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers shared by the unit tests that render roles with Ansible's own machinery."""
import os

import yaml

# The checkout root and the test fixtures, wherever a test file sits in tests/.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

# The keys of llmops_gpus that the other roles read (the contract of gpu_facts; DESIGN's fact table).
GPU_FACT_KEYS = frozenset(
    ["present", "count", "driver_version", "cuda_version", "archs", "compute_caps", "homogeneous", "error",
     "gpus"])


def role_templar(role_dir, variables):
    """A Templar rooted at a role, with the collection loader that tests/conftest.py installed."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    loader = DataLoader()
    loader.set_basedir(role_dir)
    return Templar(loader=loader, variables=variables)


def load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def run_local_playbook(play, path_prefix, extra_env=None, extra_args=()):
    """Run a playbook against localhost with the checkout's ansible.cfg and fake tools first on PATH.

    Returns the CompletedProcess and the localhost recap as a dict (ok, changed, failed, ...)."""
    import os
    import subprocess
    import sys

    root = ROOT
    env = dict(os.environ, PATH="%s:%s" % (path_prefix, os.environ["PATH"]), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=os.path.join(root, "ansible.cfg"), **(extra_env or {}))
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    argv = [playbook, "-i", "localhost,"] + list(extra_args) + [str(play)]
    result = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=120, check=False)
    recap = [line for line in result.stdout.splitlines() if line.startswith("localhost") and "ok=" in line]
    stats = dict(item.split("=") for item in recap[-1].split(":", 1)[1].split()) if recap else {}
    return result, {k: int(v) for k, v in stats.items()}


def wait_healthy(proc, url, log_path, timeout=60):
    """Wait until a server process started by a test answers 200 on <url>/health; fail with its log tail when
    it exits or stays unhealthy."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, open(str(log_path)).read()[-3000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "%s not healthy in %d s" % (url, timeout)
        time.sleep(0.3)


def module_doc(module, file_options=True):
    """The module's documentation as ansible-doc and validate-modules read it: its DOCUMENTATION with the doc
    fragments it extends merged in (options, attributes and notes written once in plugins/doc_fragments/).
    file_options=False leaves out the options of ansible.builtin.files, which AnsibleModule adds itself
    (add_file_common_args) rather than the module's argument spec."""
    from ansible.plugins.doc_fragments.files import ModuleDocFragment as Files
    from ansible.plugins.loader import fragment_loader
    from ansible.utils.plugin_docs import get_docstring

    doc = get_docstring(module.__file__, fragment_loader, collection_name="llmops.serving", is_module=True)[0]
    if not file_options and "ansible.builtin.files" in yaml.safe_load(module.DOCUMENTATION).get(
            "extends_documentation_fragment", []):
        for name in yaml.safe_load(Files.DOCUMENTATION)["options"]:
            doc["options"].pop(name)
    return doc


def assert_docs_match_argument_spec(module, spec_kwargs, returns):
    """The module's documentation (module_doc: its fragments merged in) agrees with its argument spec (type,
    default, choices, elements, required), it supports check mode, RETURN documents exactly `returns`, and
    EXAMPLES is YAML. `spec_kwargs`: what the module gave AnsibleModule
    (test_gguf_module.capture_module_kwargs)."""
    doc = module_doc(module, file_options=False)
    spec = spec_kwargs["argument_spec"]
    assert sorted(doc["options"]) == sorted(spec)
    keys = ("type", "default", "choices", "elements")
    for name, opt in doc["options"].items():
        documented = [opt.get(k) for k in keys] + [bool(opt.get("required"))]
        assert documented == [spec[name].get(k) for k in keys] + [bool(spec[name].get("required"))], name
    assert spec_kwargs["supports_check_mode"] is True
    assert set(yaml.safe_load(module.RETURN)) == set(returns)
    yaml.safe_load(module.EXAMPLES)
    return doc


def run_module_file(tmp_path, name, args, check_mode=False, timeout=120):
    """Run plugins/modules/<name>.py as Ansible does (an args file, the checkout's collections on PYTHONPATH)
    and return its JSON result."""
    import json
    import subprocess
    import sys

    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode)}))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "plugins", "modules", name + ".py"), str(path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections")), check=False)
    assert proc.stdout, proc.stderr.decode()
    return json.loads(proc.stdout.decode())


def install_serving_wait(dest, python="python3"):
    """Lay out role serving's health gate under `dest` as its tasks/wait_script.yml does on the node (each
    file and copy task, with the role's vars and _serving_wait_dir = dest) and return the command that runs
    it, as _serving_wait renders it (`python` in place of the node's python3), as an argv list."""
    import shlex
    import shutil

    role = os.path.join(ROOT, "roles", "serving")
    variables = load_yaml(os.path.join(role, "vars", "main.yml"))
    variables.update({"role_path": role, "_serving_wait_dir": str(dest)})
    templar = role_templar(role, variables)
    for task in load_yaml(os.path.join(role, "tasks", "wait_script.yml")):
        if "ansible.builtin.file" in task:
            os.makedirs(templar.template(task["ansible.builtin.file"]["path"]), exist_ok=True)
            continue
        copy = task["ansible.builtin.copy"]
        loop_var = task.get("loop_control", {}).get("loop_var", "item")
        for item in templar.template(task["loop"]) if "loop" in task else [None]:
            templar.available_variables = dict(variables, **{loop_var: item})
            src = templar.template(copy["src"])
            target = templar.template(copy["dest"])
            shutil.copy(os.path.join(role, "files", src) if not os.path.isabs(src) else src, target)
            os.chmod(target, int(copy["mode"], 8))
        templar.available_variables = variables
    argv = shlex.split(templar.template(variables["_serving_wait"]))
    assert argv[0] == "python3", argv
    return [python] + argv[1:]
