"""Make the speaker cohort that the custom-voice speaker check normalizes its scores against
(:mod:`chorus.speaker_recognition.voice_match`) and write it to ``src/chorus/assets/speaker_cohort/``.

The cohort: one clip of about 5 s (one or two sentences) from each of the base's 36 training speakers
(espeak-ng, flite, festival and their sox variants) and from 9 natural-sounding speakers made from the
Piper joe voice by sox pitch / speed+tempo chains, reading training sentences that no held-out piper-joe
clip reads (as the vocoder's Piper speakers do). No held-out dataset (piper-joe, flite-slt,
festival-ked) is in it. Each clip is embedded by both encoders in every channel class (``BANDS`` x
``SNRS``), through each of ``VARIANTS`` (pink noise, two rooms, a crowd, a coarse quantizer).

    python scripts/ship_speaker_cohort.py                      # clips + embeddings (~20 min, one core)
    python scripts/ship_speaker_cohort.py --settings bench/results/consent-groups/consent.json --only fused

(``--only``: a default bench/consent.py run's ``chorus`` is the consent encoder v3, while the ``chorus`` check
loads the encoder that starts voices, so its settings must not replace that check's.)

``--settings`` copies the thresholds that bench/consent.py calibrated (on its calibration split) into the
cohort's ``cohort.json``, which the server reads.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from chorus.audio.io import SAMPLE_RATE
from chorus.corpus.build import record_sentences, select_sentences
from chorus.corpus.speakers import SpeakerSpec, get_speaker, pretraining_speakers
from chorus.speaker_recognition.bundle import load_encoder, shipped_encoder_dir
from chorus.speaker_recognition.embedders import ChorusEmbedder, ResemblyzerEmbedder
from chorus.speaker_recognition.voice_match import SHIPPED_COHORT, VARIANTS, Cohort, MatchSettings, load_cohort

COHORT_RATE = 16_000  # every encoder here embeds at most 8 kHz of band
MIN_SECONDS = 5.0
# Natural-sounding cohort speakers from Piper joe; none of bench/consent.py's trial chains.
PIPER_CHAINS = {
    "up150": ("pitch", "150"),
    "down150": ("pitch", "-150"),
    "up450": ("pitch", "450"),
    "down450": ("pitch", "-450"),
    "up700": ("pitch", "700"),
    "speed085": ("speed", "0.85", "tempo", "1.18"),
    "speed125": ("speed", "1.25", "tempo", "0.8"),
    "speed140": ("speed", "1.4", "tempo", "0.71"),
    "down250-speed110": ("pitch", "-250", "speed", "1.1"),
}


def cohort_speakers() -> list[SpeakerSpec]:
    joe = get_speaker("piper-joe")
    piper = [
        # purpose "vocoder" + derived_from: select_sentences keeps piper-joe's held-out sentences out.
        SpeakerSpec(f"cohort-joe-{label}", joe.engine, joe.engine_voice, "male", 0, sox=chain,
                    derived_from="piper-joe", purpose="vocoder")
        for label, chain in PIPER_CHAINS.items()
    ]  # fmt: skip
    return [*pretraining_speakers(), *piper]


def record(speaker: SpeakerSpec) -> np.ndarray:
    """One or two sentences of ``speaker``, 0.2 s apart, at ``COHORT_RATE``."""
    import soxr

    sentences = [text for _, text in select_sentences(speaker, 4)]
    clips = record_sentences(speaker, sentences[:2])
    audio = clips[0] if clips[0].size >= MIN_SECONDS * SAMPLE_RATE else np.concatenate(
        [clips[0], np.zeros(int(0.2 * SAMPLE_RATE), np.float32), clips[1]]
    )  # fmt: skip
    return soxr.resample(audio, SAMPLE_RATE, COHORT_RATE).astype(np.float32)


# bench/consent.py's row of the server's check as shipped: the shipped settings, not a calibration of its own.
NOT_CALIBRATED = ("server",)


def copy_settings(cohort: Cohort, calibrated: dict[str, dict], source: str, only: list[str] | None = None) -> None:
    """Put the ``calibrated`` settings of bench/consent.py (or consent_fusion.py) into ``cohort``, those of the
    checks named in ``only`` where given, and record ``source`` as where each came from
    (``info["settings_from"]``, per check)."""
    unknown = sorted(set(only or ()) - set(calibrated))
    if unknown:
        raise SystemExit(f"{source} calibrated no {', '.join(unknown)}; it has {', '.join(sorted(calibrated))}")
    chosen = {
        name: values for name, values in calibrated.items() if name not in NOT_CALIBRATED and (not only or name in only)
    }
    cohort.settings |= {name: MatchSettings(**values) for name, values in chosen.items()}
    sources = cohort.info.get("settings_from", {})
    if isinstance(sources, (list, str)):  # cohorts shipped before it was kept per check: the files, unattributed
        sources = {"earlier": sources}
    cohort.info["settings_from"] = sources | dict.fromkeys(chosen, source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=SHIPPED_COHORT)
    parser.add_argument(
        "--settings",
        type=Path,
        nargs="+",
        help="bench/consent.py's consent.json or bench/consent_fusion.py's fusion.json: copy the calibrated "
        "settings they hold (settings of other checks stay)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="CHECK",
        help="with --settings: copy only these checks' settings (a run whose 'chorus' was another encoder than "
        "the one the 'chorus' check loads must not replace its settings)",
    )
    parser.add_argument(
        "--embeddings",
        nargs=2,
        metavar=("NAME", "NPZ"),
        help="with --settings: add another cohort's embeddings-<encoder>.npz under NAME (a candidate encoder's, "
        "embedded by --encoder into another folder: its checks are keyed by NAME)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="record the clips again (default: embed what --out lacks)")
    parser.add_argument(
        "--encoder", type=Path, help="a Chorus speaker encoder folder to embed with (default: the shipped one)"
    )
    args = parser.parse_args()
    if args.only and not args.settings:
        parser.error("--only goes with --settings")
    torch.set_num_threads(args.threads)
    if args.settings:
        cohort = load_cohort(args.out)
        if args.embeddings:
            name, path = args.embeddings
            with np.load(path) as table:
                cohort.embeddings[name] = {k: table[k].astype(np.float32) for k in table.files}
        for path in args.settings:
            copy_settings(cohort, json.loads(path.read_text())["calibration"]["settings"], str(path), args.only)
        cohort.save(args.out)
        print(f"settings for {', '.join(cohort.settings)} written to {args.out / 'cohort.json'}")
        return
    started = time.perf_counter()
    if (args.out / "cohort.json").is_file() and not args.fresh:
        cohort = load_cohort(args.out)  # embed only the classes it lacks
    else:
        speakers = cohort_speakers()
        clips = []
        for speaker in speakers:
            clips.append(record(speaker))
            print(f"{speaker.name}: {clips[-1].size / COHORT_RATE:.1f} s", flush=True)
        cohort = Cohort(clips, COHORT_RATE, [s.name for s in speakers])
        cohort.info = {"speakers": len(speakers), "piper_chains": {k: list(v) for k, v in PIPER_CHAINS.items()}}
    embedders = [ResemblyzerEmbedder(), ChorusEmbedder(load_encoder(args.encoder or shipped_encoder_dir()))]
    for embedder in embedders:
        cohort.embed_classes(embedder, progress=lambda key, e=embedder: print(f"{e.name} {key}", flush=True))
    cohort.info["encoders"] = {
        e.name: getattr(getattr(e, "bundle", None), "weights_sha256", "resemblyzer 0.1.4") for e in embedders
    }
    cohort.info["variants"] = [variant or "pink noise" for variant in VARIANTS]
    cohort.info["embedding_seconds"] = round(
        time.perf_counter() - started + cohort.info.get("embedding_seconds", 0.0), 1
    )
    cohort.info["threads"] = args.threads
    cohort.save(args.out)
    print(f"cohort of {len(cohort.speakers)} speakers in {args.out} ({cohort.info['embedding_seconds']:.0f} s in all)")


if __name__ == "__main__":
    main()
