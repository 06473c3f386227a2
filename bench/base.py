"""Benchmark of the base model: intelligibility, voice identity and speed, with Piper joe as the peer.

On the 20 held-out benchmark sentences (in no voice's training text), for seen base voices:
Whisper tiny.en WER/CER, resemblyzer similarity to real corpus clips of that voice, and real-time
factor; the Piper joe voice (onnxruntime) says the same sentences on the same machine in the same
run. Each voice's own engine (the synthesizer its corpus clips came from) also reads the same
sentences: how well the judge understands the recordings the model learned from bounds how well it
can understand the model; the same recordings turned to log-mels and back through the vocoder show
what the vocoder alone costs. The base also speaks each sentence with the timing of its recording
(durations from monotonic alignment search against the recording, the decoder as in training), which
tells whether its own predicted durations are what it loses words on. Also the mean similarity
between utterances of the same base voice against different voices.

    python bench/base.py --vocoders griffin-lim,neural --out bench/results/base

Writes ``base.md`` (the table), ``base.json`` and ``similarity.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from chorus.audio.io import SAMPLE_RATE
from chorus.audio.mel import log_mel
from chorus.corpus.build import record_sentences
from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.evaluation.voices import (
    VoiceClip,
    judge_clips,
    same_versus_different,
    synthesize_grid,
)
from chorus.models.bundle import teacher_forced_mel
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


def recording_clips(
    voices: list[str], sentences: list[str], recordings: dict[str, list[np.ndarray]]
) -> list[VoiceClip]:
    """Clips ``voice|recordings``: each voice's engine reading ``sentences`` (``recordings[voice]``)."""
    return [
        VoiceClip(f"{voice}|recordings", index, text, audio, SAMPLE_RATE, float("nan"))
        for voice in voices
        for index, (text, audio) in enumerate(zip(sentences, recordings[voice]))
    ]


def speak_and_judge(tts, voice: str, evaluation, references: list[Path], judges: Judges, against_recordings=False):
    """``tts`` reads each of ``evaluation``'s utterances (``Utterance``: text and its real recording) in
    ``voice``, judged by ``judges`` with ``references`` for similarity (and, ``against_recordings``, each
    clip against its own recording: MCD, F0); the :class:`EvalReport`."""
    items = []
    for utterance in evaluation:
        spoken = tts.synthesize(utterance.text, voice=voice)
        items.append(
            EvalItem(
                utterance.audio_path.stem,
                spoken.audio,
                utterance.text,
                reference=utterance.audio_path if against_recordings else None,
                speaker_references=references,
                synthesis_seconds=spoken.seconds,
                sample_rate=spoken.sample_rate,
            )
        )
    return evaluate_pairs(items, judges=judges, progress=False)


def judge_voice(base: Path | None, voice_dir: Path, evaluation, references: list[Path], judges: Judges) -> dict:
    """An adapted voice's corpus WER and mean similarity to ``references`` on ``base`` (None: the shipped
    one) through Griffin-Lim, as the many-voice and voice-space benchmarks compare their voices."""
    tts = load_base(base, "griffin-lim")
    report = speak_and_judge(tts, tts.load_voice(voice_dir), evaluation, references, judges)
    return {"wer": report.corpus_wer, "similarity": report.means().get("speaker_similarity")}


def base_speaker(tts, length_scale: float = 1.0):
    """``speak(text, "voice|system")`` for :func:`synthesize_grid`: the base in that voice, timed."""

    def speak(text: str, voice: str):
        result = tts.synthesize(text, voice.split("|")[0], speed=1.0 / length_scale)
        return result.audio, result.sample_rate, result.seconds

    return speak


def summarize(clips: list[VoiceClip], report) -> dict[str, dict]:
    """Per clip group (``voice|system``): corpus WER/CER, mean similarity to references, RTF (total
    synthesis time / audio), mean speaking rate (words per second of speech)."""
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
            "words_per_second": float(np.mean([r.words_per_second for r in mine])),
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
    parser.add_argument("--vocoders", default="griffin-lim,neural", help="vocoder folders or names, comma-separated")
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"), help="corpus train folder")
    parser.add_argument("--voices", default=DEFAULT_VOICES)
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--references", type=int, default=20, help="real clips per voice for similarity")
    parser.add_argument(
        "--length-scale",
        type=float,
        default=1.0,
        help="the base's durations times this (above 1: slower speech), as `chorus synthesize`",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/base"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    sentences = benchmark_sentences()[: args.sentences]
    voices = args.voices.split(",")
    vocoders = args.vocoders.split(",")

    joe = load_joe(threads=args.threads)
    joe.synthesize("Warm up.")

    def speak_joe(text: str, _voice: str):
        started = time.perf_counter()
        audio, rate = joe.synthesize(text)
        return audio, rate, time.perf_counter() - started

    # Both systems run back to back in one process on the same machine, which the table states.
    joe_clips = synthesize_grid(speak_joe, ["piper-joe"], sentences)
    recordings = {voice: record_sentences(voice, sentences) for voice in voices}
    recorded_mels = None
    clips = joe_clips + recording_clips(voices, sentences, recordings)
    systems = [("recordings", "its own engine (the recordings)")]
    for vocoder in vocoders:
        tts = load_base(args.model, vocoder)
        tts.synthesize("Warm up.", voices[0])  # first-call allocations are not part of the RTF
        if recorded_mels is None:  # every vocoder takes the model's mel settings: made once
            recorded_mels = {
                voice: [log_mel(audio, tts.bundle.mel_config) for audio in recordings[voice]] for voice in voices
            }
        name = type(tts.vocoder).__name__
        clips += synthesize_grid(
            base_speaker(tts, args.length_scale), [f"{voice}|{vocoder}" for voice in voices], sentences
        )

        def from_recordings(system: str, to_mel, tts=tts, recorded_mels=recorded_mels) -> list[VoiceClip]:
            """Clips ``voice|system`` vocoded from ``to_mel(text, recorded log-mel, voice)``."""
            return [
                VoiceClip(
                    f"{voice}|{system}",
                    index,
                    text,
                    tts.vocoder.vocode(to_mel(text, mel, voice)),
                    SAMPLE_RATE,
                    float("nan"),
                )
                for voice in voices
                for index, (text, mel) in enumerate(zip(sentences, recorded_mels[voice]))
            ]

        clips += from_recordings(f"{vocoder} vocoded", lambda text, mel, voice: mel)
        systems += [(vocoder, f"Chorus base, {name}"), (f"{vocoder} vocoded", f"the recordings -> log-mel -> {name}")]
        if vocoder == vocoders[0]:
            clips += from_recordings(
                f"{vocoder} timed",
                lambda text, mel, voice, tts=tts: teacher_forced_mel(
                    tts.bundle, text, mel, tts.resolve_speaker(voice).index
                ),
            )
            systems.append((f"{vocoder} timed", f"Chorus base with the recordings' timing, {name}"))

    speaker = SpeakerJudge()
    judges = Judges(speaker=speaker, reference=False)
    references = {
        voice: corpus_references(args.corpus, voice, args.references)
        for voice in voices
        if (args.corpus / voice).is_dir()
    }
    references |= {f"{voice}|{system}": paths for voice, paths in references.items() for system, _ in systems}
    report = judge_clips(clips, judges, references)
    summary = summarize(clips, report)
    identity = same_versus_different([c for c in clips if c.voice.endswith(f"|{vocoders[0]}")], speaker)
    plot_similarity(identity, args.out / "similarity.png")

    lines = [
        "# Base model benchmark",
        "",
        f"Model: {args.model or 'shipped base'} ({tts.bundle.info.get('steps', '?')} steps); {len(sentences)} "
        f"held-out sentences; {args.threads} CPU threads; "
        + (f"length scale {args.length_scale:g} (slower speech); " if args.length_scale != 1 else "")
        + "judges: Whisper tiny.en (faster-whisper, int8), "
        "resemblyzer (similarity to real corpus clips of the voice). Each voice's own engine reads the same "
        "sentences: the recordings the base learned from, and how well the judge understands them.",
        "",
        "| voice | system | WER % | CER % | similarity to real clips | words/s | RTF |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = [(voice, label, summary[f"{voice}|{system}"]) for voice in voices for system, label in systems]
    rows.append(("piper-joe", "Piper (VITS, onnxruntime)", summary["piper-joe"]))
    for voice, label, values in rows:
        similarity = f"{values['similarity']:.3f}" if values["similarity"] is not None else "n/a"
        rtf = "n/a" if np.isnan(values["rtf"]) else f"{values['rtf']:.4f}"
        lines.append(
            f"| {voice} | {label} | {100 * values['wer']:.1f} | {100 * values['cer']:.1f} | "
            f"{similarity} | {values['words_per_second']:.2f} | {rtf} |"
        )

    def mean(system: str, key: str) -> float:
        return float(np.mean([summary[f"{voice}|{system}"][key] for voice in voices]))

    joe_rtf = summary["piper-joe"]["rtf"]
    lines += [
        "",
        "Means over the base voices:",
        "",
        f"- their own engines (the judge's ceiling for these voices): WER {100 * mean('recordings', 'wer'):.1f}%",
    ]
    lines.append(
        f"- Chorus base with the recordings' timing, {vocoders[0]}: WER "
        f"{100 * mean(f'{vocoders[0]} timed', 'wer'):.1f}% (with its own predicted durations: "
        f"{100 * mean(vocoders[0], 'wer'):.1f}%)"
    )
    for vocoder in vocoders:
        lines.append(
            f"- Chorus base, {vocoder}: WER {100 * mean(vocoder, 'wer'):.1f}% (the recordings through "
            f"this vocoder: {100 * mean(f'{vocoder} vocoded', 'wer'):.1f}%), RTF {mean(vocoder, 'rtf'):.4f} "
            f"= {mean(vocoder, 'rtf') / joe_rtf:.2f}x Piper joe's {joe_rtf:.4f}"
        )
    lines += [
        f"- speaker similarity between synthesized clips ({vocoders[0]}): same voice {identity.same:.3f}, "
        f"different voices {identity.different:.3f} (see similarity.png)",
        "",
    ]
    (args.out / "base.md").write_text("\n".join(lines))
    (args.out / "base.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "same_voice": identity.same,
                "different_voices": identity.different,
                "rows": report.to_dict(),
            },
            indent=1,
            default=str,
        )
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
