"""Chorus's speaker encoder: training memory per category (predicted and measured), step time, and
equal error rate on speakers it never trained on, for every trunk, reversible or not, and every optimizer;
resemblyzer on the same trials; and the zero-shot use of an embedding.

Variants are named ``{arch}{depth}[-rev]-{optimizer}``: ``resnet18-adam``, ``resnet18-rev-adam8bit``,
``df-resnet56-rev-sgd8bit`` ... Every variant trains on the same corpus (the corpus' speakers and the
virtual speakers its sox chains make), with the same steps, batch and seed.

    python bench/speaker.py --train resnet18-adam,resnet18-rev-adam8bit   # train (one process per core)
    python bench/speaker.py --report                                      # judge every trained variant

Trials: the corpus' held-out voices (flite-slt, festival-ked, piper-joe) and speakers derived only
from them by the same sox chains, ``--trial-clips`` clips each, every pair a trial (a derived speaker
is a different speaker from its source: the hardest trials). None of these clips is used in training.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

from chorus.audio.mel import MelConfig
from chorus.corpus.virtual import with_virtual_speakers
from chorus.models.speaker_encoder import SpeakerEncoderConfig
from chorus.training.speaker_encoder import SpeakerTrainConfig, prepare_clips, train_speaker_encoder

VARIANT = re.compile(r"^(resnet|df-resnet)(\d+)(-rev)?-(adam8bit|adam|sgd8bit|sgd)$")
DEFAULT_VARIANTS = (
    "resnet18-adam,resnet18-adam8bit,resnet18-sgd,resnet18-sgd8bit,resnet18-rev-adam,resnet18-rev-adam8bit,"
    "df-resnet56-adam,df-resnet56-rev-adam8bit"
)


def parse_variant(name: str) -> tuple[SpeakerEncoderConfig, str]:
    """``resnet18-rev-adam8bit`` -> (its encoder config, its optimizer)."""
    match = VARIANT.match(name)
    if match is None:
        raise ValueError(f"variant {name!r} is not '{{resnet|df-resnet}}{{depth}}[-rev]-{{optimizer}}'")
    arch, depth, rev, optimizer = match.groups()
    return SpeakerEncoderConfig(arch=arch, depth=int(depth), reversible=rev is not None), optimizer


def train_variants(names: list[str], args) -> None:
    """Train every variant not trained yet, on features made once for all of them."""
    corpus = args.work / "corpus"
    if not corpus.is_dir():
        with_virtual_speakers(args.corpus, corpus, args.virtual_speakers)
    base = SpeakerTrainConfig(corpus=str(corpus), out="", steps=args.steps, seed=args.seed)
    clips = None
    for name in names:
        folder = args.work / "encoders" / name
        if (folder / "config.json").is_file():
            print(f"{name}: trained already", flush=True)
            continue
        encoder, optimizer = parse_variant(name)
        if clips is None:
            clips = prepare_clips(base, MelConfig(n_mels=encoder.n_mels))
        config = SpeakerTrainConfig(
            corpus=str(corpus), out=str(folder), encoder=encoder, optimizer=optimizer, steps=args.steps, seed=args.seed
        )
        print(f"{name}: training", flush=True)
        train_speaker_encoder(config, clips=clips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", default=None, help=f"variants to train (comma-separated), e.g. {DEFAULT_VARIANTS}")
    parser.add_argument("--report", action="store_true", help="judge every trained variant and write the report")
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--virtual-speakers", type=int, default=216, help="virtual speakers added to the corpus")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--work", type=Path, default=Path("runs/speaker"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/speaker"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.train:
        train_variants(args.train.split(","), args)
    if not args.report:
        return


if __name__ == "__main__":
    sys.exit(main())
