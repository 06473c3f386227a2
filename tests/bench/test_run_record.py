"""The arithmetic and records every benchmark shares (bench/run_record.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Benchmarks run as ``python bench/<name>.py`` and import their helpers as siblings; so does this test.
# (Not a tests/bench/conftest.py: it would shadow tests/conftest.py, which other modules import by name.)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from run_record import LoadSampler, describe, kept_on_failure, paired_ratios, provenance, spread  # noqa: E402


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
