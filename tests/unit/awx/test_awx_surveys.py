# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The job templates' surveys (awx/objects.yml): well-formed for AWX, launchable without answers, and every
variable they set is one the roles, the playbooks or the imported inventory read, with answers the roles'
own argument specs accept."""
import glob
import os
import re

import pytest

from tests.helpers import ROOT
from tests.unit.awx import awx_code

# The survey question fields and answer types of AWX's survey_spec API (the awx.awx module passes
# survey_spec through as a dict, so its argument spec says nothing about them).
AWX_QUESTION_FIELDS = {"variable", "question_name", "question_description", "required", "type", "default",
                       "choices", "min", "max", "new_question"}
AWX_ANSWER_TYPES = {"text": str, "textarea": str, "password": str, "multiplechoice": str, "multiselect": list,
                    "integer": int, "float": float}
CHOICE_TYPES = {"multiplechoice", "multiselect"}


@pytest.fixture(scope="module")
def objects():
    return awx_code.load_objects()


@pytest.fixture(scope="module")
def questions(objects):
    return objects["awx_survey_questions"]


def role_variables():
    """{variable: role} of every public role variable (defaults/main.yml is each role's interface)."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "main.yml")):
        role = path.split(os.sep)[-3]
        found.update((name, role) for name in awx_code.role_defaults(role))
    return found


def reading_files():
    """Playbooks the templates run and the imported inventory's variable files (not playbooks/awx.yml)."""
    paths = [os.path.join(ROOT, "site.yml")] + glob.glob(os.path.join(ROOT, "playbooks", "*.yml"))
    paths = [path for path in paths if path != awx_code.PLAYBOOK]
    return paths + sorted(awx_code.inventory_group_vars())


def read_outside_comments(variable):
    """Files that use the variable in YAML or Jinja (comment lines left out)."""
    pattern = re.compile(r"\b%s\b" % re.escape(variable))
    users = []
    for path in reading_files():
        with open(path) as handle:
            code = [line for line in handle if not line.lstrip().startswith("#")]
        if any(pattern.search(line) for line in code):
            users.append(os.path.relpath(path, ROOT))
    return users


def sample_answers(question):
    """The answers AWX can send for a question, as the Python values the playbook receives."""
    if question["type"] == "multiselect":
        return [list(question["choices"]), question["choices"][:1]]
    if question["type"] == "multiplechoice":
        return list(question["choices"])
    cast = AWX_ANSWER_TYPES[question["type"]]
    values = [question[key] for key in ("default", "min", "max") if key in question]
    return [cast(value) for value in values] if cast is not str else [question.get("default", "answer")]


def test_questions_are_well_formed_for_awx(questions):
    for variable, question in questions.items():
        assert question["variable"] == variable
        assert set(question) <= AWX_QUESTION_FIELDS, set(question) - AWX_QUESTION_FIELDS
        assert question["type"] in AWX_ANSWER_TYPES
        assert question["question_name"] and isinstance(question["required"], bool)
        if question["type"] in CHOICE_TYPES:
            assert question["choices"] and all(isinstance(choice, str) for choice in question["choices"])
            if "default" in question:
                assert question["default"] in question["choices"]
        else:
            assert "choices" not in question
        if "min" in question and "default" in question and question["type"] in {"text", "textarea"}:
            assert question["min"] <= len(question["default"]) <= question["max"]


def test_required_questions_have_a_default_so_a_launch_needs_no_answer(questions):
    for variable, question in questions.items():
        if question["required"]:
            assert "default" in question, variable


def test_every_template_asks_known_questions_and_every_question_is_asked(objects, questions):
    asked = set()
    for template in objects["awx_objects"]["job_template"]:
        assert template["survey"], template["name"]
        assert len(set(template["survey"])) == len(template["survey"]), template["name"]
        assert set(template["survey"]) <= set(questions), template["name"]
        asked.update(template["survey"])
    assert asked == set(questions)


def test_every_template_asks_for_the_hosts(objects):
    for template in objects["awx_objects"]["job_template"]:
        assert "llmops_target" in template["survey"], template["name"]


@pytest.mark.parametrize("variable", ["llmops_target", "nvidia_driver_allow_reboot", "llmops_model_revision",
                                      "validate_instances", "validate_min_decode_tps"])
def test_the_operator_choices_of_the_issue_are_asked(questions, variable):
    assert variable in questions


def test_every_survey_variable_is_read_by_a_role_a_playbook_or_the_inventory(questions):
    roles = role_variables()
    for variable in questions:
        assert variable in roles or read_outside_comments(variable), (
            "%s: no role default, playbook or inventory variable file reads it" % variable)


def test_every_answer_passes_the_argument_spec_of_the_role_that_reads_it(questions):
    roles = role_variables()
    checked = 0
    for variable, question in questions.items():
        if variable not in roles:
            continue
        for answer in sample_answers(question):
            errors = awx_code.role_spec_errors(roles[variable], {variable: answer})
            assert errors == [], (variable, answer, errors)
            checked += 1
    assert checked >= 3


def test_site_variables_that_no_role_declares_are_read_where_the_template_runs(objects, questions):
    """llmops_target is the playbooks' hosts; llmops_model_revision is the inventory's model revision."""
    roles = role_variables()
    for variable in set(questions) - set(roles):
        users = read_outside_comments(variable)
        for template in objects["awx_objects"]["job_template"]:
            if variable in template["survey"] and not template.get("planned"):
                runs = awx_code.playbook_closure(template["playbook"])
                inventory = [path for path in users if path.startswith("inventories/")]
                assert set(users) & runs or inventory, (template["name"], variable)


@pytest.mark.parametrize("variable", ["validate_instances", "rollback_instance"])
def test_instance_choices_are_the_instances_of_the_imported_inventory(questions, variable):
    assert set(questions[variable]["choices"]) == set(awx_code.inventory_instance_names())


def test_thresholds_and_revision_send_nothing_when_left_empty(questions):
    """A default would override the inventory's own value on every launch."""
    for variable in ("llmops_model_revision", "validate_min_decode_tps", "validate_instances",
                     "rollback_instance", "validate_force"):
        assert not questions[variable]["required"] and "default" not in questions[variable], variable


@pytest.mark.parametrize("answer, revision", [("0123abcd", "0123abcd"), ("", "main")])
def test_the_revision_answer_reaches_the_models_of_the_imported_inventory(answer, revision):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    revisions = []
    for variables in awx_code.inventory_group_vars().values():
        if "model_models" in variables:
            # the inventory's default models (a commit names one repository: an opt-in model of another
            # repository keeps its own revision)
            templar = Templar(loader=DataLoader(), variables=dict(variables, llmops_model_revision=answer))
            models = templar.template(variables["model_models"])
            revisions.extend(templar.template(model["revision"]) for model in models)
    assert revisions and set(revisions) == {revision}


def test_validate_and_site_templates_can_force_or_skip_the_measurement(objects):
    """Left empty, each playbook keeps its default (validate.yml measures all, site.yml what changed)."""
    surveys = {t["playbook"]: t["survey"] for t in objects["awx_objects"]["job_template"]}
    assert "validate_force" in surveys["playbooks/validate.yml"] and "validate_force" in surveys["site.yml"]
