# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way the collection checks a value against a pattern: over the WHOLE string (issue 34).

Python's ``$`` also matches just before a final newline, so ``re.match(r"^[a-z]+$", "qwen\\n")`` accepts the
newline, and a value checked that way becomes a new line of whatever file it reaches (an HAProxy directive,
a systemd assignment, a listing entry). Every check uses these instead:

    NAME = whole(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")   # match(), search() and fullmatch() all whole-string
    if not NAME.match(value): ...
    if not matches(r"[0-9]{1,12}", text): ...           # one-off patterns

tests/unit/packaging/test_whole_string_patterns.py refuses a ``$``-anchored pattern anywhere in plugins/ and
roles/. Plain Python 3.6, standard library only: the modules on the nodes import it too.
"""
from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type


def whole(pattern, flags=0):
    """`pattern` compiled so that match(), search() and fullmatch() only accept the whole string: ``\\A``
    and ``\\Z`` around it (``\\Z`` is the very end; ``$`` would allow a final newline). Give flags as the
    argument, not inline: an inline ``(?i)`` is only allowed at the start of the expression."""
    return re.compile(r"\A(?:%s)\Z" % pattern, flags)


def matches(pattern, value, flags=0):
    """The match of `pattern` over the whole of `value`, or None (also for a value that is not a string)."""
    if not isinstance(value, str):
        return None
    return whole(pattern, flags).match(value)
