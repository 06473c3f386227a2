"""Onboarding jobs and resident memory: is the server's RSS step after each job a plateau or a leak?

The soak (``bench/soak.py``) saw the server's RSS step up as onboarding jobs ran. This probe runs the
same work in one process, the way ``chorus serve`` runs it: an :class:`~chorus.serving.engine.Engine` on
the shipped base (default vocoder), a "batcher" thread speaking four sentences at a time throughout, and
a "worker" thread running ``--jobs`` onboarding jobs one after another, each ``Engine.base_copy()`` (a
deep copy of the model) then ``adapt`` on the shipped sample voice with the server's onboarding recipe
(``ServerSettings.adapt``, ``--steps`` steps, one thread), as ``JobRunner.run`` does. After each job, with
the job's objects dropped: the RSS as it is, after ``gc.collect()``, whether the job's model copy is
still alive (a weak reference to it; if it is, who holds it), and, in the ``trim`` variant, after
glibc's ``malloc_trim(0)`` (freed heap pages given back to the OS).

Variants, each a fresh process: ``default`` (glibc's default arenas, nothing trimmed until the end),
``arenas2`` (``MALLOC_ARENA_MAX=2``), ``trim`` (``malloc_trim(0)`` after every job). A leak grows with
every job in all three; allocator slack (freed memory that glibc's per-thread arenas keep) levels off,
and trimming gives it back.

    python bench/job_memory.py --out bench/results/job_memory

Writes ``job_memory.md``, ``job_memory.json`` and ``job_memory.png`` (RSS after each job, per variant).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import torch

from chorus.serving.engine import Engine, SentenceRequest
from chorus.serving.settings import ServerSettings
from chorus.synthesis import SAMPLE_VOICE
from chorus.training.adapt import adapt
from run_record import provenance  # bench/, beside this script
from servers import self_rss as rss_bytes
from serving import MB, TEXTS

VARIANTS = {"default": {}, "arenas2": {"MALLOC_ARENA_MAX": "2"}, "trim": {}}


def malloc_trim() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def one_job(engine: Engine, config, work: Path, number: int) -> weakref.ref:
    """One onboarding job as the worker runs it; a weak reference to its model copy."""
    bundle = engine.base_copy()
    copy = weakref.ref(bundle.model)
    adapt(SAMPLE_VOICE, bundle, work / f"job-{number}", config, progress=False, name=f"probe {number}", in_place=True)
    return copy


def child(args) -> None:
    """One variant: the jobs, and the measurements after each."""
    torch.set_num_threads(1)
    engine = Engine.load()
    config = dataclasses.replace(ServerSettings().adapt, steps=args.steps, threads=1)
    stop = threading.Event()

    def speak() -> None:  # the batcher's thread: its allocations share the process's arenas
        while not stop.is_set():
            engine.synthesize([SentenceRequest(text, engine.speakers[0]) for text in TEXTS[:4]])

    speaker = threading.Thread(target=speak, name="batcher", daemon=True)
    speaker.start()
    rows = []
    with tempfile.TemporaryDirectory(prefix="chorus-job-memory-") as work:
        rows.append({"job": 0, "rss": rss_bytes(), "rss_gc": rss_bytes(), "copy_alive": False})
        for number in range(1, args.jobs + 1):
            copies: list[weakref.ref] = []
            worker = threading.Thread(
                target=lambda n=number, out=copies: out.append(one_job(engine, config, Path(work), n)), name="worker"
            )
            began = time.perf_counter()
            worker.start()
            worker.join()
            row = {"job": number, "seconds": time.perf_counter() - began, "rss": rss_bytes()}
            gc.collect()
            row["rss_gc"] = rss_bytes()
            copy = copies[0]()
            row["copy_alive"] = copy is not None
            if copy is not None:  # who holds it: the leak's owner
                row["held_by"] = [type(r).__name__ for r in gc.get_referrers(copy)][:10]
            del copy
            if args.variant == "trim":
                malloc_trim()
                row["rss_trim"] = rss_bytes()
            rows.append(row)
            print(json.dumps(row), flush=True)
    stop.set()
    speaker.join()
    gc.collect()
    before = rss_bytes()
    malloc_trim()
    print(json.dumps({"end": True, "rss_before_trim": before, "rss_after_trim": rss_bytes()}), flush=True)
    args.child_out.write_text(
        json.dumps({"rows": rows, "end_rss_before_trim": before, "end_rss_after_trim": rss_bytes()})
    )


def report(result: dict, out: Path) -> None:
    (out / "job_memory.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Onboarding jobs and resident memory: plateau or leak?",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"{result['jobs']} onboarding jobs one after another in a worker thread ({result['steps']} training steps "
        "each on the shipped sample voice, the server's recipe, one thread; `Engine.base_copy()` then `adapt`, "
        "as `JobRunner.run` does), a batcher thread speaking throughout; this tree at "
        f"{result['git']}. RSS after each job (its objects dropped), after `gc.collect()`, and whether the job's "
        "model copy is still alive (weak reference).",
        "",
        "## Findings",
        "",
    ]
    for name, variant in result["variants"].items():
        rows = variant["rows"]
        key = "rss_trim" if name == "trim" else "rss_gc"
        values = [r[key] / MB for r in rows[1:]]
        steps = [b - a for a, b in zip([rows[0]["rss_gc"] / MB, *values], values)]
        half = len(values) // 2
        alive = sum(r["copy_alive"] for r in rows[1:])
        lines.append(
            f"- `{name}`: RSS {rows[0]['rss_gc'] / MB:.0f} MB before the jobs; after job 1 {values[0]:.0f} MB, "
            f"after job {len(values)} {values[-1]:.0f} MB; largest step {max(steps):+.0f} MB (job "
            f"{steps.index(max(steps)) + 1}); over the second half of the jobs {values[-1] - values[half - 1]:+.0f} "
            f"MB ({(values[-1] - values[half - 1]) / max(len(values) - half, 1):+.1f} MB a job); model copies still "
            f"alive after their job: {alive} of {len(rows) - 1}; at the end {variant['end_rss_before_trim'] / MB:.0f} MB, "
            f"{variant['end_rss_after_trim'] / MB:.0f} MB after `malloc_trim(0)`."
        )
    lines += [
        "",
        "## RSS after each job, MB (after gc.collect; `trim`: after malloc_trim)",
        "",
        "| job | " + " | ".join(result["variants"]) + " |",
        "|---" * (len(result["variants"]) + 1) + "|",
    ]
    for k in range(result["jobs"] + 1):
        cells = []
        for name, variant in result["variants"].items():
            row = variant["rows"][k]
            cells.append(f"{row.get('rss_trim' if name == 'trim' else 'rss_gc', row['rss_gc']) / MB:.0f}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    (out / "job_memory.md").write_text("\n".join(lines) + "\n")
    plot(result, out / "job_memory.png")
    print("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 4))
    for name, variant in result["variants"].items():
        rows = variant["rows"]
        key = "rss_trim" if name == "trim" else "rss_gc"
        axis.plot(
            [r["job"] for r in rows], [r.get(key, r["rss_gc"]) / MB for r in rows], "o-", label=name, markersize=4
        )
    axis.set_xlabel("onboarding jobs done")
    axis.set_ylabel("RSS, MB")
    axis.legend()
    axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3, help="training steps per job (the soak's)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # in the child
    parser.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("bench/results/job_memory"))
    args = parser.parse_args()
    if args.variant:
        child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": shlex.join(["python", "bench/job_memory.py", *sys.argv[1:]]),
        "provenance": provenance(
            1, "onboarding jobs as the worker runs them (Engine.base_copy + adapt), a child per variant"
        ),
        "jobs": args.jobs,
        "steps": args.steps,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="chorus-job-memory-") as work:
        for name in args.variants.split(","):
            child_out = Path(work) / f"{name}.json"
            command = [sys.executable, __file__, "--variant", name, "--child-out", str(child_out)]
            command += ["--jobs", str(args.jobs), "--steps", str(args.steps)]
            print(f"variant {name} ...", flush=True)
            env = os.environ | VARIANTS[name] | {"OMP_NUM_THREADS": "1"}
            subprocess.run(command, env=env, check=True)
            result["variants"][name] = json.loads(child_out.read_text())
    report(result, args.out)


if __name__ == "__main__":
    main()
