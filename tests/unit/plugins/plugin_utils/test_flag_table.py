# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shared core of the engines' flag tables (plugins/plugin_utils/flag_table.py), on a made-up engine."""
from collections import OrderedDict

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import flag_table
from ansible_collections.llmops.serving.plugins.plugin_utils.flag_table import FlagTable, entry
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError


class ToyError(ServingError):
    pass


FLAGS = OrderedDict([
    ("port", entry("--port")),
    ("size", entry("--size", aliases=("-s",))),
    ("verbose", entry("--verbose", "switch")),
    ("cache", entry("--cache", "bool", negative="--no-cache")),
    ("attn", entry("--attn", "onoff", choices=flag_table.ONOFF)),
    ("mode", entry("--mode", "choice", choices=("fast", "slow"))),
    ("split", entry("--split", "csv")),
    ("names", entry("--names", "nargs")),
    ("options", entry("--options", "json")),
])


def toy_table():
    return FlagTable(FLAGS, ToyError, "toy", managed_keys=("port",), folded_keys=("legacy",),
                     json_text=lambda key, value: flag_table.compact_json(value))


@pytest.mark.parametrize("key,value,argv", [
    ("size", 4096, ["--size", "4096"]),
    ("size", 0.1, ["--size", "0.1"]),
    ("size", "4k", ["--size", "4k"]),
    ("size", None, []),
    ("verbose", True, ["--verbose"]),
    ("verbose", False, []),
    ("cache", True, ["--cache"]),
    ("cache", False, ["--no-cache"]),
    ("attn", True, ["--attn", "on"]),
    ("attn", "AUTO", ["--attn", "auto"]),
    ("mode", "slow", ["--mode", "slow"]),
    ("split", [3, 1], ["--split", "3,1"]),
    ("split", "3,1", ["--split", "3,1"]),
    ("names", ["a", "b"], ["--names", "a", "b"]),
    ("names", "a", ["--names", "a"]),
    ("options", {"b": 1, "a": [1, 2]}, ["--options", '{"a":[1,2],"b":1}']),
])
def test_each_kind_renders(key, value, argv):
    assert toy_table().flag_args(key, value) == argv


@pytest.mark.parametrize("key,value,message", [
    ("size", True, "setting size: expected a number or string, got True"),
    ("size", "", "setting size is empty: remove it or give a value"),
    ("size", {}, "setting size: expected a number or string, got dict"),
    ("verbose", "yes", "setting verbose must be true or false, got 'yes'"),
    ("cache", 1, "setting cache must be true or false, got 1"),
    ("attn", "maybe", "setting attn must be one of on, off, auto (or true/false), got 'maybe'"),
    ("mode", "medium", "setting mode must be one of fast, slow, got 'medium'"),
    ("split", [], "setting split is an empty list: remove it or give values"),
    ("names", [""], "setting names is empty: remove it or give a value"),
])
def test_bad_values_raise_the_engines_error(key, value, message):
    with pytest.raises(ToyError) as raised:
        toy_table().flag_args(key, value)
    assert str(raised.value) == message


def test_argv_follows_the_table_order_and_takes_instance_fields_from_managed():
    argv = toy_table().argv({"mode": "fast", "size": 1, "port": 9}, {"port": 8080})
    assert argv == ["--port", "8080", "--size", "1", "--mode", "fast"]


def test_spellings_and_emitted_flags():
    table = toy_table()
    spellings = table.spellings()
    assert spellings["-s"] == "size" and spellings["--no-cache"] == "cache"
    assert "-s" not in table.emitted_flags()
    assert table.emitted_flags()[:5] == ["--port", "--size", "--verbose", "--cache", "--no-cache"]


def test_setting_names():
    table = toy_table()
    assert table.check_setting_names(None) == {}
    assert table.check_setting_names({"legacy": 1, "size": None}) == {"legacy": 1, "size": None}
    with pytest.raises(ToyError, match="settings must be a mapping"):
        table.check_setting_names(["size"])
    with pytest.raises(ToyError, match="setting port is an instance field"):
        table.check_setting_names({"port": 1})
    with pytest.raises(ToyError) as raised:
        table.check_setting_names({"colour": 1})
    assert str(raised.value) == (
        "unknown toy setting 'colour'; known settings: attn, cache, mode, names, options, size, split, "
        "verbose, legacy. Options the table does not know go to the instance's extra_args list")
    with pytest.raises(ToyError, match="^colour is now mode$"):
        table.check_setting_names({"colour": 1}, lambda key: "%s is now mode" % key)


def test_without_none():
    assert flag_table.without_none({"a": None, "b": 0, "c": False}) == {"b": 0, "c": False}


def test_extra_args_pass_through_the_engines_refusal():
    table = toy_table()

    def refusal(name):
        if name == "--secret":
            return "no secrets"
        return table.managed_refusal(name)

    assert table.check_extra_args(None, "--x", refusal) == []
    assert table.check_extra_args(["--x=1", 5, 2.5], "--x", refusal) == ["--x=1", "5", "2.5"]
    for args, message in ((["--secret=s"], "no secrets"),
                          (["-s", "4"], "extra_args contains -s; use the setting `size` instead"),
                          (["--no-cache"], "extra_args contains --no-cache; use the setting `cache` instead"),
                          ("--x", "extra_args must be a list of strings, e.g. ['--x']"),
                          ([True], "extra_args items must be strings, got True"),
                          ([["--x"]], "extra_args items must be strings, got ['--x']")):
        with pytest.raises(ToyError) as raised:
            table.check_extra_args(args, "--x", refusal)
        assert str(raised.value) == message


def test_extra_args_values_are_not_checked_when_option_name_says_so():
    table = toy_table()
    seen = []

    def option_name(arg):
        return arg if arg.startswith("-") else None

    def refusal(name):
        seen.append(name)

    for args in (["--y", "--size"], ["--y", "value"]):
        assert table.check_extra_args(args, "--x", refusal, option_name=option_name) == args
    assert seen == ["--y", "--size", "--y"]
    assert flag_table.dash_name("--ctx-size=4096") == "--ctx-size"
