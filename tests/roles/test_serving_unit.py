# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Render role serving's systemd unit with Ansible's own Templar and check what systemd would run.

The helpers here (role_vars, render_plan, render_unit, exec_start_argv) are also used by
test_inventory_l20.py, which renders the L20 inventory's unit and compares it with the seed notes.
"""
import os
import re
import shlex

import pytest

from tests.helpers import (
    ROOT,  # noqa: E402
    load_yaml,
    role_templar,
)

ROLE = os.path.join(ROOT, "roles", "serving")
SECRET = "unit-test-key-9f1c2b7e4d"




def _templar(variables):
    return role_templar(ROLE, variables)


def role_vars(extra=None, os_family="Debian"):
    """Role defaults + OS vars + role vars + `extra` (inventory vars, facts), like a play would see them."""
    variables = {}
    variables.update(load_yaml(os.path.join(ROLE, "defaults", "main.yml")))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "%s.yml" % os_family)))
    variables.update(extra or {})
    variables.update(load_yaml(os.path.join(ROLE, "vars", "main.yml")))
    variables.setdefault("ansible_managed", "Ansible managed")
    variables.setdefault("inventory_hostname", "testhost")
    return variables


def _set_fact_expr(name):
    """The expression role serving's tasks/plan.yml sets fact `name` with (tests render the real one)."""
    tasks = load_yaml(os.path.join(ROLE, "tasks", "plan.yml"))
    for task in tasks:
        facts = task.get("ansible.builtin.set_fact") or {}
        if name in facts:
            return facts[name]
    raise AssertionError("no set_fact of %s in tasks/plan.yml" % name)


def render_plan(variables, systemctl_version="systemd 252 (252.38-1~deb12u1)"):
    variables = dict(variables)
    variables["_serving_systemd"] = {"version_text": systemctl_version, "running_units": []}
    templar = _templar(variables)
    version_expr = _set_fact_expr("_serving_systemd_version")
    variables["_serving_systemd_version"] = templar.template(version_expr)
    # the instances the node's driver cannot run are left out first (plan.yml, as the role orders it)
    variables["_serving_refused"] = templar.template(_set_fact_expr("_serving_refused"))
    variables["_serving_instance_plans"] = templar.template(_set_fact_expr("_serving_instance_plans"))
    return variables


def render_unit(variables, index=0):
    """Text of the unit of instance `index`, as the template task would write it."""
    variables = dict(variables)
    variables["_serving_item"] = variables["_serving_instance_plans"][index]
    variables.setdefault("_serving_uid_gid", "998:998")
    with open(os.path.join(ROLE, "templates", "serving.service.j2")) as handle:
        source = handle.read()
    return _templar(variables).template(source, preserve_trailing_newlines=True, escape_backslashes=False)


def unit_sections(text):
    """{section: [(key, value), ...]} of a unit file."""
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^\[(\w+)\]$", line)
        if match:
            current = sections.setdefault(match.group(1), [])
            continue
        key, _, value = line.partition("=")
        current.append((key, value))
    return sections


def directive(text, section, key):
    values = [v for k, v in unit_sections(text).get(section, []) if k == key]
    return values


def exec_start_argv(text):
    """ExecStart as systemd splits it: double quotes, backslash escapes, then %% -> % and $$ -> $."""
    (line,) = directive(text, "Service", "ExecStart")
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(line)]


TINY = {"tiny": {"path": "/srv/models/tiny/tiny.gguf", "sha256": "cd" * 32}}
CPP = {"mode": "host", "binary": "/opt/llama.cpp/builds/b42/bin/llama-server", "build_id": "b42",
       "version": "0.5.0-dev"}


def variables_for(instances, **extra):
    base = {"serving_instances": instances, "llmops_models": TINY, "llmops_llama_cpp": CPP,
            "serving_api_keys": {}}
    base.update(extra)
    return render_plan(role_vars(base), systemctl_version=extra.pop("systemctl", "systemd 252 (252.38)"))


def test_unit_runs_host_binary_with_table_argv_and_markers():
    v = variables_for([{"name": "tiny", "model": "tiny", "port": 18003, "gpus": [],
                        "settings": {"ctx_size": 512}}])
    text = render_unit(v)
    argv = exec_start_argv(text)
    assert argv[0] == CPP["binary"]
    assert argv[argv.index("--model") + 1] == "/srv/models/tiny/tiny.gguf"
    assert argv[argv.index("--ctx-size") + 1] == "512"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--jinja" in argv and "--metrics" in argv       # role defaults merged under instance settings
    env = directive(text, "Service", "Environment")
    assert "LLMOPS_BUILD_ID=b42" in env and "LLMOPS_MODEL_SHA256=" + "cd" * 32 in env
    assert directive(text, "Service", "User") == ["llama"]
    assert directive(text, "Service", "Restart") == ["on-failure"]
    assert directive(text, "Service", "LimitMEMLOCK") == []
    assert not any(k.startswith("CUDA_VISIBLE_DEVICES") for k in env)
    assert directive(text, "Service", "EnvironmentFile") == ["/etc/llama-server/tiny.env"]   # instance env
    assert v["_serving_instance_plans"][0]["unit"] == "llama-server-tiny.service"


def test_a_build_or_model_change_changes_the_unit():
    inst = [{"name": "tiny", "model": "tiny", "port": 18003}]
    before = render_unit(variables_for(inst))
    after_build = render_unit(variables_for(inst, llmops_llama_cpp=dict(CPP, build_id="b43")))
    new_model = {"tiny": dict(TINY["tiny"], sha256="ef" * 32)}
    after_model = render_unit(variables_for(inst, llmops_models=new_model))
    assert before != after_build and before != after_model
    assert render_unit(variables_for(inst)) == before      # stable: no timestamps, no ordering noise


def test_key_never_in_unit_only_its_file():
    v = variables_for([{"name": "pub", "model": "tiny", "host": "0.0.0.0", "port": 18003}],
                      serving_api_keys={"pub": SECRET})
    text = render_unit(v)
    assert SECRET not in text
    assert SECRET not in repr(v["_serving_instance_plans"])
    argv = exec_start_argv(text)
    assert argv[argv.index("--api-key-file") + 1] == "/etc/llama-server/pub.key"
    assert "--api-key" not in argv


def test_open_bind_without_key_fails_the_plan():
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError, match=r"binds 0\.0\.0\.0 without an API key"):
        variables_for([{"name": "pub", "model": "tiny", "host": "0.0.0.0", "port": 18003}])
    # an empty key (e.g. vault var missing) counts as no key
    with pytest.raises(AnsibleError, match="without an API key"):
        variables_for([{"name": "pub", "model": "tiny", "host": "0.0.0.0", "port": 18003}],
                      serving_api_keys={"pub": ""})


def test_gpu_instance_sees_only_its_gpus_and_relative_main_gpu():
    gpus = {"present": True, "count": 4, "gpus": [{"index": i, "uuid": "GPU-%d" % i} for i in range(4)]}
    v = variables_for([{"name": "q", "model": "tiny", "port": 18003, "gpus": [2, 3],
                        "settings": {"main_gpu": 2, "tensor_split": [0.5, 0.5]}}], llmops_gpus=gpus)
    text = render_unit(v)
    assert 'CUDA_VISIBLE_DEVICES=2,3' in directive(text, "Service", "Environment")[-1]
    argv = exec_start_argv(text)
    assert argv[argv.index("--main-gpu") + 1] == "0"
    # serving_gpu_isolation: the sandbox opens only GPUs 2 and 3, which the driver numbers 0 and 1 inside it
    text = render_unit(dict(v, serving_gpu_isolation=True))
    assert 'CUDA_VISIBLE_DEVICES=0,1' in directive(text, "Service", "Environment")[-1]
    assert exec_start_argv(text)[argv.index("--main-gpu") + 1] == "0"
    # without the sandbox the node's numbers stay
    text = render_unit(dict(v, serving_hardening=False, serving_gpu_isolation=True))
    assert 'CUDA_VISIBLE_DEVICES=2,3' in directive(text, "Service", "Environment")[-1]


def test_systemd_219_unit_for_centos7():
    v = variables_for([{"name": "q", "model": "/home/models/q/q.gguf", "port": 18003,
                        "settings": {"mmap": False, "mlock": True}}], systemctl="systemd 219\n+PAM")
    text = render_unit(v)
    sections = unit_sections(text)
    service = dict(sections["Service"])
    assert service["StartLimitInterval"] == "600" and service["StartLimitBurst"] == "5"
    assert "StartLimitIntervalSec" not in dict(sections["Unit"])
    assert service["ProtectSystem"] == "full"
    assert service["ProtectHome"] == "read-only"            # the model lives under /home
    assert service["LimitMEMLOCK"] == "infinity"
    assert int(service["TimeoutStartSec"]) >= 600
    for newer in ("ProtectKernelTunables", "RestrictNamespaces", "ReadWritePaths", "LockPersonality",
                  "ProtectClock", "RestartMaxDelaySec", "DynamicUser", "LoadCredential"):
        assert newer not in service, newer
    # a CPU-only instance opens no device; 219 knows DevicePolicy= and PrivateDevices=
    assert service["PrivateDevices"] == "yes" and service["DevicePolicy"] == "closed"


def test_systemd_252_unit_gets_the_strict_set():
    v = variables_for([{"name": "q", "model": "tiny", "port": 18003}], systemctl="systemd 252 (252.38)")
    text = render_unit(v)
    sections = unit_sections(text)
    service = dict(sections["Service"])
    assert dict(sections["Unit"])["StartLimitIntervalSec"] == "600"
    assert "StartLimitInterval" not in service
    assert service["ProtectSystem"] == "strict" and service["ProtectHome"] == "yes"
    assert service["ReadWritePaths"] == "/var/lib/llama-server"
    for directive_name in ("NoNewPrivileges", "PrivateTmp", "ProtectKernelTunables",
                           "RestrictAddressFamilies"):
        assert directive_name in service
    assert service["PrivateDevices"] == "yes"        # CPU-only (GPUs: tests/roles/test_unit_hardening.py)


def test_hardening_can_be_switched_off():
    v = variables_for([{"name": "q", "model": "tiny", "port": 18003}], serving_hardening=False)
    assert "ProtectSystem" not in render_unit(v)


def test_container_unit_runs_docker_with_only_its_gpus():
    v = variables_for([{"name": "q", "model": "tiny", "port": 8003, "host": "0.0.0.0", "gpus": [2, 3],
                        "settings": {"main_gpu": 3, "mlock": True}}],
                      llmops_llama_cpp={"mode": "container", "image": "llmops/llama.cpp:b42",
                                        "build_id": "b42", "binary": "/opt/llama.cpp/bin/llama-server"},
                      serving_api_keys={"q": SECRET})
    text = render_unit(v)
    argv = exec_start_argv(text)
    assert argv[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    assert argv[argv.index("--user") + 1] == "998:998"
    assert argv[argv.index("--main-gpu") + 1] == "1"
    # llama-server's path inside the image comes from the container build's fact
    assert argv[argv.index("--entrypoint") + 1] == "/opt/llama.cpp/bin/llama-server"
    assert argv.index("--entrypoint") < argv.index("llmops/llama.cpp:b42")
    assert directive(text, "Unit", "Requires") == ["docker.service"]
    assert directive(text, "Service", "ExecStop")[0].startswith("/usr/bin/docker stop")
    assert directive(text, "Service", "User") == []
    assert SECRET not in text
    v = variables_for([{"name": "q", "model": "tiny", "port": 8003}],
                      serving_image={"llama.cpp": "ghcr.io/x/server:1"},
                      serving_mode={"llama.cpp": "container"},
                      serving_container_entrypoint={"llama.cpp": "/app/llama-server"},
                      llmops_llama_cpp={})
    argv = exec_start_argv(render_unit(v))
    assert argv[argv.index("--entrypoint") + 1] == "/app/llama-server"
    assert "ghcr.io/x/server:1" in argv
