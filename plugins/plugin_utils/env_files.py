# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An instance's environment file, for every engine: what its two readers can carry, and how it is spelled.

Instance environment (`env`) may hold secrets (LLAMA_API_KEY, HF_TOKEN, ...): it never goes into the unit
or on a command line, only into <config_dir>/<name>.env (root, 0600), read as root by systemd
(EnvironmentFile=, host mode) or by the docker client (docker run --env-file, container mode).
Tested by tests/roles/test_serving_env_secrets.py (against systemd's and docker's own parsers).
"""
from __future__ import absolute_import, division, print_function

from collections import OrderedDict

from ansible_collections.llmops.serving.plugins.module_utils._serving.env_file import (  # noqa: F401  pylint: disable=unused-import
    env_lines,
    systemd_env_quote,
)
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

__metaclass__ = type

ENV_NAME_RE = whole(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd keeps multi-line EnvironmentFile values since 239 (older ones drop the assignment); any version
# before 248 drops values with other control characters (TAB excepted).
SYSTEMD_ENV_NEWLINE_SINCE = 239
# docker's --env-file reader (bufio.Scanner) refuses lines of 64 KiB and more.
DOCKER_ENV_LINE_MAX = 65535


def _control_chars(value, allowed):
    return [c for c in value if (ord(c) < 32 or ord(c) == 127) and c not in allowed]


def check_env(env, mode="host", systemd_version=None, instance="instance"):
    """Validate an instance's `env` for its env file. Returns an OrderedDict name -> str, sorted by name.

    Error messages name the variable, never its value. `mode` picks the reader: host -> systemd's
    EnvironmentFile= (double-quoted, multi-line from systemd 239), container -> docker's --env-file (one
    literal line per variable: no newline). `systemd_version` None skips the version checks.
    """
    if env is None:
        return OrderedDict()
    if not isinstance(env, dict):
        raise ServingError("%s: env must be a mapping NAME -> value" % instance)
    out = OrderedDict()
    for key in sorted(env, key=str):
        name, value = str(key), env[key]
        if not ENV_NAME_RE.match(name):
            raise ServingError(
                "%s: env %r is not a valid variable name (letters, digits and '_', not starting with a digit)"
                % (instance, name))
        if value is None:
            raise ServingError("%s: env %s has no value; give a string ('' for empty)"
                               % (instance, name))
        if isinstance(value, (dict, list, tuple)):
            raise ServingError("%s: env %s must be a string or a number, got a %s"
                               % (instance, name, type(value).__name__))
        value = str(value)
        if "\x00" in value:
            raise ServingError("%s: env %s contains a NUL byte, which no environment can carry"
                               % (instance, name))
        if mode == "container":
            if "\n" in value:
                raise ServingError(
                    "%s: env %s contains a newline; container mode passes env with docker run --env-file, "
                    "which has one variable per line and no quoting. Use a single-line value (e.g. base64) "
                    "or host mode" % (instance, name))
            if _control_chars(value, "\t"):
                raise ServingError("%s: env %s contains a control character (other than TAB), which "
                                   "docker --env-file cannot carry" % (instance, name))
            if len(("%s=%s" % (name, value)).encode("utf-8")) > DOCKER_ENV_LINE_MAX:
                raise ServingError("%s: env %s is longer than docker --env-file accepts (64 KiB a "
                                   "line)" % (instance, name))
        else:
            if _control_chars(value, "\t\n"):
                raise ServingError("%s: env %s contains a control character (other than TAB and "
                                   "newline), which systemd before 248 drops" % (instance, name))
            if "\n" in value and systemd_version is not None \
                    and int(systemd_version or 0) < SYSTEMD_ENV_NEWLINE_SINCE:
                raise ServingError(
                    "%s: env %s contains a newline; systemd %s on this node drops multi-line EnvironmentFile "
                    "values (systemd %d and later keep them). Use a single-line value"
                    % (instance, name, systemd_version, SYSTEMD_ENV_NEWLINE_SINCE))
        out[name] = value
    return out


def env_file_lines(env, mode="host"):
    """The assignment lines of an env file (already checked with :func:`check_env` for `mode`)."""
    return env_lines(env, mode)
