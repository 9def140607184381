# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""awx/objects.yml, applied by playbooks/awx.yml, against the awx.awx modules' own argument specs, and every
object a job template names against the repository and awx/ (tests/unit/awx/awx_code.py says how the specs
are read without running a module)."""
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.unit.awx import awx_code

# Credential types AWX ships (the only objects a template may name without defining them in awx/).
AWX_BUILTIN_CREDENTIAL_TYPES = {"Machine"}
OBJECT_ORDER = ["organization", "execution_environment", "project", "credential_type", "credential",
                "inventory", "inventory_source", "job_template"]
STAGE_PLAYBOOKS = ["bootstrap", "preflight", "gpu_host", "build", "models", "serve", "validate"]
FAKE_SECRETS = {"LLMOPS_API_KEY_QWEN36_27B": "test-key-a", "LLMOPS_API_KEY_QWEN36_27B_FP8": "test-key-b",
                "LLMOPS_HF_TOKEN": "hf_test", "LLMOPS_SSH_PRIVATE_KEY": "-----BEGIN TEST KEY-----"}


@pytest.fixture(scope="module")
def objects():
    return awx_code.load_objects()


@pytest.fixture(scope="module")
def calls():
    """{module: [(item, rendered parameters)]} for the whole play."""
    return {module: awx_code.rendered_calls(module, task) for module, task in awx_code.module_tasks()}


def by_name(objects, kind):
    return {item["name"]: item for item in objects["awx_objects"][kind]}


def test_the_play_applies_every_kind_of_object_once_in_dependency_order(objects):
    modules = [module for module, _task in awx_code.module_tasks()]
    assert modules == OBJECT_ORDER
    assert list(objects["awx_objects"]) == OBJECT_ORDER


@pytest.mark.parametrize("module", OBJECT_ORDER)
def test_every_rendered_call_passes_the_modules_own_argument_validation(calls, module):
    assert calls[module], "no %s is applied" % module
    for item, params in calls[module]:
        assert awx_code.validate_params(module, params) == [], item["name"]


@pytest.mark.parametrize("module", OBJECT_ORDER)
def test_every_task_argument_and_every_data_key_is_an_option_of_the_module(objects, module):
    spec = awx_code.module_argument_spec(module)
    task = dict(awx_code.module_tasks())[module]
    task_options = set(task[awx_code.MODULE_PREFIX + module])
    assert task_options <= set(spec), task_options - set(spec)
    defaults = objects["awx_job_template_defaults"] if module == "job_template" else {}
    for item in objects["awx_objects"][module]:
        keys = set(defaults) | set(item)
        data_keys = awx_code.DATA_KEYS.get(module, set())
        # A key the task does not pass would be dropped silently: every one must reach the module.
        assert keys - data_keys <= task_options, (item["name"], keys - data_keys - task_options)
        assert keys - data_keys <= set(spec)


def test_module_defaults_are_connection_options_of_every_module():
    defaults = awx_code.load_play()["module_defaults"]["group/awx.awx.controller"]
    for module in OBJECT_ORDER:
        assert set(defaults) <= set(awx_code.module_argument_spec(module))


def test_job_templates_cover_the_site_every_stage_and_rollback(objects):
    playbooks = {item["playbook"] for item in objects["awx_objects"]["job_template"]}
    assert playbooks == ({"site.yml", "playbooks/rolling_update.yml", "playbooks/rollback.yml"}
                         | {"playbooks/%s.yml" % stage for stage in STAGE_PLAYBOOKS})


def test_every_playbook_a_template_runs_exists_unless_planned(objects):
    for template in objects["awx_objects"]["job_template"]:
        exists = os.path.isfile(os.path.join(ROOT, template["playbook"]))
        if template.get("planned"):
            assert not exists, "%s exists now: drop `planned: true` from %s" % (template["playbook"],
                                                                                template["name"])
        else:
            assert exists, template["playbook"]


def test_planned_templates_are_skipped_by_the_play(calls, objects):
    applied = {item["name"] for item, _params in calls["job_template"]}
    planned = {item["name"] for item in objects["awx_objects"]["job_template"] if item.get("planned")}
    assert applied and not applied & planned


def test_every_object_a_template_or_source_names_is_defined_in_awx(calls):
    defined = {kind: {item["name"] for item, _params in calls[kind]} for kind in OBJECT_ORDER}
    for _item, params in calls["job_template"]:
        assert params["organization"] in defined["organization"]
        assert params["project"] in defined["project"]
        assert params["inventory"] in defined["inventory"]
        assert params["execution_environment"] in defined["execution_environment"]
        assert set(params["credentials"]) <= defined["credential"]
    for _item, params in calls["inventory_source"]:
        assert params["inventory"] in defined["inventory"]
        assert params["source_project"] in defined["project"]
    for _item, params in calls["project"]:
        assert params["default_environment"] in defined["execution_environment"]
    for _item, params in calls["credential"]:
        assert params["credential_type"] in defined["credential_type"] | AWX_BUILTIN_CREDENTIAL_TYPES


def test_the_inventory_source_is_an_inventory_of_the_repository(calls):
    for _item, params in calls["inventory_source"]:
        assert params["source"] == "scm"
        assert os.path.isfile(os.path.join(ROOT, params["source_path"])), params["source_path"]


def test_templates_cache_facts_and_ask_nothing_outside_the_survey(calls):
    for item, params in calls["job_template"]:
        assert params["use_fact_cache"] is True, item["name"]
        assert params["survey_enabled"] is True and params["survey_spec"]["spec"], item["name"]
        assert not any(value is True for key, value in params.items() if key.startswith("ask_")), item["name"]


def test_the_ee_image_is_tagged_with_the_collection_version(calls):
    import yaml

    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        version = yaml.safe_load(handle)["version"]
    assert [params["image"] for _item, params in calls["execution_environment"]] == [
        "llmops-serving-ee:%s" % version]


def test_secret_fields_are_secret_and_injected_as_the_variables_the_roles_read(objects):
    credential_type = by_name(objects, "credential_type")["llmops.serving secrets"]
    fields = {field["id"]: field for field in credential_type["inputs"]["fields"]}
    assert all(field.get("secret") is True for field in fields.values())
    extra_vars = credential_type["injectors"]["extra_vars"]
    assert set(extra_vars) == {"serving_api_keys", "model_hf_token"}
    serving = awx_code.role_defaults("serving")
    model = awx_code.role_defaults("model")
    assert "serving_api_keys" in serving and "model_hf_token" in model
    # Every field is injected and every injector names a field (an unknown name renders empty in AWX).
    assert awx_code.injector_templates(extra_vars) == set(fields)
    # Injected values must pass the roles' own argument specs (a dict of strings, a string).
    assert awx_code.role_spec_errors("serving", {"serving_api_keys": {
        name: "key" for name in extra_vars["serving_api_keys"]}}) == []
    assert awx_code.role_spec_errors("model", {"model_hf_token": "token"}) == []


def test_one_api_key_field_per_instance_of_the_inventory(objects):
    extra_vars = by_name(objects, "credential_type")["llmops.serving secrets"]["injectors"]["extra_vars"]
    assert set(extra_vars["serving_api_keys"]) == set(awx_code.inventory_instance_names())


def test_credential_inputs_come_from_the_environment_and_empty_ones_are_not_sent(calls, monkeypatch):
    without = {item["name"]: params["inputs"] for item, params in calls["credential"]}
    assert without["llmops.serving secrets"] == {}
    assert set(without["llmops nodes (SSH)"]) == {"username", "become_method"}
    for name, value in FAKE_SECRETS.items():
        monkeypatch.setenv(name, value)
    task = dict(awx_code.module_tasks())["credential"]
    secrets = {item["name"]: params["inputs"] for item, params in awx_code.rendered_calls("credential", task)}
    assert secrets["llmops.serving secrets"] == {
        "api_key_qwen36_27b": "test-key-a", "api_key_qwen36_27b_fp8": "test-key-b", "hf_token": "hf_test"}
    assert secrets["llmops nodes (SSH)"]["ssh_key_data"] == FAKE_SECRETS["LLMOPS_SSH_PRIVATE_KEY"]
    # The credential fields the inputs fill are those of the credential type.
    fields = {field["id"] for field in by_name(awx_code.load_objects(), "credential_type")[
        "llmops.serving secrets"]["inputs"]["fields"]}
    assert set(secrets["llmops.serving secrets"]) == fields


def test_the_task_that_passes_secrets_never_logs(objects):
    task = dict(awx_code.module_tasks())["credential"]
    assert task.get("no_log") is True


def test_the_playbook_passes_syntax_check_with_the_repositorys_ansible_cfg():
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run([playbook, "playbooks/awx.yml", "--syntax-check"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout
