"""Benchmark: K voices in one job (batched adapters) against K sequential single-voice jobs.

Both sides run the same trainer (``chorus.training.adapt_many``) on the shipped default base
(``chorus.synthesis.DEFAULT_BASE``) with the same recipe and the same number of updates per voice,
each update from the same number of that voice's clips; a sequential job is the K = 1 case run once
per voice, paying its own setup (base loading, data checks, features, starting points, export).

Timing is interleaved, because the machine is shared and its load drifts: for each K, a group of
``--singles`` single-voice jobs, then ``--repeats`` times a K-voice job followed by another group
(B A B A B ...), so each K-voice job has single jobs timed right before and right after it. Per
repeat, the per-voice ratio is (voices trained x the mean single-job time of the two neighbouring
groups) / the K-voice job's time: above 1, one job of K voices costs less per voice than K jobs of
one. Only voices that trained count. Each job runs in a fresh process; its time is measured inside
it (loading the base to exporting the voices: the headline) and from outside (whole process,
interpreter start and imports included, which every separate job pays again).

Voices: the three held-out voices (piper-joe, flite-slt, festival-ked: their quality is judged,
Whisper WER and resemblyzer similarity to their real clips, in the first K-voice job and in their
own single-voice runs) plus pseudo-voices cut from base-corpus voices (disjoint sets of clips) to
reach K. Memory against K: peak RSS of the job process.

    python bench/many_voices.py --ks 1,8,32 --repeats 3 --threads 1 --out bench/results/many_voices

Writes ``many_voices.md``, ``many_voices.json`` and ``throughput.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from base import judge_voice  # bench/, beside this script
from chorus.adapters import parse_methods
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import Judges
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.bundle import load_bundle
from chorus.recipe import AdaptConfig
from chorus.synthesis import DEFAULT_BASE
from chorus.training.adapt_many import ManyVoicesConfig, adapt_many
from run_record import describe, mean_sd, own_peak_rss_mb, provenance  # bench/, beside this script

HELD_OUT = ("piper-joe", "flite-slt", "festival-ked")


def build_voices(args) -> tuple[list[Path], dict[str, list]]:
    """Voice folders: held-out voices first, then pseudo-voices; and each held-out voice's evaluation clips."""
    pool = args.work / "voices"
    folders, evaluation = [], {}
    for voice in HELD_OUT:
        utterances, _ = discover(args.heldout / voice)
        evaluation[voice] = utterances[-args.sentences :]
        write_subset(first_minutes(utterances[: -args.sentences], args.heldout_minutes), pool / voice)
        folders.append(pool / voice)
    corpus_voices = sorted(p for p in args.corpus.iterdir() if (p / "metadata.csv").is_file())
    chunk = 0
    while len(folders) < max(args.ks):
        for source in corpus_voices:
            if len(folders) >= max(args.ks):
                break
            utterances, _ = discover(source)
            per_voice = first_minutes(utterances, args.pseudo_minutes)
            start = chunk * len(per_voice)
            part = utterances[start : start + len(per_voice)]
            if len(part) < len(per_voice):
                continue
            folder = pool / f"{source.name}-part{chunk}"
            write_subset(part, folder)
            folders.append(folder)
        chunk += 1
    return folders, evaluation


def run_job(folders: list[Path], out: Path, args) -> dict:
    """One adapt-many job over ``folders`` in this process; wall time includes loading the base."""
    root = out / "data"
    shutil.rmtree(out, ignore_errors=True)
    root.mkdir(parents=True)
    for folder in folders:
        (root / folder.name).symlink_to(folder.resolve())
    started = time.perf_counter()
    bundle = load_bundle(args.base or DEFAULT_BASE)
    config = ManyVoicesConfig(
        adapt=AdaptConfig(methods=parse_methods(args.method), threads=args.threads),
        steps=args.steps,
        clips_per_voice=args.clips_per_voice,
        eval_every=max(args.steps // 2, 1),
    )
    result = adapt_many(root, bundle, out / "voices", config, progress=False)
    wall = time.perf_counter() - started
    ok = [o for o in result.outcomes if o.status == "ok"]
    return {
        "voices": len(ok),
        "wall_seconds": wall,
        "setup_seconds": result.setup_seconds,
        "train_seconds": result.train_seconds,
        "seconds_per_step": result.train_seconds / result.steps,
        "peak_rss_mb": own_peak_rss_mb(),  # not ru_maxrss: that holds the parent's peak (run_record)
    }


def judge(voice_dir: Path, evaluation, judges: Judges) -> dict:
    """A held-out voice on the shipped base, its own evaluation recordings the similarity references."""
    return judge_voice(None, voice_dir, evaluation, [u.audio_path for u in evaluation], judges)


def child(args) -> None:
    """One job in a fresh process (clean peak RSS): prints its JSON result."""
    folders = [Path(p) for p in args.job_folders.split(",")]
    print("RESULT " + json.dumps(run_job(folders, Path(args.job_out), args)), flush=True)


def spawn(folders: list[Path], out: Path, args) -> dict:
    """One job in a fresh process: its own result plus ``process_seconds``, the whole process's wall
    time (interpreter start and imports included)."""
    command = [
        sys.executable,
        __file__,
        "--child",
        "--job-folders",
        ",".join(map(str, folders)),
        "--job-out",
        str(out),
        "--steps",
        str(args.steps),
        "--clips-per-voice",
        str(args.clips_per_voice),
        "--method",
        args.method,
        "--threads",
        str(args.threads),
    ] + (["--base", str(args.base)] if args.base else [])
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    process_seconds = time.perf_counter() - started
    lines = [line for line in finished.stdout.splitlines() if line.startswith("RESULT ")]
    if finished.returncode != 0 or not lines:
        raise RuntimeError(f"job failed:\n{finished.stderr[-3000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "process_seconds": process_seconds, "load": os.getloadavg()[0]}


def single_group(folders: list[Path], k: int, group: int, args) -> list[dict]:
    """``--singles`` single-voice jobs, on voices taken in turn from the first ``k`` (each group its own)."""
    jobs = []
    for index in range(args.singles):
        folder = folders[(group * args.singles + index) % k]
        jobs.append(spawn([folder], args.work / "single", args) | {"voice": folder.name, "group": group})
    return jobs


def ratios(job: dict, neighbours: list[dict]) -> dict:
    """Per-voice ratio of one K-voice job against the single jobs around it, in-job and whole-process time."""
    out = {}
    for clock in ("wall_seconds", "process_seconds"):
        single = float(np.mean([s[clock] for s in neighbours]))
        out[clock] = {"single_seconds": single, "ratio": job["voices"] * single / job[clock]}
    return out


def measure_k(k: int, folders: list[Path], args) -> dict:
    """B A B A ... B for one K: single-job groups around each K-voice job; every job and ratio kept."""
    groups = [single_group(folders, k, 0, args)]
    jobs = []
    for repeat in range(args.repeats):
        job = spawn(folders[:k], args.work / f"job-{k}-r{repeat}", args) | {"repeat": repeat}
        groups.append(single_group(folders, k, repeat + 1, args))
        job["ratios"] = ratios(job, groups[repeat] + groups[repeat + 1])
        jobs.append(job)
        print(
            f"K={k} repeat {repeat}: {job['voices']} voices in {job['wall_seconds']:.0f} s (process "
            f"{job['process_seconds']:.0f} s); single jobs around it "
            f"{job['ratios']['wall_seconds']['single_seconds']:.1f} s -> per-voice ratio "
            f"{job['ratios']['wall_seconds']['ratio']:.2f}x (process {job['ratios']['process_seconds']['ratio']:.2f}x)",
            flush=True,
        )
    return summarize_k(k, jobs, groups)


def summarize_k(k: int, jobs: list[dict], groups: list[list[dict]]) -> dict:
    def stats(values: list[float]) -> dict:
        return {
            "values": values,
            "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "min": float(min(values)),
            "max": float(max(values)),
        }

    singles = [s for group in groups for s in group]
    return {
        "k": k,
        "voices": [j["voices"] for j in jobs],
        "jobs": jobs,
        "singles": singles,
        "ratio": stats([j["ratios"]["wall_seconds"]["ratio"] for j in jobs]),
        "process_ratio": stats([j["ratios"]["process_seconds"]["ratio"] for j in jobs]),
        "job_seconds": stats([j["wall_seconds"] for j in jobs]),
        "single_seconds": stats([s["wall_seconds"] for s in singles]),
        "seconds_per_voice": stats([j["wall_seconds"] / j["voices"] for j in jobs]),
        "setup_seconds_per_voice": float(np.mean([j["setup_seconds"] / j["voices"] for j in jobs])),
        "train_seconds_per_voice": float(np.mean([j["train_seconds"] / j["voices"] for j in jobs])),
        "single_setup_seconds": float(np.mean([s["setup_seconds"] for s in singles])),
        "single_train_seconds": float(np.mean([s["train_seconds"] for s in singles])),
        "peak_rss_mb": float(max(j["peak_rss_mb"] for j in jobs)),
        "load": stats([j["load"] for j in jobs] + [s["load"] for s in singles]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=lambda s: [int(k) for k in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3, help="K-voice jobs per K, each between two single groups")
    parser.add_argument("--singles", type=int, default=3, help="single-voice jobs per group")
    parser.add_argument("--steps", type=int, default=50, help="updates per voice (both sides)")
    parser.add_argument("--clips-per-voice", type=int, default=1)
    parser.add_argument("--method", default="lora+speaker")
    parser.add_argument("--heldout-minutes", type=float, default=1.0)
    parser.add_argument("--pseudo-minutes", type=float, default=0.6)
    parser.add_argument("--sentences", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", type=Path, default=None, help="default: the shipped base (DEFAULT_BASE)")
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--work", type=Path, default=Path("runs/many_voices"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/many_voices"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job-folders", help=argparse.SUPPRESS)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--report", action="store_true", help="write the report again from OUT/many_voices.json (nothing is run)"
    )
    args = parser.parse_args()
    if args.report:
        rereport(args.out)
        return
    torch.set_num_threads(args.threads)
    if args.child:
        child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    folders, evaluation = build_voices(args)
    judges = Judges(speaker=SpeakerJudge(), reference=False)
    rows, quality, commands, args.provenance = earlier_results(args)
    commands = list(dict.fromkeys([*commands, COMMAND]))
    # Read when the run starts: a later commit must not be credited with this run.
    args.provenance[COMMAND] = provenance(args.threads, TIMED_PATH)
    for k in args.ks:
        row = measure_k(k, folders, args)
        # Quality of the held-out voices trained inside the first K-voice job (after the timing, so
        # judging never sits between a K-voice job and its single jobs).
        if k >= len(HELD_OUT):
            for voice in HELD_OUT:
                voice_dir = args.work / f"job-{k}-r0" / "voices" / voice
                quality.setdefault(voice, {})[f"k{k}"] = judge(voice_dir, evaluation[voice], judges)
        rows = sorted([r for r in rows if r["k"] != k] + [row], key=lambda r: r["k"])
        report(rows, quality, commands, args)  # after every K, so a cut-short run keeps what it measured
    # Quality reference: each held-out voice adapted alone.
    for voice, folder in zip(HELD_OUT, folders):
        if "single" not in quality.setdefault(voice, {}):
            spawn([folder], args.work / f"single-{voice}", args)
            quality[voice]["single"] = judge(
                args.work / f"single-{voice}" / "voices" / voice, evaluation[voice], judges
            )
    report(rows, quality, commands, args)


def rereport(out: Path) -> None:
    """The report of the runs in ``out/many_voices.json`` again, with their settings."""
    earlier = json.loads((out / "many_voices.json").read_text())
    settings = earlier["settings"] | {"out": out}
    settings["base"] = None if settings["base"] == "None" else Path(settings["base"])
    settings["provenance"] = earlier.get("provenance", {})
    report(earlier["rows"], earlier["quality"], earlier["commands"], argparse.Namespace(**settings))


COMMAND = " ".join(["python", "bench/many_voices.py", *sys.argv[1:]])
TIMED_PATH = "adapt_many, each job in a fresh process (bench/many_voices.py --child)"
SETTINGS = (
    "steps",
    "clips_per_voice",
    "method",
    "heldout_minutes",
    "pseudo_minutes",
    "sentences",
    "threads",
    "base",
    "singles",
)


def settings_of(args) -> dict:
    return {name: str(getattr(args, name)) if name == "base" else getattr(args, name) for name in SETTINGS}


def earlier_results(args) -> tuple[list[dict], dict, list[str], dict]:
    """Rows, quality, commands and each command's provenance of earlier runs into ``--out`` with the same
    settings (so that one K can be run, or run again, on its own); nothing if the settings differ."""
    path = args.out / "many_voices.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    if earlier.get("settings") != settings_of(args):
        return [], {}, [], {}
    return earlier["rows"], earlier["quality"], earlier["commands"], earlier.get("provenance", {})


def provenance_lines(commands: list[str], records: dict) -> list[str]:
    """What each command measured (commit, src/, threads, path), then a blank line; none for runs made
    before the records were kept."""
    described = [f"`{command}`: {describe(records[command])}." for command in commands if command in records]
    return [*described, ""] if described else []


def control_lines(rows: list[dict]) -> list[str]:
    """Each K's mean per-voice ratio divided by the K = 1 control's (a one-voice job against single jobs of
    the same kind: 1 but for the bias of the run), when the run has the control."""
    control = next((row for row in rows if row["k"] == 1), None)
    if control is None:
        return []
    corrected = [
        f"K = {row['k']}: {row['ratio']['mean']:.2f} / {control['ratio']['mean']:.2f} = "
        f"**{row['ratio']['mean'] / control['ratio']['mean']:.2f}x** (lowest repeat "
        f"{min(row['ratio']['values']) / control['ratio']['mean']:.2f}x)"
        for row in rows
        if row["k"] != 1
    ]
    return [
        "",
        "Corrected by the control (the per-voice ratio's mean over the K = 1 control's): " + "; ".join(corrected) + ".",
    ]


def spread(stats: dict, digits: int = 2) -> str:
    """``a, b, c (mean ± sample standard deviation)`` of ``stats["values"]`` (one alone: as it is)."""
    return mean_sd(stats["values"], digits, listed=True)


def report(rows: list[dict], quality: dict, commands: list[str], args) -> None:
    base = args.base or DEFAULT_BASE
    named = str(args.base) if args.base else "the shipped default base (`chorus.synthesis.DEFAULT_BASE`)"
    lines = [
        "# Many voices in one job against sequential single-voice jobs",
        "",
        "```",
        *commands,
        "```",
        "",
        *provenance_lines(commands, args.provenance),
        f"Base: {named}, weights sha256 {load_bundle(base).weights_sha256[:12]}. Method {args.method}; "
        f"{args.steps} updates per voice, {args.clips_per_voice} clip(s) of the voice per update, on both "
        f"sides; {args.threads} CPU thread(s); held-out voices {args.heldout_minutes:g} min each, "
        f"pseudo-voices {args.pseudo_minutes:g} min cut from base-corpus voices.",
        "",
        f"Interleaved: for each K, {args.singles} single-voice jobs, then, repeat after repeat, one K-voice job "
        f"followed by {args.singles} more single-voice jobs (B A B A ... B). Per repeat, the per-voice ratio "
        "is (voices trained x the mean time of the single jobs right before and right after the K-voice "
        "job) / the K-voice job's time; above 1, one job of K voices costs less per voice than K jobs of "
        "one. Job time is measured inside the job (loading the base to exporting the voices; headline) "
        "and for the whole process (interpreter start and imports too, which every separate job pays).",
        "",
        "The machine is a 2-core CPU (load average over the jobs below): "
        "absolute times drift with their load, which is why each K-voice job is compared only with its "
        "neighbouring single jobs; the spread of the ratio over repeats is given as measured. K = 1 is the "
        "control: a one-voice job against single-voice jobs of the same kind, whose ratio is 1 but for that "
        "noise.",
        "",
        "| K | voices trained | K-voice job, s, per repeat | single job, s (all groups) | per-voice ratio, "
        "per repeat (mean ± sd) | whole-process ratio, per repeat (mean ± sd) | s per voice: setup + training, "
        "K job vs single | peak RSS MB | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        single = row["single_seconds"]
        lines.append(
            f"| {row['k']} | {', '.join(map(str, row['voices']))} | {spread(row['job_seconds'], 0)} | "
            f"{single['mean']:.1f} ± {single['std']:.1f} ({single['min']:.1f}-{single['max']:.1f}, "
            f"n = {len(single['values'])}) | {spread(row['ratio'])} | {spread(row['process_ratio'])} | "
            f"{row['setup_seconds_per_voice']:.1f} + {row['train_seconds_per_voice']:.1f} vs "
            f"{row['single_setup_seconds']:.1f} + {row['single_train_seconds']:.1f} | {row['peak_rss_mb']:.0f} | "
            f"{row['load']['mean']:.1f} ({row['load']['min']:.1f}-{row['load']['max']:.1f}) |"
        )
    lines += control_lines(rows)
    lines += [
        "",
        "Quality of the held-out voices (Whisper WER, resemblyzer similarity to their real clips), "
        "single-voice job against the same voice trained inside the first K-voice job:",
        "",
        "| voice | setting | WER % | similarity |",
        "|---|---|---|---|",
    ]
    for voice, settings in quality.items():
        for setting, values in settings.items():
            lines.append(f"| {voice} | {setting} | {100 * (values['wer'] or 0):.1f} | {values['similarity']:.3f} |")
    (args.out / "many_voices.md").write_text("\n".join(lines) + "\n")
    results = {
        "settings": settings_of(args),
        "commands": commands,
        "provenance": args.provenance,
        "rows": rows,
        "quality": quality,
    }
    (args.out / "many_voices.json").write_text(json.dumps(results, indent=1))
    plot(rows, args.out / "throughput.png")
    print("\n".join(lines), flush=True)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    ks = [r["k"] for r in rows]
    for key, label, marker in (("ratio", "in-job time", "o"), ("process_ratio", "whole process", "s")):
        for row in rows:
            left.plot([row["k"]] * len(row[key]["values"]), row[key]["values"], marker, color="grey", alpha=0.5)
        left.plot(ks, [r[key]["mean"] for r in rows], marker + "-", label=f"{label} (mean; dots: repeats)")
    left.axhline(1.0, color="black", lw=0.8, ls=":")
    left.set_xscale("log", base=2)
    left.set_xlabel("voices K")
    left.set_ylabel("K single jobs' time / one K-voice job's")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.plot(ks, [r["peak_rss_mb"] for r in rows], "o-")
    right.set_xscale("log", base=2)
    right.set_xlabel("voices K")
    right.set_ylabel("peak RSS of the job, MB")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
