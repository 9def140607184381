# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A test that runs a real llama-server is marked needs_llama_server, so it runs in `unit_llama_server`
(after the llama_cpp scenario built the binary) and never in `unit`, where the binary appears half-way
through a CI run and the test would run a server under the whole machine's load (a CI run failed so).

The check: in every test module that looks a llama-server binary up (the LLMOPS_LLAMA_SERVER variable, or
a build's path under .cache), each test function that reaches the lookup (directly, or through a
fixture or helper of the same module) carries the marker, itself or through the module's pytestmark."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MARK = "needs_llama_server"


def _looks_up_binary(node):
    """The variable that names the binary, or a path to a build under .cache (ci-llama, host-build)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value == "LLMOPS_LLAMA_SERVER":
            return True
        if isinstance(sub, ast.Call):
            words = [a.value for a in sub.args if isinstance(a, ast.Constant)]
            if ".cache" in words and "llama-server" in words:
                return True
    return False


def _marked(decorators):
    return any(MARK in ast.unparse(d) for d in decorators)


def unmarked(source):
    """The test functions of a module's source that reach a llama-server lookup without the marker."""
    tree = ast.parse(source)
    module_marked = any(isinstance(n, ast.Assign) and MARK in ast.unparse(n.value)
                        and any(getattr(t, "id", "") == "pytestmark" for t in n.targets) for n in tree.body)
    names = {}      # module-level name -> the node that defines it
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
    reaching, changed = {n for n, node in names.items() if _looks_up_binary(node)}, True
    while changed:          # a name reaches the lookup when its definition uses one that does
        changed = False
        for name, node in names.items():
            if name in reaching:
                continue
            used = {s.id for s in ast.walk(node) if isinstance(s, ast.Name)}
            used |= {a.arg for a in getattr(getattr(node, "args", None), "args", [])}
            if used & reaching:
                reaching.add(name)
                changed = True
    return sorted(name for name, node in names.items()
                  if name.startswith("test_") and name in reaching and not module_marked
                  and not _marked(node.decorator_list))


def _test_modules():
    for top in ("tests/unit", "tests/roles"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.startswith("test_") and name.endswith(".py"):
                    yield os.path.join(folder, name)


def test_every_test_that_runs_a_llama_server_is_marked():
    found = {}
    for path in _test_modules():
        if path == os.path.abspath(__file__):
            continue
        with open(path) as handle:
            missing = unmarked(handle.read())
        if missing:
            found[os.path.relpath(path, ROOT)] = missing
    assert not found, "mark these @pytest.mark.%s (they run a real llama-server): %s" % (MARK, found)


def test_the_check_finds_a_test_that_reaches_the_binary_through_a_fixture():
    fixture = ('import os, pytest\nBIN = os.environ.get("LLMOPS_LLAMA_SERVER")\n'
               '@pytest.fixture\ndef server(tmp_path):\n    return BIN\n')
    assert unmarked(fixture + "def test_a(server):\n    pass\n") == ["test_a"]
    assert unmarked(fixture + "@pytest.mark.needs_llama_server\ndef test_a(server):\n    pass\n") == []
    marked = "pytestmark = [pytest.mark.needs_llama_server]\n"
    assert unmarked(fixture + marked + "def test_a(server):\n    pass\n") == []
    # a test that never reaches the lookup needs no marker
    assert unmarked(fixture + "def test_b(tmp_path):\n    pass\n") == []
