# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""An instance's env file: how role serving spells it and the ONE reader of it (issue 23).

Two spellings, as the two readers on the node need them:

- host mode, read by systemd (EnvironmentFile=): NAME="value", with backslash, double quote, dollar and
  backquote escaped by a backslash; a newline inside the quotes is part of the value.
- container mode, read by the docker client (docker run --env-file): NAME=value, one literal line, no quoting
  and no escapes (docker has none).

The header the role writes says which (a container-mode file names ``docker run --env-file`` in its comment;
a file may also say ``# llmops-env-format: docker`` or ``systemd``), so a reader never guesses:
``parse_env_text`` reads a file exactly as its own reader (systemd or docker) does. llm_benchmark reads keys
with it, and so does roles/serving/files/serving-wait.py on the node: role serving installs this file beside
the script in its package layout (roles/serving/tasks/wait_script.yml). Without one reader, a value written
"sk-...\\n" was read
back with its quote by the benchmark and the fleet smoke check, which then got 401 from a healthy instance.

Plain Python 3.6, standard library only.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

SYSTEMD = "systemd"
DOCKER = "docker"
# the characters a backslash escapes inside systemd's double quotes (SHELL_NEED_ESCAPE)
SYSTEMD_ESCAPED = '"\\`$'


def systemd_env_quote(value):
    """One value for an EnvironmentFile= line: in double quotes, with backslash, double quote, dollar and
    backquote escaped by a backslash.

    Every systemd version reads these four escapes back as the character (older ones unescape any character,
    newer ones exactly these), the rest is literal (no %-specifiers, no $VAR expansion in env files), a
    newline inside the quotes is part of the value, and the line is also valid POSIX sh (`. file`).
    """
    out = str(value)
    for char in ("\\", '"', "$", "`"):
        out = out.replace(char, "\\" + char)
    return '"%s"' % out


def env_lines(env, mode="host"):
    """The assignment lines of an env file for `mode` (host: systemd, container: docker); `env` is already
    checked for that reader (plugin_utils/env_files.check_env)."""
    if mode == "container":
        return ["%s=%s" % (name, value) for name, value in env.items()]
    return ["%s=%s" % (name, systemd_env_quote(value)) for name, value in env.items()]


# --- the reader (serving-wait.py imports it on the node: standard library only) -----------------------

def parse_env_text(text, fmt=None):
    """{name: value} of an env file, read as its own reader reads it: `fmt` 'docker' (docker run --env-file:
    NAME=value literal lines) or 'systemd' (EnvironmentFile=: quotes, backslash escapes, line continuations);
    None reads the file's comments: '# llmops-env-format: docker|systemd', or role serving's header of a
    container-mode file (it names 'docker run --env-file'); else systemd."""
    if fmt is None:
        fmt = "systemd"
        for line in text.split("\n"):
            if line.startswith("# llmops-env-format: "):
                fmt = line[len("# llmops-env-format: "):].strip()
                break
            if line.startswith("#") and "docker run --env-file" in line:
                fmt = "docker"
                break
    if fmt == "docker":
        values = {}
        for line in text.split("\n"):
            line = line.lstrip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            name, value = line.split("=", 1)
            values[name.strip()] = value[:-1] if value.endswith("\r") else value
        return values
    return _parse_systemd_env(text)


def _parse_systemd_env(text):
    """systemd's env-file.c state machine for what it reads: comments (# ;), NAME=, values unquoted
    (backslash escapes any character, trailing blanks dropped), in "..." (backslash escapes the four
    characters SYSTEMD_ESCAPED, else stays) or in '...' (literal); a backslash-newline continues."""
    values = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 1
            continue
        start = i
        while i < n and text[i] not in "=\n":
            i += 1
        if i >= n or text[i] != "=":
            continue  # a line without '=': ignored, as systemd does
        name = text[start:i].strip()
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        out = []
        if i < n and text[i] in "\"'":
            quote = text[i]
            i += 1
            while i < n and text[i] != quote:
                if quote == '"' and text[i] == "\\" and i + 1 < n:
                    following = text[i + 1]
                    if following == "\n":
                        pass
                    elif following in '"\\`$':
                        out.append(following)
                    else:
                        out.append("\\" + following)
                    i += 2
                    continue
                out.append(text[i])
                i += 1
            i += 1
            # anything after the closing quote up to the end of the line is appended, as systemd does
            while i < n and text[i] != "\n":
                if text[i] not in " \t\r":
                    out.append(text[i])
                i += 1
            value = "".join(out)
        else:
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n:
                    if text[i + 1] != "\n":
                        out.append(text[i + 1])
                    i += 2
                    continue
                out.append(text[i])
                i += 1
            value = "".join(out).rstrip(" \t\r")
        if name:
            values[name] = value
    return values

# --- end of the reader -------------------------------------------------------------------------------------
