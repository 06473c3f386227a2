"""Intelligibility of every seen base voice against its own recordings (Whisper tiny.en WER).

``bench/base.py`` judges four voices in depth (similarity, vocoded and teacher-timed copies, speed
against Piper). This judges all of them on one question: does the base say the 20 benchmark sentences
as clearly as the engine its voice was learned from? For each voice of the base: its engine's
recordings of the sentences, and the base through each vocoder, all transcribed by the same judge.

    python bench/base_all_voices.py --out bench/results/base_all_voices

Writes ``base_all_voices.md``, ``.json`` and ``wer_by_voice.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from rich.progress import track

from base import base_speaker, recording_clips, summarize
from chorus.corpus.build import record_sentences
from chorus.corpus.text import benchmark_sentences
from chorus.evaluation.report import Judges
from chorus.evaluation.voices import judge_clips, synthesize_grid
from chorus.synthesis import load_base


def plot(voices: list[str], systems: list[str], wer: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(max(8.0, 0.32 * len(voices)), 4.5))
    width = 0.8 / len(systems)
    for index, system in enumerate(systems):
        axis.bar(
            np.arange(len(voices)) + (index - (len(systems) - 1) / 2) * width,
            [100 * wer[f"{voice}|{system}"] for voice in voices],
            width,
            label=system,
        )
    axis.axhline(10, color="k", linestyle="--", linewidth=1, label="target 10%")
    axis.set_xticks(range(len(voices)), voices, rotation=70, ha="right", fontsize=7)
    axis.set_ylabel("WER % (Whisper tiny.en)")
    axis.set_title("Each seen voice: its own recordings against the base")
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: shipped base)")
    parser.add_argument("--vocoders", default="griffin-lim,neural", help="vocoder folders or names, comma-separated")
    parser.add_argument("--voices", default="", help="comma-separated; default: every voice of the base")
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/base_all_voices"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    sentences = benchmark_sentences()[: args.sentences]
    vocoders = args.vocoders.split(",")

    voices = args.voices.split(",") if args.voices else None
    clips = []
    for vocoder in vocoders:
        tts = load_base(args.model, vocoder)
        voices = voices or tts.speakers
        clips += synthesize_grid(base_speaker(tts), [f"{voice}|{vocoder}" for voice in voices], sentences)
    recordings = {
        voice: record_sentences(voice, sentences)
        for voice in track(voices, description="recording the sentences in each voice's engine")
    }
    clips += recording_clips(voices, sentences, recordings)
    report = judge_clips(clips, Judges(speaker=None, reference=False), {})
    summary = summarize(clips, report)
    systems = ["recordings", *vocoders]
    wer = {key: values["wer"] for key, values in summary.items()}

    def mean(system: str, among: list[str]) -> float:
        return 100 * float(np.mean([wer[f"{voice}|{system}"] for voice in among]))

    engines = sorted({voice.split("-")[0] for voice in voices})
    lines = [
        "# Every seen voice: the base against its own recordings",
        "",
        f"Model: {args.model or 'shipped base'} ({tts.bundle.info.get('steps', '?')} steps, weights sha256 "
        f"`{tts.bundle.weights_sha256[:12]}`); the {len(sentences)} benchmark sentences (in no voice's "
        "training text); WER % by Whisper tiny.en (faster-whisper, int8, beam 5).",
        "",
        "| voice | " + " | ".join(systems) + " |",
        "|---" * (len(systems) + 1) + "|",
    ]
    lines += [
        f"| {voice} | " + " | ".join(f"{100 * wer[f'{voice}|{s}']:.1f}" for s in systems) + " |" for voice in voices
    ]
    lines += [
        "",
        "Means over voices (each voice weighs the same):",
        "",
        "| voices | count | " + " | ".join(systems) + " |",
        "|---" * (len(systems) + 2) + "|",
    ]
    for group, among in [("all", voices)] + [
        (engine, [v for v in voices if v.split("-")[0] == engine]) for engine in engines
    ]:
        lines.append(f"| {group} | {len(among)} | " + " | ".join(f"{mean(s, among):.1f}" for s in systems) + " |")
    better = {s: sum(wer[f"{v}|{s}"] <= wer[f"{v}|recordings"] for v in voices) for s in vocoders}
    lines += [
        "",
        "Voices the base says at least as clearly as their recordings: "
        + ", ".join(f"{s} {better[s]} of {len(voices)}" for s in vocoders),
        "",
    ]
    plot(voices, systems, wer, args.out / "wer_by_voice.png")
    (args.out / "base_all_voices.md").write_text("\n".join(lines))
    (args.out / "base_all_voices.json").write_text(
        json.dumps({"summary": summary, "rows": report.to_dict()}, indent=1, default=str)
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
