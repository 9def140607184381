# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Instance environment (`serving_instances[].env`) is secret: a 0600 file, never the unit.

Issue 9: values such as LLAMA_API_KEY or HF_TOKEN used to land in the 0644 unit as Environment= and, in
container mode, on the `docker run -e` command line (ps, docker inspect's Args). They now go to
<serving_config_dir>/<instance>.env (root:root 0600), read by systemd (EnvironmentFile=, host mode) or by
the docker client (--env-file, container mode), both as root before anything runs as the service user.

The env file is rendered with Ansible's own Templar, then read back with parsers that follow systemd's
EnvironmentFile rules (src/basic/env-file.c, old and new escape handling, value checks by version) and
docker's --env-file rules (opts/envfile.go: one line per variable, no quoting), so awkward values are checked
to round-trip exactly as the engine will see them.
"""
import os
import re
from collections import OrderedDict

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils.container import docker_run_args
from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import plan_instances
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

from tests.helpers import load_yaml, role_templar
from tests.roles.test_serving_unit import (
    CPP,
    ROLE,
    directive,
    exec_start_argv,
    render_unit,
    variables_for,
)

API_KEY = "env-secret-llama-api-key-4c1d9e"
HF_TOKEN = "hf_envSecretToken7b2e0a"
CONTAINER_CPP = {"mode": "container", "image": "llmops/llama.cpp:b42", "build_id": "b42",
                 "binary": "/opt/llama.cpp/bin/llama-server"}

# Values that break naive quoting: quotes, backslashes, $, %, backticks, spaces kept at both ends, comment
# and assignment characters, an empty value, non-ASCII, a tab.
AWKWARD = OrderedDict([
    ("DQ", 'say "hi" to "them"'),
    ("SQ", "it's"),
    ("BS", "back\\slash and C:\\path\\"),
    ("BS_QUOTE", '\\" and \\\\" and "\\'),
    ("DOLLAR", "$HOME ${HOME} $$ $(id) `id`"),
    ("PERCENT", "50% %n %% %i"),
    ("SPACES", "  two leading, two trailing  "),
    ("HASH", "#not-a-comment ;nor-this"),
    ("EQ", "a=b=c"),
    ("EMPTY", ""),
    ("UNICODE", "ünïcødé ✓"),
    ("TAB", "a\tb"),
    ("LLAMA_API_KEY", API_KEY),
    ("HF_TOKEN", HF_TOKEN),
])
MULTILINE = OrderedDict([("PEM", "-----BEGIN-----\nline \"two\"\\\n-----END-----"), ("NL_END", "x\n")])


# --- what systemd and docker read ----------------------------------------------------------------------

def parse_systemd_env_file(text, systemd_version=252, legacy_escapes=False):
    """EnvironmentFile= as systemd's parse_env_file_internal reads it, then its value checks.

    legacy_escapes: older systemd drops the backslash of ANY escaped character inside double quotes; newer
    ones unescape only " \\ ` $ and keep the backslash otherwise. Assignments systemd would ignore (invalid
    name, control characters the version refuses: all but TAB before 239, all but TAB/NL before 248) are
    dropped, as systemd drops them with a warning.
    """
    whitespace, newline, comments, need_escape = " \t\n\r", "\n\r", "#;", '"\\`$'
    out = {}
    state = "PRE_KEY"
    key, value = [], []
    last_key_ws = last_value_ws = None

    def push(chomp):
        name = "".join(key[:last_key_ws] if last_key_ws is not None else key)
        val = value[:last_value_ws] if (chomp and last_value_ws is not None) else value
        out[name] = "".join(val)

    for c in text:
        if state == "PRE_KEY":
            if c in comments:
                state = "COMMENT"
            elif c not in whitespace:
                state, key, last_key_ws = "KEY", [c], None
        elif state == "KEY":
            if c in newline:
                state, key = "PRE_KEY", []
            elif c == "=":
                state, value, last_value_ws = "PRE_VALUE", [], None
            else:
                if c not in whitespace:
                    last_key_ws = None
                elif last_key_ws is None:
                    last_key_ws = len(key)
                key.append(c)
        elif state == "PRE_VALUE":
            if c in newline:
                push(False)
                state = "PRE_KEY"
            elif c == "'":
                state = "SINGLE_QUOTE"
            elif c == '"':
                state = "DOUBLE_QUOTE"
            elif c == "\\":
                state = "VALUE_ESCAPE"
            elif c not in whitespace:
                state = "VALUE"
                value.append(c)
        elif state == "VALUE":
            if c in newline:
                push(True)
                state = "PRE_KEY"
            elif c == "\\":
                state, last_value_ws = "VALUE_ESCAPE", None
            else:
                if c not in whitespace:
                    last_value_ws = None
                elif last_value_ws is None:
                    last_value_ws = len(value)
                value.append(c)
        elif state == "VALUE_ESCAPE":
            state = "VALUE"
            if c not in newline:
                value.append(c)
        elif state == "SINGLE_QUOTE":
            if c == "'":
                state = "PRE_VALUE"
            else:
                value.append(c)
        elif state == "DOUBLE_QUOTE":
            if c == '"':
                state = "PRE_VALUE"
            elif c == "\\":
                state = "DOUBLE_QUOTE_ESCAPE"
            else:
                value.append(c)
        elif state == "DOUBLE_QUOTE_ESCAPE":
            state = "DOUBLE_QUOTE"
            if legacy_escapes:
                if c not in newline:
                    value.append(c)
            elif c in need_escape:
                value.append(c)
            elif c != "\n":
                value.extend(["\\", c])
        elif state == "COMMENT":
            if c == "\\":
                state = "COMMENT_ESCAPE"
            elif c in newline:
                state = "PRE_KEY"
        elif state == "COMMENT_ESCAPE":
            state = "PRE_KEY" if c in newline else "COMMENT"
    if state in ("PRE_VALUE", "VALUE", "VALUE_ESCAPE", "SINGLE_QUOTE", "DOUBLE_QUOTE", "DOUBLE_QUOTE_ESCAPE"):
        push(state == "VALUE")

    allowed_cc = "\t" if systemd_version < 239 else ("\t\n" if systemd_version < 248 else None)
    valid = {}
    for name, val in out.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            continue
        if allowed_cc is not None and any((ord(ch) < 32 or ord(ch) == 127) and ch not in allowed_cc
                                          for ch in val):
            continue
        valid[name] = val
    return valid


def parse_docker_env_file(text):
    """`docker run --env-file` as the docker CLI reads it (opts/envfile.go): literal values, one per line."""
    out = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines):
        if line.endswith("\r"):              # bufio.ScanLines drops a CR before the LF
            line = line[:-1]
        if number == 0 and line.startswith("\ufeff"):
            line = line[1:]
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        name, has_value, val = line.partition("=")
        name = name.lstrip(" \t")
        if not name or re.search(r"[ \t]", name):
            raise ValueError("docker refuses the line %r" % line)
        if not has_value:
            raise ValueError("a bare name passes the CLI's own environment through: %r" % name)
        out[name] = val
    return out


def test_the_parsers_follow_systemd_and_docker():
    text = ('# c\n; c\nA=plain  \nB = "q \\"x\\" \\\\ \\$ \\n"\nC=\'s "x" \\\'\nD=a\\\n  b\nE\nF="x\ny"\n'
            '1BAD=x\n')
    assert parse_systemd_env_file(text) == OrderedDict(
        [("A", "plain"), ("B", 'q "x" \\ $ \\n'), ("C", 's "x" \\'), ("D", "a  b"), ("F", "x\ny")])
    assert parse_systemd_env_file(text, legacy_escapes=True)["B"] == 'q "x" \\ $ n'
    assert "F" not in parse_systemd_env_file(text, systemd_version=219)      # NL: ignored before 239
    assert parse_docker_env_file("# c\nA= x \"y\" \\ \r\n  B=\n") == {"A": ' x "y" \\ ', "B": ""}


# --- helpers -----------------------------------------------------------------------------------------------

def render_env_file(variables, index=0):
    """Text of the env file of instance `index`, as the role's template task would write it."""
    variables = dict(variables)
    variables["_serving_item"] = variables["_serving_instance_plans"][index]
    with open(os.path.join(ROLE, "templates", "serving.env.j2")) as handle:
        source = handle.read()
    return role_templar(ROLE, variables).template(source, preserve_trailing_newlines=True,
                                                  escape_backslashes=False)


def host_vars(env, **extra):
    return variables_for([{"name": "q", "model": "tiny", "port": 18003, "env": dict(env)}], **extra)


def container_vars(env, **extra):
    extra.setdefault("llmops_llama_cpp", CONTAINER_CPP)
    return variables_for([{"name": "q", "model": "tiny", "port": 18003, "gpus": [], "env": dict(env)}],
                         **extra)


def tasks_of(name):
    return load_yaml(os.path.join(ROLE, "tasks", name))


def module_args(task):
    for key, value in task.items():
        if key.startswith("ansible.builtin."):
            return key, value if isinstance(value, dict) else {}
    return None, {}


def secrets_in(text, env):
    return [name for name, value in env.items() if len(value) > 3 and value in text]


# --- the unit carries no value -------------------------------------------------------------------------

def test_host_unit_names_the_env_file_and_holds_no_value():
    v = host_vars(AWKWARD)
    text = render_unit(v)
    assert secrets_in(text, AWKWARD) == []
    assert directive(text, "Service", "EnvironmentFile") == ["/etc/llama-server/q.env"]
    names = [e.strip('"').split("=", 1)[0] for e in directive(text, "Service", "Environment")]
    assert not set(names) & set(AWKWARD), names
    assert secrets_in(" ".join(exec_start_argv(text)), AWKWARD) == []
    # the plan (a fact, printed by set_fact with -v) keeps names only
    assert secrets_in(repr(v["_serving_instance_plans"]), AWKWARD) == []
    assert v["_serving_instance_plans"][0]["env_file"] == "/etc/llama-server/q.env"


def test_gpus_stay_visible_in_the_unit_they_are_not_secret():
    gpus = {"present": True, "count": 4, "gpus": [{"index": i, "uuid": "GPU-%d" % i} for i in range(4)]}
    v = variables_for([{"name": "q", "model": "tiny", "port": 18003, "gpus": [2, 3],
                        "env": {"HF_TOKEN": HF_TOKEN}}], llmops_gpus=gpus)
    text = render_unit(v)
    assert "CUDA_VISIBLE_DEVICES=2,3" in directive(text, "Service", "Environment")[-1]
    assert HF_TOKEN not in text
    assert "CUDA_VISIBLE_DEVICES" not in parse_systemd_env_file(render_env_file(v))


def test_container_unit_passes_env_file_not_dash_e():
    v = container_vars(AWKWARD)
    text = render_unit(v)
    assert secrets_in(text, AWKWARD) == []
    argv = exec_start_argv(text)
    docker_args = argv[:argv.index(CONTAINER_CPP["image"])]
    assert docker_args[docker_args.index("--env-file") + 1] == "/etc/llama-server/q.env"
    # on the command line only what the role computes: the service user's writable HOME
    dash_e = [docker_args[i + 1] for i, a in enumerate(docker_args) if a in ("-e", "--env")]
    assert dash_e == ["HOME=/var/lib/llama-server"]
    assert not any(a.startswith(("-e=", "--env=")) for a in docker_args)
    # the docker client itself must not get the instance's variables (DOCKER_HOST, ...): no EnvironmentFile=
    assert directive(text, "Service", "EnvironmentFile") == []


def test_docker_run_args_never_put_instance_env_on_the_command_line():
    p = plan_instances([{"name": "q", "model": "/m/q.gguf", "port": 1, "env": {"HF_TOKEN": HF_TOKEN}}],
                       builds={"llama.cpp": CONTAINER_CPP}, key_dir="/etc/ls")[0]
    args = docker_run_args(p)
    assert HF_TOKEN not in " ".join(args)
    assert args[args.index("--env-file") + 1] == "/etc/ls/q.env"
    assert args.index("--env-file") < args.index(CONTAINER_CPP["image"])
    assert HF_TOKEN not in repr(p)


# --- the env file: round trip ------------------------------------------------------------------------

@pytest.mark.parametrize("legacy_escapes", [False, True])
@pytest.mark.parametrize("systemctl,version", [("systemd 219", 219), ("systemd 252 (252.38)", 252)])
def test_host_env_file_round_trips_awkward_values(systemctl, version, legacy_escapes):
    v = host_vars(AWKWARD, systemctl=systemctl)
    text = render_env_file(v)
    assert parse_systemd_env_file(text, systemd_version=version, legacy_escapes=legacy_escapes) == AWKWARD


@pytest.mark.parametrize("legacy_escapes", [False, True])
def test_host_env_file_round_trips_multiline_values_on_systemd_239_and_later(legacy_escapes):
    env = OrderedDict(list(AWKWARD.items()) + list(MULTILINE.items()))
    text = render_env_file(host_vars(env, systemctl="systemd 252 (252.38)"))
    assert parse_systemd_env_file(text, systemd_version=252, legacy_escapes=legacy_escapes) == env


def test_container_env_file_round_trips_awkward_values():
    v = container_vars(AWKWARD)
    assert parse_docker_env_file(render_env_file(v)) == AWKWARD


def test_env_file_without_env_is_written_empty():
    for v in (host_vars({}), container_vars({})):
        text = render_env_file(v)
        assert parse_systemd_env_file(text) == {} and parse_docker_env_file(text) == {}


def test_env_file_quoting_of_quotes_backslashes_dollars_spaces():
    text = render_env_file(host_vars({"V": 'a "b" \\c $d  '}))
    (line,) = [li for li in text.splitlines() if li.startswith("V=")]
    # double-quoted, shell-style escapes only: valid for systemd (any version) and for `. file` in sh
    assert line == 'V="a \\"b\\" \\\\c \\$d  "'


# --- refusals: said before anything is written, never quoting the value --------------------------------

@pytest.mark.parametrize("env,mode,message", [
    ({"PEM": "pem-a\npem-b"}, "container", r"PEM.*newline.*--env-file"),
    ({"X": "cr-a\rcr-b"}, "container", r"X.*control character"),
    ({"X": "esc-a\x1besc-b"}, "host", r"X.*control character"),
    ({"X": "nul-a\x00nul-b"}, "host", r"X.*NUL"),
    ({"1X": "value-1"}, "host", r"1X.*name"),
    ({"A-B": "value-2"}, "host", r"A-B.*name"),
    ({"A B": "value-3"}, "container", r"A B.*name"),
    ({"X": None}, "host", r"X.*no value"),
])
def test_bad_env_is_refused_without_quoting_the_value(env, mode, message):
    cpp = CONTAINER_CPP if mode == "container" else CPP
    with pytest.raises(ServingError, match=message) as info:
        plan_instances([{"name": "q", "model": "/m/q.gguf", "port": 1, "env": env}],
                       builds={"llama.cpp": cpp},
                       systemd_version=252)
    for value in env.values():
        if value:
            assert value not in str(info.value)


def test_newlines_refused_in_host_mode_before_systemd_239():
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError, match=r"PEM.*newline.*systemd 219") as info:
        host_vars({"PEM": MULTILINE["PEM"]}, systemctl="systemd 219\n+PAM")
    assert "BEGIN" not in str(info.value)
    host_vars(MULTILINE, systemctl="systemd 239")


# --- the tasks: the deployment lifecycle writes, restores and keeps the env file like the unit -------------

def _template(expr, **variables):
    """`expr` with the role's vars/main.yml (its derived names, such as _serving_deploy_changed) under
    `variables`."""
    merged = load_yaml(os.path.join(ROLE, "vars", "main.yml"))
    merged.update(variables)
    return role_templar(ROLE, merged).template(expr)


def _flatten(tasks):
    out = []
    for task in tasks:
        out.append(task)
        for sub in ("block", "rescue", "always"):
            out.extend(_flatten(task.get(sub) or []))
    return out


def _task_named(tasks, fragment):
    found = [t for t in _flatten(tasks) if fragment in t.get("name", "")]
    assert len(found) == 1, "want one task named like %r, got %d" % (fragment, len(found))
    return found[0]


def lifecycle_steps(name):
    """{state: task} of the deployment module's tasks in tasks/<name>."""
    return dict((t["llmops.serving.deployment"]["state"], t) for t in _flatten(tasks_of(name))
                if "llmops.serving.deployment" in t)


def test_env_file_is_written_by_the_lifecycle_from_the_template_and_never_shown():
    from ansible_collections.llmops.serving.plugins.modules import deployment

    from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs

    deploy = lifecycle_steps("instance.yml")["deploy"]
    args = deploy["llmops.serving.deployment"]
    assert args["env_file"] == "{{ _serving_item.env_file }}"
    assert "serving.env.j2" in args["env_content"] and "serving.service.j2" in args["unit_content"]
    assert args["dir"] == "{{ serving_deployments_dir }}"
    # the content is a no_log option: Ansible masks it wherever it would print it
    assert capture_module_kwargs(deployment)["argument_spec"]["env_content"]["no_log"] is True
    # the key file (its own task) is written before the unit that names it
    names = [t.get("name", "") for t in tasks_of("instance.yml")]
    assert names.index(deploy["name"]) > [i for i, n in enumerate(names) if "API key file" in n][0]


UNCHANGED = {"changed": False, "unit_changed": False, "env_changed": False, "rollback": []}
SKIPPED = {"changed": False, "skipped": True}
ENV_ONLY = {"changed": True, "unit_changed": False, "env_changed": True, "rollback": ["environment file"]}


def test_env_change_restarts_the_instance_like_a_unit_change():
    task = _task_named(tasks_of("instance.yml"), "Restart or start")
    _, args = module_args(task)
    assert _template(args["state"], _serving_deploy=ENV_ONLY, _serving_key=SKIPPED) == "restarted"
    assert _template(args["daemon_reload"], _serving_deploy=ENV_ONLY) in (False, "False")
    assert _template(args["state"], _serving_deploy=UNCHANGED, _serving_key=SKIPPED) == "started"
    # a unit an earlier run wrote and never proved (it stopped before the gate): nothing is written now, but
    # the change is this run's to restart and gate
    pending = {"changed": False, "unit_changed": True, "env_changed": False, "rollback": ["unit"]}
    assert _template(args["state"], _serving_deploy=pending, _serving_key=SKIPPED) == "restarted"


def test_rollback_runs_when_only_the_env_file_changed_and_not_on_a_first_deployment():
    task = _task_named(tasks_of("instance.yml"), "Roll back")
    when = task["when"] if isinstance(task["when"], str) else " and ".join("(%s)" % w for w in task["when"])
    got = _template("{{ %s }}" % when, serving_rollback=True, _serving_deploy=ENV_ONLY)
    assert got is True or got == "True"
    first = dict(ENV_ONLY, unit_changed=True, rollback=[])
    got = _template("{{ %s }}" % when, serving_rollback=True, _serving_deploy=first)
    assert got is False or got == "False"


def test_rollback_restores_through_the_lifecycle_then_restarts():
    """The files the change replaced come back (the module's own tests: test_deployment.py), the failed
    unit is kept, no copy of the failed env file is."""
    steps = lifecycle_steps("rollback.yml")
    restore = steps["restore"]["llmops.serving.deployment"]
    assert restore["env_file"] == "{{ _serving_item.env_file }}"
    assert restore["keep_failed_unit"] == "{{ _serving_failed_unit }}"
    names = [t["name"] for t in tasks_of("rollback.yml")]
    restart = [i for i, n in enumerate(names) if n.startswith("Restart on the previous unit")][0]
    assert names.index(steps["restore"]["name"]) < restart
    assert set(steps) == {"restore"}


def test_a_healthy_change_is_committed_after_the_gate():
    """record.yml commits (before.* become previous.*, root 0600 in a root 0700 directory) and runs only after
    the block whose rescue ends in a failure, i.e. once healthy."""
    commit = lifecycle_steps("record.yml")["commit"]["llmops.serving.deployment"]
    assert commit["unit_changed"] == "{{ _serving_deploy.unit_changed }}"
    assert commit["env_changed"] == "{{ _serving_deploy.env_changed }}"
    instance = tasks_of("instance.yml")
    (include,) = [t for t in instance if "record.yml" in str(t.get("ansible.builtin.include_tasks"))]
    assert instance.index(include) == len(instance) - 1



# --- the deployment lock: every step of one run passes that run's token (issue 34) --------------------------

FLEET = os.path.join(os.path.dirname(ROLE), "fleet")


def test_every_lifecycle_step_passes_this_runs_token():
    """deploy (instance.yml; again with lock_takeover when the lock's owner is a dead run), restore
    (rollback.yml), commit (record.yml), release (instance.yml's rescue)
    and query/swap/release for role fleet and playbooks/rollback.yml (deployment.yml): one token per run."""
    steps = {}
    for name in ("instance.yml", "rollback.yml", "record.yml", "deployment.yml"):
        for task in _flatten(tasks_of(name)):
            if "llmops.serving.deployment" in task:
                args = task["llmops.serving.deployment"]
                assert args["lock_token"] == "{{ _serving_run.token }}", (name, task["name"])
                steps.setdefault(name, []).append(args["state"])
    assert steps == {"instance.yml": ["deploy", "deploy", "release"], "rollback.yml": ["restore"],
                     "record.yml": ["commit"], "deployment.yml": ["{{ serving_deployment_step }}"]}
    # the steps that take the lock say who holds it and for how long
    for name, state in (("instance.yml", "deploy"), ("deployment.yml", "{{ serving_deployment_step }}")):
        args = lifecycle_steps(name)[state]["llmops.serving.deployment"]
        assert args["lock_holder"] == "{{ _serving_run.holder }}"
        assert args["lock_timeout"] == "{{ _serving_lock_timeout }}"


def test_the_run_is_named_once_before_any_step():
    (named,) = tasks_of("run.yml")
    assert named["ansible.builtin.set_fact"]["_serving_run"] == \
        "{{ ansible_play_name | llmops.serving.fleet_deployment_run }}"
    assert named["when"] == "_serving_run is not defined"          # kept: the same token for the whole run
    for name, before in (("main.yml", "Deploy each instance"), ("deployment.yml", "Carry out a step")):
        names = [t.get("name", "") for t in tasks_of(name)]
        imported = [i for i, t in enumerate(tasks_of(name))
                    if t.get("ansible.builtin.import_tasks") == "run.yml"]
        assert imported and imported[0] < [i for i, n in enumerate(names) if n.startswith(before)][0]


def test_a_failed_gate_gives_the_lock_back_after_its_rollback():
    """restore gives it back itself; without a restore (serving_rollback false, a first deployment) the
    release does, before the failure ends the host."""
    block = [t for t in tasks_of("instance.yml") if "rescue" in t][0]
    names = [t["name"] for t in block["rescue"]]
    release = [i for i, n in enumerate(names) if n.startswith("Release the deployment lock")]
    rollback = [i for i, n in enumerate(names) if n.startswith("Roll back to the previous unit")]
    report = [i for i, n in enumerate(names) if n.startswith("Report why")]
    assert release and rollback[0] < release[0] < report[0]
    assert "when" not in block["rescue"][release[0]]


def test_the_fleets_swap_is_released_whatever_happens():
    tasks = load_yaml(os.path.join(FLEET, "tasks", "restore.yml"))
    swap = [t for t in tasks if (t.get("vars") or {}).get("serving_deployment_step") == "swap"]
    (block,) = [t for t in tasks if "block" in t]
    assert swap and tasks.index(swap[0]) < tasks.index(block)      # a refused swap took no lock
    (release,) = block["always"]
    assert release["vars"] == {"serving_deployment_step": "release",
                               "serving_deployment_instance": "{{ _fleet_instance }}"}


@pytest.mark.parametrize("scope, want", [
    ({"_serving_item": {"engine": "vllm"}}, 2 * (1800 + 90) + 600),
    ({"_serving_item": {"engine": "llama.cpp"}}, 2 * (900 + 90) + 600),
    ({"serving_deployment_record": {"health_timeout": 300}}, 2 * (300 + 90) + 600),
    ({}, 2 * (1800 + 90) + 600),                       # a query or release: the longest gate
])
def test_the_lock_outlasts_a_restart_the_gate_and_a_rollback(scope, want):
    defaults = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    assert int(_template("{{ _serving_lock_timeout }}", **dict(defaults, **scope))) == want
