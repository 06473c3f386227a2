"""The arithmetic of bench/cli_speed.py: the text it speaks, the ratios it takes and the verdicts it gives
(no model runs here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Benchmarks import their helpers as siblings; so does this test (no conftest.py under tests/: see
# tests/bench/test_run_record.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cli_speed import (  # noqa: E402
    CliRun,
    cache_bound_effect,
    imports_torch,
    memory_growth,
    prose,
    speed_ratios,
    summary,
    targets,
    verdict,
)


def test_prose_is_whole_sentences_in_order_and_the_same_every_time():
    sentences = ["One two three.", "Four five.", "Six seven eight nine."]
    assert prose(4, sentences) == "One two three. Four five."
    assert prose(4, sentences) == prose(4, sentences)
    # Past the end it starts again rather than stopping short.
    assert prose(12, sentences) == "One two three. Four five. Six seven eight nine. One two three."
    shipped = prose(3000)
    assert 3000 <= len(shipped.split()) < 3030
    assert shipped.startswith(prose(100))


def test_verdict_is_inclusive_and_nan_is_not_met():
    assert verdict(1.3, 1.3) == "met"
    assert verdict(1.31, 1.3) == "NOT met"
    assert verdict(float("nan"), 1.3) == "NOT met"


def test_ratios_are_taken_per_complete_pair():
    memory = [
        {"small": {"peak_rss": 400}, "large": {"peak_rss": 440}},
        {"large": {"peak_rss": 500}, "small": {"peak_rss": 400}},
        {"small": {"peak_rss": 400}},  # a pair the crash cut short
    ]
    assert memory_growth(memory) == pytest.approx([1.10, 1.25])
    speed = [{"library_s": 3.0, "server_s": 2.0}, {"server_s": 4.0, "library_s": 4.0}, {"library_s": 1.0}]
    assert speed_ratios(speed) == pytest.approx([1.5, 1.0])


def test_cache_bound_effect_compares_the_large_runs_of_each_pair():
    pairs = [
        {
            "large": {"peak_rss": 410, "total_s": 20.6, "cpu_s": 19.0},
            "large_default_cache": {"peak_rss": 500, "total_s": 20.0, "cpu_s": 20.0},
        },
        {
            "small": {"peak_rss": 400},
            "large": {"peak_rss": 400, "total_s": 21.0, "cpu_s": 20.0},
        },  # no default-cache run
    ]
    effect = cache_bound_effect(pairs)
    assert effect["peak_rss"] == pytest.approx([0.82])
    assert effect["total_s"] == pytest.approx([1.03])
    assert effect["cpu_s"] == pytest.approx([0.95])


def test_summary_shows_median_range_and_n():
    assert summary([3.0, 1.0, 2.0], 1) == "2.0 (range 1.0-3.0, n 3)"
    assert summary([0.25]) == "0.250 (n 1)"
    assert summary([]) == "not measured"


def test_imports_torch_reads_importtime_module_names_only():
    lines = "import time: 5 | 5 | typer\nimport time: 900 | 120000 | torch\n"
    assert imports_torch(lines)
    assert not imports_torch("import time: 5 | 5 | typer\nimport time: 3 | 3 | chorus.torch_free\n")


def test_first_byte_is_counted_from_the_load_mark():
    assert CliRun(600, first_byte_s=5.3, loaded_s=5.0).first_byte_after_load_s == pytest.approx(0.3)
    assert CliRun(600, first_byte_s=5.3).first_byte_after_load_s is None


def test_targets_give_each_figure_its_verdict():
    result = {
        "startup": {
            "--version": {"seconds": [0.3, 0.4, 0.6], "imports_torch": False},
            "--help": {"seconds": [0.3], "imports_torch": True},
        },
        "first_byte": [
            {"first_byte_after_load_s": 0.3},
            {"first_byte_after_load_s": 2.5},
            {"first_byte_after_load_s": 0.4},
        ],
        "memory": [{"small": {"peak_rss": 400}, "large": {"peak_rss": 484}}],
        "speed": [{"library_s": 3.0, "server_s": 3.0}],
    }
    verdicts = [row["verdict"] for row in targets(result)]
    # --version: median 0.4 s, no torch; --help imports torch; first byte median 0.4 s; +21 %; 1.00x.
    assert verdicts == ["met", "NOT met", "met", "NOT met", "met"]


def test_targets_of_a_run_that_measured_nothing_are_not_met():
    rows = targets({})
    assert [row["verdict"] for row in rows] == ["NOT met"] * 5
    assert all("not measured" in row["figure"] for row in rows[2:])
