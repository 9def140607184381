# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One env-file reader (issue 23): what role serving writes for systemd (host mode) and for docker (container
mode) reads back exactly, with module_utils/_serving/env_file.parse_env_text; llm_benchmark uses it, and so
does roles/serving/files/serving-wait.py on the node, with this module installed beside it by role serving."""
import http.server
import os
import subprocess
import threading

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.module_utils._serving import env_file
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import check_env, env_file_lines

from tests.helpers import install_serving_wait

PY36 = os.path.expanduser("~/.pyenv/versions/3.6.15/bin/python3.6")

HOST_VALUES = {"A": "sk-abc", "B": "sk-abc\n", "C": 'say "hi" $HOME `id` \\n \\', "D": "", "E": "  padded  ",
               "F": "line1\nline2\n", "G": "#not-a-comment", "H": "'single'", "I": "tab\there", "J": "é ü"}
CONTAINER_VALUES = {"A": "sk-abc", "C": 'say "hi" $HOME `id` \\n \\', "D": "", "E": "  padded  ",
                    "H": "'single'", "K": '"quoted"', "J": "é ü"}
SYSTEMD_HEADER = "# read as root by systemd (EnvironmentFile= of x.service).\n"
DOCKER_HEADER = "# root:root 0600, read as root by the docker client (docker run --env-file).\n"


def _file(values, mode, header):
    env = check_env(values, mode, systemd_version=252)
    return header + "".join(line + "\n" for line in env_file_lines(env, mode))


def test_host_mode_files_read_back_exactly():
    text = _file(HOST_VALUES, "host", SYSTEMD_HEADER)
    assert env_file.parse_env_text(text) == HOST_VALUES
    assert lb.parse_env_file(text) == HOST_VALUES


def test_container_mode_files_read_back_exactly_by_their_header():
    text = _file(CONTAINER_VALUES, "container", DOCKER_HEADER)
    assert env_file.parse_env_text(text) == CONTAINER_VALUES
    assert env_file.parse_env_text("# llmops-env-format: docker\nK=\"q\"\n") == {"K": '"q"'}
    # the same bytes read as systemd would unquote: the format matters, and the header names it
    assert env_file.parse_env_text(text, "systemd")["K"] == "quoted"


def test_the_old_misreading_is_gone():
    """'"sk-...\\n"' spans two lines: the benchmark's own reader returned it with its opening quote."""
    text = 'VLLM_API_KEY="sk-abc\n"\nNEXT="x"\n'
    assert lb.parse_env_file(text) == {"VLLM_API_KEY": "sk-abc\n", "NEXT": "x"}


@pytest.mark.parametrize("text, expected", [
    ("A=plain value  \n", {"A": "plain value"}),
    ("  # comment\n; other\nA='x y'\n", {"A": "x y"}),
    ('A="x\\\ny"\n', {"A": "xy"}),  # a backslash-newline inside double quotes continues the value
    ("A=one\\\ntwo\n", {"A": "onetwo"}),
    ('A="a\\qb"\n', {"A": "a\\qb"}),  # systemd keeps a backslash before another character
    ("no assignment here\nB=1\n", {"B": "1"}),
])
def test_systemd_rules(text, expected):
    assert env_file.parse_env_text(text) == expected


KEY = "sk-$a`b"  # systemd quoting escapes $ and `: only an unescaping reader gets the key back
# Env files and whether they hold KEY as their own reader (systemd or docker) reads them.
NODE_ENV_FILES = [
    # systemd: the role's quoting of KEY, read back unescaped (a line reader would keep quotes and escapes)
    (SYSTEMD_HEADER + 'HF_TOKEN="x"\nVLLM_API_KEY=%s\n' % env_file.systemd_env_quote(KEY), True),
    # docker: the literal line, as `docker run --env-file` passes it
    (DOCKER_HEADER + "VLLM_API_KEY=%s\n" % KEY, True),
    # the same systemd line under the docker header: docker would pass the quotes on, so this is not KEY
    (DOCKER_HEADER + "VLLM_API_KEY=%s\n" % env_file.systemd_env_quote(KEY), False),
    # no '=': systemd ignores the line, so there is no key
    (SYSTEMD_HEADER + "VLLM_API_KEY %s\n" % KEY, False),
]


@pytest.mark.parametrize("python", ["python3", PY36])
@pytest.mark.parametrize("text, holds_key", NODE_ENV_FILES)
def test_the_health_gate_reads_env_files_with_this_module_on_the_node(tmp_path, python, text, holds_key):
    """serving-wait.py, installed as role serving installs it (the script and this module in its package
    layout) and run isolated as the role runs it, reads the key through this module: a file that holds the
    key passes the gate, one that does not is refused with the server's 401."""
    if not os.path.exists(python) and python != "python3":
        pytest.skip("no Python 3.6 at %s" % python)
    assert (env_file.parse_env_text(text).get("VLLM_API_KEY") == KEY) is holds_key
    command = install_serving_wait(tmp_path / "node", python)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_systemd = {"systemctl": "echo ActiveState=active; echo SubState=running", "journalctl": "true"}
    for name, script in fake_systemd.items():
        (bin_dir / name).write_text("#!/bin/sh\n%s\n" % script)
        (bin_dir / name).chmod(0o755)
    path = tmp_path / "q.env"
    path.write_text(text)
    from tests.roles.test_serving_wait import Models

    httpd = http.server.HTTPServer(("127.0.0.1", 0), type("KeyedEngine", (Models,), {"key": KEY}))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run(command + ["--url", "http://127.0.0.1:%d" % httpd.server_port,
                                         "--unit", "vllm-q.service", "--model", "qwen-local",
                                         "--env-file", str(path), "--key-env", "VLLM_API_KEY",
                                         "--timeout", "5", "--interval", "0.1"],
                              env=dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"])),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=60, check=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    if holds_key:
        assert proc.returncode == 0 and "serving qwen-local" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 1 and "answered 401" in proc.stdout, proc.stdout
