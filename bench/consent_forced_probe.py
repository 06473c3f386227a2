"""How likely Whisper finds the company's name where a calibration voice said another: a probe of the forced
listen's bound (``ConsentSettings.forced_probability``) beyond bench/consent.py's own wrong readings.

bench/consent.py sets the bound on its calibration split's wrong phrases (read clean and in white noise at
20 dB only when this probe was written; since then also through its channels, ``WRONG_CONDITIONS``). This
probe reads the right phrase and three wrong ones ("Boris", "Coral", "Horace" for "Chorus") by each source
voice through each calibration chain (never a figures' speaker) and each of those channels, and writes for
each reading what Whisper heard and the forced probability of "Chorus" and of other names in its place: the
right readings' probabilities beside the wrong ones', which bench/consent.py does not record.

    python bench/consent_forced_probe.py --out bench/results/consent_forced_probe
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from chorus.audio.io import SAMPLE_RATE
from chorus.corpus.build import record_sentences
from chorus.corpus.speakers import get_speaker
from chorus.evaluation.asr import WhisperJudge
from chorus.serving.settings import CONSENT_PHRASES, ConsentSettings
from consent import CALIBRATION_CHAINS, SHORT, SOURCES, WRONG, babble_talkers, sox, through
from consent import WRONG_CONDITIONS as CONDITIONS

NAMES = ("Chorus", "Boris", "Coral", "Horace", "Doris", "Morris", "course", "force", "bars", "parse", "Horus")
READINGS = ("another company", "a company named like it", "a company rhyming with it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench/results/consent_forced_probe"))
    args = parser.parse_args()
    phrase = CONSENT_PHRASES["en"]
    words = phrase.split()
    slot = words.index("Chorus")
    whisper = WhisperJudge(beam_size=5, cpu_threads=args.threads)
    rng = np.random.default_rng(args.seed)
    talkers = babble_talkers()
    rows = []
    for source in SOURCES:
        for kind, text in {"right": phrase, **{k: WRONG[k] for k in READINGS}}.items():
            audio = record_sentences(get_speaker(source), [text])[0]
            for chain_name, chain in CALIBRATION_CHAINS.items():
                for condition in CONDITIONS:
                    heard = through(condition, sox(audio, chain), rng, talkers)
                    names = {}
                    for name in NAMES:
                        probabilities = whisper.word_probabilities(
                            heard, SAMPLE_RATE, " ".join([*words[:slot], name, *words[slot + 1 :]])
                        )
                        names[name] = round(float(probabilities[slot]), 5)
                    text_heard = whisper.transcribe_words(heard, SAMPLE_RATE, 5).text
                    rows.append({"speaker": SHORT[source] + chain_name, "reading": kind, "condition": condition,
                                 "heard": text_heard, "names": names})  # fmt: skip
                    print(f"{rows[-1]['speaker']} {kind} {condition}: Chorus {names['Chorus']:.4f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe.json").write_text(json.dumps(rows, indent=1))
    wrong = sorted((r for r in rows if r["reading"] != "right"), key=lambda r: -r["names"]["Chorus"])
    bound = ConsentSettings().forced_probability
    lines = [
        "# The forced listen's bound, probed", "",
        f"`python bench/consent_forced_probe.py --seed {args.seed}`: {len(rows)} readings by the calibration "
        f"chains ({', '.join(CALIBRATION_CHAINS)}) of {', '.join(SHORT.values())}, through {', '.join(CONDITIONS)}.",
        "", f"Wrong readings at or above the shipped bound ({bound}): "
        f"{sum(r['names']['Chorus'] >= bound for r in wrong)} of {len(wrong)}. The highest:", "",
        "| P(Chorus) | speaker | reading | channel | heard |", "|---|---|---|---|---|",
        *[f"| {r['names']['Chorus']:.4f} | {r['speaker']} | {r['reading']} | {r['condition']} | {r['heard']} |"
          for r in wrong[:10]],
        "", "Right readings by flite-slt's chains, P(Chorus): "
        + ", ".join(f"{r['names']['Chorus']:.4f}" for r in sorted(
            (r for r in rows if r["reading"] == "right" and r["speaker"].startswith("slt")),
            key=lambda r: r["names"]["Chorus"])),
    ]  # fmt: skip
    (args.out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
