# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/gateway/run.py without HAProxy: its goals pass on a gateway that forwards chunks as written and fail
on one that holds them (the 200 ms MSG_MORE bunching it was written to catch)."""
from bench.gateway import run


def _way(first, gaps, latency=5.0):
    return {"latency": [latency] * 20, "first": [first] * 10, "gaps": list(gaps), "spans": [sum(gaps)]}


DIRECT_GAPS = [20.0] * 93 + [19.0, 21.0, 18.0, 22.0, 20.5, 19.5, 25.0]


def test_goals_pass_when_chunks_pass_through():
    results = {"direct": _way(6.0, DIRECT_GAPS), "plain": _way(6.8, DIRECT_GAPS, 5.4),
               "tls": _way(7.1, [g + 0.1 for g in DIRECT_GAPS], 5.6)}
    goals = run.report(results)
    assert len(goals) == 8 and all(ok for _, ok in goals), goals


def test_goals_fail_when_chunks_are_held_and_bunched():
    held = [0.01] * 90 + [200.0] * 10  # most chunks together, then a 200 ms wait
    results = {"direct": _way(6.0, DIRECT_GAPS), "plain": _way(210.0, held), "tls": _way(7.0, DIRECT_GAPS)}
    failed = [text for text, ok in run.report(results) if not ok]
    assert len(failed) == 3 and all(text.startswith("plain:") for text in failed), failed
    assert any("time to first chunk" in t for t in failed) and any("together" in t for t in failed)


def test_percentile():
    values = list(range(1, 101))
    assert (run.pct(values, 50), run.pct(values, 99), run.pct(values, 100)) == (51, 99, 100)
