# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/ci/vermin_check.py (issue 35, point 9): vermin's Python 3.6 check covers what runs on the node
besides plugins/ - the roles' scripts and the Python files their templates write, rendered - and EL 7's
/usr/bin/python scripts also on 2.7."""

import os

from tests.helpers import ROOT
from tools.ci import vermin_check


def test_the_roles_scripts_and_templates_are_checked():
    files = vermin_check.node_files()
    assert "roles/vllm/files/torch_cuda.py" in files and "roles/serving/files/serving-wait.py" in files
    assert set(vermin_check.PY27) <= set(files)


def test_templates_are_checked_as_the_node_gets_them(tmp_path):
    rendered = vermin_check.render_templates(str(tmp_path))
    by_template = dict((template, path) for path, template in rendered.items())
    collector = by_template["roles/monitoring/templates/llmops_gpu_metrics.py.j2"]
    with open(collector) as handle:
        text = handle.read()
    assert '{{' not in text and 'sys.path.insert(0, "/usr/local/lib/llmops-monitoring")' in text


def test_the_collection_passes():
    status, report = vermin_check.check()
    assert status == 0, report


def fake_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)


def test_a_finding_in_a_script_a_template_or_a_python27_script_fails(tmp_path):
    fine = {"roles/r/files/ok.py": "import json\nprint(json.dumps({}))\n",
            "roles/r/templates/ok.py.j2": "X = {{ r_value | to_json }}\n",
            "roles/r/defaults/main.yml": "r_value: 1\n",
            "roles/nvidia_driver/files/el7_enabled_repos.py": "from __future__ import print_function\n"
                                                              "print(1)\n"}
    fake_tree(tmp_path / "fine", fine)
    status, report = vermin_check.check(str(tmp_path / "fine"))
    assert status == 0, report
    for name, bad in (("script", {"roles/r/files/ok.py": "from importlib import metadata\n"}),
                      ("template", {"roles/r/templates/ok.py.j2": "X = {{ r_value }}\nprint(f'{X=}')\n"}),
                      ("py27", {"roles/nvidia_driver/files/el7_enabled_repos.py": "X = 1\nprint(f'{X}')\n"})):
        fake_tree(tmp_path / name, dict(fine, **bad))
        status, report = vermin_check.check(str(tmp_path / name))
        assert status == 1, (name, report)
        if name == "template":
            assert "roles/r/templates/ok.py.j2 (rendered)" in report


def test_the_lint_session_runs_it():
    with open(os.path.join(ROOT, "noxfile.py")) as handle:
        assert 'session.run("python", "tools/ci/vermin_check.py")' in handle.read()
