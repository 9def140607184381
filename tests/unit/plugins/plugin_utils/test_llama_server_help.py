# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The flag table against a real llama-server's --help (the pinned llama.cpp, any build: CPU is enough).

Binary: $LLMOPS_LLAMA_SERVER, else .cache/host-build/bin/llama-server (a CPU build of the pinned source).
"""
import os
import re
import subprocess

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags as lsf

from tests.helpers import ROOT  # noqa: E402

BINARY = (os.environ.get("LLMOPS_LLAMA_SERVER")
          or os.path.join(ROOT, ".cache", "host-build", "bin", "llama-server"))

pytestmark = [
    pytest.mark.needs_llama_server,
    pytest.mark.skipif(not os.access(BINARY, os.X_OK),
                       reason="no llama-server binary at %s: set LLMOPS_LLAMA_SERVER to a build of the "
                              "pinned llama.cpp" % BINARY),
]


def parse_help(text):
    """--help -> {spelling: (tuple of the entry's spellings, description)}."""
    entries = []
    for line in text.splitlines():
        if line.startswith("-"):
            names, rest, expect_more = [], [], True
            for token in line.split():
                if expect_more and token.startswith("-"):
                    names.append(token.rstrip(","))
                    expect_more = token.endswith(",")
                else:
                    expect_more = False
                    rest.append(token)
            entries.append([names, " ".join(rest)])
        elif line.startswith(" ") and entries:
            entries[-1][1] += " " + line.strip()
    out = {}
    for names, description in entries:
        for name in names:
            out[name] = (tuple(names), description)
    return out


@pytest.fixture(scope="module")
def help_entries():
    proc = subprocess.run([BINARY, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:]
    entries = parse_help(proc.stdout)
    assert "--port" in entries and "--ctx-size" in entries, "unexpected --help format"
    return entries


def retired(description):
    return re.search(r"\b(removed|deprecated)\b", description, re.IGNORECASE)


def test_binary_is_the_pinned_build():
    out = subprocess.run([BINARY, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=60, check=False).stdout
    assert "commit %s" % lsf.PINNED_LLAMA_CPP["commit"][:7] in out, out


def test_every_generated_flag_exists_and_is_current(help_entries):
    for flag in lsf.emitted_flags():
        assert flag in help_entries, "the table emits %s, which this llama-server does not know" % flag
        names, description = help_entries[flag]
        assert not retired(description), "%s is marked: %s" % (flag, description)


def test_generated_spelling_is_the_current_one(help_entries):
    """llama-server lists an option's current long name first; older ones follow as aliases."""
    for key, spec in lsf.FLAGS.items():
        names = help_entries[spec["flag"]][0]
        longs = [n for n in names if n.startswith("--") and not n.startswith("--no-")]
        assert spec["flag"] == longs[0], "setting %s: generate %s, not %s" % (key, longs[0], spec["flag"])
        if spec["negative"]:
            negatives = [n for n in names if n.startswith("--no-")]
            assert spec["negative"] == negatives[0], (key, negatives)


def test_aliases_belong_to_the_same_option(help_entries):
    for key, spec in lsf.FLAGS.items():
        names = help_entries[spec["flag"]][0]
        for alias in spec["aliases"] + ((spec["negative"],) if spec["negative"] else ()):
            assert alias in names, "%s (setting %s): %s is not one of %s" % (spec["flag"], key, alias, names)


def test_choices_are_accepted_values(help_entries):
    for key, spec in lsf.FLAGS.items():
        if spec["kind"] not in ("choice", "onoff"):
            continue
        description = help_entries[spec["flag"]][1]
        for choice in spec["choices"]:
            if choice == "auto" and key == "reasoning_format":
                continue   # "(default: auto)"
            assert re.search(r"(?<![\w+-])%s(?![\w+-])" % re.escape(choice), str(description)), (key, choice)


def test_removed_and_legacy_flags_are_what_the_table_says(help_entries):
    for flag in lsf.REMOVED_FLAGS:
        if flag in help_entries:
            assert retired(help_entries[flag][1]), "%s is not marked removed/deprecated any more" % flag
    for flag, replacement in lsf.LEGACY_FLAGS.items():
        if flag in help_entries:   # still accepted as an alias of the replacement
            assert replacement.split()[0] in help_entries[flag][0], (flag, help_entries[flag][0])
    # the seed's --no-mmap/--mlock are gone in the pinned build: only --load-mode remains
    assert "--no-mmap" not in help_entries and "--mlock" not in help_entries
    assert "draft-mtp" in help_entries["--spec-type"][1]


def test_plan_of_seed_like_settings_parses(help_entries, tmp_path):
    """The argv the table builds for the seed's settings passes the binary's parser (no model load)."""
    settings = {"ctx_size": 4096, "n_gpu_layers": 999, "split_mode": "layer", "parallel": 2,
                "kv_unified": True, "cont_batching": True, "cache_type_k": "q8_0", "cache_type_v": "q8_0",
                "spec_type": "draft-mtp",
                "spec_draft_n_max": 3, "spec_draft_p_min": 0.85, "flash_attn": "auto", "mmap": False,
                "mlock": True, "batch_size": 512, "ubatch_size": 128, "top_p": 0.95, "top_k": 20, "temp": 0.7,
                "repeat_penalty": 1.0, "jinja": True, "reasoning": "off", "metrics": True,
                "chat_template_kwargs": {"enable_thinking": False}}
    key = tmp_path / "key"
    key.write_text("k\n")
    argv = lsf.build_argv(settings, model=str(tmp_path / "missing.gguf"), host="127.0.0.1", port=1,
                          api_key_file=str(key))
    proc = subprocess.run([BINARY] + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120, check=False)
    # parsing succeeded when the server got as far as trying to load the (missing) model
    assert "error while handling argument" not in proc.stdout and "invalid argument" not in proc.stdout, \
        proc.stdout[-3000:]
    assert "missing.gguf" in proc.stdout or "failed to load model" in proc.stdout, proc.stdout[-3000:]
    # ... and without a deprecation warning (the seed's enable_thinking kwarg would print one)
    assert "deprecated" not in proc.stdout.lower(), proc.stdout[-3000:]
