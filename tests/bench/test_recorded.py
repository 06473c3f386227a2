"""bench/recorded.py: a benchmark without its own provenance, run and recorded: the threads it ran with, what
changed under it, and where the record lands when the run succeeds or fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from recorded import main, threads_of  # noqa: E402
from run_record import LoadSampler, finish  # noqa: E402


def test_threads_come_from_the_commands_option_else_the_environment():
    assert threads_of(["python", "bench/x.py", "--threads", "2"], {"OMP_NUM_THREADS": "1"}) == "2"
    assert threads_of(["python", "bench/x.py", "--threads=3"], {}) == "3"
    assert threads_of(["python", "bench/x.py"], {"OMP_NUM_THREADS": "1"}) == "1"
    assert threads_of(["python", "bench/x.py"], {}).startswith("unset")


def start(**changes) -> dict:
    return {"commit": "a" * 40, "src_clean": True, "src_modified": [], "threads": "1", "path": "x", **changes}


def test_a_commit_or_an_edit_during_the_run_and_a_failure_are_named():
    with LoadSampler(every=60) as load:
        pass
    quiet = finish(start(), start(), 0, load)
    assert "note" not in quiet and quiet["returncode"] == 0 and quiet["load"].endswith("(1-minute, n = 2)")
    moved = finish(start(), start(commit="b" * 40, src_clean=False, src_modified=["src/chorus/a.py"]), 2, load)
    assert moved["note"] == (
        "HEAD moved to `bbbbbbbbbb` during the run; src/ changed during the run: src/chorus/a.py; "
        "the command exited with status 2"
    )


def test_a_run_appends_its_record_to_the_markdown_it_wrote(tmp_path):
    markdown = tmp_path / "x.md"
    write = f"open({str(markdown)!r}, 'w').write('# results\\n')"
    assert main(["--markdown", str(markdown), "--", sys.executable, "-c", write, "--threads", "1"]) == 0
    text = markdown.read_text()
    assert text.startswith("# results\n") and "\nMeasured at commit `" in text and "1 thread(s)" in text
    assert "`x.provenance.json`" in text
    record = json.loads((tmp_path / "x.provenance.json").read_text())
    assert record["returncode"] == 0 and record["path"].endswith("--threads 1") and "load" in record


def test_a_failed_run_leaves_an_older_results_file_alone(tmp_path):
    markdown = tmp_path / "x.md"
    markdown.write_text("# an older run's results\n")
    assert main(["--markdown", str(markdown), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert markdown.read_text() == "# an older run's results\n"
    note = (tmp_path / "x.provenance.md").read_text()
    assert "the command exited with status 3" in note
