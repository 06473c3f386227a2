"""Griffin-Lim against the trained neural vocoder, judged on copy-synthesis of real clips.

Each clip's log-mel is turned back into audio by each vocoder; Whisper tiny.en transcribes it (WER
against the text, beside the WER of the original clip), MCD and F0 RMSE compare it with the original,
distillmos predicts its MOS, and the real-time factor is timed. Clips come from the held-out datasets
(piper-joe, flite-slt, festival-ked; the shipped vocoder heard Piper joe resampled, reading other
sentences) and from seen voices.

    python bench/vocoders.py --vocoder runs/vocoder --corpus corpus_out --out bench/results/vocoders
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from chorus.audio.io import load_audio
from chorus.audio.mel import MelSpectrogram
from chorus.audio.vocoders import load_vocoder
from chorus.data.formats import discover
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge

HELDOUT = ["piper-joe", "flite-slt", "festival-ked"]
SEEN = ["flite-rms", "festival-kal", "espeak-us-m3"]


def pick_clips(corpus: Path, per_voice: int) -> list[tuple[str, object]]:
    chosen = []
    for voice in HELDOUT + SEEN:
        split = "heldout" if voice in HELDOUT else "train"
        utterances, _ = discover(corpus / split / voice)
        rng = np.random.default_rng(7)
        for index in sorted(rng.choice(len(utterances), size=min(per_voice, len(utterances)), replace=False)):
            chosen.append((voice, utterances[index]))
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocoder", type=Path, required=True, help="trained neural vocoder folder")
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out"))
    parser.add_argument("--per-voice", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/vocoders"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    clips = pick_clips(args.corpus, args.per_voice)
    mel_fn = MelSpectrogram()
    vocoders = {"griffin-lim": load_vocoder("griffin-lim"), "neural": load_vocoder(args.vocoder, mel_fn.config)}
    for vocoder in vocoders.values():  # first-call allocations are not part of the RTF
        with torch.no_grad():
            vocoder(torch.zeros(1, 50, mel_fn.config.n_mels) - 5)
    judges = Judges(speaker=SpeakerJudge(), f0_method="dio")
    results: dict[str, dict] = {}
    originals = evaluate_pairs(
        [EvalItem(f"{v}/{u.id}", load_audio(u.audio_path), u.text) for v, u in clips],
        judges=Judges(speaker=None, reference=False),
        progress=False,
    )
    results["original"] = {"wer": originals.corpus_wer, "mcd_db": 0.0, "rtf": None, "mos": originals.means().get("mos")}
    for name, vocoder in vocoders.items():
        items, synth_seconds, audio_seconds = [], 0.0, 0.0
        for voice, utterance in clips:
            audio = load_audio(utterance.audio_path)
            with torch.no_grad():
                mel = mel_fn(torch.from_numpy(audio)).unsqueeze(0)
                started = time.perf_counter()
                output = vocoder(mel)[0].numpy()
                synth_seconds += time.perf_counter() - started
            audio_seconds += len(output) / 22_050
            items.append(
                EvalItem(f"{voice}/{utterance.id}", output, utterance.text, reference=audio, speaker_references=[audio])
            )
        report = evaluate_pairs(items, judges=judges, progress=False)
        means = report.means()
        results[name] = {
            "wer": report.corpus_wer,
            "mcd_db": means.get("mcd_db"),
            "f0_rmse_hz": means.get("f0_rmse_hz"),
            "similarity_to_original": means.get("speaker_similarity"),
            "mos": means.get("mos"),
            "rtf": synth_seconds / audio_seconds,
        }
    lines = [
        "# Vocoders: copy-synthesis of real clips",
        "",
        f"{len(clips)} clips ({args.per_voice} each from {', '.join(HELDOUT)} (held out: no clip of theirs was "
        "ever heard by a vocoder; the shipped one heard Piper joe resampled by sox, reading other sentences) and "
        f"{', '.join(SEEN)}); {args.threads} thread(s); Whisper tiny.en, resemblyzer, WORLD (dio), distillmos.",
        "",
        "| audio | predicted MOS | WER % | MCD dB | F0 RMSE Hz | similarity to original | RTF |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        fmt = lambda value, spec: "" if value is None else format(value, spec)  # noqa: E731
        lines.append(
            f"| {name} | {fmt(r.get('mos'), '.2f')} | {100 * r['wer']:.1f} | {fmt(r.get('mcd_db'), '.2f')} | "
            f"{fmt(r.get('f0_rmse_hz'), '.1f')} | "
            f"{fmt(r.get('similarity_to_original'), '.3f')} | {fmt(r.get('rtf'), '.4f')} |"
        )
    (args.out / "vocoders.md").write_text("\n".join(lines) + "\n")
    (args.out / "vocoders.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
