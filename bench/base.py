"""Benchmark of the base model: intelligibility, voice identity and speed, with Piper joe as the peer.

On the 20 held-out benchmark sentences (in no voice's training text), for seen base voices:
Whisper tiny.en WER/CER, resemblyzer similarity to real corpus clips of that voice, and real-time
factor; the Piper joe voice (onnxruntime) says the same sentences on the same machine in the same
run. Also the mean similarity between utterances of the same base voice against different voices.

    python bench/base.py --vocoder griffin-lim --out bench/results/base   (and --vocoder neural)

Writes ``base.md`` (the table), ``base.json`` and ``similarity.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.evaluation.report import Judges
from chorus.evaluation.similarity import SpeakerJudge
from chorus.evaluation.voices import (
    VoiceClip,
    judge_clips,
    same_versus_different,
    synthesize_grid,
)
from chorus.peers.piper import load_joe
from chorus.synthesis import load_base

DEFAULT_VOICES = "flite-rms,flite-awb,festival-kal,flite-kal16"


def corpus_references(corpus: Path, voice: str, count: int, seed: int = 0) -> list[Path]:
    """``count`` real clips of ``voice`` from the corpus (the reference for speaker similarity).

    Paths, not arrays: the judge embeds each file once and reuses it for every clip of the voice.
    """
    utterances, _ = discover(corpus / voice)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(utterances), size=min(count, len(utterances)), replace=False)
    return [utterances[i].audio_path for i in sorted(chosen)]


def summarize(clips: list[VoiceClip], report) -> dict[str, dict]:
    """Per voice: corpus WER/CER, mean similarity to references, RTF (total synth time / audio)."""
    rows = {row.id: row for row in report.rows}
    summary = {}
    for voice in dict.fromkeys(clip.voice for clip in clips):
        mine = [rows[clip.id] for clip in clips if clip.voice == voice]
        similarity = [r.speaker_similarity for r in mine if r.speaker_similarity is not None]
        summary[voice] = {
            "wer": sum(r.word_edits for r in mine) / sum(r.reference_words for r in mine),
            "cer": sum(r.char_edits for r in mine) / sum(r.reference_chars for r in mine),
            "similarity": float(np.mean(similarity)) if similarity else None,
            "rtf": sum(r.synthesis_seconds for r in mine) / sum(r.audio_seconds for r in mine),
            "clips": len(mine),
        }
    return summary


def plot_similarity(result, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(5.5, 4.5))
    image = axis.imshow(result.matrix, vmin=0.5, vmax=1.0, cmap="viridis")
    axis.set_xticks(range(len(result.voices)), result.voices, rotation=45, ha="right")
    axis.set_yticks(range(len(result.voices)), result.voices)
    for i in range(len(result.voices)):
        for j in range(len(result.voices)):
            axis.text(j, i, f"{result.matrix[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
    axis.set_title("resemblyzer similarity between synthesized clips")
    fig.colorbar(image)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: shipped base)")
    parser.add_argument("--vocoder", default=None, help="vocoder folder or name (default: shipped)")
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"), help="corpus train folder")
    parser.add_argument("--voices", default=DEFAULT_VOICES)
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--references", type=int, default=20, help="real clips per voice for similarity")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/base"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    sentences = benchmark_sentences()[: args.sentences]
    voices = args.voices.split(",")

    tts = load_base(args.model, args.vocoder)
    tts.synthesize("Warm up.", voices[0])  # first-call allocations are not part of the RTF

    def speak_base(text: str, voice: str):
        result = tts.synthesize(text, voice)
        return result.audio, result.sample_rate, result.seconds

    joe = load_joe(threads=args.threads)
    joe.synthesize("Warm up.")

    def speak_joe(text: str, _voice: str):
        started = time.perf_counter()
        audio, rate = joe.synthesize(text)
        return audio, rate, time.perf_counter() - started

    # Interleave the two systems sentence by sentence would be fairer to drift; both run back to back
    # in one process on the same machine, which the table states.
    base_clips = synthesize_grid(speak_base, voices, sentences)
    joe_clips = synthesize_grid(speak_joe, ["piper-joe"], sentences)

    speaker = SpeakerJudge()
    judges = Judges(speaker=speaker, reference=False)
    references = {voice: corpus_references(args.corpus, voice, args.references) for voice in voices
                  if (args.corpus / voice).is_dir()}
    report = judge_clips(base_clips + joe_clips, judges, references)
    summary = summarize(base_clips + joe_clips, report)
    identity = same_versus_different(base_clips, speaker)
    plot_similarity(identity, args.out / "similarity.png")

    info = tts.bundle.info
    lines = [
        "# Base model benchmark", "",
        f"Model: {args.model or 'shipped base'} ({info.get('steps', '?')} steps), vocoder: "
        f"{type(tts.vocoder).__name__}; {len(sentences)} held-out sentences; {args.threads} CPU threads; "
        "judge: Whisper tiny.en (faster-whisper, int8), resemblyzer.", "",
        "| voice | system | WER % | CER % | similarity to real clips | RTF |",
        "|---|---|---|---|---|---|",
    ]
    for voice, values in summary.items():
        system = "Piper (VITS, onnxruntime)" if voice == "piper-joe" else "Chorus base"
        similarity = f"{values['similarity']:.3f}" if values["similarity"] is not None else "n/a"
        lines.append(f"| {voice} | {system} | {100 * values['wer']:.1f} | {100 * values['cer']:.1f} | "
                     f"{similarity} | {values['rtf']:.4f} |")
    base_rtf = float(np.mean([summary[v]["rtf"] for v in voices]))
    base_wer = float(np.mean([summary[v]["wer"] for v in voices]))
    lines += ["", f"Mean over base voices: WER {100 * base_wer:.1f}%, RTF {base_rtf:.4f} "
                  f"(Piper joe RTF {summary['piper-joe']['rtf']:.4f}; ratio {base_rtf / summary['piper-joe']['rtf']:.2f}).",
              f"Speaker similarity between synthesized clips: same voice {identity.same:.3f}, "
              f"different voices {identity.different:.3f} (see similarity.png).", ""]
    (args.out / "base.md").write_text("\n".join(lines))
    (args.out / "base.json").write_text(json.dumps({"summary": summary, "same_voice": identity.same,
                                                    "different_voices": identity.different,
                                                    "rows": report.to_dict()}, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
