# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write docs/variables.md, the table of every role variable, from the roles' meta/argument_specs.yml.

    .venv/bin/python tools/gen_variables_table.py           # regenerate docs/variables.md
    .venv/bin/python tools/gen_variables_table.py --check   # exit 1 when docs/variables.md is not current

The argument specs are what Ansible validates a role's variables against, so the table is generated from
them rather than copied by hand; tests/unit/packaging/test_variables_table.py fails when it is stale.
Suboptions are listed under their option: `serving_instances[].name` is the key `name` of each element of
the list `serving_instances`, `a.b` the key `b` of the dict `a`.
"""
import argparse
import glob
import html
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join("docs", "variables.md")
REGENERATE = ".venv/bin/python tools/gen_variables_table.py"
COLUMNS = ("Entry point", "Variable", "Type", "Default", "Required", "Description")

# Ansible's documentation markup: C() code and the semantic V() value, O() option, E() environment variable,
# P() plugin are shown as code; I() italic, B() bold, U() a link, L(text,url) a titled link.
_MARKUP = re.compile(r"\b([CVOEPIBUL])\(([^)]*)\)")


def _code(text):
    """A Markdown code span that survives a table cell: pipes escaped, backticks fenced by more."""
    text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return "%s%s%s%s%s" % (fence, pad, text, pad, fence)


def _prose(text):
    """Plain text in a table cell: no HTML tags made of `<name>`, no column breaks made of `|`."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("*", "\\*")


def markup_to_markdown(text):
    """One description paragraph, Ansible markup turned into Markdown that fits in one table cell."""
    parts = []
    position = 0
    for match in _MARKUP.finditer(text):
        parts.append(_prose(text[position:match.start()]))
        kind, content = match.groups()
        if kind in "CVOEP":
            parts.append(_code(content))
        elif kind == "I":
            parts.append("*%s*" % _prose(content))
        elif kind == "B":
            parts.append("**%s**" % _prose(content))
        elif kind == "U":
            parts.append("<%s>" % content)
        else:
            title, _, url = content.partition(",")
            parts.append("[%s](%s)" % (_prose(title.strip()), url.strip()))
        position = match.end()
    parts.append(_prose(text[position:]))
    return " ".join("".join(parts).split())


def _paragraphs(description):
    if description is None:
        return []
    if isinstance(description, str):
        return [description]
    return [str(paragraph) for paragraph in description]


def _type_of(option):
    kind = option.get("type", "str")
    if kind == "list" and option.get("elements"):
        return "list of %s" % option["elements"]
    return kind


def _default_of(option):
    if "default" not in option:
        return ""
    value = option["default"]
    if isinstance(value, str) and value:
        return _code(value)
    return _code(json.dumps(value, sort_keys=False))


def _description_of(option):
    paragraphs = [markup_to_markdown(paragraph) for paragraph in _paragraphs(option.get("description"))]
    if option.get("choices"):
        paragraphs.append("Choices: %s." % ", ".join(_code(str(choice)) for choice in option["choices"]))
    if option.get("no_log"):
        paragraphs.append("Secret: never logged.")
    return "<br>".join(paragraphs)


def _option_rows(options, prefix=""):
    """Rows for options and, after each, its suboptions, in the spec's order."""
    rows = []
    for name, option in (options or {}).items():
        option = option or {}
        variable = prefix + name
        rows.append({
            "variable": variable,
            "type": _type_of(option),
            "default": _default_of(option),
            "required": "yes" if option.get("required") else "",
            "description": _description_of(option),
        })
        if option.get("options"):
            nested = variable + ("[]." if option.get("type") == "list" else ".")
            rows.extend(_option_rows(option["options"], nested))
    return rows


def _entry_point_order(name):
    return (name != "main", name)


def load_argument_specs(roles_dir):
    """{role: [(entry point, its spec), ...]} for every role with a meta/argument_specs.yml, roles sorted,
    entry points main first."""
    specs_by_role = {}
    for spec_path in sorted(glob.glob(os.path.join(roles_dir, "*", "meta", "argument_specs.yml"))):
        role = os.path.basename(os.path.dirname(os.path.dirname(spec_path)))
        with open(spec_path) as handle:
            specs = (yaml.safe_load(handle) or {}).get("argument_specs") or {}
        specs_by_role[role] = [(name, specs[name] or {}) for name in sorted(specs, key=_entry_point_order)]
    return specs_by_role


def collect_rows(roles_dir):
    """Every variable of every role's argument specs, as a list of dicts with the keys role, entry_point,
    variable, type, default, required and description (Markdown-ready cell texts), sorted by role, then
    entry point (main first), then the spec's own order."""
    rows = []
    for role, entry_points in load_argument_specs(roles_dir).items():
        for entry_point, spec in entry_points:
            for row in _option_rows(spec.get("options")):
                row.update(role=role, entry_point=entry_point)
                rows.append(row)
    return rows


def render(roles_dir):
    """The whole of docs/variables.md for the roles under roles_dir, as a string."""
    rows = collect_rows(roles_dir)
    specs_by_role = load_argument_specs(roles_dir)
    lines = [
        "<!-- Generated by tools/gen_variables_table.py from roles/*/meta/argument_specs.yml: do not edit.",
        "     Regenerate with `%s`. -->" % REGENERATE,
        "# Role variables",
        "",
        "Every variable the roles of `llmops.serving` accept, from their `meta/argument_specs.yml`",
        "(what Ansible validates them against). Defaults live in each role's `defaults/main.yml`; site",
        "values belong in the inventory (`inventories/l20/`). `a[].b` is the key `b` of each element of",
        "the list `a`; `a.b` the key `b` of the dict `a`. An empty Default cell: no default (required,",
        "or unset unless given).",
        "",
    ]
    lines.extend("- [%s](#%s) (%d)" % (role, role, sum(1 for row in rows if row["role"] == role))
                 for role in specs_by_role)
    for role, entry_points in specs_by_role.items():
        lines.extend(["", "## %s" % role, ""])
        lines.extend("- `%s`: %s" % (entry_point, markup_to_markdown(spec.get("short_description") or ""))
                     for entry_point, spec in entry_points)
        lines.extend(["", "| %s |" % " | ".join(COLUMNS), "|%s" % ("---|" * len(COLUMNS))])
        for row in rows:
            if row["role"] == role:
                lines.append("| %s |" % " | ".join([
                    _code(row["entry_point"]), _code(row["variable"]), row["type"], row["default"],
                    row["required"], row["description"]]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1, writing nothing, when %s is not current" % OUTPUT)
    parser.add_argument("--root", default=ROOT, help="the collection root (default: this checkout)")
    args = parser.parse_args(argv)
    output = os.path.join(args.root, OUTPUT)
    wanted = render(os.path.join(args.root, "roles"))
    current = None
    if os.path.exists(output):
        with open(output) as handle:
            current = handle.read()
    if args.check:
        if current != wanted:
            sys.stderr.write("%s is not current: run `%s`\n" % (OUTPUT, REGENERATE))
            return 1
        return 0
    if current != wanted:
        with open(output, "w") as handle:
            handle.write(wanted)
        print("wrote %s" % output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
