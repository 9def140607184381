# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The llm_benchmark module through Ansible against the fake OpenAI server: documentation matches the argument
spec, the key from each source works and never shows (not even at -vvv), failed requests fail the task
with the figures kept, a benchmark that cannot start fails with a message, check mode still measures."""
import json
import os
import subprocess
import sys

import pytest
import yaml
from ansible_collections.llmops.serving.plugins.modules import llm_benchmark

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT
from tests.unit.plugins.modules import test_python36_managed_node as py36
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs

py36path = py36.py36path  # the fixture: Ansible's and the collection's module_utils for Python 3.6

VENV_BIN = os.path.dirname(sys.executable)
KEY = "sk-module-test-key-5678"


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(llm_benchmark.DOCUMENTATION)
    kwargs = capture_module_kwargs(llm_benchmark)
    spec = kwargs["argument_spec"]
    assert sorted(doc["options"]) == sorted(spec)
    for name, opt in doc["options"].items():
        assert opt["type"] == spec[name]["type"], name
        assert opt.get("default") == spec[name].get("default"), name
        assert opt.get("choices") == spec[name].get("choices"), name
        assert bool(opt.get("required")) == bool(spec[name].get("required")), name
        for sub, subopt in opt.get("suboptions", {}).items():
            assert subopt["type"] == spec[name]["options"][sub]["type"], sub
            assert bool(subopt.get("required")) == bool(spec[name]["options"][sub].get("required")), sub
    assert spec["api_key"]["no_log"] is True and kwargs["supports_check_mode"] is True
    # the names the validate role reads are documented
    ret = yaml.safe_load(llm_benchmark.RETURN)
    assert {"url", "engine", "model", "runs", "summary", "errors", "failed"} <= set(ret)
    yaml.safe_load(llm_benchmark.EXAMPLES)


PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    small_run: [{prompt_tokens: 40, max_tokens: 11, concurrency: 2, requests: 2}]
  tasks:
    - name: Key given directly
      llmops.serving.llm_benchmark:
        url: "{{ url }}"
        api_key: "{{ key }}"
        runs: "{{ small_run }}"
      register: direct
    - name: Key from llama-server's key file, in check mode
      llmops.serving.llm_benchmark:
        url: "{{ url }}"
        api_key_file: "{{ key_file }}"
        runs: "{{ small_run }}"
      check_mode: true
      register: from_file
    - name: Key from a vLLM unit's environment file, default runs
      llmops.serving.llm_benchmark:
        url: "{{ url }}"
        engine: vllm
        env_file: "{{ env_file }}"
        warmup_requests: 0
        runs: [{prompt_tokens: 30, max_tokens: 3}]
      register: from_env
    - name: A wrong key cannot start
      llmops.serving.llm_benchmark:
        url: "{{ url }}"
        api_key: "{{ key }}-wrong"
      register: wrong
      ignore_errors: true
    - name: Save
      ansible.builtin.copy:
        content: "{{ {'direct': direct, 'from_file': from_file, 'from_env': from_env,
                      'wrong': wrong} | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
"""

FAILING = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Every second completion fails
      llmops.serving.llm_benchmark:
        url: "{{ url }}"
        api_key: "{{ key }}"
        runs: [{prompt_tokens: 30, max_tokens: 3, requests: 4}]
      register: flaky
      failed_when: false
    - name: Save
      ansible.builtin.copy:
        content: "{{ flaky | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
"""


def _play(tmp_path, text, variables, verbose=False):
    (tmp_path / "play.yml").write_text(text)
    variables = dict(variables, ansible_python_interpreter=sys.executable, out=str(tmp_path / "out.json"))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(variables)]
    proc = subprocess.run(argv + (["-vvv"] if verbose else []) + [str(tmp_path / "play.yml")], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    with open(variables["out"]) as handle:
        return proc.stdout, json.load(handle)


def test_module_through_ansible(tmp_path):
    key_file = tmp_path / "api.key"
    key_file.write_text("# key\n%s\n" % KEY)
    env_file = tmp_path / "vllm.env"
    env_file.write_text('HF_HOME=/srv/hf\nVLLM_API_KEY="%s"\n' % KEY)
    with FakeOpenAI(api_key=KEY, decode_tps=1000.0, prefill_tps=1e6) as fake:
        stdout, r = _play(tmp_path, PLAYBOOK, {"url": fake.url, "key": KEY, "key_file": str(key_file),
                                               "env_file": str(env_file)}, verbose=True)
    assert KEY not in stdout and KEY not in json.dumps(r)
    for name in ("direct", "from_file", "from_env"):
        result = r[name]
        assert result["changed"] is False and result["failed"] is False and result["errors"] == 0, name
        assert result["model"] == "fake-model" and result["runs"][0]["ok"] == result["runs"][0]["requests"]
        assert result["summary"]["decode_tps"] > 0
    assert r["direct"]["runs"][0]["completion_tokens"] == 11 and r["direct"]["runs"][0]["concurrency"] == 2
    assert r["from_env"]["engine"] == "vllm"
    assert r["wrong"]["failed"] and "HTTP 401: Invalid API Key" in r["wrong"]["msg"]


def test_failed_requests_fail_the_task_with_figures_kept(tmp_path):
    with FakeOpenAI(api_key=KEY, fail_every=2, decode_tps=1000.0, prefill_tps=1e6) as fake:
        stdout, flaky = _play(tmp_path, FAILING, {"url": fake.url, "key": KEY})
    # completions 1, 3 calibrate (2 failed, retried); the run is 4..7: 4 and 6 fail
    assert flaky["errors"] == 2 and flaky["runs"][0]["ok"] == 2
    assert flaky["msg"].startswith("2 benchmark requests failed: HTTP 503: fake failure")
    assert KEY not in stdout and KEY not in json.dumps(flaky)


@pytest.mark.skipif(not os.path.exists(py36.PY36), reason="no Python 3.6 interpreter at %s" % py36.PY36)
def test_runs_under_python36(tmp_path, py36path):
    """CentOS 7's python3 is 3.6: the module runs there, threads, streaming and all."""
    # The rate is timing on a shared machine (CI runs this beside a compile, and a 3.6 interpreter starts per
    # run): the best of three runs must be within 15% of the fake's pace. A wrong token count or clock is off
    # in every run (e.g. 100 or 400 tok/s always); a descheduled client is late now and then.
    rates = []
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        with FakeOpenAI(api_key=KEY, decode_tps=200.0, prefill_tps=1e6) as fake:
            result = py36.run36(tmp_path / str(attempt), py36path, "llm_benchmark", {
                "url": fake.url, "api_key": KEY,
                "runs": [{"prompt_tokens": 40, "max_tokens": 21, "concurrency": 2, "requests": 2}]})
        assert not result.get("failed"), result
        run = result["runs"][0]
        assert run["ok"] == 2 and fake.max_in_flight == 2 and KEY not in json.dumps(result)
        rates.append(run["decode_tps"])
        if run["decode_tps"] == pytest.approx(200.0, rel=0.15):
            break
    assert min(rates, key=lambda rate: abs(rate - 200.0)) == pytest.approx(200.0, rel=0.15), rates
