"""Distil the posterior encoder that the Piper adaptation recipe reads recordings with, for a Piper voice.

    python scripts/distill_posterior.py --out runs/piper_posterior/joe            # the installed joe voice
    python scripts/distill_posterior.py --base voice.onnx --out runs/posterior/v  # any single-speaker voice

The shipped one (``src/chorus/assets/piper_posterior_joe``) was made by the first command and copied
with ``--ship src/chorus/assets/piper_posterior_joe --reuse``, which stores the weights as float16.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from chorus.models.piper_posterior import CONFIG, WEIGHTS
from chorus.synthesis.bases.piper import open_base
from chorus.training.piper_posterior import DistillConfig, distill_posterior


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="piper-joe", help="piper-joe or a Piper .onnx voice file")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ship", type=Path, default=None, help="also copy the result here, weights as float16")
    parser.add_argument("--reuse", action="store_true", help="ship the encoder already in --out: no distilling")
    numbers = {"int": int, "float": float}  # the config's number fields (annotations are strings here)
    for f in dataclasses.fields(DistillConfig):
        if f.type in numbers:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=numbers[f.type], default=f.default)
    args = parser.parse_args()
    config = DistillConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(DistillConfig) if hasattr(args, f.name)}
    )
    if not args.reuse:
        distill_posterior(open_base(args.base).model, config, args.out, base_name=args.base, progress=True)
    if args.ship:
        args.ship.mkdir(parents=True, exist_ok=True)
        weights = {k: v.half() for k, v in load_file(args.out / WEIGHTS).items()}
        save_file(weights, args.ship / WEIGHTS)
        shutil.copy(args.out / CONFIG, args.ship / CONFIG)
        shutil.copy(args.out / "loss.csv", args.ship / "loss.csv")


if __name__ == "__main__":
    main()
