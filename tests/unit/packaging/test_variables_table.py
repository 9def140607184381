# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""docs/variables.md is generated from the roles' meta/argument_specs.yml and kept current."""
import glob
import os
import textwrap

from tests.helpers import ROOT
from tools import gen_variables_table


def _write_role(roles_dir, role, specs_yaml):
    meta = roles_dir / role / "meta"
    meta.mkdir(parents=True)
    (meta / "argument_specs.yml").write_text(textwrap.dedent(specs_yaml))


def _count_options(options):
    return sum(1 + _count_options(option.get("options")) for option in (options or {}).values())


def test_docs_variables_md_is_current():
    with open(os.path.join(ROOT, gen_variables_table.OUTPUT)) as handle:
        current = handle.read()
    assert current == gen_variables_table.render(os.path.join(ROOT, "roles")), (
        "%s is not current: run `%s`" % (gen_variables_table.OUTPUT, gen_variables_table.REGENERATE))


def test_every_option_of_every_role_has_a_row():
    rows = gen_variables_table.collect_rows(os.path.join(ROOT, "roles"))
    specs = gen_variables_table.load_argument_specs(os.path.join(ROOT, "roles"))
    roles_with_specs = {path.split(os.sep)[-3] for path in glob.glob(os.path.join(ROOT, "roles", "*", "meta",
                                                                                   "argument_specs.yml"))}
    assert set(specs) == roles_with_specs
    expected = sum(_count_options(spec.get("options")) for entry_points in specs.values()
                   for _, spec in entry_points)
    assert len(rows) == expected
    # A role's variables are prefixed with its name (docs/CONVENTIONS.md): a row that is not points at a
    # spec that documents something else, or at a generator that mixed roles up.
    for row in rows:
        top = row["variable"].split("[]")[0].split(".")[0]
        assert top.startswith(row["role"].lstrip("_") + "_"), row


def test_rows_carry_type_default_required_and_nested_options(tmp_path):
    _write_role(tmp_path, "demo", """\
        argument_specs:
          setup:
            short_description: The setup entry point.
            options:
              demo_port:
                type: int
                required: true
                description: Port.
          main:
            short_description: Demo C(role).
            options:
              demo_items:
                type: list
                elements: dict
                default: []
                description:
                  - Items; see I(demo_port) and C(a|b).
                  - Written to C(<dir>/<name>.env), never <shown>.
                options:
                  name:
                    type: str
                    required: true
                    description: Item name.
                  mode:
                    type: str
                    choices: [host, container]
                    default: host
                    description: Mode.
              demo_token:
                type: str
                default: ""
                no_log: true
                description: Token.
              demo_settings:
                type: dict
                default: {a: 1, b: [true, null]}
                options:
                  depth:
                    type: int
                    description: B(Depth) per L(docs,https://example.invalid/d).
        """)
    rows = gen_variables_table.collect_rows(str(tmp_path))
    table = [(row["entry_point"], row["variable"], row["type"], row["default"], row["required"])
             for row in rows]
    assert table == [
        ("main", "demo_items", "list of dict", "`[]`", ""),
        ("main", "demo_items[].name", "str", "", "yes"),
        ("main", "demo_items[].mode", "str", "`host`", ""),
        ("main", "demo_token", "str", '`""`', ""),
        ("main", "demo_settings", "dict", '`{"a": 1, "b": [true, null]}`', ""),
        ("main", "demo_settings.depth", "int", "", ""),
        ("setup", "demo_port", "int", "", "yes"),
    ]
    descriptions = {row["variable"]: row["description"] for row in rows}
    assert descriptions["demo_items"] == (
        "Items; see *demo_port* and `a\\|b`.<br>Written to `<dir>/<name>.env`, never &lt;shown&gt;.")
    assert descriptions["demo_items[].mode"] == "Mode.<br>Choices: `host`, `container`."
    assert descriptions["demo_token"] == "Token.<br>Secret: never logged."
    assert descriptions["demo_settings"] == ""
    assert descriptions["demo_settings.depth"] == "**Depth** per [docs](https://example.invalid/d)."


def test_rendered_table_has_one_line_per_row_and_entry_point_summaries(tmp_path):
    _write_role(tmp_path, "demo", """\
        argument_specs:
          main:
            short_description: Demo C(role).
            options:
              demo_a: {type: str, description: "A | pipe"}
              demo_b: {type: bool, default: false, description: [B, "two lines"]}
        """)
    rendered = gen_variables_table.render(str(tmp_path))
    assert "- [demo](#demo) (2)" in rendered
    assert "- `main`: Demo `role`." in rendered
    lines = rendered.splitlines()
    header = lines.index("| Entry point | Variable | Type | Default | Required | Description |")
    assert lines[header + 1:header + 4] == [
        "|---|---|---|---|---|---|",
        "| `main` | `demo_a` | str |  |  | A \\| pipe |",
        "| `main` | `demo_b` | bool | `false` |  | B<br>two lines |",
    ]


def test_check_mode_reports_a_stale_table_and_writes_nothing(tmp_path, capsys):
    _write_role(tmp_path / "roles", "demo", """\
        argument_specs:
          main:
            options:
              demo_a: {type: str, description: A.}
        """)
    (tmp_path / "docs").mkdir()
    output = tmp_path / "docs" / "variables.md"
    output.write_text("stale\n")
    assert gen_variables_table.main(["--check", "--root", str(tmp_path)]) == 1
    assert gen_variables_table.REGENERATE in capsys.readouterr().err
    assert output.read_text() == "stale\n"
    assert gen_variables_table.main(["--root", str(tmp_path)]) == 0
    assert "`demo_a`" in output.read_text()
    assert gen_variables_table.main(["--check", "--root", str(tmp_path)]) == 0
