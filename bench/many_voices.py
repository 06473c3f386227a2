"""Benchmark: K voices in one job (batched adapters) against K sequential single-voice jobs.

Both sides run the same trainer (``chorus.training.adapt_many``) with the same recipe and the same
number of updates per voice, each update from the same number of that voice's clips; a sequential
job is the K = 1 case run once per voice, paying its own setup (base loading, data checks,
features, starting points, export). Voices per hour = voices / (setup + training) wall time.

Voices: the three held-out voices (piper-joe, flite-slt, festival-ked: their quality is judged,
Whisper WER and resemblyzer similarity to their real clips, in the one-job run and in their own
single-voice runs) plus pseudo-voices cut from base-corpus voices (disjoint sets of clips) to reach
K. Sequential time for K voices is the measured mean single-voice job time times K (the jobs are
independent and identical in kind); each K-voice job is measured whole. Memory against K: peak RSS
of the job process.

    python bench/many_voices.py --ks 1,8,32,128 --out bench/results/many_voices

Writes ``many_voices.md``, ``many_voices.json`` and ``throughput.png``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import parse_methods
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.bundle import load_bundle
from chorus.recipe import AdaptConfig
from chorus.synthesis import DEFAULT_BASE, load_base
from chorus.training.adapt_many import ManyVoicesConfig, adapt_many

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
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def judge(voice_dir: Path, evaluation, judges: Judges) -> dict:
    tts = load_base(None, "griffin-lim")
    name = tts.load_voice(voice_dir)
    references = [u.audio_path for u in evaluation]
    items = []
    for utterance in evaluation:
        spoken = tts.synthesize(utterance.text, voice=name)
        items.append(
            EvalItem(
                utterance.audio_path.stem,
                spoken.audio,
                utterance.text,
                speaker_references=references,
                synthesis_seconds=spoken.seconds,
                sample_rate=spoken.sample_rate,
            )
        )
    report = evaluate_pairs(items, judges=judges, progress=False)
    return {"wer": report.corpus_wer, "similarity": report.means().get("speaker_similarity")}


def child(args) -> None:
    """One job in a fresh process (clean peak RSS): prints its JSON result."""
    folders = [Path(p) for p in args.job_folders.split(",")]
    print("RESULT " + json.dumps(run_job(folders, Path(args.job_out), args)), flush=True)


def spawn(folders: list[Path], out: Path, args) -> dict:
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
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in finished.stdout.splitlines() if line.startswith("RESULT ")]
    if finished.returncode != 0 or not lines:
        raise RuntimeError(f"job failed:\n{finished.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=lambda s: [int(k) for k in s.split(",")], default=[1, 8, 32, 128])
    parser.add_argument("--sequential-jobs", type=int, default=3, help="single-voice jobs timed after each K")
    parser.add_argument("--steps", type=int, default=50, help="updates per voice (both sides)")
    parser.add_argument("--clips-per-voice", type=int, default=1)
    parser.add_argument("--method", default="lora+speaker")
    parser.add_argument("--heldout-minutes", type=float, default=1.0)
    parser.add_argument("--pseudo-minutes", type=float, default=0.6)
    parser.add_argument("--sentences", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--base", type=Path, default=None)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--work", type=Path, default=Path("runs/many_voices"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/many_voices"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job-folders", help=argparse.SUPPRESS)
    parser.add_argument("--job-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    folders, evaluation = build_voices(args)
    judges = Judges(speaker=SpeakerJudge(), reference=False)
    rows, single, quality = earlier_results(args)

    # Quality reference: each held-out voice adapted alone.
    for voice, folder in zip(HELD_OUT, folders):
        if "single" not in quality.setdefault(voice, {}):
            spawn([folder], args.work / f"single-{voice}", args)
            quality[voice]["single"] = judge(
                args.work / f"single-{voice}" / "voices" / voice, evaluation[voice], judges
            )

    for k in args.ks:
        job = spawn(folders[:k], args.work / f"job-{k}", args)
        # Single-voice jobs timed right after each K-voice job, so both see the same machine load.
        singles = [
            spawn([folder], args.work / f"single-{k}-{index}", args)
            for index, folder in enumerate(folders[: args.sequential_jobs])
        ]
        single += singles
        per_job = float(np.mean([s["wall_seconds"] for s in singles]))
        sequential = per_job * k
        row = {
            "k": k,
            **job,
            "single_job_seconds": per_job,
            "sequential_seconds": sequential,
            "voices_per_hour": 3600 * k / job["wall_seconds"],
            "sequential_voices_per_hour": 3600 / per_job,
            "speedup": sequential / job["wall_seconds"],
        }
        if k >= len(HELD_OUT):
            for voice in HELD_OUT:
                quality[voice][f"k{k}"] = judge(args.work / f"job-{k}" / "voices" / voice, evaluation[voice], judges)
        rows = sorted([r for r in rows if r["k"] != k] + [row], key=lambda r: r["k"])
        print(
            f"K={k}: {job['wall_seconds']:.0f} s in one job vs {sequential:.0f} s sequential ({row['speedup']:.1f}x)",
            flush=True,
        )
        report(rows, quality, single, args)  # after every K, so a cut-short run keeps what it measured


SETTINGS = ("steps", "clips_per_voice", "method", "heldout_minutes", "pseudo_minutes", "sentences", "threads", "base")


def settings_of(args) -> dict:
    return {name: str(getattr(args, name)) if name == "base" else getattr(args, name) for name in SETTINGS}


def earlier_results(args) -> tuple[list[dict], list[dict], dict]:
    """Rows, single jobs and quality of an earlier run into ``--out`` with the same settings (so that
    one K can be run, or run again, on its own); nothing if the settings differ."""
    path = args.out / "many_voices.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    if earlier.get("settings") != settings_of(args):
        return [], [], {}
    return earlier["rows"], earlier["single"], earlier["quality"]


def report(rows: list[dict], quality: dict, single: list[dict], args) -> None:
    lines = [
        "# Many voices in one job against sequential single-voice jobs",
        "",
        f"Method {args.method}; {args.steps} updates per voice, {args.clips_per_voice} clip(s) of the voice "
        f"per update, on both sides; {args.threads} CPU threads; held-out voices {args.heldout_minutes:g} min "
        f"each, pseudo-voices {args.pseudo_minutes:g} min cut from base-corpus voices. Sequential = K x the "
        f"mean of {args.sequential_jobs} single-voice jobs timed right after the K-voice job (each including "
        "loading the base, data checks, features, starting points and export).",
        "",
        "| K | one job, s (setup + training) | s/step | single job, s | voices/hour, one job | "
        "voices/hour, sequential | speedup | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['k']} | {row['wall_seconds']:.0f} ({row['setup_seconds']:.0f} + {row['train_seconds']:.0f}) "
            f"| {row['seconds_per_step']:.2f} | {row['single_job_seconds']:.1f} | {row['voices_per_hour']:.0f} | "
            f"{row['sequential_voices_per_hour']:.0f} | {row['speedup']:.1f}x | {row['peak_rss_mb']:.0f} |"
        )
    lines += [
        "",
        "Quality of the held-out voices (Whisper WER, resemblyzer similarity to their real clips), "
        "single-voice job against the same voice trained inside a K-voice job:",
        "",
        "| voice | setting | WER % | similarity |",
        "|---|---|---|---|",
    ]
    for voice, settings in quality.items():
        for setting, values in settings.items():
            lines.append(f"| {voice} | {setting} | {100 * (values['wer'] or 0):.1f} | {values['similarity']:.3f} |")
    (args.out / "many_voices.md").write_text("\n".join(lines) + "\n")
    results = {"settings": settings_of(args), "rows": rows, "single": single, "quality": quality}
    (args.out / "many_voices.json").write_text(json.dumps(results, indent=1))
    plot(rows, args.out / "throughput.png")
    print("\n".join(lines))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    ks = [r["k"] for r in rows]
    left.plot(ks, [r["voices_per_hour"] for r in rows], "o-", label="one job")
    left.plot(ks, [r["sequential_voices_per_hour"] for r in rows], "s--", label="sequential jobs")
    left.set_xscale("log", base=2)
    left.set_xlabel("voices K")
    left.set_ylabel("voices per hour")
    left.legend()
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
