# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Risky constructs in a model's chat template (a Jinja template that llama-server and vLLM render).

gguf_info reports them for a GGUF's tokenizer.chat_template (gguf.py summarize(): chat_template_risks).
Linear time on any input: the template comes from a downloaded file.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type


CHAT_TEMPLATE_RISKS = (
    ("__globals__", re.compile(r"__globals__")),
    ("__class__", re.compile(r"__class__")),
    ("__subclasses__", re.compile(r"__subclasses__")),
    ("__builtins__", re.compile(r"__builtins__")),
    ("__import__", re.compile(r"__import__")),
    ("__mro__", re.compile(r"__mro__|__bases?__")),
    ("__init__", re.compile(r"__init__")),
    ("import", re.compile(r"(?<![A-Za-z0-9_])import(?![A-Za-z0-9_])")),
    ("os.", re.compile(r"(?<![A-Za-z0-9_])os\s*\.\s*[A-Za-z_]")),
    ("popen", re.compile(r"popen", re.I)),
    ("subprocess", re.compile(r"subprocess")),
    ("eval/exec", re.compile(r"(?<![A-Za-z0-9_])(?:eval|exec|compile)\s*\(")),
    ("open(", re.compile(r"(?<![A-Za-z0-9_.])open\s*\(")),
)
_QUOTE_OR_ESCAPE = re.compile(r"['\"\\]")


def _strip_string_literals(code):
    """code with the contents of '...' and "..." literals removed; linear time, tolerant of bad quoting."""
    out = []
    start = 0
    quote = None
    escaped_until = -1
    for m in _QUOTE_OR_ESCAPE.finditer(code):
        pos = m.start()
        if pos < escaped_until:
            continue
        ch = m.group()
        if quote is None:
            if ch != "\\":
                out.append(code[start:pos])
                quote = ch
        elif ch == "\\":
            escaped_until = pos + 2
        elif ch == quote:
            out.append("''")
            quote = None
            start = pos + 1
    if quote is None:
        out.append(code[start:])
    return "".join(out)


def _jinja_code(template):
    """The insides of {{ }} and {% %} blocks, joined; linear time (an unclosed block runs to the end)."""
    parts = []
    i = 0
    n = len(template)
    next_expr = template.find("{{")
    next_stmt = template.find("{%")
    while True:
        if 0 <= next_expr < i:
            next_expr = template.find("{{", i)
        if 0 <= next_stmt < i:
            next_stmt = template.find("{%", i)
        starts = [p for p in (next_expr, next_stmt) if p >= 0]
        if not starts:
            break
        j = min(starts)
        k = template.find("}}" if template[j + 1] == "{" else "%}", j + 2)
        k = n if k < 0 else k
        parts.append(template[j + 2:k])
        i = k + 2
        if i >= n:
            break
    return "\n".join(parts)


# Flagged anywhere in the template (also inside string literals: `x|attr('__globals__')`).
_ANYWHERE = ("__globals__", "__class__", "__subclasses__", "__builtins__", "__import__", "__mro__",
             "__init__", "popen", "subprocess")


def chat_template_risks(template):
    """Risky constructs in a chat template (sandbox-escape attribute walks, imports, shell access).

    Dunder attribute walks, popen and subprocess are flagged anywhere (names can be built from strings);
    `import`, `os.`, eval/exec and open( only in {{ }} / {% %} code outside string literals, so that prose
    in a system prompt ("import the data...") does not count."""
    if not template:
        return []
    code = _strip_string_literals(_jinja_code(template))
    found = []
    for name, pattern in CHAT_TEMPLATE_RISKS:
        haystack = template if name in _ANYWHERE else code
        if pattern.search(haystack):
            found.append(name)
    return found
