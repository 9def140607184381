# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A run of site.yml that changes nothing re-reads nothing it already knows (issue 26), and every stage run on
its own still reads what it needs:

- facts are gathered once per site.yml run (by preflight; the later stages get llmops_site_run: true from
  site.yml's imports), and by each stage playbook run alone (site.yml and the stages really run, with a tag
  that selects no task, under profile_tasks);
- the GPU host stage decides from the GPUs preflight read in the same run (no second nvidia-smi);
- role serving reads the services once per run and again after it started or restarted a unit;
- role model does not re-read the GGUF header of a file preflight read in the same run and the download left
  as it was, and preflight does not read the header of a file a past run read while it is the same file;
- role llama_cpp publishes an installed build from the manifest llama_cpp_build_info already returned;
- validate measures only what changed in site.yml, everything when playbooks/validate.yml runs alone.
"""
import json
import os
import re
import sys
import time

import pytest

from plugins.module_utils._model_format.gguf import SUMMARY_VERSION
from tests.helpers import ROOT, load_yaml, role_templar, run_local_playbook

STAGES = ("gpu_host", "build", "models", "serve")


def task(path, name):
    """The task named `name` in a tasks file or a playbook's plays (searched through blocks)."""
    def walk(items):
        for item in items or ():
            if item.get("name") == name:
                return item
            found = walk(item.get("block")) or walk(item.get("tasks")) or walk(item.get("rescue")) \
                or walk(item.get("always"))
            if found:
                return found
        return None
    found = walk(load_yaml(os.path.join(ROOT, path)))
    assert found, "no task %r in %s" % (name, path)
    return found


def holds(templar, conditions):
    """Whether every `when` condition holds, as Ansible evaluates a list of them."""
    conditions = conditions if isinstance(conditions, list) else [conditions]
    return all(templar.template("{{ (%s) | bool }}" % c) in (True, "True") for c in conditions)


# --- site.yml and the stage playbooks ----------------------------------------------------------------------

def test_site_marks_every_stage_after_preflight_as_part_of_the_run():
    imports = [(p["ansible.builtin.import_playbook"], p.get("vars") or {})
               for p in load_yaml(os.path.join(ROOT, "site.yml"))]
    assert [name for name, _vars in imports] == [
        "playbooks/bootstrap.yml", "playbooks/offline_bundle.yml", "playbooks/preflight.yml",
        "playbooks/gpu_host.yml", "playbooks/build.yml",
        "playbooks/models.yml", "playbooks/serve.yml", "playbooks/validate.yml", "playbooks/refused.yml"]
    # the last one only fails naming the instances the run left out (it gathers nothing)
    assert [bool(v.get("llmops_site_run")) for _name, v in imports] == [False] * 3 + [True] * 5 + [False]
    assert load_yaml(os.path.join(ROOT, "playbooks", "refused.yml"))[0]["gather_facts"] is False


@pytest.mark.parametrize("site_run, expected", [(None, True), (False, True), (True, False), ("true", False)])
def test_stages_gather_facts_unless_site_yml_gathered_them_in_this_run(site_run, expected):
    variables = {} if site_run is None else {"llmops_site_run": site_run}
    templar = role_templar(ROOT, variables)
    for stage in STAGES:
        plays = load_yaml(os.path.join(ROOT, "playbooks", "%s.yml" % stage))
        assert templar.template(plays[0]["gather_facts"]) is expected, stage
    assert load_yaml(os.path.join(ROOT, "playbooks", "preflight.yml"))[0]["gather_facts"] is True


@pytest.mark.parametrize("site_run, force", [(None, True), (True, False)])
def test_validate_alone_measures_everything_and_in_site_only_what_changed(site_run, force):
    play = load_yaml(os.path.join(ROOT, "playbooks", "validate.yml"))[0]
    templar = role_templar(ROOT, {} if site_run is None else {"llmops_site_run": site_run})
    assert templar.template(play["vars"]["validate_force"]) is force


def _run_with_no_task(playbook, tmp_path):
    """Run a playbook against localhost with a tag no task has: what runs is what runs whatever the tags
    (fact gathering, the roles' argument checks). The fact cache is the test's own."""
    env = dict(ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    args = ["-c", "local", "--tags", "llmops-test-no-such-tag", "-e", "llmops_target=localhost",
            "-e", "ansible_become=false", "-e", "ansible_python_interpreter=%s" % sys.executable]
    result, recap = run_local_playbook(os.path.join(ROOT, playbook), str(tmp_path), extra_env=env,
                                       extra_args=args)
    assert recap.get("failed") == 0 and recap.get("unreachable") == 0, result.stdout + result.stderr
    return result.stdout.count("TASK [Gathering Facts]")


def test_site_yml_gathers_facts_once(tmp_path):
    assert _run_with_no_task("site.yml", tmp_path) == 1


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_alone_gathers_its_facts(stage, tmp_path):
    assert _run_with_no_task("playbooks/%s.yml" % stage, tmp_path) == 1


# --- the GPU host stage: no second nvidia-smi ----------------------------------------------------------

def test_gpu_host_stage_decides_from_the_gpus_preflight_read_in_the_same_run():
    role = load_yaml(os.path.join(ROOT, "playbooks", "gpu_host.yml"))[0]["tasks"][0]
    assert role["ansible.builtin.include_role"]["name"] == "llmops.serving.nvidia_driver"
    read = task("roles/nvidia_driver/tasks/detect.yml", "Gather GPU facts (llmops_gpus)")["when"]
    defaults = load_yaml(os.path.join(ROOT, "roles", "nvidia_driver", "defaults", "main.yml"))
    gpus = {"present": True, "count": 4}
    for site_run, facts, expected in [(True, gpus, False), (True, None, True), (None, gpus, True)]:
        variables = dict(defaults)
        variables.update({} if site_run is None else {"llmops_site_run": site_run})
        variables["nvidia_driver_read_gpus"] = role_templar(ROOT, variables).template(
            role["vars"]["nvidia_driver_read_gpus"])
        if facts:
            variables["llmops_gpus"] = facts
        assert holds(role_templar(ROOT, variables), read) is expected, (site_run, facts)


@pytest.mark.parametrize("over, reads", [
    ({}, False),                                                                 # preflight's read stands
    ({"_nvidia_driver_detected": "install"}, True),                              # the driver changed
    ({"_nvidia_driver_detected": "reboot"}, True),
    ({"_preflight_gpus": {"later_checks_pass": False}}, True),                   # would fail: say so
    ({"_preflight_gpus": {"skipped": True}}, True),
    ({"llmops_site_run": False}, True),                                          # the stage run alone
])
def test_the_gpu_host_gates_reuse_preflight_s_read_when_nothing_changed_the_driver(over, reads):
    gates = [t for t in load_yaml(os.path.join(ROOT, "playbooks", "gpu_host.yml"))[1]["tasks"]
             if "llmops.serving.gpu_facts" in t][0]
    variables = {"llmops_site_run": True, "_preflight_gpus": {"later_checks_pass": True},
                 "_nvidia_driver_detected": "none"}
    variables.update(over)
    assert holds(role_templar(ROOT, variables), gates["when"]) is reads
    # preflight asks for the very checks the stage makes
    preflight = task("playbooks/preflight.yml", "Read the GPUs and the driver, and refuse GPUs that no "
                     "driver can make fit (architecture, memory, devices)")["llmops.serving.gpu_facts"]
    stage = gates["llmops.serving.gpu_facts"]
    later = ("required", "require_cuda", "min_driver_version")
    assert preflight["later_checks"] == {k: stage[k] for k in later}
    assert all(preflight[k] == stage[k] for k in ("require_arch", "min_memory_mib", "devices"))


# --- role serving: the services, once per run ---------------------------------------------------------

def test_serving_reads_the_services_once_per_run_and_again_after_a_unit_started():
    # plan.yml and memory_plan.yml both read systemd through systemd.yml (one module call)
    for tasks_file in ("plan.yml", "memory_plan.yml"):
        imports = [t for t in load_yaml(os.path.join(ROOT, "roles", "serving", "tasks", tasks_file))
                   if t.get("ansible.builtin.import_tasks") == "systemd.yml"]
        assert len(imports) == 1, tasks_file
    read = task("roles/serving/tasks/systemd.yml", "Read systemd on the node (the services that run now, its "
                "version, what PID 1 may grant)")
    keep = task("roles/serving/tasks/systemd.yml", "Keep what systemd said for the rest of the run")
    assert "llmops.serving.systemd_info" in read and read["register"] == "_serving_systemd_read"
    for when in (read["when"], keep["when"]):
        # the fact cache may hold services from days ago: not enough
        assert holds(role_templar(ROOT, {"_serving_systemd": {"running_units": []}}), when)
        assert not holds(role_templar(ROOT, {"_serving_services_fresh": True}), when)
    # the read is followed by the set_fact that marks it fresh
    assert keep["ansible.builtin.set_fact"]["_serving_services_fresh"] is True
    publish = [t for t in load_yaml(os.path.join(ROOT, "roles", "serving", "tasks", "record.yml"))
               if "llmops_deployments" in (t.get("ansible.builtin.set_fact") or {})][0]
    expr = publish["ansible.builtin.set_fact"]["_serving_services_fresh"]
    for fresh, service, expected in [(True, {"changed": False}, False), (True, {"changed": True}, True),
                                     (None, {"changed": False}, True)]:
        variables = {"_serving_service": service}
        if fresh is not None:
            variables["_serving_services_fresh"] = fresh
        stale = role_templar(ROOT, variables).template(expr) in (False, "False")
        assert stale is expected, (fresh, service)


UNIT = "llama-server-qwen.service"


@pytest.mark.parametrize("over, needed", [
    ({}, False),                                                                  # runs, enabled, unchanged
    ({"_serving_deploy": {"unit_changed": True, "env_changed": False}}, True),    # restart
    ({"_serving_deploy": {"unit_changed": False, "env_changed": True}}, True),
    ({"_serving_key": {"changed": True}}, True),                                  # a new API key
    ({"_serving_systemd": {"running_units": [], "enabled_units": [UNIT]}}, True),  # stopped: start it
    ({"_serving_systemd": {"running_units": [UNIT], "enabled_units": []}}, True),  # disabled: enable it
    ({"_serving_systemd": {"running_units": [UNIT]}}, True),                      # not read: ask systemd
])
def test_a_running_enabled_unchanged_instance_is_left_alone_without_asking_systemd(over, needed):
    variables = load_yaml(os.path.join(ROOT, "roles", "serving", "vars", "main.yml"))
    variables.update({"_serving_item": {"unit": UNIT}, "_serving_key": {"changed": False},
                      "_serving_deploy": {"unit_changed": False, "env_changed": False},
                      "_serving_systemd": {"running_units": ["cron.service", UNIT], "enabled_units": [UNIT]}})
    variables.update(over)
    start = task("roles/serving/tasks/instance.yml", "Restart or start {{ _serving_item.unit }}")
    assert holds(role_templar(ROOT, variables), start["when"]) is needed


# --- role model: the header preflight read ----------------------------------------------------------------

MODEL = {"name": "tiny", "repo": "org/tiny", "filename": "tiny.gguf"}
HEADER = {"architecture": "qwen35", "chat_template_risks": [], "block_count": 4}


def _model_vars(**over):
    variables = load_yaml(os.path.join(ROOT, "roles", "model", "defaults", "main.yml"))
    variables.update(load_yaml(os.path.join(ROOT, "roles", "model", "vars", "main.yml")))
    variables.update({"_model_item": MODEL, "model_dir": "/srv/models",
                      "_model_download": {"path": "/srv/models/tiny/tiny.gguf", "changed": False},
                      "_model_gguf": {"skipped": True}, "llmops_model_headers": {"tiny": HEADER}})
    variables.update(over)
    return variables


@pytest.mark.parametrize("over, known", [
    ({}, True),
    ({"_model_download": {"path": "/srv/models/tiny/tiny.gguf", "changed": True}}, False),     # replaced
    ({"llmops_model_headers": {"tiny": dict(HEADER, remote={"url": "http://hub"})}}, False),  # from the hub
    ({"llmops_model_headers": {}}, False),                                                  # no preflight
    ({"_model_download": {"path": "/srv/models/tiny/other.gguf", "changed": False}}, False),
])
def test_the_models_stage_reuses_the_header_preflight_read_of_the_same_unchanged_file(over, known):
    variables = _model_vars(**over)
    templar = role_templar(os.path.join(ROOT, "roles", "model"), variables)
    check = task("roles/model/tasks/model.yml", "Check the GGUF structure (header, tensor table, exact size, "
                 "chat template): {{ _model_item.name }}")
    assert holds(templar, check["when"][-1]) is (not known)
    if known:
        assert templar.template("{{ _model_gguf_info }}") == HEADER
    else:
        variables["_model_gguf"] = dict(HEADER, block_count=5)
        assert role_templar(ROOT, variables).template("{{ _model_gguf_info }}")["block_count"] == 5


def _read(exists, path="/srv/models/tiny/tiny.gguf"):
    """node_state_info's result for preflight's read (tasks/headers.yml)."""
    return {"paths": {path: {"exists": True, "type": "file"} if exists else {"exists": False}}}


@pytest.mark.parametrize("over, on_node", [
    ({"_model_node": _read(True)}, True),
    ({"_model_node": _read(False)}, False),                                          # not there yet
    ({}, False),                                                                    # role run alone
    ({"_model_node": _read(True, "/srv/models/tiny/other.gguf")}, False),             # another file
    ({"_model_node": _read(True), "model_update": True}, False),
    ({"_model_node": _read(True), "model_force_verify": True}, False),
])
def test_a_model_already_on_the_node_is_checked_in_one_task_not_an_async_job(over, on_node):
    templar = role_templar(os.path.join(ROOT, "roles", "model"), _model_vars(**over))
    assert holds(templar, "_model_on_node | bool") is on_node
    present = task("roles/model/tasks/model.yml", "Check the model already on the node against its "
                   "verification record: {{ _model_item.name }}")
    start = task("roles/model/tasks/model.yml", "Start the download as an async job (resumes a partial "
                 "download, verifies sha256): {{ _model_item.name }}")
    templar = role_templar(os.path.join(ROOT, "roles", "model"),
                           _model_vars(ansible_check_mode=False, **over))
    assert holds(templar, present["when"]) is on_node
    assert holds(templar, start["when"]) is (not on_node)
    # the same module arguments either way (one anchor)
    assert present["llmops.serving.model_download"] == start["llmops.serving.model_download"]


IDENTITY = {"size": 4096, "mtime_ns": 1, "ctime_ns": 2, "inode": 3}
PUBLISH_HEADERS = "Publish llmops_model_headers, and leave out of the disk check what is on the node already"


@pytest.mark.parametrize("identity, over, reused", [
    (IDENTITY, {}, True),
    (dict(IDENTITY, ctime_ns=5), {}, False),                  # changed since
    (IDENTITY, {"model_force_verify": True}, False),          # asked to check every file again
    (IDENTITY, {"model_update": True}, False),
])
def test_preflight_reuses_the_header_a_past_run_recorded_for_the_same_file(identity, over, reused):
    """Preflight (tasks/headers.yml) reads no model file whose identity is the one the header recorded in
    llmops_models (the fact cache) was read from, and publishes that header."""
    variables = _model_vars(**over)
    keys = [k for k in variables["_model_gguf_keys"] if k not in ("remote", "split_set")]
    header = dict({k: None for k in keys}, architecture="qwen35", block_count=4, chat_template_risks=[],
                  identity=IDENTITY, summary_version=SUMMARY_VERSION)
    final = "/srv/models/tiny/tiny.gguf"
    variables.update({"model_models": [MODEL], "llmops_models": {"tiny": {"path": final, "gguf": header}},
                      "_model_node": {"paths": {final: {"exists": True, "type": "file",
                                                        "identity": identity}}}})
    variables.pop("llmops_model_headers")
    templar = role_templar(os.path.join(ROOT, "roles", "model"), variables)
    read = task("roles/model/tasks/headers.yml", "Read each model's GGUF header (on the node when it is "
                "there, else from the hub with range requests)")
    assert holds(templar, read["when"]) is (not reused)
    fresh = dict(header, block_count=5, identity=identity)
    variables.update({"_model_headers": {"results": [{"skipped": True, "_model_item": MODEL} if reused
                                                     else dict(fresh, _model_item=MODEL, chat_template="x")]},
                      "_model_snapshot_headers": {"results": [{"skipped": True, "_model_item": MODEL}]}})
    templar = role_templar(os.path.join(ROOT, "roles", "model"), variables)
    publish = task("roles/model/tasks/headers.yml", PUBLISH_HEADERS)
    published = templar.template(publish["ansible.builtin.set_fact"]["llmops_model_headers"])
    assert published == {"tiny": header if reused else fresh}
    # a model whose every read was skipped is no loop item of the disk count (not an undefined one)
    count = task("roles/model/tasks/headers.yml", "Count each model that is not on the node yet as a write "
                 "for the disk check")
    assert [r["_model_item"]["name"] for r in templar.template(count["loop"])] == ([] if reused else ["tiny"])


def _preflight_models(tmp_path, cache):
    """Preflight's model part for real on localhost (role model's `headers` entry point, then the disk check
    as preflight.yml runs it), and the record the model stage makes of the header (cacheable, as
    tasks/main.yml publishes llmops_models) into the fact cache `cache`. Returns how many headers it read
    and whether the disk check ran."""
    final = tmp_path / "models" / "tiny" / "tiny.gguf"
    play = tmp_path / "play.yml"
    check = task("playbooks/preflight.yml", "Check the free space of each filesystem against what the run "
                 "writes there")
    play.write_text(json.dumps([{"hosts": "localhost", "connection": "local", "gather_facts": False, "vars": {
        "model_dir": str(tmp_path / "models"),
        "model_models": [{"name": "tiny", "url": "http://127.0.0.1:9/tiny.gguf"}],
        "llmops_disk_writes": []}, "tasks": [
            {"ansible.builtin.include_role": {"name": "llmops.serving.model", "tasks_from": "headers"}},
            {"name": "disk", "llmops.serving.disk_space_info": {"writes": "{{ llmops_disk_writes }}"},
             "register": "disk", "when": check["when"]},
            {"ansible.builtin.set_fact": {"cacheable": True, "llmops_models": {
                "tiny": {"path": str(final), "gguf": "{{ llmops_model_headers.tiny }}"}}}},
            {"ansible.builtin.debug": {"msg": "READ={{ _model_headers.results "
                                              "| rejectattr('skipped', 'true') | list | length }} "
                                              "DISK={{ disk is not skipped }} "
                                              "ARCH={{ llmops_model_headers.tiny.architecture }}"}}]}]))
    proc, recap = run_local_playbook(play, "", extra_env={"ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                                                          "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache)})
    assert proc.returncode == 0 and recap["failed"] == 0, proc.stdout + proc.stderr
    found = re.search(r"READ=(\d) DISK=(\w+) ARCH=(\w+)", proc.stdout)
    assert found and found.group(3) == "qwen35", proc.stdout
    return int(found.group(1)), found.group(2) == "True"


def test_a_second_preflight_reads_no_model_file_until_the_file_changes(tmp_path):
    """For real, with a fact cache: the first run reads the header, the second reads none (the same file),
    and a chmod (ctime) makes the next one read it again. Nothing left to write: no disk check either."""
    from tests.fixtures.gguf.builder import tiny_qwen35

    final = tmp_path / "models" / "tiny" / "tiny.gguf"
    final.parent.mkdir(parents=True)
    final.write_bytes(tiny_qwen35().build().data)
    time.sleep(1.1)  # older than a timestamp granule (file_identity.settled): its identity is recorded
    cache = tmp_path / "facts"
    assert _preflight_models(tmp_path, cache) == (1, False)
    assert _preflight_models(tmp_path, cache) == (0, False)
    final.chmod(0o600)
    assert _preflight_models(tmp_path, cache) == (1, False)


def test_preflight_plans_memory_from_this_run_s_headers_not_a_past_run_s_models():
    """In preflight, llmops_models is a past run's (the fact cache): a model replaced under the same file name
    since would be planned with the old file's sizes. Preflight's plan reads this run's headers only."""
    plays = load_yaml(os.path.join(ROOT, "playbooks", "preflight.yml"))
    include = next(t for t in plays[0]["tasks"]
                   if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "memory_plan")
    assert include["vars"] == {"serving_memory_models": {}}
    gather = task("roles/serving/tasks/memory_plan.yml", "Gather what the planner needs for each instance "
                  "(merged settings, model metadata, GPUs in order)")
    assert "models=serving_memory_models," in gather["ansible.builtin.set_fact"]["_serving_memory_inputs"]
    variables = load_yaml(os.path.join(ROOT, "roles", "serving", "defaults", "main.yml"))
    variables["llmops_models"] = {"q": {"path": "/m/q.gguf"}}
    # the serve stage (plan.yml imports memory_plan.yml) reads what role model published in this run
    served = role_templar(ROOT, variables).template("{{ serving_memory_models }}")
    assert served == variables["llmops_models"]


@pytest.mark.parametrize("build_there, left", [(True, 0), (False, 1)])
def test_preflight_checks_the_disk_only_when_something_is_left_to_write(build_there, left):
    """The build's disk entry is counted before the models' read, which reads its unless_exists path too:
    with the build there and no model to fetch, nothing is left and disk_space_info does not run."""
    plays = load_yaml(os.path.join(ROOT, "playbooks", "preflight.yml"))
    names = [t["name"] for t in plays[0]["tasks"]]
    assert names.index("Count what the llama.cpp build writes (disk check)") < names.index(
        "Read each model's GGUF header (on the node, or from the hub with range requests; nothing is "
        "downloaded)")
    current = "/opt/llama.cpp/current"
    write = {"path": "/opt/llama.cpp", "what": "llama.cpp build", "bytes": 1, "unless_exists": current}
    variables = _model_vars(model_models=[MODEL], llmops_disk_writes=[write], _model_headers={"results": []},
                            _model_snapshot_headers={"results": []})
    read = task("roles/model/tasks/headers.yml", "Look for the models directory and each model's directory "
                "and file on the node")
    templar = role_templar(os.path.join(ROOT, "roles", "model"), dict(variables, **read["vars"]))
    assert current in templar.template(read["llmops.serving.node_state_info"]["paths"])
    variables["_model_node"] = {"paths": {current: {"exists": build_there, "type": "link",
                                                    "target_exists": build_there},
                                          "/srv/models/tiny/tiny.gguf": {"exists": True, "type": "file"}}}
    publish = task("roles/model/tasks/headers.yml", PUBLISH_HEADERS)
    writes = role_templar(ROOT, variables).template(publish["ansible.builtin.set_fact"]["llmops_disk_writes"])
    assert len(writes) == left
    # the model is on the node (seen by the same read): it adds no write
    count = task("roles/model/tasks/headers.yml", "Count each model that is not on the node yet as a write "
                 "for the disk check")
    variables.update({"llmops_disk_writes": writes,
                      "_model_headers": {"results": [dict(HEADER, _model_item=MODEL)]},
                      "_model_snapshot_headers": {"results": [{"skipped": True, "_model_item": MODEL}]}})
    templar = role_templar(os.path.join(ROOT, "roles", "model"), variables)
    items = templar.template(count["loop"])
    assert len(items) == 1 and not holds(role_templar(os.path.join(ROOT, "roles", "model"),
                                                      dict(variables, _model_result=items[0])), count["when"])
    check = task("playbooks/preflight.yml", "Check the free space of each filesystem against what the run "
                 "writes there")
    assert holds(role_templar(ROOT, {"llmops_disk_writes": writes}), check["when"]) is bool(left)


# --- role llama_cpp: the manifest it has -------------------------------------------------------------------

MANIFEST = {"build_id": "b1", "mode": "host", "binary": "/opt/llama.cpp/builds/b1/bin/llama-server",
            "image": "", "version": "1 (abc)", "install_dir": "/opt/llama.cpp/builds/b1", "source": {},
            "cuda": False, "cuda_architectures": "", "targets": ["llama-server"], "cmake_args": []}


@pytest.mark.parametrize("installed, check_mode, slurped", [(True, False, False), (False, False, True),
                                                            (False, True, False)])
def test_an_installed_build_is_published_from_the_manifest_build_info_returned(installed, check_mode,
                                                                               slurped):
    facts = load_yaml(os.path.join(ROOT, "roles", "llama_cpp", "tasks", "facts.yml"))
    read, publish = facts[0], facts[1]
    variables = load_yaml(os.path.join(ROOT, "roles", "llama_cpp", "defaults", "main.yml"))
    variables.update(publish["vars"])
    variables.update({"_llama_cpp_installed": installed, "ansible_check_mode": check_mode,
                      "_llama_cpp_plan": {"manifest": MANIFEST if installed else None,
                                          "identity": {"source": {}},
                                          "next_previous_build_id": None, "cuda": False,
                                          "cuda_architectures": "", "targets": [], "cmake_args": []},
                      "_llama_cpp_build_id": "b1", "_llama_cpp_mode": "host", "_llama_cpp_image": "",
                      "_llama_cpp_install_dir": "/opt/llama.cpp/builds/b1", "_llama_cpp_src": "/src"})
    templar = role_templar(os.path.join(ROOT, "roles", "llama_cpp"), variables)
    assert holds(templar, read["when"]) is slurped
    if not slurped:
        published = templar.template(publish["ansible.builtin.set_fact"]["llmops_llama_cpp"])
        assert published["version"] == ("1 (abc)" if installed else "")


def test_profile_of_the_noop_validate_stage_is_two_module_calls(tmp_path):
    """The validate stage of a run that changed nothing runs two modules on the node, once each: the slurp of
    its last report and one `systemctl show` of every instance's unit (an unchanged instance that systemd
    gave up on is named, not passed over); profile_tasks lists every task that took time
    (tests/roles/test_validate_role.py measures it against the fakes)."""
    text = open(os.path.join(ROOT, "roles", "validate", "tasks", "plan.yml")).read()
    modules = re.findall(r"^\s+(ansible\.builtin\.\w+|llmops\.serving\.\w+):", text, re.M)
    assert [m for m in modules if m not in ("ansible.builtin.set_fact", "ansible.builtin.debug")] == [
        "ansible.builtin.slurp", "ansible.builtin.command"]
    assert not re.search(r"^\s+(loop|with_\w+):", text, re.M)     # once each, whatever the instances
