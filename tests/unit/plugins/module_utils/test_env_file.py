# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One env-file reader (issue 23): what role serving writes for systemd (host mode) and for docker (container
mode) reads back exactly, with module_utils/env_file.parse_env_text; llm_benchmark uses it and
roles/serving/files/serving-wait.py carries a verbatim copy of it (it runs alone on the node)."""
import ast
import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._serving import env_file
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import check_env, env_file_lines

from tests.helpers import ROOT

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


def _functions(path):
    tree = ast.parse(open(path).read())
    source = open(path).read()
    return dict((node.name, ast.get_source_segment(source, node)) for node in tree.body
                if isinstance(node, ast.FunctionDef)
                and node.name in ("parse_env_text", "_parse_systemd_env"))


def test_serving_wait_carries_the_same_reader():
    ours = _functions(os.path.join(ROOT, "plugins", "module_utils", "_serving", "env_file.py"))
    theirs = _functions(os.path.join(ROOT, "roles", "serving", "files", "serving-wait.py"))
    assert set(ours) == {"parse_env_text", "_parse_systemd_env"} and ours == theirs
