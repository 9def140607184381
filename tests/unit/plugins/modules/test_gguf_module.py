# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gguf_info module through Ansible: documentation matches the argument spec, results, sha256 check
with model_download's sidecar record (read, never written), check mode, clean failures."""
import hashlib
import json
import os
import subprocess
import sys

import yaml
from ansible_collections.llmops.serving.plugins.modules import gguf_info

from tests.fixtures.gguf.builder import tiny_qwen35
from tests.helpers import ROOT, module_doc  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)


def capture_module_kwargs(module):
    """The keyword arguments a module's main() gives AnsibleModule, captured without running the module."""
    captured = {}

    class Stop(Exception):
        pass

    class Fake(object):
        def __init__(self, **kwargs):
            captured.update(kwargs)
            raise Stop()

    real = module.AnsibleModule
    module.AnsibleModule = Fake
    try:
        module.main()
    except Stop:
        pass
    finally:
        module.AnsibleModule = real
    return captured


def _spec():
    """The argument spec gguf_info's main() builds."""
    return capture_module_kwargs(gguf_info)["argument_spec"]


def test_documentation_matches_argument_spec():
    doc = module_doc(gguf_info)
    spec = _spec()
    assert sorted(doc["options"]) == sorted(spec)
    for name, opt in doc["options"].items():
        assert opt["type"] == spec[name]["type"], name
        assert opt.get("default") == spec[name].get("default"), name
        assert bool(opt.get("required")) == bool(spec[name].get("required")), name
        for sub, subopt in opt.get("suboptions", {}).items():
            assert subopt["type"] == spec[name]["options"][sub]["type"]
            assert subopt.get("default") == spec[name]["options"][sub].get("default"), sub
    limits = spec["limits"]["options"]
    from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf
    assert dict((k, v["default"]) for k, v in limits.items()) == gguf.DEFAULT_LIMITS
    ret = yaml.safe_load(gguf_info.RETURN)
    info = gguf.inspect(_seed_file())
    assert set(info) <= set(ret)
    yaml.safe_load(gguf_info.EXAMPLES)


def _seed_file(directory="/tmp"):
    path = os.path.join(directory, "gguf-module-seed-%d.gguf" % os.getpid())
    with open(path, "wb") as f:
        f.write(tiny_qwen35().build().data)
    return path


PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Describe
      llmops.serving.gguf_info:
        path: "{{ model }}"
        compute_sha256: true
      register: first
    - name: Again, a file model_download verified and recorded
      llmops.serving.gguf_info:
        path: "{{ recorded }}"
        sha256: "sha256:{{ digest | upper }}"
      register: second
    - name: Wrong digest
      llmops.serving.gguf_info:
        path: "{{ model }}"
        sha256: "{{ '0' * 64 }}"
      register: wrong
      ignore_errors: true
    - name: Truncated
      llmops.serving.gguf_info:
        path: "{{ truncated }}"
      register: trunc
      ignore_errors: true
    - name: Check mode writes nothing either
      llmops.serving.gguf_info:
        path: "{{ other }}"
        compute_sha256: true
      check_mode: true
      register: checked
    - name: Save
      ansible.builtin.copy:
        content: "{{ {'first': first, 'second': second, 'wrong': wrong, 'trunc': trunc,
                      'checked': checked} | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
"""


def test_module_through_ansible(tmp_path):
    model = _seed_file(str(tmp_path))
    with open(model, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    truncated = str(tmp_path / "truncated.gguf")
    with open(truncated, "wb") as f:
        f.write(data[:-200])
    other = str(tmp_path / "other.gguf")
    with open(other, "wb") as f:
        f.write(data)
    recorded = str(tmp_path / "recorded.gguf")
    with open(recorded, "wb") as f:
        f.write(data)
    from ansible_collections.llmops.serving.plugins.module_utils._download import sidecar as model_sidecar
    model_sidecar.write_sidecar_record(recorded, digest, commit="c" * 40)  # what model_download leaves
    with open(model_sidecar.sidecar_path(recorded), "rb") as f:
        record = f.read()
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = str(tmp_path / "out.json")
    extra = json.dumps({"model": model, "digest": digest, "truncated": truncated, "other": other,
                        "recorded": recorded, "out": out,
                        "ansible_python_interpreter": sys.executable})
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-e", extra,
                           str(tmp_path / "play.yml")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    with open(out) as f:
        r = json.load(f)
    first, second = r["first"], r["second"]
    assert first["architecture"] == "qwen35" and first["nextn_predict_layers"] == 1
    assert first["layer_types"] == ["recurrent", "recurrent", "recurrent", "attention", "nextn"]
    assert first["sha256"] == digest and first["sha256_cached"] is False and first["verified"] is False
    assert first["changed"] is False
    assert second["sha256_cached"] is True and second["verified"] is True  # the record spares the hashing
    assert second["changed"] is False
    assert r["wrong"]["failed"] and "sha256 mismatch" in r["wrong"]["msg"] and digest in r["wrong"]["msg"]
    assert r["trunc"]["failed"] and "truncated" in r["trunc"]["msg"] and r["trunc"]["offset"] > 0
    assert r["checked"]["sha256"] == digest
    # an _info module writes nothing: no record for the files it hashed, the download's record untouched
    assert not os.path.exists(str(tmp_path / ".other.gguf.llmops.json"))
    assert not os.path.exists(str(tmp_path / (".%s.llmops.json" % os.path.basename(model))))
    with open(model_sidecar.sidecar_path(recorded), "rb") as f:
        assert f.read() == record
