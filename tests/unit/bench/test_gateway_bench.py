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


def test_reliability_goal_fails_on_one_lost_generation_and_on_none_counted():
    ok = {(way, conn, mode): (2000, {}, 60.0) for way in ("plain", "tls") for conn in run.CONNECTIONS
          for mode in ("sequential", "concurrent")}
    goals = run.reliability_goals(ok)
    assert len(goals) == 2 and all(passed for _, passed in goals), goals
    assert "0 of 16000" not in goals[0][0] and "0 of 8000" in goals[0][0]
    lost = dict(ok)
    lost[("tls", "new", "concurrent")] = (2000, {"HTTP 502": 1}, 60.0)
    (plain, plain_ok), (tls, tls_ok) = run.reliability_goals(lost)
    assert plain_ok and not tls_ok and "1 of 8000" in tls, tls
    # nothing measured is no evidence: a way with no generation fails
    empty = {key: (0, {}, 0.0) for key in ok}
    assert not any(passed for _, passed in run.reliability_goals(empty))
    # the direct control is printed, never a gateway goal
    with_direct = dict(ok)
    with_direct[("direct", "new", "sequential")] = (5, {"HTTP 502": 5}, 1.0)
    assert all(passed for _, passed in run.reliability_goals(with_direct))
