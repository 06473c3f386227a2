"""The arithmetic and records every benchmark shares (bench/run_record.py)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

# Benchmarks run as ``python bench/<name>.py`` and import their helpers as siblings; so does this test.
# (Not a tests/bench/conftest.py: it would shadow tests/conftest.py, which other modules import by name.)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from run_record import (  # noqa: E402
    ChildPeakRss,
    LoadSampler,
    RunLog,
    closed_loop,
    describe,
    gather_runs,
    kept_on_failure,
    latency_ms,
    machine,
    mean_sd,
    paired_ratios,
    percentile,
    provenance,
    run_records,
    runs_section,
    spread,
    tree_at,
)


def test_spread_matches_numpy_quartiles():
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    got = spread(values)
    assert (got.q1, got.median, got.q3) == pytest.approx(tuple(np.percentile(values, [25, 50, 75])))
    assert (got.low, got.high, got.n) == (1.0, 9.0, 6)
    assert got.mean == pytest.approx(np.mean(values)) and got.sd == pytest.approx(np.std(values, ddof=1))
    assert str(spread([2.0])) == "2 (n 1, no spread)"
    with pytest.raises(ValueError, match="no values"):
        spread([])


def test_paired_ratios_are_taken_pair_by_pair():
    # Load that doubles both sides of the second pair leaves its ratio alone; the pooled ratio would not show it.
    assert paired_ratios([2.0, 4.0, 3.0], [1.0, 2.0, 3.0]) == [2.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="not pairs"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="0"):
        paired_ratios([1.0], [0.0])
    # A report that shows the other pairs asks for a stand-in instead (serving.py's per-repeat ratios).
    got = paired_ratios([1.0, 3.0], [0.0, 2.0], zero=float("nan"))
    assert np.isnan(got[0]) and got[1] == 1.5


@pytest.mark.parametrize("values", [[5.0], [2.0, 1.0], [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3], list(range(101))])
def test_percentile_is_numpys_linear_percentile(values):
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert np.isnan(percentile([], 50))


def test_latency_is_in_milliseconds_with_its_sample_size():
    got = latency_ms([0.1, 0.3, 0.2, 0.4])
    assert got["n"] == 4
    assert got["p50_ms"] == pytest.approx(250.0) and got["max_ms"] == pytest.approx(400.0)
    assert got["mean_ms"] == pytest.approx(250.0)
    assert got["p99_ms"] == pytest.approx(float(np.percentile([100, 300, 200, 400], 99)))
    assert latency_ms([]) == {"n": 0}  # no percentile without requests behind it


def test_mean_sd_as_the_reports_write_it():
    # serving.py's and many_voices.py's "per repeat" cells: the values, then mean ± sample sd.
    assert mean_sd([1.15, 0.97, 0.83], listed=True) == "1.15, 0.97, 0.83 (0.98 ± 0.16)"
    assert mean_sd([18.0, 22.0, 28.0], 0, listed=True) == "18, 22, 28 (23 ± 5)"
    # short_samples.py's cells: mean ± sd alone; one value has no spread to show.
    assert mean_sd([0.5, 0.7], 3) == f"0.600 ± {np.std([0.5, 0.7], ddof=1):.3f}"
    assert mean_sd([0.25], 3) == mean_sd([0.25], 3, listed=True) == "0.250"
    with pytest.raises(ValueError, match="no values"):
        mean_sd([])


def test_closed_loop_sends_each_plan_in_order_and_records_failures():
    seen: dict[int, list[int]] = {0: [], 1: []}

    def send(item: tuple[int, int]) -> int:
        client, n = item
        seen[client].append(n)
        if n == 2:
            raise RuntimeError("refused")
        return n * 10

    loop = closed_loop([[(0, 0), (0, 1), (0, 2)], [(1, 3)]], send)
    assert seen == {0: [0, 1, 2], 1: [3]}  # one after another within a client
    assert len(loop.sent) == 4 and loop.wall_s >= 0
    outcomes = {s.client: [] for s in loop.sent}
    for s in sorted(loop.sent, key=lambda s: s.ended):
        outcomes[s.client].append(s.outcome)
    assert outcomes[0][:2] == [0, 10] and isinstance(outcomes[0][2], RuntimeError) and outcomes[1] == [30]
    assert all(s.seconds >= 0 and s.ended >= loop.started for s in loop.sent)


def test_closed_loop_for_a_time_stops_endless_plans_and_windows_by_end():
    def send(item) -> str:
        time.sleep(0.001)
        return item

    loop = closed_loop([itertools.repeat("a"), itertools.repeat("b")], send, seconds=0.05)
    assert {s.outcome for s in loop.sent} == {"a", "b"}
    assert all(s.ended >= loop.started for s in loop.sent)
    everything = loop.within(0.0, loop.wall_s + 1.0)
    assert len(everything) == len(loop.sent)
    late = loop.within(loop.wall_s + 1.0, 1.0)
    assert late == []
    cut = loop.sent[len(loop.sent) // 2].ended - loop.started
    early = loop.within(0.0, cut)
    assert all(s.ended - loop.started < cut for s in early) and len(early) < len(loop.sent)


def test_tree_at_reads_either_record():
    assert tree_at({"git": "abc1234 with uncommitted changes"}) == "abc1234 with uncommitted changes"
    assert tree_at({"commit": "0123456789abcdef", "src_clean": True}) == "0123456"
    assert tree_at({"commit": "0123456789abcdef", "src_clean": False}) == "0123456 with uncommitted changes to src/"


def test_machine_opens_a_config_with_provenance():
    got = machine(2, "chorus serve", store="sqlite")
    assert got["cpus"] >= 1 and len(got["load_average_start"]) == 3
    assert got["provenance"]["threads"] == 2 and got["provenance"]["path"] == "chorus serve"
    assert got["provenance"]["store"] == "sqlite"


def test_provenance_names_the_commit_and_what_differs(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "one"], check=True)
    monkeypatch.chdir(repo)
    clean = provenance(2, "the thread runner")
    assert clean["src_clean"] and len(clean["commit"]) == 40 and clean["threads"] == 2
    (repo / "src" / "a.py").write_text("x = 2\n")
    dirty = provenance(1, "chorus serve")
    assert not dirty["src_clean"] and dirty["src_modified"] == ["src/a.py"]
    line = describe({**dirty, "load": "1.0-2.0 (1-minute, n = 3)"})
    assert "uncommitted changes to src/a.py" in line and "1 thread(s)" in line and "timed: chorus serve" in line
    assert dirty["commit"][:10] in line and "load average during the run 1.0-2.0" in line


def test_load_is_sampled_not_written():
    with LoadSampler(every=0.01) as load:
        for _ in range(200_000):
            pass
    assert len(load.samples) >= 2 and all(s >= 0 for s in load.samples)
    assert load.summary().endswith(f"(1-minute, n = {len(load.samples)})")


def test_a_run_that_dies_keeps_what_it_measured(tmp_path):
    path = tmp_path / "partial.json"
    with pytest.raises(RuntimeError, match="disk"), kept_on_failure(path, {"repeats": []}) as result:
        result["repeats"].append(1.25)
        raise RuntimeError("disk full")
    kept = json.loads(path.read_text())
    assert kept["repeats"] == [1.25] and "disk full" in kept["crashed"]
    with kept_on_failure(tmp_path / "never.json", {}) as result:
        result["fine"] = True
    assert not (tmp_path / "never.json").exists()


def test_a_run_log_names_its_rows_as_they_come_and_its_end(tmp_path):
    with RunLog(tmp_path, threads=1, path="bench/x.py --rows a,b") as log:
        assert not log.path.exists()  # nothing measured yet: no record
        log.measured("a")
        so_far = json.loads(log.path.read_text())
        assert so_far["measured"] == ["a"] and "ended_utc" not in so_far and so_far["path"].endswith("a,b")
        assert "still running or killed" in runs_section(run_records(tmp_path))
        log.measured("b", "a")
    record = json.loads(log.path.read_text())
    assert record["measured"] == ["a", "b"] and record["ended_utc"] and "crashed" not in record
    assert record["returncode"] == 0 and record["load"].endswith("(1-minute, n = 2)") and record["threads"] == 1
    assert run_records(tmp_path) == {log.id: record}
    section = runs_section(run_records(tmp_path), ["a", "b", "c"])
    assert f"- run `{log.id}` (" in section and "measured 2 row(s): a, b." in section and "1 thread(s)" in section
    assert "1 row(s) with no run record (measured before runs were recorded): c" in section


def test_a_run_that_measured_nothing_leaves_no_record(tmp_path):
    with RunLog(tmp_path, threads=1, path="x"):
        pass
    assert run_records(tmp_path) == {}


def test_a_run_that_dies_keeps_its_record_with_the_error(tmp_path):
    with pytest.raises(RuntimeError, match="disk"), RunLog(tmp_path, threads=2, path="x") as log:
        log.measured("a")
        raise RuntimeError("disk full")
    record = json.loads(log.path.read_text())
    assert record["measured"] == ["a"] and "RuntimeError: disk full" in record["crashed"]
    assert record["returncode"] == 1 and "the command exited with status 1" in record["note"]
    assert "crashed: RuntimeError: disk full" in runs_section(run_records(tmp_path))


def test_a_record_that_cannot_be_read_is_left_out_not_fatal(tmp_path, capsys):
    with RunLog(tmp_path, threads=1, path="x") as log:
        log.measured("a")
    (tmp_path / "runs" / "half-written.json").write_text('{"measured": ["b"')
    (tmp_path / "runs" / ".being-written.json.1.ab.tmp.json").write_text('{"measured": ["c"')  # atomic's temp
    assert list(run_records(tmp_path)) == [log.id]
    warned = capsys.readouterr().err
    assert "half-written.json left out" in warned and "being-written" not in warned


def test_a_row_measured_again_belongs_to_the_later_run(tmp_path):
    with RunLog(tmp_path / "work", threads=1, path="first") as first:
        first.measured("a", "b")
    with RunLog(tmp_path / "work", threads=1, path="second") as second:
        second.measured("a")
    with RunLog(tmp_path / "work", threads=1, path="other") as other:
        other.measured("c")
    assert list(run_records(tmp_path / "work")) == [first.id, second.id, other.id]
    assert list(run_records(tmp_path / "work", rows=["a"])) == [second.id]
    assert list(run_records(tmp_path / "work", rows=["a", "b"])) == [first.id, second.id]
    gather_runs(tmp_path / "out", tmp_path / "work", rows=["a", "b"])
    assert sorted(p.stem for p in (tmp_path / "out" / "runs").glob("*.json")) == sorted([first.id, second.id])


def test_a_childs_own_peak_is_not_its_parents():
    """wait4's ru_maxrss of a child holds at least the parent's peak (exec keeps the old address space's
    high-water mark, and the old one is the parent's); ChildPeakRss reads the child's own."""
    ballast = np.ones(400 * 2**20 // 8)  # 400 MB touched: this process's peak is at least that
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    with ChildPeakRss(child.pid, interval=0.05) as peak:
        _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0  # reaped above
    del ballast
    assert 1 < peak.mb < 100
    assert usage.ru_maxrss / 1024 > 400


def test_own_peak_is_the_processes_own_not_its_parents():
    """own_peak_rss_mb in a child that touched 200 MB reads about that, under its 600 MB parent's peak."""
    ballast = np.ones(600 * 2**20 // 8)
    bench = Path(__file__).resolve().parents[2] / "bench"
    code = (
        f"import sys; sys.path.insert(0, {str(bench)!r}); import numpy as np; a = np.ones(200 * 2**20 // 8); "
        "from run_record import own_peak_rss_mb; print(own_peak_rss_mb())"
    )
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    del ballast
    assert 200 < child < 500
