"""The adaptation data's one-speaker check (``chorus.speaker_recognition.one_speaker``): its group threshold
set on calibration folders, then what it refuses on others.

* **calibration**: the 36 pretraining voices of the offline corpus (``corpus_out/train``), each folder
  alone: the threshold is the lowest centroid cosine any of them splits into, less a margin
  (:data:`MARGIN`), so that no calibration folder is refused.
* **figures**: the three held-out voices (piper-joe, flite-slt, festival-ked: no model here learnt
  them), each alone; each alone with half its clips through a phone line (a person recorded on two
  channels); and mixtures, half of one voice and half of another: the held-out pairs, the corpus's voices
  paired at random, and pairs of one engine reading the same sentences (espeak-ng's voices, as a probe
  made them).

```
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
from pathlib import Path

import numpy as np
import torch

from chorus.audio.augment import phone_line
from chorus.audio.io import load_audio
from chorus.data.formats import discover
from chorus.speaker_recognition.bundle import SHIPPED_ENCODER, load_encoder
from chorus.speaker_recognition.one_speaker import CHECKED_CLIPS, MIN_SHARE, SAME_PERSON, split_score, spread
from run_record import LoadSampler, describe, provenance

CLIPS = CHECKED_CLIPS  # per folder, spread over it, as `chorus adapt` judges one
MARGIN = 0.02
ESPEAK_PAIRS = [("en-us+m3", "en-gb+f4"), ("en-us+m1", "en-us+m5"), ("en-us+f2", "en-us+f3"), ("en-us", "en-us+m7")]


def embed_folder(encoder, folder: Path) -> np.ndarray:
    """The folder's clips as the check picks them (spread evenly over it), embedded."""
    return encoder.embed([u.audio_path for u in spread(discover(folder)[0])])


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


def measure(args, rng: random.Random, record: dict) -> dict:
    """Calibration scores, the threshold from them, and the figures' scores."""
    encoder = load_encoder(SHIPPED_ENCODER)
    corpus = {p.name: embed_folder(encoder, p) for p in sorted(args.corpus.iterdir()) if p.is_dir()}
    calibration = {name: split_score(e) for name, e in corpus.items()}
    threshold = round(min(calibration.values()) - MARGIN, 3)
    heldout = {p.name: p for p in sorted(args.heldout.iterdir()) if p.is_dir()}
    figures: dict[str, list[dict]] = {"alone": [], "two channels": [], "held-out pairs": [], "corpus pairs": []}
    figures["espeak pairs"] = []
    for name, folder in heldout.items():
        alone = embed_folder(encoder, folder)
        figures["alone"].append({"folder": name, "score": split_score(alone)})
        clips = [u.audio_path for u in spread(discover(folder)[0])]
        phoned = [
            phone_line(load_audio(p, encoder.mel_config.sample_rate), encoder.mel_config.sample_rate)
            for p in clips[::2]
        ]
        mixed = np.concatenate([encoder.embed(clips[1::2]), encoder.embed(phoned)])
        figures["two channels"].append({"folder": f"{name}, half through a phone line", "score": split_score(mixed)})
        corpus[f"heldout:{name}"] = alone
    for a, b in itertools.combinations(heldout, 2):
        mix = np.concatenate([corpus[f"heldout:{a}"][: CLIPS // 2], corpus[f"heldout:{b}"][: CLIPS // 2]])
        figures["held-out pairs"].append({"folder": f"{a} + {b}", "score": split_score(mix)})
    names = [n for n in corpus if not n.startswith("heldout:")]
    pairs = list(itertools.combinations(names, 2))
    rng.shuffle(pairs)
    for a, b in pairs[: args.pairs]:
        mix = np.concatenate([corpus[a][: CLIPS // 2], corpus[b][: CLIPS // 2]])
        figures["corpus pairs"].append({"folder": f"{a} + {b}", "score": split_score(mix)})
    sentences = [f"This is sentence number {n}, which I am reading for my new voice today." for n in range(CLIPS // 2)]
    for a, b in ESPEAK_PAIRS:
        mix = np.concatenate([espeak_clips(encoder, a, sentences), espeak_clips(encoder, b, sentences)])
        figures["espeak pairs"].append(
            {"folder": f"espeak-ng {a} + {b}, the same sentences", "score": split_score(mix)}
        )
    return {
        "provenance": record,
        "clips": CLIPS,
        "min_share": MIN_SHARE,
        "calibration": calibration,
        "threshold": threshold,
        "shipped": SAME_PERSON,
        "figures": figures,
    }


def report(result: dict) -> str:
    threshold = result["threshold"]
    lines = [
        "# Adaptation data: one person or two (the one-speaker check)",
        "",
        describe(result["provenance"]),
        "",
        f"{result['clips']} clips a folder, embedded by the shipped speaker encoder; split in two groups by two-means; "
        f"a folder is two voices when the smaller group holds at least {result['min_share']:.0%} of the clips (2 at "
        "least) and the groups' centroids score under the threshold.",
        "",
        f"**Threshold {threshold}**: the lowest of the {len(result['calibration'])} calibration folders' scores "
        f"({min(result['calibration'].values()):.3f}) less {MARGIN}; Chorus ships {result['shipped']}. A folder "
        "that does not split scores 1.",
        "",
        "| figures | folders | refused | scores (min-max) |",
        "|---|---|---|---|",
    ]
    for kind, rows in result["figures"].items():
        scores = [r["score"] for r in rows]
        refused = sum(s < threshold for s in scores)
        lines.append(
            f"| {kind} | {len(rows)} | {refused} ({refused / len(rows):.0%}) | {min(scores):.3f}-{max(scores):.3f} |"
        )
    lines += ["", "Each folder of the figures:", ""]
    for kind, rows in result["figures"].items():
        if kind == "corpus pairs":
            continue
        for r in rows:
            lines.append(
                f"* {kind}: {r['folder']}: {r['score']:.3f} ({'refused' if r['score'] < threshold else 'taken'})"
            )
    missed = [r for r in result["figures"]["corpus pairs"] if r["score"] >= threshold]
    lines += [
        "",
        f"Corpus pairs taken as one voice ({len(missed)}): "
        + "; ".join(f"{r['folder']} {r['score']:.3f}" for r in missed),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
