"""How far a voice space can reach: each held-out voice against every voice the space was learned on.

No model is involved: only the real recordings and the similarity judge (resemblyzer). For each
held-out voice, its reference clips (the same ones ``bench/voice_space.py`` judges against) give its
d-vector; each training voice of the space (``--space-voices``, the folder that bench built) is scored
as if a space voice were exactly that voice: the mean similarity of its clips to the held-out voice's
d-vector. The voice's own held-out clips give the ceiling (what a perfect copy scores). Beside them,
from ``--results`` when present: the 0.9x target of the 3-minute LoRA and what the space voices scored.

A space that only moves between its training voices cannot score above its nearest one; a target
above every training voice asks the space to extrapolate.

    python bench/voice_space_reach.py --space-voices runs/voice_space/space_voices --out bench/results/voice_space

Writes ``reach.md``, ``reach.json`` and ``reach.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.data.formats import discover
from chorus.evaluation.similarity import SpeakerJudge, cosine_similarity
from chorus.training.voice_space_training import speaker_embedding
from voice_space import heldout_split, read_rows, row_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument(
        "--space-voices",
        type=Path,
        default=Path("runs/voice_space/space_voices"),
        help="the voice folders the space was learned on",
    )
    parser.add_argument("--clips", type=int, default=8, help="clips of each training voice to score")
    parser.add_argument("--sentences", type=int, default=8, help="as in bench/voice_space.py")
    parser.add_argument("--references", type=int, default=10, help="as in bench/voice_space.py")
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--results", type=Path, default=Path("bench/results/voice_space/voice_space.json"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/voice_space"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    judge = SpeakerJudge()

    def embeddings(paths: list[Path]) -> list[np.ndarray]:
        return [judge.embed(load_audio(path, SAMPLE_RATE), SAMPLE_RATE) for path in paths]

    training = sorted(p for p in args.space_voices.iterdir() if (p / "metadata.csv").is_file())
    training_clips = {
        folder.name: embeddings([u.audio_path for u in discover(folder)[0][: args.clips]]) for folder in training
    }
    rows = read_rows(args.results)
    result = {}
    for voice in args.voices.split(","):
        evaluation, references, _ = heldout_split(args.heldout / voice, args.sentences, args.references)
        reference = speaker_embedding(judge, references)
        scores = {
            name: float(np.mean([cosine_similarity(e, reference) for e in clips]))
            for name, clips in training_clips.items()
        }
        own = float(np.mean([cosine_similarity(e, reference) for e in embeddings([u.audio_path for u in evaluation])]))
        lora_3 = next((r["similarity"] for r in rows if row_key(r) == (voice, 3, "lora+speaker")), None)
        space_1 = {
            r["kind"]: r["similarity"]
            for r in rows
            if r["voice"] == voice and r["minutes"] == 1 and r["kind"] != "lora+speaker"
        }
        result[voice] = {
            "training_voices": dict(sorted(scores.items(), key=lambda kv: -kv[1])),
            "own_clips": own,
            "target": 0.9 * lora_3 if lora_3 is not None else None,
            "lora_3_min": lora_3,
            "space_1_min": space_1,
        }
    (args.out / "reach.json").write_text(json.dumps(result, indent=1))
    write(result, args)
    plot(result, args.out / "reach.png")


def write(result: dict, args) -> None:
    lines = [
        "# How far the voice space reaches",
        "",
        f"Each held-out voice's {args.references} reference clips (those `bench/voice_space.py` judges against) "
        f"against {args.clips} real clips of each of the space's {len(next(iter(result.values()))['training_voices'])} "
        f"training voices (`{args.space_voices}`): the similarity a space voice would score if it were exactly "
        "that training voice. No model involved. *Own clips*: the voice's held-out clips, the ceiling.",
        "",
        "| voice | own clips | nearest training voices | above the target | target (0.9x LoRA, 3 min) | "
        "space voices, 1 min |",
        "|---|---|---|---|---|---|",
    ]
    for voice, entry in result.items():
        ranked = list(entry["training_voices"].items())
        nearest = ", ".join(f"{name} {score:.3f}" for name, score in ranked[:3])
        target = entry["target"]
        above = "n/a" if target is None else str(sum(score >= target for _, score in ranked))
        space = (
            ", ".join(
                f"{kind.removeprefix('voice space, ')} {score:.3f}" for kind, score in entry["space_1_min"].items()
            )
            or "n/a"
        )
        lines.append(
            f"| {voice} | {entry['own_clips']:.3f} | {nearest} | {above} | "
            f"{'n/a' if target is None else f'{target:.3f}'} | {space} |"
        )
    (args.out / "reach.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 1.2 + 0.9 * len(result)))
    for row, entry in enumerate(result.values()):
        scores = list(entry["training_voices"].values())
        axis.scatter(
            scores,
            np.full(len(scores), row) + np.random.default_rng(row).uniform(-0.15, 0.15, len(scores)),
            s=10,
            color="grey",
            alpha=0.6,
            label="training voices" if row == 0 else None,
        )
        axis.scatter(
            [entry["own_clips"]],
            [row],
            marker="*",
            s=120,
            color="black",
            label="own clips (ceiling)" if row == 0 else None,
        )
        if entry["target"] is not None:
            axis.plot(
                [entry["target"]] * 2,
                [row - 0.35, row + 0.35],
                color="red",
                label="target: 0.9x LoRA, 3 min" if row == 0 else None,
            )
        for kind, score in entry["space_1_min"].items():
            axis.scatter(
                [score],
                [row],
                marker="o",
                s=40,
                facecolors="none",
                edgecolors="blue",
                label="space voices, 1 min" if row == 0 and kind == next(iter(entry["space_1_min"])) else None,
            )
    axis.set_yticks(range(len(result)), list(result))
    axis.set_xlabel("similarity to the held-out voice's reference clips")
    axis.grid(alpha=0.3, axis="x")
    axis.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
