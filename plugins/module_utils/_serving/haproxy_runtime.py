# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Drive one server of an HAProxy backend through the runtime API (the admin Unix socket).

Python 3.6, stdlib only: it runs on the gateway host. One command per connection (HAProxy's non-interactive
mode: it answers and closes). The rolling update drains an instance here before restarting it and readies
it afterwards.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import math
import socket
import time

from ansible_collections.llmops.serving.plugins.module_utils.module_guard import brief
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

STATES = ("ready", "drain", "maint")
# HAProxy's proxy and server names: letters, digits, '-', '_', '.' and ':'. Anything else (a space, ';', a
# newline) would end the runtime API command and start another.
_NAME_RE = whole(r"[A-Za-z0-9_.:-]{1,256}")
# The longest wait (seconds) accepted for drain_timeout and healthy_timeout: a week.
MAX_WAIT = 7 * 24 * 3600

# srv_admin_state bits of `show servers state` (HAProxy's SRV_ADMF_*): forced, inherited, configured,
# resolver and hostname maintenance; forced and inherited drain.
_MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
_DRAIN_BITS = 0x08 | 0x10

_HINT = ("check that the gateway role is applied on this host and that the backend/server names are the ones "
         "in the gateway's llmops_gateway fact")


class RuntimeApiError(Exception):
    """A runtime API failure, with a message that says what to check (and the result so far, if any)."""

    def __init__(self, message, result=None):
        super(RuntimeApiError, self).__init__(message)
        self.result = result


def send_command(path, command, timeout=10.0):
    """Send one command on a fresh connection and return HAProxy's whole answer (text)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (IOError, OSError) as exc:
            raise RuntimeApiError(_connect_message(path, exc))  # noqa: B904
        try:
            sock.sendall(command.encode("utf-8") + b"\n")
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except socket.timeout:
            raise RuntimeApiError(  # noqa: B904 - Python 3.6 code, the message says it all
                "HAProxy runtime API at %s did not answer '%s' within %ss"
                                  % (path, command, timeout))
        except (IOError, OSError) as exc:
            raise RuntimeApiError(  # noqa: B904
                "HAProxy runtime API at %s failed during '%s': %s" % (path, command, exc))
    finally:
        sock.close()
    return b"".join(chunks).decode("utf-8", "replace")


def _connect_message(path, exc):
    code = getattr(exc, "errno", None)
    if code in (errno.ENOENT,):
        return ("HAProxy admin socket %s does not exist: is HAProxy running with "
                "'stats socket %s level admin' (%s)?" % (path, path, _HINT))
    if code in (errno.EACCES, errno.EPERM):
        return ("permission denied on HAProxy admin socket %s: run the task with become "
                "(the socket belongs to HAProxy's user/group) or check the socket's mode/group in the "
                "gateway configuration" % path)
    if code in (errno.ECONNREFUSED,):
        return ("HAProxy admin socket %s refuses connections: HAProxy is not running (a stale socket); "
                "check 'systemctl status haproxy' on the gateway" % path)
    if code in (errno.ENOTSOCK,):
        return "%s is not a Unix socket: the socket option must name HAProxy's admin stats socket" % path
    return "cannot connect to HAProxy admin socket %s: %s" % (path, exc)


def parse_stat_csv(text):
    """Rows of `show stat` as dicts keyed by the header's column names (`# pxname,svname,...`)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("#"):
        raise RuntimeApiError("unexpected answer to 'show stat' (no '# pxname,...' header): %r" % text[:200])
    names = [name.strip() for name in lines[0].lstrip("#").strip().split(",")]
    rows = []
    for line in lines[1:]:
        values = line.split(",")
        rows.append(dict(zip(names, values)))  # noqa: B905 - Python 3.6 has no strict=
    return rows


def _check_answer(answer, what):
    """Raise on HAProxy's error answers (which are text; a successful `set server` answers nothing)."""
    text = answer.strip()
    if text in ("No such backend.", "Can't find backend."):
        raise RuntimeApiError("HAProxy has no backend named in %s: %s" % (what, _HINT))
    if text == "No such server.":
        raise RuntimeApiError("HAProxy has no server named in %s: %s" % (what, _HINT))
    if text.startswith("Permission denied") or "Unknown command" in text:
        raise RuntimeApiError("HAProxy refused %s (%s): the admin socket must be declared 'level admin'"
                              % (what, text.splitlines()[0]))
    return text


class RuntimeApi(object):
    """The runtime API on one socket; `send` is the transport (replaceable in tests)."""

    def __init__(self, path, send=send_command):
        self.path = path
        self._send = send

    def command(self, command):
        return self._send(self.path, command)

    def server_stat(self, backend, server):
        """The `show stat` row of backend/server."""
        what = "'%s/%s'" % (backend, server)
        rows = parse_stat_csv(_check_answer(self.command("show stat"), "'show stat'"))
        backends = set(row.get("pxname") for row in rows)
        if backend not in backends:
            raise RuntimeApiError("HAProxy has no backend '%s' (it has: %s): %s"
                                  % (backend, ", ".join(sorted(b for b in backends if b)), _HINT))
        for row in rows:
            if row.get("pxname") == backend and row.get("svname") == server:
                return row
        servers = sorted(r.get("svname") for r in rows if r.get("pxname") == backend
                         and r.get("svname") not in ("FRONTEND", "BACKEND"))
        raise RuntimeApiError("HAProxy backend '%s' has no server '%s' (it has: %s): %s"
                              % (backend, server, ", ".join(servers), _HINT) if servers else
                              "HAProxy has no server %s: %s" % (what, _HINT))

    def admin_state(self, backend, server):
        """ready, drain or maint, from srv_admin_state of `show servers state <backend>`."""
        answer = _check_answer(self.command("show servers state %s" % backend), "backend '%s'" % backend)
        lines = answer.splitlines()
        header = None
        for line in lines:
            if line.startswith("#"):
                header = line.lstrip("#").split()
                continue
            if header is None or not line.strip():
                continue
            row = dict(zip(header, line.split()))  # noqa: B905
            if row.get("be_name") == backend and row.get("srv_name") == server:
                bits = int(row.get("srv_admin_state", "0"))
                if bits & _MAINT_BITS:
                    return "maint"
                if bits & _DRAIN_BITS:
                    return "drain"
                return "ready"
        raise RuntimeApiError("HAProxy backend '%s' has no server '%s': %s" % (backend, server, _HINT))

    def set_state(self, backend, server, state):
        if state not in STATES:
            raise RuntimeApiError("state must be one of %s, not %r" % (", ".join(STATES), state))
        what = "'%s/%s'" % (backend, server)
        answer = _check_answer(self.command("set server %s/%s state %s" % (backend, server, state)), what)
        if answer:
            raise RuntimeApiError("HAProxy did not set %s to %s: %s" % (what, state, answer))


def _sessions(row):
    try:
        return int(row.get("scur") or 0)
    except ValueError:
        return 0


def _status(row):
    return (row.get("status") or "").strip()


def _is_down(status):
    # "DOWN", "DOWN 1/2" (going down), "MAINT (resolution)", ... : the backend server is not reachable.
    return status.startswith("DOWN") or status.startswith("NOLB")


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_arguments(socket_path, backend, server, state, drain_timeout, healthy_timeout, poll_interval):
    """Refuse what HAProxy or the waits cannot take, naming the option: RuntimeApiError."""
    if not isinstance(socket_path, str) or not socket_path or "\0" in socket_path or "\n" in socket_path:
        raise RuntimeApiError("socket must be the path of HAProxy's admin socket (no NUL or newline), got %s"
                              % brief(socket_path))
    for option, value in (("backend", backend), ("server", server)):
        if not isinstance(value, str) or not _NAME_RE.match(value):
            raise RuntimeApiError("%s %s: HAProxy names hold only letters, digits, '-', '_', '.' and ':' (%s)"
                                  % (option, brief(value), _HINT))
    if state not in STATES:
        raise RuntimeApiError("state must be one of %s, not %r" % (", ".join(STATES), state))
    for option, value in (("drain_timeout", drain_timeout), ("healthy_timeout", healthy_timeout)):
        if not _is_number(value) or math.isnan(value) or not 0 <= value <= MAX_WAIT:
            raise RuntimeApiError("%s must be a number of seconds from 0 to %d, got %r"
                                  % (option, MAX_WAIT, value))
    if not _is_number(poll_interval) or not math.isfinite(poll_interval) or not 0 < poll_interval <= 60:
        raise RuntimeApiError("poll_interval must be a number of seconds above 0 and at most 60, got %r"
                              % (poll_interval,))


def apply_state(api, backend, server, state, drain_timeout=120, wait_healthy=True, healthy_timeout=120,
                poll_interval=0.5, check_mode=False, clock=time.monotonic, sleep=time.sleep):
    """Set backend/server to `state` and wait: sessions to end (drain/maint), health UP (ready).

    Returns a dict: previous_state, state, status, sessions, waited, changed. Raises RuntimeApiError with a
    message naming backend/server and what to do on a timeout, or naming the option it cannot take.
    """
    check_arguments(api.path, backend, server, state, drain_timeout, healthy_timeout, poll_interval)
    name = "%s/%s" % (backend, server)
    row = api.server_stat(backend, server)
    previous = api.admin_state(backend, server)
    changed = previous != state
    result = dict(previous_state=previous, state=state, status=_status(row), sessions=_sessions(row),
                  waited=0.0, changed=changed)
    if check_mode:
        # Report what would change; touch nothing and wait for nothing.
        return result
    if changed:
        api.set_state(backend, server, state)
    start = clock()
    if state in ("drain", "maint"):
        while True:
            row = api.server_stat(backend, server)
            sessions, status = _sessions(row), _status(row)
            waited = clock() - start
            if sessions == 0:
                break
            result.update(status=status, sessions=sessions, waited=round(waited, 3))
            if _is_down(status):
                # A DOWN server's sessions end when HAProxy's timeouts close them, not by draining: waiting
                # the whole drain_timeout would only delay the rolling update.
                raise RuntimeApiError(
                    "HAProxy server %s is %s with %d session(s) left that cannot finish normally: "
                    "the instance is not answering; restart it now (its clients will retry) or clear them "
                    "with "
                    "'shutdown sessions server %s' on the admin socket" % (name, status, sessions, name),
                    result)
            if waited >= drain_timeout:
                raise RuntimeApiError(
                    "HAProxy server %s still has %d session(s) after %ds of %s (status %s): "
                    "raise drain_timeout for long generations, or check for stuck clients with 'show sess' "
                    "on the admin socket"
                    % (name, sessions, drain_timeout, state, status), result)
            sleep(poll_interval)
    elif wait_healthy:
        while True:
            row = api.server_stat(backend, server)
            status = _status(row)
            waited = clock() - start
            result.update(status=status, sessions=_sessions(row), waited=round(waited, 3))
            if status.startswith("UP") or status == "no check":
                # "no check": HAProxy does not health-check this server, so there is nothing to wait for.
                break
            if waited >= healthy_timeout:
                raise RuntimeApiError(
                    "HAProxy server %s is not UP after %ds in ready state (status %s, last check %s): check "
                    "that the instance answers its health check on %s, or raise healthy_timeout"
                    % (name, healthy_timeout, status, row.get("check_status") or "-",
                       row.get("addr") or "its address"), result)
            sleep(poll_interval)
    result.update(status=_status(row), sessions=_sessions(row), waited=round(clock() - start, 3))
    return result
