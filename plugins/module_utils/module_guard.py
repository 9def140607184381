# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""No tracebacks, ever (issue 23): every module of the collection ends with one JSON result.

``new_module`` builds the AnsibleModule: ansible-core's own argument validation raises (instead of failing)
on some wrong types, e.g. a number where a dict with sub-options is expected; that becomes one failed result
naming the problem. ``unexpected_failure`` wraps a module's work: anything its own checks did not foresee
(a bug, a MemoryError, a RecursionError) fails the task with one line that names the module and the error,
scrubbed of the module's secrets, instead of a traceback that Ansible prints with the locals' values.
``run_module`` is every module's main(): both of them around the module's own work, and the one place where a
known error of a module's logic (``expected``) becomes its failure message.

Plain Python 3.6.
"""
from __future__ import absolute_import, division, print_function

import copy
import io
import json
import sys
from contextlib import contextmanager

from ansible_collections.llmops.serving.plugins.module_utils.secrets import scrub

__metaclass__ = type

# what ansible-core's validation raises on values it does not expect (it reports the others itself)
_VALIDATION_CRASHES = (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError,
                       UnicodeError, OverflowError)


def _raw_secrets(spec, params, depth=0):
    """The raw values of the no_log options (sub-options too) in the module's arguments."""
    found = []
    if not isinstance(spec, dict) or not isinstance(params, dict) or depth > 8:
        return found
    for name, option in spec.items():
        value = params.get(name)
        if not isinstance(option, dict):
            continue
        if option.get("no_log") and isinstance(value, str):
            found.append(value)
        if option.get("options"):
            for item in value if isinstance(value, list) else [value]:
                found += _raw_secrets(option["options"], item, depth + 1)
    return found


def new_module(factory, **kwargs):
    """factory(**kwargs) (AnsibleModule); a crash of its argument validation is one failed JSON result.

    What the validation itself prints (its failure) is scrubbed of the no_log values: ansible-core 2.16
    shows them in invocation.module_args when a sub-option is malformed (``runs: ""``)."""
    secrets = []
    from ansible.module_utils import basic
    if isinstance(factory, type) and issubclass(factory, basic.AnsibleModule):
        # the arguments AnsibleModule is about to read (_load_params caches them: read once either way)
        secrets = _raw_secrets(kwargs.get("argument_spec"), basic._load_params())
    real, captured = sys.stdout, io.StringIO()
    sys.stdout = captured
    try:
        return factory(**kwargs)
    except SystemExit:
        sys.stdout = real
        real.write(scrub(captured.getvalue(), *secrets))
        raise
    except _VALIDATION_CRASHES as exc:
        sys.stdout = real
        msg = ("the module arguments do not match the module's options (a number, string or list where a "
               "mapping of options is expected?): %s: %s" % (type(exc).__name__, str(exc)[:300]))
        # no AnsibleModule to call fail_json on: its JSON result written as fail_json writes it
        real.write(json.dumps({"failed": True, "changed": False, "msg": scrub(msg, *secrets)}) + "\n")
        raise SystemExit(1) from None
    finally:
        if sys.stdout is captured:
            sys.stdout = real
            real.write(scrub(captured.getvalue(), *secrets))


def module_secrets(module):
    """The values of the module's no_log options and those Ansible collected (module.no_log_values)."""
    spec = getattr(module, "argument_spec", None) or {}
    params = getattr(module, "params", None) or {}
    found = [params.get(name) for name, option in spec.items() if option.get("no_log")]
    found += list(getattr(module, "no_log_values", None) or ())
    return [s for s in found if isinstance(s, str) and s]


def brief(value, limit=80):
    """repr(value), cut to `limit` characters: a message names what was wrong without echoing 70 KB."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(%d characters)" % len(text)


@contextmanager
def unexpected_failure(module, what, secrets=()):
    """Inside: module.fail_json(...) for any Exception (not SystemExit: exit_json/fail_json end the module).
    `what`: the module's name; `secrets`: values no message may show (scrubbed in every form), besides the
    module's no_log options."""
    try:
        yield
    except Exception as exc:  # the last line of defence: everything expected is handled inside
        text = str(exc)
        if isinstance(exc, RecursionError):
            text = "input nested too deeply"
        elif isinstance(exc, MemoryError):
            text = "out of memory (an input too large)"
        msg = "%s failed: %s: %s" % (what, type(exc).__name__, text[:2000])
        hidden = [s for s in secrets if s] + module_secrets(module)
        module.fail_json(msg=scrub(msg, *hidden), changed=False)


def run_module(factory, name, run, expected=(), **kwargs):
    """A module's whole main(): ``new_module(factory, **kwargs)``, then ``run(module)`` inside
    ``unexpected_failure(module, name)``. ``factory`` is the module file's own AnsibleModule (what
    ansible-test's validate-modules and the unit tests capture); the argument spec is copied, as AnsibleModule
    adds to the one it is given and a module's spec is a constant of its file. ``supports_check_mode`` is
    True unless given: every module of the collection supports check mode.

    ``expected``: the exception classes of the module's own logic, the refusals its checks raise (DiskError,
    DeploymentError...). One of them fails the task with its message alone, ``fail_json(msg=str(exc),
    changed=False)``; anything else is unexpected and fails as ``unexpected_failure`` says. A module whose
    failure carries more (other return values, a prefix, a scrubbed token) catches its errors itself."""
    if "argument_spec" in kwargs:
        kwargs["argument_spec"] = copy.deepcopy(kwargs["argument_spec"])
    kwargs.setdefault("supports_check_mode", True)
    module = new_module(factory, **kwargs)
    with unexpected_failure(module, name):
        try:
            run(module)
        except tuple(expected) as exc:
            module.fail_json(msg=str(exc), changed=False)
