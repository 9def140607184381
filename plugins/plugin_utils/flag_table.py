# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every engine's flag table does the same way: settings -> argv fragments, and the extra_args checks.

An engine file (llama_server_flags.py, vllm_flags.py) keeps only what is its own: the table of its flags
(rows made by :func:`entry`), its renamed/removed/secret flags and the messages that name their
replacements, and its folds of settings (llama-server's load_mode, vLLM's JSON options). It wraps that in a
:class:`FlagTable`, which raises the engine's own error class (a ServingError subclass) so callers and
tests still see ``LlamaServerArgsError`` or ``VllmArgsError``. Controller-only (plugin_utils), unit-tested by
tests/unit/plugins/plugin_utils/test_flag_table.py.
"""
from __future__ import absolute_import, division, print_function

import json

from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import is_number

__metaclass__ = type

ONOFF = ("on", "off", "auto")


# kinds:
#   value   --flag VALUE
#   switch  True -> --flag ; False/None -> nothing (the flag has no negative form)
#   bool    True -> --flag ; False -> the negative flag
#   onoff   on|off|auto (booleans accepted: True -> on, False -> off)
#   choice  one of `choices`
#   csv     list -> "a,b,c" (a string is passed as is)
#   nargs   list -> --flag a b c (argparse nargs="+")
#   json    the engine's `json_text(key, value)` -> one argument
# `aliases` are the other spellings the engine accepts for the same option; extra_args may not use them.
def entry(flag, kind="value", aliases=(), negative=None, choices=None, help_text=""):
    """One row of a flag table."""
    return {"flag": flag, "kind": kind, "aliases": tuple(aliases), "negative": negative,
            "choices": tuple(choices) if choices else None, "help": help_text}


def compact_json(value):
    """The one JSON spelling on command lines: sorted keys, no spaces (stable argv, stable unit files)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def dash_name(arg):
    """`--ctx-size=4096` -> `--ctx-size`: the option an extra_args item names."""
    return arg.split("=", 1)[0]


class FlagTable:
    """An engine's ordered flag table (setting name -> :func:`entry`) and the checks every engine shares.

    `error` is the engine's ServingError subclass; `engine` names the engine in messages ("vLLM");
    `managed_keys` are instance fields the serving layer fills, never settings; `folded_keys` are settings
    that are not flags of their own (the engine folds them into one before rendering); `json_text(key,
    value)` writes the single argument of a "json" flag. `checked_versions` are the engine versions the
    table was checked against (option by option, in the real engine); `version_key(text)` turns the version
    a build reports into what is compared with them (None: the build does not say), `same_version(key,
    checked)` compares (default: equal).
    """

    def __init__(self, flags, error, engine, managed_keys=(), folded_keys=(), json_text=None,
                 checked_versions=(), version_key=None, same_version=None):
        self.flags = flags
        self.error = error
        self.engine = engine
        self.managed_keys = tuple(managed_keys)
        self.folded_keys = tuple(folded_keys)
        self.json_text = json_text
        self.checked_versions = tuple(checked_versions)
        self.version_key = version_key or _plain_version
        self.same_version = same_version or (lambda key, checked: key == checked)

    # --- the engine version the table was checked against -----------------------------------------------
    def version_warning(self, version, argv=(), unknown_is_checked=False):
        """None when `version` (as the build reports it) is one the table was checked against; else one
        sentence naming both versions and the options this command line renders, which are then unchecked.
        A build that does not say its version is warned about too, unless `unknown_is_checked`."""
        key = self.version_key(version) if version else None
        if key is None and unknown_is_checked:
            return None
        if key is not None and any(self.same_version(key, c) for c in self.checked_versions):
            return None
        checked = ", ".join(self.checked_versions)
        rendered = sorted(set(a.split("=", 1)[0] for a in argv if str(a).startswith("-")))
        runtime = ("%s %s" % (self.engine, key)) if key else ("a %s whose version is not known" % self.engine)
        return ("%s runs with the flag table checked against %s %s only: an option that %s lacks or spells "
                "otherwise stops it at start (the health gate then keeps the running unit). Check the "
                "options this instance renders against its --help: %s"
                % (runtime, self.engine, checked, "version" if not key else key,
                   ", ".join(rendered) or "(none)"))

    # --- one value ---------------------------------------------------------------------------------------
    def scalar(self, key, value):
        """A number or non-empty string -> its argv spelling (floats as repr, so 0.1 stays 0.1)."""
        if isinstance(value, bool):
            raise self.error("setting %s: expected a number or string, got %r" % (key, value))
        if isinstance(value, float):
            return repr(value)
        if is_number(value):
            return str(value)
        if isinstance(value, str):
            if value == "":
                raise self.error("setting %s is empty: remove it or give a value" % key)
            return value
        raise self.error("setting %s: expected a number or string, got %s" % (key, type(value).__name__))

    def scalars(self, key, value):
        """A list (or one value) -> the argv spelling of each item; an empty list is refused."""
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if not values:
            raise self.error("setting %s is an empty list: remove it or give values" % key)
        return [self.scalar(key, v) for v in values]

    def onoff(self, key, value):
        if value is True:
            return "on"
        if value is False:
            return "off"
        text = str(value).lower()
        if text not in ONOFF:
            raise self.error("setting %s must be one of on, off, auto (or true/false), got %r" % (key, value))
        return text

    def flag_args(self, key, value):
        """The argv fragment for one setting (may be empty)."""
        spec = self.flags[key]
        kind = spec["kind"]
        if value is None:
            return []
        if kind in ("switch", "bool"):
            if not isinstance(value, bool):
                raise self.error("setting %s must be true or false, got %r" % (key, value))
            if value:
                return [spec["flag"]]
            return [spec["negative"]] if kind == "bool" else []
        if kind == "onoff":
            return [spec["flag"], self.onoff(key, value)]
        if kind == "choice":
            text = self.scalar(key, value)
            if text not in spec["choices"]:
                raise self.error("setting %s must be one of %s, got %r"
                                 % (key, ", ".join(spec["choices"]), value))
            return [spec["flag"], text]
        if kind == "csv":
            return [spec["flag"], ",".join(self.scalars(key, value))]
        if kind == "nargs":
            return [spec["flag"]] + self.scalars(key, value)
        if kind == "json":
            return [spec["flag"], self.json_text(key, value)]
        return [spec["flag"], self.scalar(key, value)]

    def argv(self, settings, managed):
        """Every flag in table order: instance fields from `managed`, the rest from normalised `settings`."""
        out = []
        for key in self.flags:
            value = managed[key] if key in self.managed_keys else settings.get(key)
            out.extend(self.flag_args(key, value))
        return out

    # --- spellings ---------------------------------------------------------------------------------------
    def spellings(self):
        """Every spelling (flag, aliases, negative) of the table, with the setting that owns it."""
        out = {}
        for key, spec in self.flags.items():
            for name in (spec["flag"],) + spec["aliases"] + ((spec["negative"],) if spec["negative"] else ()):
                out[name] = key
        return out

    def emitted_flags(self):
        """The flags the table can put on a command line (canonical spellings and negatives)."""
        out = []
        for spec in self.flags.values():
            out.append(spec["flag"])
            if spec["negative"]:
                out.append(spec["negative"])
        return out

    # --- checks ------------------------------------------------------------------------------------------
    def check_setting_names(self, settings, unknown_refusal=None):
        """Refuse instance fields and unknown keys in `settings`; returns a copy ({} for None).

        `unknown_refusal(key)` may explain an unknown key better (a renamed option): a message, or None.
        """
        if settings is None:
            return {}
        if not isinstance(settings, dict):
            raise self.error("settings must be a mapping of setting name -> value")
        for key in settings:
            if key in self.managed_keys:
                raise self.error("setting %s is an instance field: set `%s` on the instance, not under "
                                 "settings" % (key, key))
            if key in self.flags or key in self.folded_keys:
                continue
            message = unknown_refusal(key) if unknown_refusal else None
            if message:
                raise self.error(message)
            known = sorted(k for k in self.flags if k not in self.managed_keys) + list(self.folded_keys)
            raise self.error(
                "unknown %s setting %r; known settings: %s. Options the table does not know go to the "
                "instance's extra_args list" % (self.engine, key, ", ".join(known)))
        return dict(settings)

    def managed_refusal(self, name):
        """The message for an extra_args option the table already renders (it would be given twice)."""
        owner = self.spellings().get(name)
        if owner is None:
            return None
        return "extra_args contains %s; use the setting `%s` instead" % (name, owner)

    def check_extra_args(self, extra_args, example, refusal, option_name=dash_name):
        """extra_args as a list of strings, each option passed through the engine's `refusal(name)`.

        `option_name(arg)` is the option an item names, or None for an item that is a value; `refusal(name)`
        returns the message that refuses it, or None. `example` is an extra flag of this engine for the
        message about a bad type.
        """
        if extra_args is None:
            return []
        if not isinstance(extra_args, (list, tuple)):
            raise self.error("extra_args must be a list of strings, e.g. ['%s']" % example)
        out = []
        for arg in extra_args:
            if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
                raise self.error("extra_args items must be strings, got %r" % (arg,))
            arg = str(arg)
            name = option_name(arg)
            message = refusal(name) if name is not None else None
            if message:
                raise self.error(message)
            out.append(arg)
        return out


def _plain_version(text):
    """A build's version text as it is, or None when empty."""
    text = "" if text is None else str(text).strip()
    return text or None


def without_none(settings):
    """Settings left unset (None) render nothing; drop them so folds and checks see only set values."""
    return dict((k, v) for k, v in settings.items() if v is not None)
