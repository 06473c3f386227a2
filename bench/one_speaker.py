"""The adaptation data's one-speaker check (``chorus.speaker_recognition.one_speaker``): its group threshold
set on calibration folders, then what it refuses on others.

The check judges a folder of 16 clips or more by up to 48 of them, spread over it.

* **calibration**: the 36 pretraining voices of the offline corpus (``corpus_out/train``), each folder
  alone, judged at 16, 32 and 48 clips (the fewest the check judges, the most, and between): the threshold
  is the lowest centroid cosine any of them splits into, less a margin (:data:`MARGIN`), so that no
  calibration folder is refused at any size the check judges.
* **figures**: the three held-out voices (piper-joe, flite-slt, festival-ked: no model here learnt
  them), each alone; each alone with half its clips through a phone line (a person recorded on two
  channels); mixtures, half of one voice and half of another: the held-out pairs, the corpus's voices
  paired at random, and pairs of one engine reading the same sentences (espeak-ng's voices, as a probe
  made them); and a few clips of another voice among one's (3 of 26, as a new user's probe made them, and
  5 of 48).

```
chorus corpus build corpus_out --scale 0.25   # 62-150 clips a voice: 48 to judge at
python bench/one_speaker.py --corpus corpus_out/train --heldout corpus_out/heldout --out bench/results/one_speaker
```
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from chorus.audio.augment import phone_line
from chorus.audio.io import load_audio
from chorus.data.formats import discover
from chorus.speaker_recognition.bundle import SHIPPED_ENCODER, load_encoder
from chorus.speaker_recognition.one_speaker import (
    CHECKED_CLIPS,
    FEWEST_CHECKED,
    MIN_SHARE,
    SAME_PERSON,
    split_score,
    spread,
)
from run_record import LoadSampler, describe, provenance

SIZES = (FEWEST_CHECKED, 32, CHECKED_CLIPS)  # folder sizes the threshold is calibrated at
MARGIN = 0.02
ESPEAK_PAIRS = [("en-us+m3", "en-gb+f4"), ("en-us+m1", "en-us+m5"), ("en-us+f2", "en-us+f3"), ("en-us", "en-us+m7")]
INTRUDERS = ((23, 3), (43, 5))  # (one voice's clips, another's) in a folder with a few clips of another voice


def embed_folder(encoder, folder: Path, count: int = CHECKED_CLIPS) -> np.ndarray:
    """``count`` of the folder's clips, spread evenly over it as the check picks them, embedded ``[count, D]``."""
    return encoder.embed([u.audio_path for u in spread(discover(folder)[0], count)])


def espeak_clips(encoder, voice: str, sentences: list[str]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as work:
        paths = []
        for number, text in enumerate(sentences):
            path = Path(work) / f"{number}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True)
            paths.append(path)
        return encoder.embed(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/one_speaker"))
    parser.add_argument("--pairs", type=int, default=120, help="Random pairs of corpus voices.")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rng = random.Random(0)
    record = provenance(2, "speaker_recognition.one_speaker.split_score on the shipped encoder")
    with LoadSampler() as load:
        result = measure(args, rng, record)
        result["provenance"]["load"] = load.summary()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "one_speaker.json").write_text(json.dumps(result, indent=1))
    (args.out / "one_speaker.md").write_text(report(result))
    print(report(result))


def calibration_scores(corpus: dict[str, np.ndarray]) -> dict[str, float]:
    """Each voice's score at each calibrated size (``"voice @ n"``), from its clips' embeddings ``[N, D]``
    (all of its clips, in order): the size's clips spread over them, as the check picks them."""
    return {
        f"{name} @ {size}": split_score(embeddings[spread(list(range(len(embeddings))), size)])
        for name, embeddings in corpus.items()
        for size in SIZES
        if len(embeddings) >= size
    }


def intruded(one: np.ndarray, other: np.ndarray, kept: int, intruders: int) -> np.ndarray:
    """A folder of ``kept`` clips of one voice with ``intruders`` of another spread among them ``[kept +
    intruders, D]`` (the check spreads its picks over a folder: where they sit does not favour it)."""
    size = kept + intruders
    at = {int((k + 0.5) * size / intruders) for k in range(intruders)}
    ours, theirs = iter(one[:kept]), iter(other[:intruders])
    return np.stack([next(theirs) if i in at else next(ours) for i in range(size)])


def measure(args, rng: random.Random, record: dict) -> dict:
    """Calibration scores, the threshold from them, and the figures' scores."""
    encoder = load_encoder(SHIPPED_ENCODER)
    corpus = {
        p.name: encoder.embed([u.audio_path for u in discover(p)[0]])
        for p in sorted(args.corpus.iterdir())
        if p.is_dir()
    }
    calibration = calibration_scores(corpus)
    threshold = round(min(calibration.values()) - MARGIN, 3)
    corpus = {name: e[spread(list(range(len(e))), CHECKED_CLIPS)] for name, e in corpus.items()}
    heldout = {p.name: p for p in sorted(args.heldout.iterdir()) if p.is_dir()}
    kinds = ["alone", "two channels", "held-out pairs", "corpus pairs", "espeak pairs"]
    kinds += [f"{few} of {kept + few} another voice's, held-out" for kept, few in INTRUDERS]
    kinds += [f"{few} of {kept + few} another voice's, corpus" for kept, few in INTRUDERS]
    figures: dict[str, list[dict]] = {kind: [] for kind in kinds}
    timed = []
    for name, folder in heldout.items():
        started = time.perf_counter()
        alone = embed_folder(encoder, folder)
        figures["alone"].append({"folder": name, "score": split_score(alone)})
        timed.append(time.perf_counter() - started)
        clips = [u.audio_path for u in spread(discover(folder)[0], CHECKED_CLIPS)]
        phoned = [
            phone_line(load_audio(p, encoder.mel_config.sample_rate), encoder.mel_config.sample_rate)
            for p in clips[::2]
        ]
        mixed = np.concatenate([encoder.embed(clips[1::2]), encoder.embed(phoned)])
        figures["two channels"].append({"folder": f"{name}, half through a phone line", "score": split_score(mixed)})
        corpus[f"heldout:{name}"] = alone
    half = CHECKED_CLIPS // 2
    for a, b in itertools.combinations(heldout, 2):
        mix = np.concatenate([corpus[f"heldout:{a}"][:half], corpus[f"heldout:{b}"][:half]])
        figures["held-out pairs"].append({"folder": f"{a} + {b}", "score": split_score(mix)})
    for a, b in itertools.permutations(heldout, 2):
        for kept, few in INTRUDERS:
            mix = intruded(corpus[f"heldout:{a}"], corpus[f"heldout:{b}"][::-1], kept, few)
            figures[f"{few} of {kept + few} another voice's, held-out"].append(
                {"folder": f"{kept} {a} + {few} {b}", "score": split_score(mix)}
            )
    names = [n for n in corpus if not n.startswith("heldout:")]
    pairs = list(itertools.combinations(names, 2))
    rng.shuffle(pairs)
    for a, b in pairs[: args.pairs]:
        mix = np.concatenate([corpus[a][:half], corpus[b][:half]])
        figures["corpus pairs"].append({"folder": f"{a} + {b}", "score": split_score(mix)})
        for kept, few in INTRUDERS:
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            mix = intruded(corpus[first], corpus[second][::-1], kept, few)
            figures[f"{few} of {kept + few} another voice's, corpus"].append(
                {"folder": f"{kept} {first} + {few} {second}", "score": split_score(mix)}
            )
    sentences = [f"This is sentence number {n}, which I am reading for my new voice today." for n in range(half)]
    for a, b in ESPEAK_PAIRS:
        mix = np.concatenate([espeak_clips(encoder, a, sentences), espeak_clips(encoder, b, sentences)])
        figures["espeak pairs"].append(
            {"folder": f"espeak-ng {a} + {b}, the same sentences", "score": split_score(mix)}
        )
    return {
        "provenance": record,
        "clips": CHECKED_CLIPS,
        "fewest": FEWEST_CHECKED,
        "sizes": list(SIZES),
        "min_share": MIN_SHARE,
        "calibration": calibration,
        "threshold": threshold,
        "shipped": SAME_PERSON,
        "check_seconds": timed,
        "figures": figures,
    }


def report(result: dict) -> str:
    threshold, shipped = result["threshold"], result["shipped"]
    lowest = min(result["calibration"], key=result["calibration"].get)
    lines = [
        "# Adaptation data: one person or two (the one-speaker check)",
        "",
        describe(result["provenance"]),
        "",
        f"A folder of {result['fewest']} clips or more is judged by up to {result['clips']} of them, spread over it, "
        "embedded by the shipped speaker encoder and split in two groups by two-means; it is two voices when the "
        f"smaller group holds at least {result['min_share']:.0%} of the clips (2 at least) and the groups' centroids "
        "score under the threshold. The figures' folders are judged as the check judges them.",
        "",
        f"**Threshold {threshold}**: the lowest of the calibration folders' {len(result['calibration'])} scores "
        f"(each voice at {', '.join(map(str, result['sizes']))} clips; lowest {lowest} "
        f"{result['calibration'][lowest]:.3f}) less {MARGIN}; Chorus ships {result['shipped']}. A folder that does "
        "not split scores 1. Checking one held-out folder (embedding its clips and splitting them) took "
        f"{min(result['check_seconds']):.1f}-{max(result['check_seconds']):.1f} s.",
        "",
        f"| figures | folders | refused at this run's {threshold} | refused at the shipped {shipped} | scores (min-max) |",
        "|---|---|---|---|---|",
    ]
    for kind, rows in result["figures"].items():
        scores = [r["score"] for r in rows]
        counts = [sum(s < bound for s in scores) for bound in (threshold, shipped)]
        lines.append(
            f"| {kind} | {len(rows)} | "
            + " | ".join(f"{n} ({n / len(rows):.0%})" for n in counts)
            + f" | {min(scores):.3f}-{max(scores):.3f} |"
        )
    lines += ["", f"Each folder of the figures, as Chorus judges it (at {shipped}):", ""]
    for kind, rows in result["figures"].items():
        if "corpus" in kind:
            continue
        for r in rows:
            lines.append(
                f"* {kind}: {r['folder']}: {r['score']:.3f} ({'refused' if r['score'] < shipped else 'taken'})"
            )
    for kind in (k for k in result["figures"] if "corpus" in k):
        missed = [r for r in result["figures"][kind] if r["score"] >= shipped]
        lines += [
            "",
            f"{kind}, taken as one voice ({len(missed)}): "
            + "; ".join(f"{r['folder']} {r['score']:.3f}" for r in missed),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
