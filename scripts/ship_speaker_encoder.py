"""Copy a trained speaker encoder into the package as the one Chorus uses by default, with its card.

    python scripts/ship_speaker_encoder.py runs/speaker/encoders/resnet18-adam \
        --report bench/results/speaker/speaker.json

Writes ``src/chorus/assets/speaker_encoder/`` (encoder.safetensors + config.json, as trained) and its
``MODEL_CARD.md`` from the encoder's own record (recipe, corpus, calibration) and, when given, the
benchmark's verification figures on speakers it never trained on.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from chorus.models.bundle import file_sha256
from chorus.speaker_recognition.bundle import CONFIG, SHIPPED_ENCODER, WEIGHTS, load_encoder


def card(folder: Path, report: dict | None, note: str = "") -> str:
    bundle = load_encoder(folder)
    info, config = bundle.info, bundle.encoder.config
    parameters = sum(p.numel() for p in bundle.encoder.parameters())
    recipe = info.get("recipe", {})
    lines = [
        "# Chorus speaker encoder",
        "",
        f"A {config.arch}-{config.depth}{' (reversible stages)' if config.reversible else ''} on 80-bin log-mels: "
        f"channels {list(config.channels)}, GroupNorm ({config.groups} groups), attentive statistics pooling, a "
        f"{config.embedding_dim}-number embedding centred over the batch and normalized to unit length. "
        f"{parameters:,} parameters; `{WEIGHTS}` sha256 `{file_sha256(folder / WEIGHTS)}`.",
        "",
        "## How it was made",
        "",
        f"- data: {info['speakers']} speakers: the corpus's training speakers (`chorus corpus build`: espeak-ng, "
        "flite and festival voices and their sox variants) and virtual speakers made from them by sox chains "
        f"(`chorus.corpus.virtual`); {info['train_clips']:,} training clips, {info['augmented_copies']:,} of them "
        "augmented copies (noise, simulated room reverberation, telephone band, speed), made offline. The held-out "
        "voices piper-joe, flite-slt and festival-ked, and anything derived from them, were never seen.",
        f"- training: {info['steps']:,} steps of {recipe.get('batch_speakers')} speakers x {recipe.get('per_speaker')} "
        f"random {recipe.get('segment_frames')}-frame crops, additive angular margin softmax (scale "
        f"{recipe.get('scale')}, margin 0 for the first {recipe.get('margin_start')} of the steps, then up to "
        f"{recipe.get('margin')} by {recipe.get('margin_full')}), optimizer {info['optimizer']}, learning rate "
        f"{recipe.get('learning_rate')} with cosine decay to a tenth, seed {recipe.get('seed')}; "
        f"{info['train_seconds']:,.0f} s on {recipe.get('threads')} CPU thread(s); final loss {info['final_loss']}.",
        f"- threshold: {bundle.threshold:.4f}, the equal-error point of {info['calibration']['trials']:,} trials "
        f"between clips held out of every training speaker (EER {100 * info['calibration']['eer']:.2f}%, minDCF "
        f"{info['calibration']['min_dcf']:.3f}).",
        *([f"- {note}"] if note else []),
        "",
        "## Verification on speakers it never trained on",
        "",
    ]
    row = next((r for r in (report or {}).get("encoders", []) if r["variant"] == folder.name), None)
    if row is None:
        lines.append("Not measured (run `python bench/speaker.py --report`).")
    else:
        resemblyzer = report["resemblyzer"]
        lines.append(
            f"`python bench/speaker.py --report`: {row['trials']:,} trials ({row['targets']:,} same-speaker) among the "
            f"held-out voices and speakers derived from them: EER {100 * row['eer']:.2f}%, minDCF {row['min_dcf']:.3f}; "
            f"resemblyzer (GE2E, trained on thousands of real speakers) on the same trials: EER "
            f"{100 * resemblyzer['eer']:.2f}%, minDCF {resemblyzer['min_dcf']:.3f}."
        )
    lines += [
        "",
        "## Limits",
        "",
        "Every training speaker is a synthesizer or a sox variant of one: a few engines' timbres, no real",
        "recording conditions beyond the simulated ones. It tells synthetic voices apart; on real speech it is",
        "untested here and should be expected to do worse than encoders trained on thousands of real speakers.",
        "",
        "`chorus speaker train CORPUS --out DIR` trains another; `--encoder DIR` uses it instead of this one.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("encoder", type=Path, help="a folder written by chorus speaker train / bench/speaker.py")
    parser.add_argument("--report", type=Path, default=None, help="bench/results/speaker/speaker.json")
    parser.add_argument("--note", default="", help="a line for the card: why this encoder, how its data was built")
    args = parser.parse_args()
    report = json.loads(args.report.read_text()) if args.report and args.report.is_file() else None
    SHIPPED_ENCODER.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS, CONFIG):
        shutil.copyfile(args.encoder / name, SHIPPED_ENCODER / name)
    (SHIPPED_ENCODER / "MODEL_CARD.md").write_text(card(args.encoder, report, args.note))
    print(f"shipped {args.encoder} -> {SHIPPED_ENCODER}")


if __name__ == "__main__":
    main()
