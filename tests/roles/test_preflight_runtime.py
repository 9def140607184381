# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 35, point 2: with the L20 inventory's vLLM instance on, preflight compares the vLLM runtime the
build stage would install (CUDA 13.0 for the pinned 0.33.0) with the driver the node runs after the GPU host
stage, before any pull or download. On R550 the vLLM instance is left out of the run (the build stage pulls
no image for it, the models stage does not fetch its ~30 GB snapshot, the serve stage deploys no unit for it)
while the llama.cpp instance goes on, and the run fails at its end naming it with the ways out; on R580 both
go on.

The preflight's own tasks (as playbooks/preflight.yml has them: role vllm's `planned` entry point, role
serving's `runtime_check`), then what the later stages read (build.yml's engines, model_models, the serve
stage's instances, the disk check's engines), then playbooks/refused.yml's play, run here for real on the
L20 inventory's variables."""

import json
import os
import sys

import pytest
import yaml
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan

from tests.helpers import ROOT, load_yaml, role_templar, run_local_playbook
from tests.roles.test_inventory_l20 import INVENTORY, L20_GPUS

PREFLIGHT = os.path.join(ROOT, "playbooks", "preflight.yml")
BUILD = os.path.join(ROOT, "playbooks", "build.yml")
REFUSED = os.path.join(ROOT, "playbooks", "refused.yml")
SERVING_VARS = os.path.join(ROOT, "roles", "serving", "vars", "main.yml")
RUNTIME_TASKS = ("Read which vLLM the build stage will install and the CUDA it is built for "
                 "(nothing is pulled)",
                 "Leave out the instances whose engine runtime the node's driver cannot run (CUDA's rules)",
                 "Leave the models only the refused instances serve out of this run (no download)")


def l20_inventory(**overrides):
    variables = {}
    variables.update(load_yaml(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")))
    variables.update(load_yaml(os.path.join(INVENTORY, "host_vars", "l20-node-01.yml")))
    variables.update({"vault_serving_api_keys": {"qwen36-27b": "k" * 24, "qwen36-27b-fp8": "v" * 24},
                      "l20_vllm_enabled": True})
    variables.update(overrides)
    return variables


def run_stages(tmp_path, driver, **overrides):
    """Preflight's runtime check on the L20 inventory with llmops_gpus at `driver`, what the later stages
    would read, and the final play. Returns (result, what the stages read, the final play's message)."""
    preflight = load_yaml(PREFLIGHT)[0]
    tasks = [t for t in preflight["tasks"] if t.get("name") in RUNTIME_TASKS]
    assert [t["name"] for t in tasks] == list(RUNTIME_TASKS)
    build_vars = load_yaml(BUILD)[0]["vars"]
    seen = ("{{ {'preflight_engines': _preflight_engines, 'build_roles': _build_roles,"
            " 'vllm_built': 'vllm' in _build_roles, 'llama_cpp_built': 'llama_cpp' in _build_roles,"
            " 'models': model_models | map(attribute='name') | list,"
            " 'instances': _serving_kept_instances | map(attribute='name') | list,"
            " 'refused': llmops_refused_instances | map(attribute='name') | list} | to_json }}")
    variables = l20_inventory(**overrides)
    variables.update({"llmops_gpus": dict(L20_GPUS, driver_version=driver),
                      **preflight["vars"], **build_vars,
                      # what role serving plans and deploys in the serve stage
                      "_serving_kept_instances": load_yaml(SERVING_VARS)["_serving_kept_instances"]})
    final = load_yaml(REFUSED)[0]
    plays = [{"hosts": "localhost", "connection": "local", "gather_facts": True,
              "gather_subset": ["!all", "!min", "distribution"], "vars": variables,
              "tasks": tasks + [{"name": "stages", "ansible.builtin.debug": {"msg": seen}}]},
             {"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": final["tasks"]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(plays))
    result, _ = run_local_playbook(path, str(tmp_path), extra_env={"ANSIBLE_STDOUT_CALLBACK": "json"},
                                   extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])
    report = json.loads(result.stdout)
    by_name = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            by_name[task["task"]["name"]] = task["hosts"]["localhost"]
    stages = json.loads(by_name["stages"]["msg"])
    final_task = by_name[final["tasks"][0]["name"]]
    return result, stages, final_task


def test_on_r550_the_vllm_instance_is_left_out_in_preflight_and_the_run_fails_at_its_end(tmp_path):
    result, stages, final = run_stages(tmp_path, "550.54.14")
    assert stages["refused"] == ["qwen36-27b-fp8"]
    # what the later stages read: no vLLM engine to install (no image pull) nor to count on the disk, no FP8
    # snapshot to download, only the llama.cpp instance to deploy
    assert stages["build_roles"] == ["llama_cpp"] and stages["vllm_built"] is False
    assert stages["llama_cpp_built"] is True
    assert stages["preflight_engines"] == ["llama.cpp"]
    assert stages["models"] == ["qwen3.6-27b-ud-q5_k_xl"]
    assert stages["instances"] == ["qwen36-27b"]
    # the run fails at its end, naming the instance and the ways out
    assert result.returncode != 0 and final.get("failed") is True
    message = " ".join(final["msg"].split())
    assert message.startswith("1 instance(s) not deployed in this run, the others were: [qwen36-27b-fp8 "
                              "(vllm)] instance qwen36-27b-fp8: CUDA 13.0 of vllm 0.33.0 needs NVIDIA driver "
                              ">= 580.65.06")
    assert "the node has 550.54.14 (R550, CUDA 12.4)" in message
    assert "(1) a CUDA 12.x build of vLLM 0.33.0" in message
    assert "(3) install NVIDIA driver >= 580.65.06" in message
    assert "links libcudart.so.13" in message


def test_a_driver_that_runs_cuda_13_after_the_gpu_host_stage_keeps_both(tmp_path):
    # the node runs R550 now, but the inventory pins R580: the GPU host stage installs it before the build
    result, stages, final = run_stages(tmp_path, "550.54.14", nvidia_driver_version="580.65.06")
    assert stages["refused"] == []
    assert stages["build_roles"] == ["llama_cpp", "vllm"] and stages["vllm_built"] is True
    assert stages["preflight_engines"] == ["llama.cpp", "vllm"]
    assert stages["models"] == ["qwen3.6-27b-ud-q5_k_xl", "qwen3.6-27b-fp8"]
    assert stages["instances"] == ["qwen36-27b", "qwen36-27b-fp8"]
    assert result.returncode == 0 and final.get("skipped") is True


def test_a_cuda_12_vllm_build_on_r550_keeps_both(tmp_path):
    result, stages, _ = run_stages(tmp_path, "550.54.14", vllm_version="0.32.0", vllm_cuda_variant="cu129")
    assert stages["refused"] == [] and stages["vllm_built"] is True
    assert result.returncode == 0


def test_a_host_whose_only_instance_is_refused_builds_nothing(tmp_path):
    inventory = l20_inventory()
    result, stages, _ = run_stages(tmp_path, "550.54.14", serving_instances=[inventory["l20_vllm_instance"]])
    assert stages["refused"] == ["qwen36-27b-fp8"] and stages["instances"] == []
    assert stages["build_roles"] == [] and not stages["vllm_built"] and not stages["llama_cpp_built"]
    assert result.returncode != 0


SERVING_MAIN = os.path.join(ROOT, "roles", "serving", "tasks", "main.yml")


@pytest.mark.parametrize("site_run,refused,fails", [
    (False, True, True),        # playbooks/serve.yml alone: the role's last task names them
    (True, True, False),        # site.yml: playbooks/refused.yml does, after validate
    (False, False, False),
])
def test_the_serve_stage_alone_fails_after_deploying_the_others(site_run, refused, fails):
    tasks = load_yaml(SERVING_MAIN)
    names = [t["name"] for t in tasks]
    last = tasks[-1]
    # after every instance it kept is deployed and published
    assert names.index("Deploy each instance (key and env files, unit, health-gated restart with rollback)") \
        < names.index("Publish llmops_instances") < len(tasks) - 1
    entry = {"name": "qwen36-27b-fp8", "engine": "vllm", "model": "m",
             "message": "instance qwen36-27b-fp8: x"}
    variables = {"_serving_refused": [entry] if refused else [], "llmops_site_run": site_run}
    templar = role_templar(os.path.dirname(SERVING_MAIN), variables)
    assert all(templar.template("{{ %s }}" % c) for c in last["when"]) is fails
    if fails:
        assert templar.template(last["ansible.builtin.fail"]["msg"]) == instance_plan.refusal_report([entry])
