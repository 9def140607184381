# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/ci/schedule.py: which job starts when, and the table of where the time went."""
import io
import sys

import noxfile
from tools.ci import ports, schedule


def job(name, needs=(), weight=1, estimate=60):
    return schedule.Job(name, [sys.executable, "-c", "pass"], needs, weight, estimate)


def test_every_scenario_is_a_job_and_every_job_a_session():
    molecule_jobs = [j.name.split(":", 1)[1] for j in schedule.JOBS if j.name.startswith("molecule:")]
    assert sorted(molecule_jobs) == sorted(noxfile.MOLECULE_SCENARIOS) == sorted(ports.SCENARIO_PORTS)
    sessions = {j.argv[3] for j in schedule.JOBS}
    assert sessions <= {"lint", "sanity", "unit", "molecule", "unit_llama_server"}
    names = {j.name for j in schedule.JOBS}
    assert all(n in names for j in schedule.JOBS for n in j.needs)


def test_the_longest_chain_starts_first():
    jobs = [job("compile", estimate=600), job("after", needs=("compile",), estimate=500),
            job("long-alone", estimate=900), job("short", estimate=60)]
    priority = schedule.critical_paths(jobs, {})
    assert priority == {"compile": 1100, "after": 500, "long-alone": 900, "short": 60}
    started = schedule.next_jobs(jobs, set(), 0, 2, priority)
    assert [j.name for j in started] == ["compile", "long-alone"]


def test_a_job_waits_for_what_it_needs_and_for_room():
    jobs = [job("a", weight=2), job("b", needs=("a",)), job("c")]
    priority = {"a": 3, "b": 2, "c": 1}
    assert [j.name for j in schedule.next_jobs(jobs, set(), 0, 3, priority)] == ["a", "c"]
    assert [j.name for j in schedule.next_jobs(jobs[1:], set(), 2, 3, priority)] == ["c"]
    assert [j.name for j in schedule.next_jobs(jobs[1:], {"a"}, 0, 3, priority)] == ["b", "c"]
    # A job heavier than the machine's capacity still runs, alone.
    assert [j.name for j in schedule.next_jobs([job("big", weight=5)], set(), 0, 3, {"big": 1})] == ["big"]
    assert schedule.next_jobs([job("big", weight=5)], set(), 1, 3, {"big": 1}) == []


def test_measured_durations_replace_the_estimates(tmp_path):
    history = tmp_path / "durations.json"
    schedule.save_history({"x": 12.5}, str(history))
    schedule.save_history({"y": 3}, str(history))
    assert schedule.load_history(str(history)) == {"x": 12.5, "y": 3.0}
    assert schedule.critical_paths([job("x", estimate=999)], {"x": 12.5}) == {"x": 12.5}


def test_a_partial_run_drops_what_it_did_not_ask_for():
    chosen = schedule.select([job("a"), job("b", needs=("a",))], ["b"])
    assert [(j.name, j.needs) for j in chosen] == [("b", ())]


def test_molecule_steps_are_read_from_the_stamped_log():
    log = ("[00:00] INFO     l20 \u279c destroy: Executing\n[00:04] INFO     l20 \u279c create: Executing\n"
           "[00:30] noise\n[01:10] INFO     l20 \u279c converge: Executing\n[05:00] INFO done\n")
    assert schedule.molecule_steps(log) == [("destroy", 4), ("create", 66), ("converge", 230)]


def test_the_compile_a_scenario_recorded_is_in_the_table(tmp_path):
    """The L20 twin's verify writes its CUDA compile's time and ccache hits; the table prints them under it,
    and a scenario that recorded nothing (or a broken record) adds no line."""
    (tmp_path / "ci-l20").mkdir()
    (tmp_path / "ci-l20" / "compile.tsv").write_text(
        "CUDA compile (nvcc 12.4, sm_89)\t1234\t0\t190\nbad\tx\n")
    assert schedule.compile_records("molecule:l20", cache=str(tmp_path)) == [
        ("CUDA compile (nvcc 12.4, sm_89)", 1234, "0", "190")]
    assert schedule.compile_records("molecule:model", cache=str(tmp_path)) == []


def test_the_fault_rows_are_read_and_printed_after_the_phase_table(tmp_path):
    """Each fault scenario writes one row per fault (.cache/faults/<scenario>-<fault>.tsv, five tab-separated
    fields); the table prints each with its recovery time; rows with fewer or more fields, an empty field,
    two lines, or another extension are left out; a row older than the run says so."""
    folder = tmp_path / "faults"
    folder.mkdir()
    (folder / "faults-kill.tsv").write_text(
        "kill\tSIGKILL of a\tconnection closed in 0.01 s\t2 streams\t11.4\n")
    (folder / "faults-crash-loop.tsv").write_text("crash-loop\tbad drop-in\tstart-limit-hit\tnothing\t3.2\n")
    (folder / "disk_full-disk.tsv").write_text("disk\tdisk filled\tENOSPC\tnothing\tn/a\n")
    (folder / "faults-short.tsv").write_text("short\tonly\tfour\tfields\n")
    (folder / "faults-long.tsv").write_text("long\t1\t2\t3\t4\t5\n")
    (folder / "faults-empty.tsv").write_text("empty\t\tx\ty\t1\n")
    (folder / "faults-two.tsv").write_text("two\ta\tb\tc\t1\ntwo\ta\tb\tc\t2\n")
    (folder / "faults-notes.txt").write_text("kill\ta\tb\tc\t1\n")
    records = schedule.fault_records(cache=str(tmp_path))
    assert [r[:6] for r in records] == [
        ("disk_full", "disk", "disk filled", "ENOSPC", "nothing", "n/a"),
        ("faults", "crash-loop", "bad drop-in", "start-limit-hit", "nothing", "3.2"),
        ("faults", "kill", "SIGKILL of a", "connection closed in 0.01 s", "2 streams", "11.4")]
    table = schedule.fault_table(records, since=records[0][6] + 1)
    assert table.splitlines()[1].startswith("== faults")
    assert "faults: kill                       11.4 s  (an earlier run's)" in table
    assert "    client    connection closed in 0.01 s" in table and "disk_full: disk" in table
    assert "(an earlier run's)" not in schedule.fault_table(records, since=records[0][6] - 1)
    assert schedule.fault_records(cache=str(tmp_path / "none")) == [] and schedule.fault_table([]) == ""


def test_jobs_run_side_by_side_and_a_failure_stops_new_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(schedule, "LOGS", str(tmp_path / "logs"))
    monkeypatch.setattr(schedule, "HISTORY", str(tmp_path / "durations.json"))
    monkeypatch.setattr(schedule, "load_history", lambda path=None: {})
    monkeypatch.setattr(schedule, "save_history", lambda d, path=None: None)
    ok = schedule.Job("ok", [sys.executable, "-c", "print('\\x1b[32mgreen\\x1b[0m')"])
    bad = schedule.Job("bad", [sys.executable, "-c", "import sys; sys.exit(3)"], estimate=999)
    later = schedule.Job("later", [sys.executable, "-c", "pass"], needs=("bad",))
    out = io.StringIO()
    results = schedule.run([ok, bad, later], capacity=3, out=out)
    assert results["ok"][2] == "passed" and results["bad"][2] == "FAILED (exit 3)"
    assert "later" not in results
    assert "not started after the failure of bad: later" in out.getvalue()
    assert "[00:00] green" in (tmp_path / "logs" / "ok.log").read_text()
    table = schedule.table(results, min(r[0] for r in results.values()))
    assert "FAILED (exit 3)" in table and "total" in table


def _quiet_history(tmp_path, monkeypatch):
    monkeypatch.setattr(schedule, "LOGS", str(tmp_path / "logs"))
    monkeypatch.setattr(schedule, "load_history", lambda path=None: {})
    monkeypatch.setattr(schedule, "save_history", lambda d, path=None: None)


def test_after_a_failure_the_independent_jobs_still_run(tmp_path, monkeypatch):
    # One job at a time, the failing one first (longest estimate): the independent job still runs after it
    # (one CI log shows every failure), the job that needs it does not.
    _quiet_history(tmp_path, monkeypatch)
    bad = schedule.Job("bad", [sys.executable, "-c", "import sys; sys.exit(3)"], estimate=999)
    ok = schedule.Job("ok", [sys.executable, "-c", "pass"], estimate=1)
    later = schedule.Job("later", [sys.executable, "-c", "pass"], needs=("bad",), estimate=1)
    out = io.StringIO()
    results = schedule.run([bad, ok, later], capacity=1, out=out)
    assert results["bad"][2] == "FAILED (exit 3)" and results["ok"][2] == "passed"
    assert "later" not in results
    assert "not started after the failure of bad: later" in out.getvalue()


def test_fail_fast_starts_nothing_after_a_failure(tmp_path, monkeypatch):
    _quiet_history(tmp_path, monkeypatch)
    bad = schedule.Job("bad", [sys.executable, "-c", "import sys; sys.exit(3)"], estimate=999)
    ok = schedule.Job("ok", [sys.executable, "-c", "pass"], estimate=1)
    out = io.StringIO()
    results = schedule.run([bad, ok], capacity=1, out=out, fail_fast=True)
    assert "ok" not in results
    assert "not started after the failure of bad: ok" in out.getvalue()


def test_the_table_says_how_busy_the_cpus_were(tmp_path, monkeypatch):
    _quiet_history(tmp_path, monkeypatch)
    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"
    burn = schedule.Job("burn", [sys.executable, "-c", spin])
    cpu = {}
    results = schedule.run([burn], capacity=1, out=io.StringIO(), cpu=cpu)
    assert results["burn"][2] == "passed"
    # one busy loop on this machine's CPUs: more than nothing, at most all of them
    assert 0 < cpu["jobs"]["burn"] <= 100 and 0 < cpu["total"] <= 100
    text = schedule.table(results, results["burn"][0], cpu=cpu)
    assert "passed  cpu %d%%" % cpu["jobs"]["burn"] in text
    assert "machine CPU busy over the jobs: %d%%" % cpu["total"] in text


def test_cpu_busy_is_read_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 700 100 0 0 0 0 0\n")
    before = schedule.cpu_times(str(stat))
    assert before == (1000, 800)
    stat.write_text("cpu  400 0 200 900 100 0 0 0 0 0\n")
    assert schedule.busy_percent(before, schedule.cpu_times(str(stat))) == 67   # 400 of 600 jiffies busy
    assert schedule.cpu_times(str(tmp_path / "none")) is None and schedule.busy_percent(None, before) is None


def test_a_failed_jobs_digest_names_its_failures_and_ends_its_log(tmp_path):
    passing = ["[00:0%d] ." % i for i in range(9)]
    log = passing + ["[09:01] FAILED tests/unit/test_x.py::test_y - AssertionError: 1 != 2",
                     "[09:01] E       assert 1 == 2", "[09:02] 1 failed, 3369 passed in 540s"]
    (tmp_path / "unit.log").write_text("\n".join(log) + "\n")
    digest = schedule.failure_digest("unit", logs=str(tmp_path), tail=2)
    assert "FAILED tests/unit/test_x.py::test_y" in digest
    assert "E       assert 1 == 2" in digest
    # the tail: the last two lines only, none of the passing lines before them
    assert digest.endswith("[09:01] E       assert 1 == 2\n[09:02] 1 failed, 3369 passed in 540s")
    assert "[00:00] ." not in digest
    # more failure lines than it keeps: the last ones
    many = ["[00:00] FAILED t.py::test_%d" % i for i in range(50)]
    (tmp_path / "molecule-x.log").write_text("\n".join(many) + "\n")
    digest = schedule.failure_digest("molecule:x", logs=str(tmp_path), matches=5, tail=0)
    assert "test_49" in digest and "test_45" in digest and "test_44" not in digest


def test_a_failed_job_without_a_log_says_so(tmp_path):
    assert "no log" in schedule.failure_digest("unit", logs=str(tmp_path))
