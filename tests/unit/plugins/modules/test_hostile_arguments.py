# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every module of the collection under hostile arguments (property-based, issue 23): each is driven from its
own argument spec with values of the wrong type inside lists and dicts, NaN, inf, 0, negatives, huge integers,
control characters, non-UTF-8 text (as Ansible hands it over: lone surrogates), planted FIFOs and links, and
must end with one JSON result - success, or failed with a clear `msg` - within a bounded time and memory:
never a traceback, never a hang.

Each module runs in this process as Ansible runs it (AnsibleModule reads the arguments, exit_json/fail_json
print the JSON and exit), with a wall-clock alarm and an address-space limit around it, network access limited
to 127.0.0.0/8 (which answers nothing here), and every path-type option under a temporary directory (so no
module writes outside it). Cases are either fully hostile (every option drawn from the spec) or a working
set of arguments with one to three options, or keys inside them, made hostile; the second kind reaches past
the first checks into the planners and parsers.

The CI budget is small and seed-fixed (derandomize); LLMOPS_HOSTILE_EXAMPLES raises it, e.g.
LLMOPS_HOSTILE_EXAMPLES=500 .venv/bin/python -m pytest tests/unit/plugins/modules/test_hostile_arguments.py
"""
import importlib
import io
import json
import math
import os
import pkgutil
import resource
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager

import pytest
from ansible.module_utils import basic
from ansible_collections.llmops.serving.plugins import modules as modules_pkg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.fake_hub.helpers import Hung, fails_fast
from tests.unit.plugins.module_utils.test_memory_plan import l20, llama_8b
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs

EXAMPLES = int(os.environ.get("LLMOPS_HOSTILE_EXAMPLES", "12"))
# A module answers within this (every one of them fails fast on unreachable or missing things; the deadlines
# under test are the modules' own, which the working arguments set low).
WALL_S = float(os.environ.get("LLMOPS_HOSTILE_WALL_S", "20"))
# Address space a module may add to this process (a bounded read never comes near it).
MEMORY_BYTES = 768 * 1024 * 1024

MODULES = sorted(name for _f, name, _p in pkgutil.iter_modules(modules_pkg.__path__)
                 if hasattr(importlib.import_module(modules_pkg.__name__ + "." + name), "main"))

NASTY_TEXT = ["", " ", "\n", "x\n", "\r\n", "\x00", "\x1b[31m", "\t", "#comment", "$HOME", "%[env(HOME)]",
              '"', "'", "\\", "`", "{{ x }}", "\u200b", "\udcff\udcfe", "é", "-1", "0", "nan", "inf",
              "-inf", "1e999", "9" * 5000, "a" * 70000, "../../..", "/", ".", "sub/", "a,b", "::",
              "http://", "http://127.0.0.1:1/", "https://[::1", "file:///etc/passwd", "x" * 300]
NASTY_NUMBERS = [0, -1, 1, -(2 ** 63), 2 ** 63, 2 ** 200, float("nan"), float("inf"), float("-inf"), 1e308,
                 -1e-308, 0.5, True, False]


def _text():
    return st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=16),
                     st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7f), max_size=8))


def _scalar():
    return st.one_of(_text(), st.sampled_from(NASTY_NUMBERS), st.none(),
                     st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True, allow_infinity=True))


def _any(depth=2):
    if depth <= 0:
        return _scalar()
    inner = _any(depth - 1)
    return st.one_of(_scalar(), st.lists(inner, max_size=4), st.dictionaries(_text(), inner, max_size=4))


HOSTILE = _any()


# --- paths: every one under the case's directory --------------------------------------------------------

PATH_KINDS = ("missing", "dir", "empty", "fifo", "link-zero", "link-dir", "garbage", "text", "hostile")


def _make_path(root, kind, text):
    """A path under `root` of the given kind (a FIFO no writer opens, a link to /dev/zero, ...)."""
    path = os.path.join(root, "p-%s-%d" % (kind, len(os.listdir(root))))
    if kind == "dir":
        os.mkdir(path)
    elif kind == "empty":
        open(path, "wb").close()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-zero":
        os.symlink("/dev/zero", path)
    elif kind == "link-dir":
        os.symlink(root, path)
    elif kind == "garbage":
        with open(path, "wb") as handle:
            handle.write(b"\xff\xfe\x00GGUF" + os.urandom(64))
    elif kind == "text":
        with open(path, "w") as handle:
            handle.write("KEY=\"sk-x\\n\"\n" + text.encode("utf-8", "replace").decode("utf-8") + "\n")
    elif kind == "hostile":
        # the user's text as a name inside the directory (never absolute: nothing outside is touched)
        name = text.replace("\x00", "").lstrip("/") or "x"
        return os.path.join(root, name[:200])
    return path


@st.composite
def _path(draw, root):
    return _make_path(root, draw(st.sampled_from(PATH_KINDS)), draw(_text()))


# --- values from an argument spec -------------------------------------------------------------------------

def _value(draw, spec, root):
    """One value for an option: usually of its declared type but hostile in content, sometimes any type."""
    kind = spec.get("type", "str")
    if draw(st.integers(0, 5)) == 0:
        return draw(HOSTILE)
    if kind == "path":
        return draw(_path(root))
    if kind in ("int", "float"):
        return draw(st.one_of(st.sampled_from(NASTY_NUMBERS), st.integers(-2 ** 70, 2 ** 70),
                              st.sampled_from(["1e9", "nan", " 3", "0x10", "-0"])))
    if kind == "bool":
        return draw(st.sampled_from([True, False, "yes", "maybe", 2, None]))
    if kind == "str" and spec.get("choices"):
        return draw(st.one_of(st.sampled_from(list(spec["choices"])), _text()))
    if kind == "list":
        element = spec.get("elements", "str")
        sub = dict(spec, type=element)
        sub.pop("elements", None)
        return [_value(draw, sub, root) if draw(st.booleans()) else draw(HOSTILE)
                for _i in range(draw(st.integers(0, 3)))]
    if kind == "dict":
        options = spec.get("options")
        if options:
            chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True, max_size=len(options)))
            return dict((name, _value(draw, options[name], root)) for name in chosen)
        return draw(st.dictionaries(_text(), HOSTILE, max_size=4))
    if kind == "raw":
        return draw(HOSTILE)
    return draw(_text())


def _fully_hostile(draw, spec, root):
    args = {}
    for name, option in sorted(spec.items()):
        if option.get("required") or option.get("type") == "path" or draw(st.booleans()):
            args[name] = _value(draw, option, root)
    return args


def _mutate(draw, value, root, depth=0):
    """The value with one element (of a list) or key (of a dict) made hostile, or the value itself."""
    if isinstance(value, dict) and value and depth < 3 and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        out = dict(value)
        out[key] = _mutate(draw, value[key], root, depth + 1)
        return out
    if isinstance(value, list) and value and depth < 3 and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        out = list(value)
        out[index] = _mutate(draw, value[index], root, depth + 1)
        return out
    if isinstance(value, dict) and draw(st.booleans()):
        out = dict(value)
        out[draw(_text())] = draw(HOSTILE)  # an unknown key
        return out
    return draw(HOSTILE)


# --- working arguments per module: the start of the second kind of case --------------------------------

def _working(name, root):
    gguf = _make_path(root, "garbage", "")
    fifo = _make_path(root, "fifo", "")
    env_file = _make_path(root, "text", "")
    dead = "http://127.0.0.1:9"  # discard port: nothing listens, refused at once
    return {
        "deployment": {"state": "deploy", "dir": os.path.join(root, "deployments"), "name": "q",
                       "unit_file": os.path.join(root, "q.service"), "env_file": env_file,
                       "unit_content": "[Service]\n", "env_content": "KEY=sk-abc\n",
                       "lock_token": "20261205T100000Z-aaaaaaaaaaaaaaaa"},
        "disk_space_info": {"writes": [{"path": root, "bytes": 1024, "label": "m"}], "reserve": "1GiB"},
        "firewall_ports": {"owner": "llmops", "ports": ["8000/tcp"], "sources": ["10.0.0.0/8"],
                           "record_dir": os.path.join(root, "fw"), "firewall_cmd": fifo},
        "gateway_server": {"socket": fifo, "backend": "llm_q", "server": "q-a", "state": "drain",
                           "drain_timeout": 1, "healthy_timeout": 1, "poll_interval": 0.1},
        "gguf_info": {"path": gguf, "timeout": 2, "retries": 0, "limits": {"max_tensors": 16}},
        "gpu_facts": {"nvidia_smi_path": env_file, "timeout": 2, "devices": ["0"], "require_arch": ["sm_89"]},
        "gpu_pci_info": {"sysfs_root": root, "expected": {"count": 1}},
        "llama_cpp_build_info": {"source_type": "dir", "source_dir": root, "mode": "host",
                                 "gpus": {"gpus": [{"index": 0, "compute_cap": "8.9"}]},
                                 "install_root": os.path.join(root, "opt")},
        "llm_benchmark": {"url": dead, "api_key": "sk-abc", "timeout": 2, "busy_wait": 1, "busy_poll": 0.1,
                          "warmup_requests": 0, "runs": [{"prompt_tokens": 16, "max_tokens": 4,
                                                          "concurrency": 1, "requests": 1}]},
        "model_download": {"url": dead + "/m.gguf", "dest": os.path.join(root, "models"), "timeout": 2,
                           "retries": 0, "lock_timeout": 1},
        "model_snapshot": {"repo": "org/m", "endpoint": dead, "dest": os.path.join(root, "snap"),
                           "timeout": 2, "retries": 0},
        "nvidia_driver_info": {"wanted_version": "570.133.20", "gpus": {"present": True, "count": 1},
                               "sysfs_module_dir": root, "proc_root": root},
        "safetensors_info": {"path": gguf},
        "systemd_info": {"systemctl": fifo, "proc_root": root, "timeout": 2},
        "memory_plan_info": {"gpus": [l20(0), l20(1)], "host_memory_mib": 65536, "instances": [
            {"name": "a", "gpus": [0, 1], "model": llama_8b(),
             "settings": {"ctx_size": 8192, "parallel": 2, "tensor_split": [1, 1], "batch_size": 512}},
            {"name": "v", "engine": "vllm", "gpus": [1], "model_dir": root,
             "settings": {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9}}]},
        "source_probe": {"sources": [{"name": "repo", "kind": "yum", "url": dead + "/repo", "why": "test",
                                      "key": "docker_ce", "have": {"file": env_file}}], "timeout": 2,
                         "environment_file": env_file},
        "wheel_compat_info": {"python": sys.executable, "requires_python": ">=3.6",
                              "wheel": gguf + "-1.0-cp38-abi3-manylinux_2_28_x86_64.whl"},
    }.get(name, {})


@st.composite
def cases(draw, name, spec, root):
    working = _working(name, root)
    if not working or draw(st.integers(0, 3)) == 0:
        return _fully_hostile(draw, spec, root), draw(st.booleans())
    args = dict(working)
    for option in draw(st.lists(st.sampled_from(sorted(spec)), min_size=1, max_size=3, unique=True)):
        if option in args and draw(st.booleans()):
            args[option] = _mutate(draw, args[option], root)
        else:
            args[option] = _value(draw, spec[option], root)
    return args, draw(st.booleans())


# --- running one module as Ansible does, bounded ----------------------------------------------------------

def _loopback_only(real):
    def guarded(host, *args, **kwargs):
        text = host.decode("ascii", "replace") if isinstance(host, bytes) else str(host)
        if text not in ("localhost", "::1") and not text.startswith("127.") and text not in ("0", "0.0.0.0"):
            raise socket.gaierror(socket.EAI_NONAME, "no network in this test (%s)" % text[:60])
        return real(host, *args, **kwargs)
    return guarded


@contextmanager
def _bounded(seconds, memory):
    """The module's address space capped at what the test process uses now plus `memory`, and its time at
    `seconds` (the fake hub's alarm: fails_fast raises Hung)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as handle:
        used = int(handle.read().split()[0]) * resource.getpagesize()
    limit = used + memory
    soft_limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft_limit, hard))
    try:
        with fails_fast(seconds):
            yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_in_process(name, args, check_mode, cwd, monkeypatch):
    """Run plugins/modules/<name>.py's main() with `args`; returns (result dict, seconds)."""
    module = importlib.import_module(modules_pkg.__name__ + "." + name)
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode,
                                                      _ansible_tmpdir=cwd, _ansible_remote_tmp=cwd)})
    out = io.StringIO()
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", payload.encode("utf-8", "surrogatepass"))
    monkeypatch.setattr(basic.AnsibleModule, "_log_invocation", lambda self: None)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(socket, "getaddrinfo", _loopback_only(socket.getaddrinfo))
    monkeypatch.setattr(socket, "gethostbyname", _loopback_only(socket.gethostbyname))
    monkeypatch.chdir(cwd)
    start = time.monotonic()
    code = None
    try:
        with _bounded(WALL_S, MEMORY_BYTES):
            module.main()
    except SystemExit as exc:
        code = exc.code
    except Hung:
        pytest.fail("%s ran longer than %g s with %s" % (name, WALL_S, _show(args)))
    except BaseException as exc:  # a traceback: exactly what must never happen
        import traceback
        pytest.fail("%s raised %s with %s:\n%s" % (name, type(exc).__name__, _show(args),
                                                  "".join(traceback.format_exc())[-3000:]))
    finally:
        monkeypatch.undo()
    elapsed = time.monotonic() - start
    text = out.getvalue()
    assert text.strip(), "%s printed nothing (exit %r) with %s" % (name, code, _show(args))
    try:
        result = json.loads(text.strip().splitlines()[-1])
    except ValueError:
        pytest.fail("%s printed no JSON result with %s: %r" % (name, _show(args), text[-2000:]))
    return result, elapsed


def _show(args):
    return json.dumps(args, default=repr)[:1500]


SPECS = dict((name, capture_module_kwargs(importlib.import_module(modules_pkg.__name__ + "." + name)))
             for name in MODULES)


def test_every_module_is_driven():
    """The list is every module with a main() (download_wait's file documents an action plugin)."""
    assert len(MODULES) >= 14 and "memory_plan_info" in MODULES and "download_wait" not in MODULES
    assert all(SPECS[name].get("argument_spec") for name in MODULES)


def _clear_msg(result):
    msg = result.get("msg")
    return isinstance(msg, str) and msg.strip() and "Traceback" not in msg and len(msg) < 20000 \
        and "MemoryError" not in msg and "RecursionError" not in msg


@pytest.mark.parametrize("name", MODULES)
def test_hostile_arguments_end_in_one_clear_json_result(name, monkeypatch):
    spec = SPECS[name]["argument_spec"]
    root = tempfile.mkdtemp(prefix="llmops-hostile-")

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def check(data):
        case_dir = tempfile.mkdtemp(dir=root)
        args, check_mode = data.draw(cases(name, spec, case_dir))
        result, elapsed = run_in_process(name, args, check_mode, case_dir, monkeypatch)
        assert elapsed < WALL_S
        if result.get("failed"):
            assert _clear_msg(result), "%s: unclear failure %r with %s" % (name, str(result.get("msg"))[:500],
                                                                          _show(args))
            assert "exception" not in result, result.get("exception")
        for value in (args.get("api_key"), args.get("token"), args.get("url_query")):
            if isinstance(value, str) and len(value) >= 6 and value.strip():
                assert value not in json.dumps(result), "%s shows a secret" % name
        assert not isinstance(result.get("msg"), float) or not math.isnan(result["msg"])

    try:
        check()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# Cases the property test found (each a traceback, a leak or an unclear message before issue 23), kept as
# fixed examples so that CI's small budget always covers them. None: the module's working arguments.
KNOWN = [
    ("gguf_info", {"limits": 0}),
    ("llm_benchmark", {"timeout": "inf"}),
    ("llm_benchmark", {"timeout": "-1"}),
    ("llm_benchmark", {"api_key": "\u0100"}),
    ("llm_benchmark", {"runs": "", "api_key_env": ""}),
    ("llm_benchmark", {"api_key": "sk-abc\n"}),
    ("nvidia_driver_info", {"sysfs_module_dir": "\x00"}),
    ("nvidia_driver_info", {"reboot_policy": "a" * 70000}),
    ("gateway_server", {"backend": "a" * 70000}),
    ("memory_plan_info", {"gpus": -1}),
    ("memory_plan_info", {"gpus": " "}),
    ("memory_plan_info", {"instances": [{"name": "v", "engine": "vllm", "gpus": [0],
                                     "model": {"weights_bytes": 1},
                                     "settings": {"tensor_parallel_size": 0}}]}),
    ("memory_plan_info", {"instances": [{"name": "a", "gpus": [0], "model": llama_8b(),
                                     "settings": {"gpu_memory_utilization": "x", "main_gpu": "x",
                                                  "parallel": 10 ** 9}}]}),
    ("wheel_compat_info", {"wheel": None, "tags": ["cp3" + "1" * 5000 + "-abi3-manylinux_2_28_x86_64"]}),
]


@pytest.mark.parametrize("name, changes", KNOWN, ids=["%s-%d" % (n, i) for i, (n, _c) in enumerate(KNOWN)])
def test_known_hostile_arguments(name, changes, tmp_path, monkeypatch):
    args = _working(name, str(tmp_path))
    args.update(changes)
    args = dict((k, v) for k, v in args.items() if v is not None)
    result, _elapsed = run_in_process(name, args, False, str(tmp_path), monkeypatch)
    assert result.get("failed") and _clear_msg(result), (name, str(result.get("msg"))[:300])
    assert "sk-abc" not in json.dumps(result) and "\u0100" not in json.dumps(result, ensure_ascii=False)
