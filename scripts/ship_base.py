"""Copy a pretraining run's checkpoint into the package as the shipped base model, with its card.

    python scripts/ship_base.py runs/base --showcase flite-rms,flite-awb,festival-kal,flite-kal16

Writes ``src/chorus/assets/base/`` (model.safetensors + config.json, no optimizer state) and its
``MODEL_CARD.md`` from the run's log, the corpus' voices.json and, if present, the benchmark table.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from chorus.models.bundle import file_sha256, load_bundle, save_bundle
from chorus.synthesis import DEFAULT_BASE


def schedule(recipe: dict) -> str:
    """The learning-rate schedule of ``recipe`` (a PretrainConfig as a dict) in words."""
    if not recipe:
        return "not recorded"
    words = (
        f"peak learning rate {recipe['learning_rate']:g}, linear warmup over {recipe['warmup_steps']:,} "
        "steps, then inverse-square-root decay"
    )
    if recipe.get("anneal_from") is not None:
        words += f"; from step {recipe['anneal_from']:,} a linear anneal to 0 at step {recipe['steps']:,}"
    return words + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="pretraining run folder (has checkpoint/ and log.csv)")
    parser.add_argument("--showcase", default="", help="comma-separated voices `chorus demo` uses")
    parser.add_argument(
        "--default-vocoder",
        default=None,
        choices=["griffin-lim", "neural"],
        help="vocoder load_base() uses when none is named (pick it on bench/base.py; default: the run's own, which a "
        "warm start keeps from its base, else griffin-lim)",
    )
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out"))
    parser.add_argument("--bench", type=Path, default=Path("bench/results/base/base.md"))
    parser.add_argument("--to", type=Path, default=DEFAULT_BASE)
    parser.add_argument("--machine", default="2 CPU cores (x86_64), 1 thread per process, shared with other jobs")
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        help="a line for 'How it was made' that the run does not record (repeatable)",
    )
    args = parser.parse_args()

    bundle = load_bundle(args.run / "checkpoint")
    if args.showcase:
        bundle.info["showcase_speakers"] = args.showcase.split(",")
    bundle.info["default_vocoder"] = args.default_vocoder or bundle.info.get("default_vocoder", "griffin-lim")
    save_bundle(bundle, args.to)
    rows = list(csv.DictReader((args.run / "log.csv").open()))
    last_val = [r for r in rows if r["split"] == "val"][-1] if rows else {}
    voices = json.loads((args.corpus / "voices.json").read_text()) if (args.corpus / "voices.json").is_file() else {}
    config = bundle.model.config
    params = sum(p.numel() for p in bundle.model.parameters())
    info = bundle.info
    recipe = info.get("recipe", {})
    natural = [
        name
        for name in bundle.speakers
        if voices.get("voices", {}).get(name, {}).get("path", "").startswith("natural/")
    ]
    heard = (
        f" ({len(natural)} of them natural-sounding: Piper joe reading other sentences than its held-out clips' "
        "through sox, corpus split natural/; piper-joe judged on this base is judged on a base that heard its "
        "relatives)"
        if natural
        else ""
    )
    card = [
        "# Chorus base model",
        "",
        "A small non-autoregressive multi-speaker acoustic model (phonemes + speaker -> 80-bin log-mel,",
        "22,050 Hz, hop 256) that learns its own alignment by monotonic alignment search.",
        "",
        "## How it was made",
        "",
        f"* Parameters: {params / 1e6:.2f} M; d_model {config.d_model}, {config.encoder_layers}+{config.decoder_layers} "
        f"FFT blocks, conv feed-forward {config.ff_hidden}x{config.ff_kernel}, speaker vectors of {config.speaker_dim}.",
        f"* Data: the offline corpus (`chorus corpus build`; {', '.join(map(str, info.get('corpus') or ['?']))}), "
        f"{len(bundle.speakers)} voices{heard}, {info.get('utterances', '?')} utterances. Held out: piper-joe, "
        "flite-slt, festival-ked.",
        *(
            [f"* Warm start: from the weights of `{recipe['init_from']}` (its speakers' vectors kept)."]
            if recipe.get("init_from")
            else []
        ),
        f"* Steps: {info.get('steps')} (world size {info.get('world_size')}, device {info.get('device', 'cpu')}); "
        f"time inside training steps {info.get('step_seconds', 0) / 3600:.2f} h"
        + (f", elapsed {info['elapsed_seconds'] / 3600:.2f} h" if "elapsed_seconds" in info else "")
        + f". Machine: {args.machine}.",
        f"* Schedule: {schedule(info.get('recipe', {}))}",
        *[f"* {note}" for note in args.note],
        f"* Recipe: `{json.dumps(info.get('recipe', {}))}` (its model's n_symbols and n_speakers as given; "
        f"pretraining fits them to the corpus: {config.n_symbols} and {config.n_speakers}, as config.json says)",
        f"* Last validation losses: mel L1 {last_val.get('mel', '?')}, prior {last_val.get('prior', '?')}, "
        f"duration {last_val.get('duration', '?')} (normalized log-mel units).",
        f"* Weights sha256: `{file_sha256(args.to / 'model.safetensors')}`",
        f"* Default vocoder: {info['default_vocoder']} (the neural one is `assets/vocoder/`, see its card).",
        "",
        "## Voices",
        "",
        "| index | voice | engine | transforms | gender | clips | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, name in enumerate(bundle.speakers):
        v = voices.get("voices", voices).get(name, {}) if isinstance(voices, dict) else {}
        card.append(
            f"| {index} | {name} | {v.get('engine', '')} {v.get('engine_voice', '')} | "
            f"{' '.join(v.get('sox', []) or [])} | {v.get('gender', '')} | {v.get('clips', '')} | "
            f"{v.get('minutes', '')} |"
        )
    card += ["", "## Measured quality", ""]
    card += [args.bench.read_text()] if args.bench.is_file() else ["(run `python bench/base.py` and re-ship)"]
    card += ["", "Loss curves: `loss.png` beside this card.", ""]
    (args.to / "MODEL_CARD.md").write_text("\n".join(card))
    if (args.run / "loss.png").is_file():
        (args.to / "loss.png").write_bytes((args.run / "loss.png").read_bytes())
    print(f"shipped {args.run} -> {args.to}")


if __name__ == "__main__":
    main()
