"""A Chorus base and vocoder that also heard natural-sounding speakers, against the shipped ones (issue 38's
fallback).

Rows per voice: its recordings; the recordings' log-mels through each vocoder (``copy <vocoder>``: what the
vocoder alone costs); and each base with each vocoder speaking freely (``<base> + <vocoder>``, the base's own
post-filter), the combinations taking turns sentence by sentence. Base voices read the benchmark sentences (in
no speaker's training text; their recordings made by their engine: flite, festival, or Piper joe through its
sox chain); held-out voices (``--heldout-voices``) get the recordings and copy rows only, on their last clips.
Judged per row: predicted MOS (distillmos, mean ± sd over the clips), WER (Whisper tiny.en) and resemblyzer
similarity to other recordings of the voice (its first corpus clips).

    python bench/natural_base.py --bases shipped,natural=runs/base-natural/checkpoint \
        --vocoders shipped=neural,natural=runs/vocoder-natural --out bench/results/natural_base

The natural-sounding voices are Piper joe (whose own dataset is held out) reading other sentences through sox
(``chorus.corpus.speakers.NATURAL_SPEAKERS``): a base or vocoder that heard them heard joe's relatives, and
every vocoder here heard joe resampled (``VOCODER_SPEAKERS``): piper-joe's copy rows are those of a voice whose
relatives the vocoder heard.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from base import summarize  # bench/, beside this script
from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.audio.mel import log_mel
from chorus.corpus.build import record_sentences
from chorus.corpus.speakers import get_speaker
from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.evaluation.report import Judges
from chorus.evaluation.voices import VoiceClip, judge_clips
from chorus.synthesis import load_base
from run_record import LoadSampler, describe, provenance, write_results


def labelled(spec: str) -> dict[str, str | None]:
    """``"a,b=path"`` -> ``{"a": None, "b": "path"}`` (None: the shipped one)."""
    return dict(item.split("=", 1) if "=" in item else (item, None) for item in spec.split(","))


def clips_of(voice: str, system: str, texts: list[str], audios: list[np.ndarray]) -> list[VoiceClip]:
    return [
        VoiceClip(f"{voice}|{system}", index, text, audio, SAMPLE_RATE, 0.0)
        for index, (text, audio) in enumerate(zip(texts, audios))
    ]


def free_synthesis(synthesizers: dict, voices: list[str], sentences: list[str]) -> list[VoiceClip]:
    """Clips ``voice|<base> + <vocoder>``: each sentence said by each combination in turn, in every voice that
    base has."""
    clips = []
    for index, text in enumerate(sentences):
        for system, tts in synthesizers.items():
            for voice in voices:
                if voice in tts.speakers:
                    result = tts.synthesize(text, voice)
                    clips.append(VoiceClip(f"{voice}|{system}", index, text, result.audio, result.sample_rate, 0.0))
    return clips


def copy_synthesis(vocoders: dict, voice: str, texts: list[str], recordings: list[np.ndarray]) -> list[VoiceClip]:
    """Clips ``voice|copy <vocoder>``: each recording's log-mel through each vocoder (peaks above 0.99 scaled)."""
    clips = []
    for label, vocoder in vocoders.items():
        audios = []
        for audio in recordings:
            spoken = vocoder.vocode(torch.from_numpy(log_mel(audio, vocoder.mel_config)))
            peak = float(np.abs(spoken).max()) if spoken.size else 0.0
            audios.append(spoken * (0.99 / peak) if peak > 0.99 else spoken)
        clips += clips_of(voice, f"copy {label}", texts, audios)
    return clips


def mos_by_group(clips: list[VoiceClip], report) -> dict[str, tuple[float, float]]:
    """``voice|system`` -> (mean, sd) of the predicted MOS over its clips."""
    rows = {row.id: row for row in report.rows}
    groups: dict[str, list[float]] = {}
    for clip in clips:
        groups.setdefault(clip.voice, []).append(rows[clip.id].mos)
    return {group: (float(np.mean(values)), float(np.std(values))) for group, values in groups.items()}


def report(result: dict) -> str:
    systems = result["systems"]
    lines = [
        "# A base and vocoder that heard natural-sounding speakers, against the shipped ones",
        "",
        f"Base voices: {result['sentences']} benchmark sentences; held-out voices: their last {result['sentences']} "
        "clips (recordings and copy rows only). MOS mean ± sd over the clips / WER % (Whisper tiny.en) / similarity "
        "to the voice's first corpus clips (resemblyzer). Bases: "
        + "; ".join(f"{label} = `{info['folder']}` ({info['steps']} steps)" for label, info in result["bases"].items())
        + ". Vocoders: "
        + "; ".join(f"{label} = `{source}`" for label, source in result["vocoders"].items())
        + ". A blank cell: that base has no such voice.",
        "",
        "| voice | " + " | ".join(systems) + " |",
        "|---" * (1 + len(systems)) + "|",
    ]
    for voice in result["voices"]:
        cells = []
        for system in systems:
            key = f"{voice}|{system}"
            if key not in result["summary"]:
                cells.append("")
                continue
            mos, sd = result["mos"][key]
            row = result["summary"][key]
            cells.append(f"{mos:.2f} ± {sd:.2f} / {100 * row['wer']:.1f} / {row['similarity']:.3f}")
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The natural-sounding voices (natural-joe-*) are Piper joe (its own dataset held out) reading other sentences "
        "through sox chains; a base or vocoder that heard them heard joe's relatives, and every vocoder here heard joe "
        "resampled (the vocoder/ split).",
        "",
        f"Measured at {describe(result['provenance'])}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bases", default="shipped,natural=runs/base-natural/checkpoint", help="label=folder, ...")
    parser.add_argument("--vocoders", default="shipped=neural", help="label=vocoder (a folder, or neural), ...")
    parser.add_argument(
        "--voices", default="flite-rms,festival-kal,natural-joe-speed-116,natural-joe-pitch-600-speed-120"
    )
    parser.add_argument("--heldout-voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument(
        "--corpus", type=Path, default=Path("corpus_out"), help="the corpus root (train/, natural/ ...)"
    )
    parser.add_argument("--sentences", type=int, default=12)
    parser.add_argument("--references", type=int, default=10, help="corpus clips per voice for similarity")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/natural_base"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    voices, heldout = args.voices.split(","), [v for v in args.heldout_voices.split(",") if v]
    sentences = benchmark_sentences()[: args.sentences]
    bases, vocoders = labelled(args.bases), labelled(args.vocoders)
    synthesizers = {
        f"{base} + {vocoder}": load_base(folder, source or "neural")
        for base, folder in bases.items()
        for vocoder, source in vocoders.items()
    }
    first_base, first_vocoder = next(iter(bases)), next(iter(vocoders))
    vocoder_models = {label: synthesizers[f"{first_base} + {label}"].engine.base.vocoder for label in vocoders}
    result = {
        "bases": {
            label: {
                "folder": folder or "shipped",
                "steps": synthesizers[f"{label} + {first_vocoder}"].bundle.info.get("steps"),
            }
            for label, folder in bases.items()
        },
        "vocoders": {label: source or "neural" for label, source in vocoders.items()},
        "voices": [*voices, *heldout],
        "sentences": len(sentences),
        "systems": ["recordings", *(f"copy {label}" for label in vocoders), *synthesizers],
        "provenance": provenance(args.threads, "Synthesizer.synthesize of each base + vocoder; vocoder.vocode (copy)"),
    }
    with LoadSampler() as load:
        clips = free_synthesis(synthesizers, voices, sentences)
        references = {}
        for voice in voices:
            recordings = record_sentences(voice, sentences)
            clips += clips_of(voice, "recordings", sentences, recordings)
            clips += copy_synthesis(vocoder_models, voice, sentences, recordings)
            folder = args.corpus / get_speaker(voice).split / voice
            references[voice] = [load_audio(u.audio_path) for u in discover(folder)[0][: args.references]]
        for voice in heldout:
            utterances = discover(args.corpus / "heldout" / voice)[0]
            last = utterances[-args.sentences :]
            recordings = [load_audio(u.audio_path) for u in last]
            texts = [u.text for u in last]
            clips += clips_of(voice, "recordings", texts, recordings)
            clips += copy_synthesis(vocoder_models, voice, texts, recordings)
            references[voice] = [load_audio(u.audio_path) for u in utterances[: args.references]]
        by_group = {clip.voice: references[clip.voice.split("|")[0]] for clip in clips}
        judged = judge_clips(clips, Judges(reference=False), by_group)
        result["summary"] = summarize(clips, judged)
        result["mos"] = mos_by_group(clips, judged)
    write_results(args.out, "natural_base", result, load, report)


if __name__ == "__main__":
    main()
