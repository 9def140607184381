# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read AWX-as-code the way Ansible does: awx/objects.yml, the tasks of playbooks/awx.yml rendered per item,
and the awx.awx modules' own argument specs.

Argument specs: every awx.awx module builds `ControllerAPIModule(argument_spec=dict(...))` inside main().
Parsing the source with ast would break on specs that are computed (credential_type's
`kind=dict(choices=list(KIND_CHOICES.keys()))`) and would not see the base class's connection options. So the
module is imported from the installed collection and main() runs with ControllerAPIModule replaced by a
class that raises with the argument_spec it is given, before any connection or parameter parsing; the base
class's AUTH_ARGSPEC (controller_host, controller_oauthtoken, ...) is merged the way its __init__ merges it.
"""
import importlib
import os
import re
from unittest import mock

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from tests.helpers import ROOT

OBJECTS_FILE = os.path.join(ROOT, "awx", "objects.yml")
PLAYBOOK = os.path.join(ROOT, "playbooks", "awx.yml")
MODULE_PREFIX = "awx.awx."
OMIT = "__llmops_test_omit__"

# Keys of awx/objects.yml items that the playbook consumes itself instead of passing them to a module.
DATA_KEYS = {"job_template": {"survey", "planned"}}


class _SpecCaptured(Exception):
    def __init__(self, argument_spec):
        super().__init__("argument_spec captured")
        self.argument_spec = argument_spec


class _SpecCapturingModule:
    """Stands in for ControllerAPIModule: hands the spec back instead of parsing parameters."""

    def __init__(self, argument_spec=None, **_kwargs):
        raise _SpecCaptured(argument_spec)


def module_argument_spec(short_name):
    """The full argument spec of awx.awx.<short_name>, as the module would validate its parameters."""
    module = importlib.import_module("ansible_collections.awx.awx.plugins.modules." + short_name)
    with mock.patch.object(module, "ControllerAPIModule", _SpecCapturingModule):
        try:
            module.main()
        except _SpecCaptured as captured:
            spec = captured.argument_spec
        else:
            raise AssertionError("awx.awx.%s main() built no ControllerAPIModule" % short_name)
    full = dict(module.ControllerAPIModule.AUTH_ARGSPEC)
    full.update(spec)
    return full


def validate_params(short_name, params):
    """Errors of the module's own argument validation (types, choices, required) for these parameters."""
    result = ArgumentSpecValidator(module_argument_spec(short_name)).validate(params)
    return [str(error) for error in result.errors]


def _loader():
    loader = DataLoader()
    loader.set_basedir(os.path.dirname(PLAYBOOK))
    return loader


def load_objects():
    """awx/objects.yml with Ansible's loader (it keeps !unsafe values, the injectors' AWX templates)."""
    return _loader().load_from_file(OBJECTS_FILE)


def load_play():
    with open(PLAYBOOK) as handle:
        plays = yaml.safe_load(handle)
    assert len(plays) == 1, "playbooks/awx.yml is one play"
    return plays[0]


def module_tasks():
    """[(module short name, task)] of the play's awx.awx tasks."""
    found = []
    for task in load_play()["tasks"]:
        modules = [key for key in task if key.startswith(MODULE_PREFIX)]
        if modules:
            found.append((modules[0][len(MODULE_PREFIX):], task))
    return found


def play_variables(env_overrides=None):
    """The play's variables as the playbook sees them: objects.yml, play vars, playbook_dir, omit."""
    variables = dict(load_objects())
    variables.update(load_play().get("vars", {}))
    variables.update(env_overrides or {})
    variables["playbook_dir"] = os.path.dirname(PLAYBOOK)
    variables["omit"] = OMIT
    return variables


def _drop_omitted(value):
    if isinstance(value, dict):
        return {key: _drop_omitted(item) for key, item in value.items() if item != OMIT}
    return value


def rendered_calls(short_name, task, extra_vars=None):
    """[(item, module parameters)] for each loop item the task runs (skipped items left out), rendered with
    the play's variables, module_defaults merged under the task's own arguments, omitted ones dropped."""
    variables = play_variables(extra_vars)
    templar = Templar(loader=_loader(), variables=variables)
    defaults = templar.template(load_play().get("module_defaults", {}).get("group/awx.awx.controller", {}))
    calls = []
    for item in templar.template(task["loop"]):
        item_vars = dict(variables, item=item)
        templar.available_variables = item_vars
        for name, expression in (task.get("vars") or {}).items():
            item_vars[name] = templar.template(expression)
            templar.available_variables = item_vars
        if "when" in task and not templar.template("{{ %s }}" % task["when"]):
            continue
        params = dict(defaults)
        params.update(_drop_omitted(templar.template(task[MODULE_PREFIX + short_name])))
        calls.append((item, params))
    return calls


def injector_templates(value):
    """The AWX input names that an injector's templates ({{ name }}) refer to."""
    if isinstance(value, dict):
        return set().union(*[injector_templates(item) for item in value.values()]) if value else set()
    return set(re.findall(r"{{\s*(\w+)\s*}}", str(value)))


def role_defaults(role):
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        return yaml.safe_load(handle) or {}


def role_options(role):
    """The options of a role's main entry point (meta/argument_specs.yml)."""
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
        return yaml.safe_load(handle)["argument_specs"]["main"]["options"]


def role_spec_errors(role, params):
    """Errors of the role's own argument validation for these variables (only their own options)."""
    options = role_options(role)
    spec = {name: options[name] for name in params}
    return [str(error) for error in ArgumentSpecValidator(spec).validate(params).errors]


def inventory_source_dir():
    """The directory of the inventory that AWX imports (its group_vars/ and host_vars/ come with it)."""
    source_path = Templar(loader=_loader(), variables=play_variables()).template(
        load_objects()["awx_inventory_source_path"])
    return os.path.dirname(os.path.join(ROOT, source_path))


def inventory_group_vars():
    """{path: variables} of every group_vars/host_vars file of the imported inventory."""
    found = {}
    for sub in ("group_vars", "host_vars"):
        for folder, _dirs, files in os.walk(os.path.join(inventory_source_dir(), sub)):
            for name in files:
                if name.endswith((".yml", ".yaml")) and not name.startswith("vault"):
                    path = os.path.join(folder, name)
                    with open(path) as handle:
                        found[path] = yaml.safe_load(handle) or {}
    return found


def with_opt_ins(variables):
    """The file's variables with every `*_enabled` switch on: an inventory adds its opt-in instances and
    models by expression (inventories/l20's vLLM instance), and AWX offers every one it can serve."""
    switches = {k: True for k, v in variables.items() if k.endswith("_enabled") and isinstance(v, bool)}
    return dict(variables, **switches)


def inventory_instance_names():
    """Names of the serving instances the imported inventory can serve (opt-ins on), each rendered with its
    own file's variables (names are often `{{ site_name }}` variables; the list may be an expression)."""
    names = []
    for variables in inventory_group_vars().values():
        templar = Templar(loader=_loader(), variables=with_opt_ins(variables))
        instances = templar.template(variables.get("serving_instances", []))
        names.extend(templar.template(instance["name"]) for instance in instances)
    return names


def playbook_closure(playbook):
    """The playbook and the playbooks it imports (site.yml imports the stages), relative to the root."""
    found = {playbook}
    with open(os.path.join(ROOT, playbook)) as handle:
        plays = yaml.safe_load(handle) or []
    for play in plays:
        imported = play.get("ansible.builtin.import_playbook") or play.get("import_playbook")
        if imported:
            path = os.path.normpath(os.path.join(os.path.dirname(playbook), imported))
            found |= playbook_closure(path)
    return found
