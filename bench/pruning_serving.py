"""Benchmark: serving 32 voices on a pruned base against the dense base (issue 17, item 6).

For each base (``--bases``: model folders; ``dense`` is the shipped base), one child process loads it
into the voice server's engine with the neural-free Griffin-Lim vocoder set aside (the acoustic model
alone: what pruning changes), makes 32 synthetic ``lora+speaker`` voices for it (random adapter values,
as ``bench/serving.py``: speed and memory, not quality), uses them all once, and then sends 32
concurrent requests over the 32 voices in a closed loop through the batcher (``--per-thread`` each);
it reports requests per second, audio seconds per second and its resident memory (VmRSS after a
garbage collection and ``malloc_trim``, every voice resident). Rounds alternate the bases in a new
order each time (``--repeats``); the median round and the spread are reported, beside each base's
parameter count and the bytes of its parameters in memory (a pruned unstructured base is as large
in memory as the dense one: its zeros are stored; only the structured base shrinks).

    python bench/pruning_serving.py --bases dense,runs/pruning/ump-0.5-100,runs/pruning/structured-0.3-100

Writes ``pruning_serving.md`` and ``pruning_serving.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from chorus.serving.batcher import Batcher
from chorus.serving.engine import Engine
from chorus.synthesis import DEFAULT_BASE, load_base
from serving import closed_loop, make_voices, settle, vocoder_mode, workload  # bench/, beside this script

VOICES = 32


def child(base: Path, args) -> dict:
    torch.set_num_threads(args.threads)
    synthesizer = load_base(base, "griffin-lim")
    with tempfile.TemporaryDirectory(prefix="chorus-prune-serve-") as temp:
        folders = make_voices(synthesizer, VOICES, Path(temp), "lora+speaker", 0.02, args.seed)
        engine = Engine.load(base, "griffin-lim", cache_bytes=1 << 30)
        for voice_id, folder in folders.items():
            engine.add_voice(voice_id, folder)
        batcher = Batcher(engine, max_batch=VOICES, max_wait_ms=10.0)
        frame_seconds = synthesizer.bundle.mel_config.hop_length / synthesizer.bundle.mel_config.sample_rate
        try:
            with vocoder_mode(engine, vocode=False):
                voice_ids = list(folders)
                closed_loop(
                    lambda r: batcher.synthesize(r.text, r.voice), workload(voice_ids, VOICES, VOICES, 1), frame_seconds
                )
                run = closed_loop(
                    lambda r: batcher.synthesize(r.text, r.voice),
                    workload(voice_ids, VOICES, VOICES, args.per_thread),
                    frame_seconds,
                )
        finally:
            batcher.close()
        model = synthesizer.bundle.model
        return {
            "req_per_s": run["req_per_s"],
            "audio_s_per_s": run["audio_s_per_s"],
            "errors": run["errors"],
            "requests": run["requests"],
            "rss_bytes": settle(),
            "resident_voices": len(engine.resident()),
            "parameters": sum(p.numel() for p in model.parameters()),
            "nonzero_parameters": sum(int(torch.count_nonzero(p)) for p in model.parameters()),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bases", type=lambda s: s.split(","), default=["dense"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-thread", type=int, default=4, help="requests per client thread in a round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/pruning"))
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args)))
        return
    folders = {name: DEFAULT_BASE if name == "dense" else Path(name) for name in args.bases}
    rounds: dict[str, list[dict]] = {name: [] for name in folders}
    order = list(folders)
    rng = random.Random(args.seed)
    for _ in range(args.repeats):
        rng.shuffle(order)
        for name in order:
            command = [sys.executable, __file__, "--child", str(folders[name]), "--threads", str(args.threads)]
            command += ["--per-thread", str(args.per_thread), "--seed", str(args.seed)]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            rounds[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    dense = rounds[order[0]] if "dense" not in rounds else rounds["dense"]
    dense_speed = float(np.median([r["req_per_s"] for r in dense]))
    lines = [
        "# Serving 32 voices on a pruned base",
        "",
        f"One child process per base and round; {VOICES} synthetic lora+speaker voices, all resident; {VOICES} "
        f"concurrent requests over the {VOICES} voices, {args.per_thread} each, through the batcher; acoustic "
        f"model only (no vocoder); {args.threads} torch thread(s); {args.repeats} rounds, bases in a new order "
        "each. RSS after a garbage collection, every voice resident.",
        "",
        "| base | parameters | non-zero | parameter MB in memory | requests/s, median (min-max) | x dense | RSS MB, median | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in rounds.items():
        speeds = [r["req_per_s"] for r in runs]
        first = runs[0]
        lines.append(
            f"| {name} | {first['parameters']:,} | {first['nonzero_parameters']:,} | "
            f"{first['parameter_bytes'] / 1e6:.1f} | {np.median(speeds):.2f} ({min(speeds):.2f}-{max(speeds):.2f}) | "
            f"{np.median(speeds) / dense_speed:.2f} | {np.median([r['rss_bytes'] for r in runs]) / 1e6:.0f} | "
            f"{sum(r['errors'] for r in runs)} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pruning_serving.md").write_text("\n".join(lines) + "\n")
    (args.out / "pruning_serving.json").write_text(json.dumps(rounds, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
