"""``chorus prune``: a smaller base, by one of the pruning techniques of :mod:`chorus.pruning`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from chorus.cli.common import (
    config_default,
    console,
    fail,
    model_kind,
    overwrite_help,
    refuse_output_folder,
    user_errors,
)
from chorus.pruning import PruneConfig, prune_base
from chorus.pruning.registry import get_technique, technique_names
from chorus.pruning.targets import DEFAULT_EXCLUDE

CORPUS_DEFAULT = Path("corpus_out/train")


def prune(
    method: str = typer.Option(..., help=f"Technique: {', '.join(technique_names())}."),
    sparsity: float = typer.Option(
        ..., help="Share to remove: of the targeted weights (unstructured) or of the channels and heads (structured)."
    ),
    out: Path = typer.Option(..., help="Model folder to write (loads like the shipped base)."),
    overwrite: bool = typer.Option(False, help=overwrite_help("model")),
    model: Path | None = typer.Option(None, help="Base model folder (default: the shipped base)."),
    data: Path = typer.Option(
        CORPUS_DEFAULT,
        help="Corpus with the base's speakers to fine-tune (or train) on: `chorus corpus build corpus_out`.",
    ),
    steps: int | None = typer.Option(
        None, help="Training steps (default: 300 of fine-tuning after training, 3,000 from scratch)."
    ),
    learning_rate: float | None = typer.Option(
        None, help="Peak learning rate (default: 2e-4 fine-tuning, 1e-3 from scratch)."
    ),
    include: list[str] = typer.Option(["*"], help="Module-name patterns to prune (fnmatch; repeat the option)."),
    exclude: list[str] = typer.Option(
        [],
        help=f"More module-name patterns to leave dense, beside {', '.join(DEFAULT_EXCLUDE)} (always dense: a given "
        "--exclude had replaced them, and mel_proj was pruned).",
    ),
    features: Path | None = typer.Option(None, help="Feature cache of the corpus (default: beside --out)."),
    max_frames: int = typer.Option(config_default(PruneConfig, "max_frames"), help="Padded mel frames per batch."),
    threads: int = typer.Option(config_default(PruneConfig, "threads"), help="CPU threads."),
    seed: int = typer.Option(config_default(PruneConfig, "seed"), help="Random seed."),
    device: str = typer.Option(config_default(PruneConfig, "device"), help="cpu, cuda ..."),
) -> None:
    """Prune the base model and fine-tune (or train) it.

    The folder works with synthesize, adapt, adapt-many and serve (--model DIR) like the shipped base; its config.json records what was done (info.pruning).

    ump: magnitude pruning in one shot, then fine-tuning with the mask fixed.

    parp: prune, adjust with the pruned weights free to come back, re-prune.

    snip: connection sensitivity at initialization, then training from scratch.

    dynamic: sparse training from scratch with drop-and-regrow (RigL).

    structured: whole neurons, heads and channels removed; the layers shrink.
    """
    if not data.is_dir():
        fail(f"{data}: no corpus folder here; build the corpus first (chorus corpus build corpus_out) or give --data")
    refuse_output_folder(out, data, overwrite, model_kind())  # it had replaced a model folder without a word
    with user_errors():
        config = PruneConfig(
            method=method,
            sparsity=sparsity,
            out=str(out),
            data=str(data),
            model=str(model) if model else None,
            steps=steps,
            learning_rate=learning_rate,
            include=list(include),
            exclude=[*DEFAULT_EXCLUDE, *(pattern for pattern in exclude if pattern not in DEFAULT_EXCLUDE)],
            features=str(features) if features else None,
            max_frames=max_frames,
            threads=threads,
            seed=seed,
            device=device,
        )
        folder = prune_base(config)
    info = json.loads((folder / "config.json").read_text())["info"]["pruning"]
    size = (folder / "model.safetensors").stat().st_size
    console.print(
        f"{get_technique(method).name}: sparsity {info['sparsity']:.1%} of the targeted weights, "
        f"{info['nonzero_parameters']:,} non-zero of {info['dense_parameters']:,} parameters, "
        f"{size / 1e6:.2f} MB on disk; {info['steps']} steps in {info['train_seconds']:.0f} s"
    )
    console.print(f"model: {folder}  (chorus synthesize --model {folder} ...)")
