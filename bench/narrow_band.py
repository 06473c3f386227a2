"""Recordings through a phone line: where `chorus data check`, `chorus adapt` and an upload's job warn that the
clips hold nothing above 4.2 kHz (``chorus.data.check.NARROW_BAND_DB``).

A clip's statistic is :func:`chorus.data.check.upper_band_db`: its energy above ``NARROW_BAND_HZ`` against its
whole energy. Each clip is measured as recorded (at its own rate, and resampled to 16 and 48 kHz) and through
three narrow channels, each saved as 16-bit WAV as a user's export would be (its rounding noise fills the upper
band a little):

* ``phone line``: 300-3,400 Hz, 8 kHz, 8-bit mu-law, back to 16 kHz (``chorus.audio.augment.phone_line``);
* ``8 kHz and up to 16 kHz`` / ``to 48 kHz``: resampled to 8 kHz and back up;
* ``phone line, 20 dB quieter``: the phone line at a tenth of the level, where 16-bit rounding fills the upper band
  20 dB more against the voice (the statistic's known limit: measured on the figures only).

* **Calibration**: the training corpus's voices (``--corpus``), which set the bound: the middle, in dB rounded to
  a whole one, of the gap between the whole-band clips' lowest and the narrow channels' highest. One corpus
  voice, flite-kal, is itself an 8 kHz voice resampled up: it is counted with the narrow ones.
* **Figures**: the held-out voices (``--heldout``; nothing is chosen on them): clips warned of, per channel.

    python bench/narrow_band.py --corpus corpus_out/train --heldout corpus_out/heldout --out bench/results/narrow_band
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from chorus.audio.augment import phone_line
from chorus.data.check import NARROW_BAND_DB, upper_band_db
from chorus.data.formats import discover
from run_record import LoadSampler, describe, provenance, write_results

EIGHT_KHZ_VOICES = {"flite-kal"}  # corpus voices made at 8 kHz (flite's kal diphones)
CHANNELS = (
    "as recorded",
    "as recorded, at 16 kHz",
    "as recorded, at 48 kHz",
    "phone line",
    "8 kHz and up to 16 kHz",
    "8 kHz and up to 48 kHz",
    "phone line, 20 dB quieter",
)
CALIBRATED = CHANNELS[:6]


def sixteen_bit(audio: np.ndarray, rate: int) -> np.ndarray:
    """``audio`` as a 16-bit WAV file holds it."""
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(audio, -1, 1), rate, format="WAV", subtype="PCM_16")
    return sf.read(io.BytesIO(buffer.getvalue()), dtype="float32")[0]


def through(channel: str, audio: np.ndarray, rate: int) -> tuple[np.ndarray, int]:
    """``audio`` at ``rate`` through ``channel``, saved as 16-bit: the samples and their rate."""
    if channel.startswith("as recorded"):
        at = 16_000 if "16 kHz" in channel else 48_000 if "48 kHz" in channel else rate
        return (audio, rate) if at == rate else (sixteen_bit(soxr.resample(audio, rate, at), at), at)
    if channel.startswith("phone line"):
        at, gain = 16_000, 0.1 if channel.endswith("quieter") else 1.0
        return sixteen_bit(gain * phone_line(soxr.resample(audio, rate, at), at), at), at
    at = 16_000 if channel.endswith("16 kHz") else 48_000
    return sixteen_bit(soxr.resample(soxr.resample(audio, rate, 8_000), 8_000, at), at), at


def measure_voice(folder: Path, clips: int, rng: random.Random, channels: tuple[str, ...]) -> list[dict]:
    rows = []
    for utterance in rng.sample(discover(folder)[0], clips):
        audio, rate = sf.read(utterance.audio_path, dtype="float32", always_2d=True)
        mono = audio.mean(axis=1)
        for channel in channels:
            samples, at = through(channel, mono, rate)
            rows.append(
                {"voice": folder.name, "clip": utterance.key, "channel": channel, "db": upper_band_db(samples, at)}
            )
    return rows


def narrow_expected(row: dict) -> bool:
    return not row["channel"].startswith("as recorded") or row["voice"] in EIGHT_KHZ_VOICES


def bounds(rows: list[dict]) -> dict:
    """The whole-band clips' lowest and the narrow ones' highest statistic, and the bound between them (the
    middle of the gap, rounded to a whole dB)."""
    whole = min(r["db"] for r in rows if not narrow_expected(r))
    narrow = max(r["db"] for r in rows if narrow_expected(r))
    return {
        "whole_band_lowest": round(whole, 1),
        "narrow_highest": round(narrow, 1),
        "bound": float(round((whole + narrow) / 2)),
        "n": len(rows),
    }


def report(result: dict) -> str:
    calibration = bounds(result["calibration"])
    lines = [
        "# Recordings through a phone line (the narrow-band warning)",
        "",
        describe(result["provenance"]) + ".",
        "",
        f"Calibration, the training corpus's voices ({calibration['n']} measurements): whole-band clips read "
        f"{calibration['whole_band_lowest']} dB or more above 4.2 kHz, narrow ones (flite-kal as recorded, every "
        f"clip through a narrow channel) {calibration['narrow_highest']} dB or less. The rule (the middle of the gap, "
        f"rounded) gives {calibration['bound']:g} dB; Chorus warns below {NARROW_BAND_DB:g} dB"
        + (" (the same)." if calibration["bound"] == NARROW_BAND_DB else " (not the same)."),
        "",
        f"Figures, held-out voices (nothing chosen on them), clips under {NARROW_BAND_DB:g} dB:",
        "",
        "| voice | " + " | ".join(CHANNELS) + " |",
        "|---|" + "---|" * len(CHANNELS),
    ]
    for voice in sorted({r["voice"] for r in result["figures"]}):
        cells = []
        for channel in CHANNELS:
            values = [r["db"] for r in result["figures"] if r["voice"] == voice and r["channel"] == channel]
            warned = sum(v < NARROW_BAND_DB for v in values)
            cells.append(f"{warned} of {len(values)} ({min(values):.0f} to {max(values):.0f} dB)")
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--calibration-clips", type=int, default=5, help="clips per training voice")
    parser.add_argument("--clips", type=int, default=20, help="clips per held-out voice")
    parser.add_argument("--out", type=Path, default=Path("bench/results/narrow_band"))
    args = parser.parse_args()
    record = provenance(1, "data.check.upper_band_db")
    with LoadSampler() as load:
        rng = random.Random(0)
        voices = lambda root: sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file())  # noqa: E731
        result = {
            "provenance": record,
            "calibration": [
                r for f in voices(args.corpus) for r in measure_voice(f, args.calibration_clips, rng, CALIBRATED)
            ],
            "figures": [
                r for f in voices(args.heldout) for r in measure_voice(f, args.clips, random.Random(f.name), CHANNELS)
            ],
        }
    write_results(args.out, "narrow_band", result, load, report)


if __name__ == "__main__":
    main()
