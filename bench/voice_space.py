"""Benchmark: a voice-space voice (only its vector learns) against a per-voice LoRA as data shrinks.

The space is learned over the base corpus's voices (``--space-minutes`` of each) and, with
``--space-virtual N``, over N new virtual voices derived from them by sox
(:mod:`chorus.corpus.virtual`): voices the base has never heard, so that the space must learn adapter
directions and not only speaker vectors. Nothing is derived from the held-out voices. Then for each
held-out voice and amount of data (30 s, 1, 3, 10 minutes: the first clips of the voice), a voice is
made both ways, from the same clips: ``chorus voice-space fit`` (``dim`` numbers, started from the
clips' speaker d-vector) and ``chorus adapt --method lora+speaker``. Both speak the voice's held-out
sentences and are judged against its real recordings (Whisper WER, resemblyzer similarity).

    python bench/voice_space.py --voices piper-joe --out bench/results/voice_space

Writes ``voice_space.md``, ``voice_space.json`` and ``similarity_vs_minutes.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from chorus.adapters.voice_space import VoiceSpace
from chorus.corpus.virtual import add_virtual_voices
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.synthesis import DEFAULT_BASE, load_base
from chorus.training.adapt import AdaptConfig, adapt
from chorus.training.checkpoint import load_bundle
from chorus.training.voice_space import VoiceSpaceConfig, fit_voice, train_voice_space


def judge(voice_dir: Path, evaluation, references, judges: Judges) -> dict:
    tts = load_base(None, "griffin-lim")
    name = tts.load_voice(voice_dir)
    items = []
    for utterance in evaluation:
        spoken = tts.synthesize(utterance.text, voice=name)
        items.append(EvalItem(utterance.audio_path.stem, spoken.audio, utterance.text, speaker_references=references,
                              synthesis_seconds=spoken.seconds, sample_rate=spoken.sample_rate))
    report = evaluate_pairs(items, judges=judges, progress=False)
    return {"wer": report.corpus_wer, "similarity": report.means().get("speaker_similarity")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument("--minutes", default="0.5,1,3,10")
    parser.add_argument("--space-method", default="cln+speaker", help="the adapter the space generates")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--space-steps", type=int, default=200)
    parser.add_argument("--space-minutes", type=float, default=1.0, help="audio of each corpus voice in the space")
    parser.add_argument("--space-virtual", type=int, default=54, help="new virtual voices added to the space")
    parser.add_argument("--fit-steps", type=int, default=150)
    parser.add_argument("--redo-lora", action="store_true", help="adapt the LoRA voices again")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--references", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--work", type=Path, default=Path("runs/voice_space"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/voice_space"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    space_dir = args.work / "space"
    if not (space_dir / "voice_space.json").is_file():
        root = args.work / "space_voices"
        for source in sorted(p for p in args.corpus.iterdir() if (p / "metadata.csv").is_file()):
            utterances, _ = discover(source)
            write_subset(first_minutes(utterances, args.space_minutes), root / source.name)
        add_virtual_voices(root, args.space_virtual, minutes=args.space_minutes)
        started = time.perf_counter()
        _, history = train_voice_space(root, load_bundle(DEFAULT_BASE), space_dir,
                                       VoiceSpaceConfig(method=args.space_method, dim=args.dim,
                                                        steps=args.space_steps, threads=args.threads),
                                       progress=False)
        (args.work / "space_training.json").write_text(json.dumps(
            {"seconds": time.perf_counter() - started, "history": history}))
    space, _, space_voices = VoiceSpace.load(space_dir)
    space_info = json.loads((args.work / "space_training.json").read_text())

    judges = Judges(speaker=SpeakerJudge(), reference=False)
    results_path = args.out / "voice_space.json"
    rows = json.loads(results_path.read_text()) if results_path.is_file() else []
    for voice in args.voices.split(","):
        utterances, _ = discover(args.heldout / voice)
        evaluation = utterances[-args.sentences:]
        references = [u.audio_path for u in utterances[-args.sentences - args.references: -args.sentences]]
        pool = utterances[: -args.sentences - args.references]
        for minutes in [float(m) for m in args.minutes.split(",")]:
            data = args.work / "data" / f"{voice}-{minutes:g}"
            write_subset(first_minutes(pool, minutes), data)
            bundle = load_bundle(DEFAULT_BASE)
            fitted = fit_voice(data, bundle, space, args.work / "voices" / f"{voice}-{minutes:g}-space",
                               steps=args.fit_steps, threads=args.threads, progress=False)
            made = [("voice space", fitted.voice_dir, fitted.card)]
            # The per-voice LoRA does not depend on the space: a result from an earlier run is kept.
            if args.redo_lora or not any((r["voice"], r["minutes"], r["kind"]) == (voice, minutes, "lora+speaker")
                                         for r in rows):
                lora = adapt(data, load_bundle(DEFAULT_BASE), args.work / "voices" / f"{voice}-{minutes:g}-lora",
                             AdaptConfig(method="lora+speaker", threads=args.threads, min_minutes=0.4),
                             progress=False)
                made.append(("lora+speaker", lora.voice_dir, lora.card))
            for kind, voice_dir, card in made:
                scores = judge(voice_dir, evaluation, references, judges)
                rows = [r for r in rows if (r["voice"], r["minutes"], r["kind"]) != (voice, minutes, kind)]
                rows.append({"voice": voice, "minutes": minutes, "data_minutes": card.data_minutes, "kind": kind,
                             "numbers": card.trainable_parameters, "seconds": card.train_seconds, **scores})
                print(f"{voice} {minutes:g} min {kind}: similarity {scores['similarity']:.3f}", flush=True)
            results_path.write_text(json.dumps(rows, indent=1))
    write(rows, args, space, space_voices, space_info)


def write(rows: list[dict], args, space: VoiceSpace, space_voices: list[str], space_info: dict) -> None:
    rows = sorted(rows, key=lambda r: (r["voice"], r["minutes"], r["kind"]))
    lines = ["# Voice space against per-voice LoRA", "",
             f"Space: dim {space.dim}, generating {', '.join(c.method for c in space.configs)} adapters; learned over "
             f"{len(space_voices)} voices ({sum('~' in v for v in space_voices)} of them new virtual voices; "
             f"{args.space_minutes:g} min each) in "
             f"{space_info['seconds'] / 60:.1f} min. A space voice fits only its {space.dim} numbers "
             f"(started from its clips' d-vector, at most {args.fit_steps} steps); LoRA is `chorus adapt --method "
             "lora+speaker` with its defaults. Same clips, same held-out sentences, judged against the real "
             "recordings.", "",
             "| voice | minutes | kind | numbers learned | seconds | WER % | similarity |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['voice']} | {row['data_minutes']:.2f} | {row['kind']} | {row['numbers']:,} | "
                     f"{row['seconds']:.0f} | {100 * (row['wer'] or 0):.1f} | {row['similarity']:.3f} |")
    lines += ["", "Target: a voice-space voice from 1 minute reaches at least 0.9x the similarity of a per-voice "
                  "LoRA trained on 3 minutes."]
    for voice in dict.fromkeys(r["voice"] for r in rows):
        space_1 = next((r for r in rows if r["voice"] == voice and r["minutes"] == 1 and r["kind"] == "voice space"), None)
        lora_3 = next((r for r in rows if r["voice"] == voice and r["minutes"] == 3 and r["kind"] == "lora+speaker"), None)
        if space_1 and lora_3:
            lines.append(f"- {voice}: {space_1['similarity']:.3f} / {lora_3['similarity']:.3f} = "
                         f"{space_1['similarity'] / lora_3['similarity']:.3f}x")
    (args.out / "voice_space.md").write_text("\n".join(lines) + "\n")
    plot(rows, args.out / "similarity_vs_minutes.png")
    print("\n".join(lines))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4))
    for voice in dict.fromkeys(r["voice"] for r in rows):
        for kind, style in (("voice space", "o-"), ("lora+speaker", "s--")):
            points = sorted((r["minutes"], r["similarity"]) for r in rows if r["voice"] == voice and r["kind"] == kind)
            if points:
                axis.plot(*zip(*points), style, label=f"{voice}, {kind}")
    axis.set_xscale("log")
    axis.set_xlabel("minutes of the new voice")
    axis.set_ylabel("similarity to real clips")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
