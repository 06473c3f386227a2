"""Sound that is not speech, and noisy recordings: where `chorus data check`, `chorus adapt` and an upload leave a
clip out as holding no speech (``CheckConfig.min_heard_fraction``), and where they warn that the recordings are
noisy (``chorus.data.check.NOISY_SNR_DB``).

Both read a voice-activity detector (:mod:`chorus.audio.speech_activity`, Silero VAD as faster-whisper ships it):

* **no speech**: the seconds it hears as speech over the seconds of the clip's sound (its windows within 30 dB
  of the loudest and, where its pauses are quieter, above their noise: ``data.check.heard_fraction``);
* **noisy**: a clip's speech windows' level over the level inside its pauses (``data.check.clip_snr_db``), and a
  dataset's, the median of its clips' (``data.check.dataset_snr_db``, each voice's clips here one dataset).

Each clip is measured clean, mixed with noise (``chorus.audio.augment``: white, pink and room noise at 30, 20
and 10 dB SNR; babble of four other voices at 30, 20 and 10 dB), and twice with a 5 s pause between (quiet room
tone 50 dB under the speech, or white noise 20 dB under it throughout); sounds that are not speech are made here (tones, harmonic tones, chords,
arpeggios, mains hum, glides, white, pink, brown and room noise; 1-8 s, seeded).

* **Calibration**: the training corpus's voices (``--corpus``), which set both bounds. No speech: the middle of
  the gap between the speech clips' lowest fraction heard (every condition) and the other sounds' highest,
  rounded to a tenth. Noisy: the middle of the gap between the clean datasets' lowest ratio and the highest of
  the datasets at 20 dB SNR of white, pink or room noise, rounded to a whole dB (warned: 20 dB and worse). The
  report says whether each rounded bound falls inside its gap.
* **Figures**: the held-out voices (``--heldout``; nothing is chosen on them) and other sounds of another seed.

    python bench/speech_activity.py --corpus corpus_out/train --heldout corpus_out/heldout \\
        --out bench/results/speech_activity
"""

from __future__ import annotations

import argparse
import random
import zlib
from pathlib import Path

import numpy as np
import soundfile as sf

from chorus.audio.augment import add_babble, add_noise, colored_noise
from chorus.audio.io import downmix
from chorus.audio.speech_activity import speech_activity
from chorus.data.check import NOISY_SNR_DB, CheckConfig, clip_snr_db, dataset_snr_db, heard_fraction
from chorus.data.formats import discover
from run_record import LoadSampler, describe, provenance, write_results

NOISES = ("white", "pink", "room")
PAUSED = "twice, a 5 s pause between"
PAUSED_NOISY = "twice, a 5 s pause between, white 20 dB"
CONDITIONS = ("clean", *(f"{k} {snr} dB" for snr in (30, 20, 10) for k in (*NOISES, "babble")), PAUSED, PAUSED_NOISY)
TALKERS = 4  # voices in a babble
WARNED = tuple(f"{k} 20 dB" for k in NOISES)  # the calibration's noisy side: what the warning is for
SOUNDS = ("tone", "harmonic tone", "chord", "arpeggio", "hum", "glide", "white", "pink", "brown", "room")
RATE = 22_050  # the sounds' rate


def through(condition: str, audio: np.ndarray, rate: int, talkers: list[np.ndarray], rng) -> np.ndarray:
    """``audio`` at ``rate`` in ``condition`` (see :data:`CONDITIONS`)."""
    if condition == "clean":
        return audio
    if condition in (PAUSED, PAUSED_NOISY):  # two readings, a pause between; noise under the speech's power
        power = np.mean(np.square(audio, dtype=np.float64))
        if condition == PAUSED:  # room tone 50 dB under, in the pause
            return np.concatenate([audio, (rng.standard_normal(5 * rate) * np.sqrt(power / 1e5)), audio])
        both = np.concatenate([audio, np.zeros(5 * rate), audio])
        return both + rng.standard_normal(len(both)) * np.sqrt(power / 100)  # white noise 20 dB under, throughout
    kind, snr = condition.split()[0], float(condition.split()[1])
    if kind == "babble":
        return add_babble(audio, talkers, snr, rng)
    return add_noise(audio, snr, rng, kind, rate)


def sound(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One sound that is not speech, ``kind`` of :data:`SOUNDS`, 1-8 s at :data:`RATE`, peak 0.3."""
    t = np.arange(int(RATE * rng.uniform(1, 8))) / RATE
    f0 = rng.uniform(80, 600)
    if kind == "tone":
        wave = np.sin(2 * np.pi * f0 * t)
    elif kind == "harmonic tone":
        wave = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 10))
    elif kind == "chord":
        wave = sum(np.sin(2 * np.pi * f0 * ratio * t) for ratio in (1, 1.26, 1.5))
    elif kind == "arpeggio":  # three notes, four a second
        wave = np.sin(2 * np.pi * f0 * (1 + 0.26 * ((t * 4).astype(int) % 3)) * t)
    elif kind == "hum":  # mains hum and its harmonics
        wave = sum(np.sin(2 * np.pi * 50 * k * t) / k for k in range(1, 8))
    elif kind == "glide":  # a pitch sliding up and down, as a siren or a whistle
        wave = np.sin(2 * np.pi * np.cumsum(f0 + 100 * np.sin(np.pi * t)) / RATE)
    else:
        wave = colored_noise(kind, len(t), rng, RATE)
    return (0.3 * wave / np.abs(wave).max()).astype(np.float32)


def measure(audio: np.ndarray, rate: int) -> dict:
    """What the check reads of one clip: the fraction heard as speech and the clip's noise ratio (or None)."""
    return {"heard": heard_fraction(audio, rate), "snr_db": clip_snr_db(speech_activity(audio, rate))}


def measure_voices(root: Path, clips: int, seed: int) -> list[dict]:
    pick = random.Random(seed)
    voices = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file())
    recordings = []
    for folder in voices:
        for utterance in pick.sample(discover(folder)[0], clips):
            audio, rate = sf.read(utterance.audio_path, dtype="float32", always_2d=True)
            recordings.append((folder.name, downmix(audio), rate))
    rows = []
    for number, (voice, audio, rate) in enumerate(recordings):
        others = [a for v, a, r in pick.sample(recordings, len(recordings)) if v != voice and r == rate][:TALKERS]
        assert len(others) == TALKERS, f"{voice}: too few other voices at {rate} Hz for a babble"
        for condition in CONDITIONS:
            # A noise stream of each clip's own in each condition: adding a condition leaves the others' draws.
            rng = np.random.default_rng([seed, number, zlib.crc32(condition.encode())])
            mixed = through(condition, audio, rate, others, rng)
            rows.append({"voice": voice, "condition": condition, **measure(mixed, rate)})
    return rows


def measure_sounds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"sound": kind, **measure(sound(kind, rng), RATE)} for kind in SOUNDS for _ in range(count)]


def datasets(rows: list[dict]) -> dict[tuple[str, str], float | None]:
    """(voice, condition) -> the dataset's noise ratio, each voice's clips in a condition as one dataset."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["voice"], r["condition"]), [])
        if r["snr_db"] is not None:
            groups[(r["voice"], r["condition"])].append(r["snr_db"])
    return {key: dataset_snr_db(values) for key, values in groups.items()}


def bounds(result: dict) -> dict:
    """The calibration's two gaps, the bounds the rules give and whether each falls inside its gap."""
    speech = min(r["heard"] for r in result["calibration"])
    other = max(r["heard"] for r in result["calibration_sounds"])
    ratios = datasets(result["calibration"])
    clean = [v for (_, c), v in ratios.items() if c == "clean" and v is not None]
    noisy = [v for (_, c), v in ratios.items() if c in WARNED and v is not None]
    heard_bound = round((speech + other) / 2, 1)
    snr_bound = float(round((min(clean) + max(noisy)) / 2)) if clean and noisy else float("nan")
    return {
        "speech_lowest": round(speech, 2),
        "other_highest": round(other, 2),
        "heard_bound": heard_bound,
        "heard_bound_in_gap": other < heard_bound <= speech,
        "clean_lowest": round(min(clean), 1) if clean else None,
        "clean_n": len(clean),
        "noisy_highest": round(max(noisy), 1) if noisy else None,
        "noisy_n": len(noisy),
        "snr_bound": snr_bound,
        "snr_bound_in_gap": bool(clean and noisy and max(noisy) < snr_bound <= min(clean)),
        "voices": len({r["voice"] for r in result["calibration"]}),
    }


def _heard_table(rows: list[dict], sounds: list[dict], bound: float) -> list[str]:
    lines = ["| clips | n | left out as no speech | fraction heard, lowest-highest |", "|---|---|---|---|"]
    for condition in CONDITIONS:
        values = [r["heard"] for r in rows if r["condition"] == condition]
        left = sum(v < bound for v in values)
        lines.append(f"| speech, {condition} | {len(values)} | {left} | {min(values):.2f}-{max(values):.2f} |")
    for kind in SOUNDS:
        values = [r["heard"] for r in sounds if r["sound"] == kind]
        left = sum(v < bound for v in values)
        lines.append(f"| {kind} (not speech) | {len(values)} | {left} | {min(values):.2f}-{max(values):.2f} |")
    return lines


def _noisy_table(rows: list[dict]) -> list[str]:
    ratios = datasets(rows)
    voices = sorted({r["voice"] for r in rows})
    lines = ["| condition | " + " | ".join(voices) + " | warned |", "|---|" + "---|" * (len(voices) + 1)]
    for condition in CONDITIONS:
        cells, warned, told = [], 0, 0
        for voice in voices:
            value = ratios[(voice, condition)]
            measured = sum(r["snr_db"] is not None for r in rows if r["voice"] == voice and r["condition"] == condition)
            cells.append("too few pauses" if value is None else f"{value:.1f} dB ({measured} clips)")
            told += value is not None
            warned += value is not None and value < NOISY_SNR_DB
        lines.append(f"| {condition} | " + " | ".join(cells) + f" | {warned} of {len(voices)} ({told} told) |")
    return lines


def report(result: dict) -> str:
    b = bounds(result)
    config = CheckConfig()
    same = lambda ours, rule: " (the same)." if ours == rule else " (not the same)."  # noqa: E731
    lines = [
        "# Sound that is not speech, and noisy recordings (the voice-activity detector's checks)",
        "",
        describe(result["provenance"]) + ".",
        "",
        f"Calibration, the training corpus's {b['voices']} voices: speech clips (every condition) have "
        f"{b['speech_lowest']} of their sound or more heard as speech, the sounds that are not speech "
        f"{b['other_highest']} or less. The rule (the middle of the gap, to a tenth) gives {b['heard_bound']:g}"
        + (" (inside the gap); " if b["heard_bound_in_gap"] else " (**not inside the gap**); ")
        + f"Chorus leaves out a clip under {config.min_heard_fraction:g}"
        + same(config.min_heard_fraction, b["heard_bound"]),
        "",
        f"Noisy: the clean voices that tell a ratio ({b['clean_n']}) read {b['clean_lowest']} dB or more, the voices "
        f"at 20 dB SNR of {', '.join(NOISES)} noise that tell one ({b['noisy_n']}) {b['noisy_highest']} dB or less. The "
        f"rule (the middle of the gap, to a whole dB) gives {b['snr_bound']:g} dB"
        + (" (inside the gap); " if b["snr_bound_in_gap"] else " (**not inside the gap**); ")
        + f"Chorus warns below {NOISY_SNR_DB:g} dB"
        + same(NOISY_SNR_DB, b["snr_bound"]),
        "",
        "## Figures: held-out voices (nothing chosen on them)",
        "",
        f"Clips left out as holding no speech (under {config.min_heard_fraction:g} of their sound heard as speech):",
        "",
        *_heard_table(result["figures"], result["figures_sounds"], config.min_heard_fraction),
        "",
        f"Each voice's clips as one dataset: its ratio (the median of the clips that tell one, {result['clips']} "
        f"clips a voice) and whether it is warned of (under {NOISY_SNR_DB:g} dB):",
        "",
        *_noisy_table(result["figures"]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--calibration-clips", type=int, default=12, help="clips per training voice")
    parser.add_argument("--clips", type=int, default=20, help="clips per held-out voice")
    parser.add_argument("--sounds", type=int, default=20, help="sounds of each kind, per split")
    parser.add_argument("--out", type=Path, default=Path("bench/results/speech_activity"))
    args = parser.parse_args()
    record = provenance(1, "data.check.heard_fraction, clip_snr_db (audio.speech_activity)")
    with LoadSampler() as load:
        result = {
            "provenance": record,
            "clips": args.clips,
            "calibration": measure_voices(args.corpus, args.calibration_clips, seed=0),
            "calibration_sounds": measure_sounds(args.sounds, seed=0),
            "figures": measure_voices(args.heldout, args.clips, seed=1),
            "figures_sounds": measure_sounds(args.sounds, seed=1),
        }
    write_results(args.out, "speech_activity", result, load, report)


if __name__ == "__main__":
    main()
