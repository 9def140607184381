# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Python 3.6 compatibility (vermin) of everything the collection runs on managed nodes, whose python3 is
CentOS 7's 3.6:

    python tools/ci/vermin_check.py        # what the lint session runs (exit 1 on a finding)

- the modules and module_utils (plugins/modules, plugins/module_utils);
- the scripts roles ship and run on the node (roles/*/files/*.py: ansible.builtin.script, copies);
- the Python files roles write from templates (roles/*/templates/*.py.j2), checked as the node gets them:
  rendered with the role's defaults and vars/main.yml into a temporary directory, since vermin cannot parse
  the Jinja itself;
- the scripts run with EL 7's /usr/bin/python (PY27 below) must also run on Python 2.7.

A construct that vermin flags although the file guards it (an import inside ``try ... except ImportError``
with a fallback) carries ``# novermin`` on that line, with the guard next to it.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, "collections")
NODE_DIRS = ("plugins/modules", "plugins/module_utils")
NODE_GLOBS = ("roles/*/files/*.py",)
TEMPLATE_GLOB = "roles/*/templates/*.py.j2"
# Run with the host's /usr/bin/python: 2.7 on EL 7 (roles/nvidia_driver/tasks/setup-RedHat.yml).
PY27 = ("roles/nvidia_driver/files/el7_enabled_repos.py",)
VERMIN_ARGS = ["--no-tips", "--violations", "--eval-annotations", "--exclude-regex", "__pycache__"]
# What a role's template sees besides the role's own variables.
TEMPLATE_VARS = {"ansible_managed": "Ansible managed"}


def node_files(root=ROOT):
    """The shipped scripts of the roles (paths relative to root), sorted."""
    found = []
    for pattern in NODE_GLOBS:
        found.extend(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    return sorted(found)


def _load_yaml(path):
    import yaml

    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def render_templates(dest, root=ROOT):
    """Render every roles/*/templates/*.py.j2 as the role would (its defaults < vars/main.yml) into
    dest/<role>/<name>.py; returns {rendered path: template path relative to root}."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    init_plugin_loader([COLLECTIONS])
    rendered = {}
    for template in sorted(glob.glob(os.path.join(root, TEMPLATE_GLOB))):
        role_dir = os.path.dirname(os.path.dirname(template))
        variables = dict(TEMPLATE_VARS)
        variables.update(_load_yaml(os.path.join(role_dir, "defaults", "main.yml")))
        variables.update(_load_yaml(os.path.join(role_dir, "vars", "main.yml")))
        variables["role_path"] = role_dir
        loader = DataLoader()
        loader.set_basedir(role_dir)
        with open(template) as handle:
            text = Templar(loader=loader, variables=variables).template(handle.read(),
                                                                        preserve_trailing_newlines=True)
        out_dir = os.path.join(dest, os.path.basename(role_dir))
        if not os.path.isdir(out_dir):
            os.makedirs(out_dir)
        out = os.path.join(out_dir, os.path.basename(template)[:-len(".j2")])
        with open(out, "w") as handle:
            handle.write(text)
        rendered[out] = os.path.relpath(template, root)
    return rendered


def vermin(targets, paths):
    """(exit status, output) of vermin with these targets over paths."""
    here = os.path.join(os.path.dirname(sys.executable), "vermin")  # the virtualenv's own
    program = here if os.path.exists(here) else (shutil.which("vermin") or "vermin")
    argv = [program] + ["-t=%s" % t for t in targets] + VERMIN_ARGS + list(paths)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          check=False)
    return proc.returncode, proc.stdout


def check(root=ROOT):
    """(exit status, report) of the whole check: 0 when every file keeps to its Python versions."""
    tmp = tempfile.mkdtemp(prefix="vermin-templates-")
    try:
        rendered = render_templates(tmp, root)
        paths = [os.path.join(root, d) for d in NODE_DIRS if os.path.isdir(os.path.join(root, d))]
        paths += [os.path.join(root, p) for p in node_files(root)] + sorted(rendered)
        status, out = vermin(["3.6-"], paths)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = [out]
    old = [os.path.join(root, p) for p in PY27 if os.path.exists(os.path.join(root, p))]
    if old:
        old_status, old_out = vermin(["2.7-", "3.6-"], old)
        status = status or old_status
        report.append(old_out)
    text = "\n".join(report)
    for path, template in rendered.items():
        text = text.replace(path, "%s (rendered)" % template)
    return status, text


def main():
    status, text = check()
    sys.stdout.write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
