# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The test tasks of llmops.serving, run with nox (as antsibull-nox does for the community collections).

    .venv/bin/nox -l                      # the sessions
    .venv/bin/nox -s lint                 # yamllint, ansible-lint, ruff, vermin: no Docker, no image
    .venv/bin/nox -s unit                 # pytest: tests/unit (pure) and tests/roles (rendering, local plays)
    .venv/bin/nox -s molecule -- model    # one Molecule scenario (all of them without an argument)

Every session runs in the project's one virtualenv (.venv, made from requirements.txt by
`bin/llmops-dev setup`) rather than a venv per session: the toolchain is pinned once, and a session costs no
install. `bin/llmops-dev` provisions the machine (system packages, dockerd, .venv, the test image, the
llama.cpp source) and then calls these sessions; they do not provision anything themselves, so `lint`,
`sanity` and `unit` run without Docker. Sessions that count tests write them to .cache/counts/<session>
for the summary line of `bin/llmops-dev test`.
"""
import os
import shutil
import sys
import xml.etree.ElementTree as ET

import nox

ROOT = os.path.dirname(os.path.abspath(__file__))
# The checkout's own tools (tools/ci): importable once ROOT is on the path.
sys.path.insert(0, ROOT)
from tools.ci.schedule import CI_CACHE  # noqa: E402

CACHE = os.environ.get("LLMOPS_CACHE_DIR", os.path.join(ROOT, ".cache"))
COUNTS = os.path.join(CACHE, "counts")
# Every Molecule scenario. `bin/llmops-dev test` runs them side by side with the other sessions
# (tools/ci/schedule.py decides the order and how many at once); `nox -s molecule` runs them in turn.
MOLECULE_SCENARIOS = ("llama_cpp", "serving_llama_cpp", "default", "l20", "gpu_host", "model", "vllm",
                      "fleet", "ray", "bundle", "faults")
PYTEST_PATHS = ("tests/unit", "tests/roles")

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "sanity", "unit"]
nox.options.error_on_missing_interpreters = True


def _record(name, passed):
    os.makedirs(COUNTS, exist_ok=True)
    with open(os.path.join(COUNTS, name), "w") as handle:
        handle.write("%d\n" % passed)


def _pytest(session, name, *args):
    report = os.path.join(CACHE, "%s.xml" % name)
    session.run("python", "-m", "pytest", "-q", "--junitxml", report, *args, *session.posargs)
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    _record(name, counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"])


@nox.session
def lint(session):
    """yamllint, ansible-lint (production profile), ruff, antsibull-changelog lint, antsibull-docs lint
    (module and role docs), and Python 3.6 compatibility (vermin) of everything that runs on managed nodes
    (CentOS 7's python3 is 3.6)."""
    session.run("yamllint", "-s", ".")
    session.run("ansible-lint", "--profile", "production")
    session.run("ruff", "check", ".")
    # The changelog fragments and changelogs/changelog.yaml, as the community collections check them.
    session.run("antsibull-changelog", "lint")
    session.run("python", "tools/ci/docs_lint.py")  # antsibull-docs: module and role docs, their references
    # modules, module_utils, roles/*/files/*.py and the rendered roles/*/templates/*.py.j2 (3.6; EL 7's
    # /usr/bin/python scripts also 2.7)
    session.run("python", "tools/ci/vermin_check.py")


@nox.session
def sanity(session):
    """ansible-test sanity (validate-modules, pep8, pylint, ...) on a copy laid out as
    ansible_collections/llmops/serving (tests/sanity.sh)."""
    session.run("bash", "tests/sanity.sh", *session.posargs, external=True)


@nox.session
def unit(session):
    """Unit tests (tests/unit) and role rendering tests (tests/roles); those that need a built
    llama-server run in `unit_llama_server`."""
    # Both cores (pytest-xdist); LLMOPS_UNIT_WORKERS=0 runs them in this process (pdb, -x).
    workers = os.environ.get("LLMOPS_UNIT_WORKERS", "2")
    xdist = ["-n", workers] if workers not in ("", "0", "1") else []
    # No llama-server here, whatever the llama_cpp scenario has built meanwhile: in CI the binary appears in
    # .cache/ci-llama half-way through this session, and a test that found it would run a real server under
    # the full machine's load. Tests that need one are marked needs_llama_server and run in unit_llama_server.
    session.env["LLMOPS_LLAMA_SERVER"] = "/nonexistent/the-unit-session-runs-no-llama-server"
    _pytest(session, "unit", *xdist, "-m", "not needs_llama_server", *PYTEST_PATHS)


@nox.session(name="unit_llama_server")
def unit_llama_server(session):
    """The flag table against the built llama-server's --help, and the tiny models served by it. The
    binary is the one the llama_cpp Molecule scenario built from the pinned source."""
    binary = os.environ.get("LLMOPS_LLAMA_SERVER", os.path.join(CACHE, "ci-llama", "bin", "llama-server"))
    if not os.access(binary, os.X_OK):
        session.error("no llama-server at %s: run `nox -s molecule -- llama_cpp` first" % binary)
    session.env["LLMOPS_LLAMA_SERVER"] = binary
    _pytest(session, "unit_llama_server", "-m", "needs_llama_server", *PYTEST_PATHS)


@nox.session
def molecule(session):
    """Molecule scenarios on the host network, the named ones (after --) or all, one after another. Before
    each, the host ports it listens on are checked (tools/ci/ports.py): a port held by another process fails
    here, naming that process, instead of deep inside the scenario."""
    from tools.ci import ports

    if shutil.which("docker") is None:
        session.error("no docker CLI: run `bin/llmops-dev setup` (installs and starts the engine)")
    session.env.setdefault("LLMOPS_DOCKER_CLI", shutil.which("docker"))
    session.env["LLMOPS_CACHE_DIR"] = CACHE
    session.env["LLMOPS_CI_CACHE"] = CI_CACHE
    for folder in (os.path.join(CACHE, "ci-llama"), os.path.join(CI_CACHE, "ccache")):
        os.makedirs(folder, exist_ok=True)
    scenarios = session.posargs or MOLECULE_SCENARIOS
    unknown = sorted(set(scenarios) - set(MOLECULE_SCENARIOS))
    if unknown:
        session.error("unknown scenario(s) %s; known: %s"
                      % (", ".join(unknown), ", ".join(MOLECULE_SCENARIOS)))
    for scenario in scenarios:
        held = ports.check([scenario])
        if held:
            session.error(held)
        session.log("molecule test -s %s" % scenario)
        session.run("molecule", "test", "-s", scenario)
        _record("molecule-" + scenario, 1)


@nox.session
def docs(session):
    """The collection's doc site as on Ansible's own (antsibull-docs + Sphinx), in
    .cache/docsite/build/build/html; not one of the CI sessions."""
    dest = os.path.join(CACHE, "docsite", "build")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    os.chmod(dest, 0o755)  # antsibull-docs refuses a destination that others may write to
    session.env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, "collections")
    session.run("antsibull-docs", "sphinx-init", "--use-current", "--squash-hierarchy", "--lenient",
                "--sphinx-theme", "alabaster", "--dest-dir", dest, "llmops.serving")
    session.run("bash", os.path.join(dest, "build.sh"), external=True)


@nox.session
def bench(session):
    """Benchmarks: ratios measured side by side in one run (bench/README.md)."""
    session.run("python", "-m", "bench", *session.posargs)
