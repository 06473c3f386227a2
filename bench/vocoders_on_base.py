"""Which vocoder makes the base model's own speech most intelligible.

The base's log-mels for sentences that no corpus voice reads (and that are not the benchmark's 20, so
choosing a vocoder here leaves ``bench/base.py`` untouched) go through each vocoder; Whisper tiny.en
transcribes them. Copy-synthesis of real clips (``bench/vocoders.py``) judges a vocoder on real
spectra; this judges it on the smoother spectra the model makes, which is what a fine-tuned
(``chorus train-vocoder --aligned-model``) vocoder is meant to fit.

    python bench/vocoders_on_base.py --vocoders griffin-lim,src/chorus/assets/vocoder,runs/vocoder-gta

Writes ``vocoders_on_base.md`` and ``.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from chorus.audio.vocoders import load_vocoder
from chorus.corpus.text import sentence_key, training_sentences
from chorus.data.formats import discover
from chorus.evaluation.asr import WhisperJudge, word_errors
from chorus.synthesis import load_base

DEFAULT_VOICES = "flite-rms,flite-awb,festival-kal,flite-kal16"


def unread_sentences(corpus: Path, voices: list[str], count: int) -> list[str]:
    """The first ``count`` corpus sentences of 5-14 words that none of ``voices`` (folders under ``corpus``) reads."""
    read = {sentence_key(u.text) for voice in voices for u in discover(corpus / voice)[0]}
    return [
        text for _, text in training_sentences() if sentence_key(text) not in read and 5 <= len(text.split()) <= 14
    ][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vocoders", default="griffin-lim,src/chorus/assets/vocoder", help="vocoder names or folders, comma-separated"
    )
    parser.add_argument("--voices", default=DEFAULT_VOICES)
    parser.add_argument("--sentences", type=int, default=25)
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--length-scale", type=float, default=1.0, help="the base's durations times this")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/vocoders_on_base"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    tts = load_base(None, "griffin-lim")
    # Every model voice, so that no sentence is one the model heard in any voice.
    sentences = unread_sentences(args.corpus, tts.speakers, args.sentences)
    voices = args.voices.split(",")
    mels = {voice: tts.mel(sentences, voice, speed=1.0 / args.length_scale) for voice in voices}
    judge = WhisperJudge(cpu_threads=args.threads)
    results = {}
    for name in args.vocoders.split(","):
        vocoder = load_vocoder(name, mel_config=tts.bundle.mel_config)
        for voice in voices:
            counts = [
                word_errors(text, judge.transcribe(vocoder.vocode(mel))) for text, mel in zip(sentences, mels[voice])
            ]
            results[f"{name}|{voice}"] = sum(counts[1:], counts[0]).rate
        print(name, {v: round(100 * results[f"{name}|{v}"], 1) for v in voices}, flush=True)
    (args.out / "vocoders_on_base.json").write_text(json.dumps({"sentences": sentences, "wer": results}, indent=1))
    lines = [
        "# The base's speech through each vocoder",
        "",
        f"Shipped base ({tts.bundle.info.get('steps', '?')} steps, weights sha256 "
        f"`{tts.bundle.weights_sha256[:12]}`), {len(sentences)} sentences no corpus voice reads, "
        + (f"length scale {args.length_scale:g}, " if args.length_scale != 1 else "")
        + "Whisper tiny.en WER %.",
        "",
        "| vocoder | " + " | ".join(voices) + " | mean |",
        "|---" * (len(voices) + 2) + "|",
    ]
    for name in args.vocoders.split(","):
        rates = [100 * results[f"{name}|{voice}"] for voice in voices]
        lines.append(f"| {name} | " + " | ".join(f"{r:.1f}" for r in rates) + f" | {np.mean(rates):.1f} |")
    (args.out / "vocoders_on_base.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
