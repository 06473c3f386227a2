"""A Chorus base that also heard natural-sounding speakers, against the shipped one (issue 38's fallback).

Each base (``label=folder``; ``shipped``: the package's) reads the same benchmark sentences (in no speaker's
training text) in each voice it has, through its own default synthesis (vocoder and post-filter), the bases
taking turns sentence by sentence; beside them, each voice's own recordings of the sentences (its engine:
flite, festival, or Piper joe through its sox chain). Judged per voice and system: predicted MOS
(distillmos, mean and sd over the sentences), WER (Whisper tiny.en) and resemblyzer similarity to the
voice's recordings of other sentences (its corpus clips).

    python bench/natural_base.py --bases shipped,natural=runs/base-natural/checkpoint \
        --voices flite-rms,festival-kal,natural-joe-speed-116,natural-joe-pitch-600-speed-120 \
        --out bench/results/natural_base

The natural-sounding voices are Piper joe (whose own dataset is held out) reading other sentences through sox
(``chorus.corpus.speakers.NATURAL_SPEAKERS``): a base that heard them heard joe's relatives.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from base import recording_clips, summarize  # bench/, beside this script
from chorus.audio.io import load_audio
from chorus.corpus.build import record_sentences
from chorus.corpus.speakers import get_speaker
from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.evaluation.report import Judges
from chorus.evaluation.voices import VoiceClip, judge_clips
from chorus.synthesis import load_base
from run_record import LoadSampler, provenance, write_results


def corpus_folder(voice: str, corpus: Path) -> Path:
    """Where ``voice``'s corpus clips are (``train/`` or ``natural/``): its similarity references."""
    return corpus / get_speaker(voice).split / voice


def interleaved(bases: dict, voices: list[str], sentences: list[str]) -> list[VoiceClip]:
    """Clips ``voice|label``: each sentence said by each base in turn, in every voice that base has."""
    clips = []
    for index, text in enumerate(sentences):
        for label, tts in bases.items():
            for voice in voices:
                if voice in tts.speakers:
                    result = tts.synthesize(text, voice)
                    clips.append(VoiceClip(f"{voice}|{label}", index, text, result.audio, result.sample_rate, 0.0))
    return clips


def mos_by_group(clips: list[VoiceClip], report) -> dict[str, tuple[float, float]]:
    """``voice|system`` -> (mean, sd) of the predicted MOS over its clips."""
    rows = {row.id: row for row in report.rows}
    groups: dict[str, list[float]] = {}
    for clip in clips:
        groups.setdefault(clip.voice, []).append(rows[clip.id].mos)
    return {group: (float(np.mean(values)), float(np.std(values))) for group, values in groups.items()}


def report(result: dict) -> str:
    systems = ["recordings", *result["bases"]]
    lines = [
        "# A base that heard natural-sounding speakers, against the shipped one",
        "",
        f"{result['sentences']} benchmark sentences per voice and system; MOS mean ± sd over them, WER % (Whisper "
        "tiny.en), similarity to the voice's corpus clips (resemblyzer). Bases: "
        + "; ".join(f"{label} = `{info['folder']}` ({info['steps']} steps)" for label, info in result["bases"].items())
        + ". A blank cell: that base has no such voice.",
        "",
        "| voice | " + " | ".join(f"{s} MOS | {s} WER | {s} sim." for s in systems) + " |",
        "|---" * (1 + 3 * len(systems)) + "|",
    ]
    for voice in result["voices"]:
        cells = []
        for system in systems:
            key = f"{voice}|{system}"
            if key not in result["summary"]:
                cells += ["", "", ""]
                continue
            mos, sd = result["mos"][key]
            row = result["summary"][key]
            cells += [f"{mos:.2f} ± {sd:.2f}", f"{100 * row['wer']:.1f}", f"{row['similarity']:.3f}"]
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The natural-sounding voices are Piper joe (its own dataset held out) reading other sentences through sox "
        "chains; a base that heard them heard joe's relatives.",
        "",
        f"Provenance: commit `{result['provenance']['commit'][:10]}`, src/ clean: {result['provenance']['src_clean']}, "
        f"{result['provenance']['threads']} thread(s), load {result['provenance']['load']}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bases", default="shipped,natural=runs/base-natural/checkpoint", help="label=folder, ...")
    parser.add_argument(
        "--voices", default="flite-rms,festival-kal,natural-joe-speed-116,natural-joe-pitch-600-speed-120"
    )
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out"), help="the corpus root (train/, natural/)")
    parser.add_argument("--sentences", type=int, default=12)
    parser.add_argument("--references", type=int, default=10, help="corpus clips per voice for similarity")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/natural_base"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    voices = args.voices.split(",")
    sentences = benchmark_sentences()[: args.sentences]
    folders = dict(item.split("=", 1) if "=" in item else (item, None) for item in args.bases.split(","))
    bases = {label: load_base(folder) for label, folder in folders.items()}
    result = {
        "bases": {
            label: {"folder": folders[label] or "shipped", "steps": tts.bundle.info.get("steps")}
            for label, tts in bases.items()
        },
        "voices": voices,
        "sentences": len(sentences),
        "provenance": provenance(args.threads, "Synthesizer.synthesize, each base's default vocoder and post-filter"),
    }
    with LoadSampler() as load:
        clips = interleaved(bases, voices, sentences)
        recordings = {voice: record_sentences(voice, sentences) for voice in voices}
        clips += recording_clips(voices, sentences, recordings)
        references = {
            voice: [load_audio(u.audio_path) for u in discover(corpus_folder(voice, args.corpus))[0][: args.references]]
            for voice in voices
        }
        by_group = {clip.voice: references[clip.voice.split("|")[0]] for clip in clips}
        judged = judge_clips(clips, Judges(reference=False), by_group)
        result["summary"] = summarize(clips, judged)
        result["mos"] = mos_by_group(clips, judged)
    write_results(args.out, "natural_base", result, load, report)


if __name__ == "__main__":
    main()
