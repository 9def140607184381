# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/serving/files/serving-wait.py: health and model-list wait that fails fast when the unit died, run
from the files role serving installs (tests.helpers.install_serving_wait), as the role runs it.

A local HTTP server plays llama-server (503 while loading, then 200); fake `systemctl`/`journalctl` scripts
on PATH play systemd (their answers come from files the test writes).
"""
import http.server
import os
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.helpers import install_serving_wait, run_local_playbook

FAKE_SYSTEMCTL = """#!/bin/sh
# fake systemctl: `show -p ... UNIT` prints the state file
cat "$FAKE_STATE"
"""
FAKE_JOURNALCTL = """#!/bin/sh
echo "journalctl $*"
echo "llama-server-t[42]: error: invalid argument: --no-such-option"
"""


class Loading(http.server.BaseHTTPRequestHandler):
    ready_after = 0.0
    started = 0.0

    def do_GET(self):  # noqa: N802 (http.server API)
        ready = time.time() - self.started >= self.ready_after
        self.send_response(200 if ready else 503)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}' if ready else b'{"error":{"message":"Loading model"}}')

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_systemd(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    state = tmp_path / "state"
    state.write_text("ActiveState=active\nSubState=running\nResult=success\nExecMainStatus=0\n")
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]), FAKE_STATE=str(state))
    return env, state


@pytest.fixture
def wait_command(tmp_path):
    return install_serving_wait(tmp_path / "node")


@pytest.fixture
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Loading)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def run(wait_command, env, url, timeout=10):
    start = time.time()
    proc = subprocess.run(wait_command + ["--url", url, "--unit", "llama-server-t.service",
                           "--timeout", str(timeout), "--interval", "0.1"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=60, check=False)
    return proc.returncode, proc.stdout, time.time() - start


def test_waits_through_503_until_200(wait_command, fake_systemd, server):
    env, _ = fake_systemd
    Loading.started, Loading.ready_after = time.time(), 0.8
    rc, out, took = run(wait_command, env, "http://127.0.0.1:%d" % server.server_port)
    assert rc == 0, out
    assert "healthy after" in out
    assert took >= 0.7


def test_fails_fast_with_journal_when_the_process_exited(wait_command, fake_systemd, server):
    env, state = fake_systemd
    state.write_text("ActiveState=activating\nSubState=auto-restart\nResult=exit-code\nExecMainStatus=1\n")
    Loading.started, Loading.ready_after = time.time(), 3600
    rc, out, took = run(wait_command, env, "http://127.0.0.1:%d" % server.server_port, timeout=30)
    assert rc == 1
    assert took < 10, "should not wait out the timeout when the unit died"
    assert "the process exited" in out and "SubState=auto-restart" in out
    assert "--no-such-option" in out                      # journal lines of this start
    assert "--since" in out and "-u llama-server-t.service" in out


def test_an_empty_journal_is_asked_again_until_the_lines_arrive(wait_command, fake_systemd, server, tmp_path):
    """journald writes a dead process's last lines a little later on a loaded host: the first answer may be
    empty ("-- No entries --"); the gate asks again rather than report no cause."""
    env, state = fake_systemd
    calls = tmp_path / "journal-calls"
    lagging = tmp_path / "bin" / "journalctl"
    lagging.write_text('#!/bin/sh\necho x >> "%s"\n'
                       'if [ "$(wc -l < "%s")" -lt 2 ]; then echo "-- No entries --"; exit 0; fi\n'
                       'if [ "$(wc -l < "%s")" -lt 3 ]; then\n'
                       '  echo "t systemd[1]: t.service: Scheduled restart job"; exit 0; fi\n'
                       'echo "llama-server-t[42]: error: invalid argument: --no-such-option"\n'
                       % (calls, calls, calls))
    state.write_text("ActiveState=activating\nSubState=auto-restart\nResult=exit-code\nExecMainStatus=1\n")
    Loading.started, Loading.ready_after = time.time(), 3600
    rc, out, took = run(wait_command, env, "http://127.0.0.1:%d" % server.server_port, timeout=30)
    assert rc == 1 and "--no-such-option" in out and "No entries" not in out, out
    assert len(calls.read_text().splitlines()) == 3
    # a journal that stays empty is reported as such, after a bounded number of tries
    calls.write_text("")
    lagging.write_text('#!/bin/sh\necho x >> "%s"\necho "-- No entries --"\n' % calls)
    rc, out, took = run(wait_command, env, "http://127.0.0.1:%d" % server.server_port, timeout=30)
    assert rc == 1 and "-- No entries --" in out and took < 15
    assert len(calls.read_text().splitlines()) == 5


def test_times_out_with_last_answer(wait_command, fake_systemd, server):
    env, _ = fake_systemd
    Loading.started, Loading.ready_after = time.time(), 3600
    rc, out, _ = run(wait_command, env, "http://127.0.0.1:%d" % server.server_port, timeout=1)
    assert rc == 1
    assert "no 200 from" in out and "last answer: 503" in out


def test_nothing_listening_counts_as_not_ready(wait_command, fake_systemd):
    env, _ = fake_systemd
    rc, out, _ = run(wait_command, env, "http://127.0.0.1:9", timeout=1)
    assert rc == 1 and "last answer: none" in out


class Models(http.server.BaseHTTPRequestHandler):
    """Plays an engine after loading: /health 200, /v1/models only with the right key."""
    key = "wait-test-key-77"

    def do_GET(self):  # noqa: N802 (http.server API)
        if self.path == "/v1/models" and self.headers.get("Authorization") != "Bearer " + self.key:
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        body = b'{"object":"list","data":[{"id":"qwen-local","object":"model"}]}'
        self.wfile.write(body if self.path == "/v1/models" else b'{"status":"ok"}')

    def log_message(self, *args):
        pass


def test_checks_the_served_name_with_the_key_from_a_key_file_or_the_env_file(wait_command, fake_systemd,
                                                                               tmp_path):
    env, _ = fake_systemd
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % httpd.server_port
    key_file, env_file = tmp_path / "q.key", tmp_path / "q.env"
    key_file.write_text(Models.key + "\n")
    env_file.write_text('# managed\nHF_TOKEN="x"\nVLLM_API_KEY="%s"\n' % Models.key)

    def wait(*extra):
        proc = subprocess.run(wait_command + ["--url", url, "--unit", "vllm-q.service",
                               "--timeout", "5", "--interval", "0.1"] + list(extra), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=60, check=False)
        return proc.returncode, proc.stdout

    try:
        assert wait("--model", "qwen-local", "--key-file", str(key_file))[0] == 0
        rc, out = wait("--model", "qwen-local", "--env-file", str(env_file), "--key-env", "VLLM_API_KEY")
        assert rc == 0 and "serving qwen-local" in out
        rc, out = wait("--model", "other", "--key-file", str(key_file))
        assert rc == 1 and "lists qwen-local, not the served name other" in out
        rc, out = wait("--model", "qwen-local")
        assert rc == 1 and "answered 401" in out
    finally:
        httpd.shutdown()


def _tree(root):
    return dict((os.path.relpath(os.path.join(d, name), str(root)),
                 (open(os.path.join(d, name), "rb").read(), os.stat(os.path.join(d, name)).st_mode & 0o7777))
                for d, _dirs, names in os.walk(str(root)) for name in names)


def test_the_role_installs_the_gate_as_the_tests_run_it_and_a_second_run_changes_nothing(tmp_path):
    """tasks/wait_script.yml run by Ansible (as role fleet includes role serving's tasks): the same files,
    bytes and modes that install_serving_wait lays out for the tests above; copies in place change nothing."""
    node = tmp_path / "node"
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "tasks": [{"ansible.builtin.include_role": {"name": "llmops.serving.serving",
                                                         "tasks_from": "wait_script.yml"}}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    args = ["-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "_serving_wait_dir=%s" % node]
    result, first = run_local_playbook(path, str(tmp_path), extra_args=args)
    assert first.get("failed") == 0 and first.get("changed") == 3, result.stdout[-3000:] + result.stderr
    result, second = run_local_playbook(path, str(tmp_path), extra_args=args)
    assert second.get("failed") == 0 and second.get("changed") == 0, result.stdout[-3000:]
    install_serving_wait(tmp_path / "expected")
    installed = _tree(node)
    assert "serving-wait.py" in installed and installed == _tree(tmp_path / "expected")
