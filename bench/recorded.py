"""Run a benchmark that does not record its own provenance, and record it for it.

    python bench/recorded.py --markdown OUT/x.md -- python bench/vocoders_on_base.py ... --out OUT

Most benchmarks here write what they measured on (commit, ``src/`` clean or not, threads, the machine's
load through the run, the path timed) into their results themselves (``run_record``). The older ones
(adaptation memory, the vocoders, the consent probe ...) do not; this wrapper gives
their runs the same record: :func:`run_record.provenance` when the command starts and again when it ends
(a commit or an edit of ``src/`` during the run is named), the 1-minute load average sampled through it,
the command and its exit status. The record goes to ``--record`` (default: the Markdown's name with
``.provenance.json``), and one sentence of it is appended to the Markdown the benchmark wrote, or to a
note beside it where the run failed before writing one. Its exit status is the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from run_record import LoadSampler, describe, finish, provenance, utc_now  # bench/, beside this script


def threads_of(command: Sequence[str], environ: dict[str, str]) -> str:
    """The threads the command runs with: its ``--threads`` option where it has one, else OMP_NUM_THREADS."""
    for i, word in enumerate(command):
        if word == "--threads" and i + 1 < len(command):
            return command[i + 1]
        if word.startswith("--threads="):
            return word.split("=", 1)[1]
    return environ.get("OMP_NUM_THREADS", "unset (torch's default)")


def sentence(record: dict, record_path: Path) -> str:
    """The Markdown line that says what the run measured on."""
    return f"\nMeasured at {describe(record)} (recorded by `bench/recorded.py`: `{record_path.name}`).\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, required=True, help="the results file the benchmark writes")
    parser.add_argument("--record", type=Path, help="where the record goes (default: beside the Markdown)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark's command after --")
    record_path = args.record or args.markdown.with_suffix(".provenance.json")
    started = utc_now()
    record = provenance(threads_of(command, dict(os.environ)), " ".join(command), started_utc=started)
    with LoadSampler() as load:
        returncode = subprocess.call(command)
    record = finish(record, provenance(record["threads"], record["path"]), returncode, load)
    record["ended_utc"] = utc_now()
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    # A failed run may have written nothing: its record then lands in a note of its own, never in an old file.
    target = args.markdown if returncode == 0 and args.markdown.exists() else record_path.with_suffix(".md")
    with target.open("a") as markdown:
        markdown.write(sentence(record, record_path))
    print(describe(record), file=sys.stderr)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
