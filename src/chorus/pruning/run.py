"""``chorus prune``: a pruned copy of a base model, as a model folder like the shipped base's.

The folder's ``config.json`` records under ``info.pruning`` the technique, the target and reached
sparsity (over the targeted layers and per layer), parameters and non-zero parameters, the steps
and the seconds they took; unstructured zeros are stored compactly (kept values + bitmask).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from chorus.data.formats import discover
from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle, load_bundle, save_bundle
from chorus.pruning.loop import Budget, TrainingData
from chorus.pruning.registry import PruneJob, get_technique
from chorus.pruning.targets import DEFAULT_EXCLUDE, DEFAULT_INCLUDE, matches
from chorus.synthesis import DEFAULT_BASE
from chorus.training.pretrain import prepare_features

FINE_TUNE_RATE, SCRATCH_RATE = 2e-4, 1e-3  # peak learning rates: after training, from scratch


@dataclass
class PruneConfig:
    """One pruning run. ``steps`` / ``learning_rate`` None: the technique's defaults (fine-tuning
    300 steps at 2e-4; from scratch 3,000 steps at 1e-3, the alignment prior over the first third).
    ``features``: the corpus' feature cache (built there the first time; default beside ``out``)."""

    method: str
    sparsity: float
    out: str
    data: str  # the corpus to fine-tune (or train) on: the base's speakers, in its order
    model: str | None = None  # base model folder; None: the shipped base
    steps: int | None = None
    learning_rate: float | None = None
    include: list[str] = field(default_factory=lambda: list(DEFAULT_INCLUDE))
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    features: str | None = None
    max_frames: int = 4_800
    threads: int = 1
    seed: int = 1234
    device: str = "cpu"

    def __post_init__(self) -> None:
        technique = get_technique(self.method)  # an unknown name fails here, with the known ones
        if not 0.0 < self.sparsity < 1.0:
            raise ValueError(f"sparsity must be between 0 and 1 (a share, e.g. 0.5), got {self.sparsity}")
        if self.steps is not None and self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        self.steps = technique.default_steps if self.steps is None else self.steps
        if self.learning_rate is None:
            self.learning_rate = SCRATCH_RATE if technique.from_scratch else FINE_TUNE_RATE

    def budget(self) -> Budget:
        scratch = get_technique(self.method).from_scratch
        return Budget(
            steps=self.steps,
            learning_rate=self.learning_rate,
            warmup=max(1, self.steps // 10),
            alignment_prior_steps=self.steps // 3 if scratch else 0,
            max_frames=self.max_frames,
            seed=self.seed,
        )


def load_training_data(base: ModelBundle, data: str | Path, features: Path, progress: bool = True) -> TrainingData:
    """The corpus' features for ``base``: ``ValueError`` when its speakers are not the base's (by their folders'
    names first, before any feature is made: a one-speaker folder had been refused after its whole cache)."""
    listed = sorted({utterance.speaker for utterance in discover(data)[0]})
    if listed != sorted(base.speakers):
        raise ValueError(
            f"{data}: its speakers ({len(listed)}) are not the base model's ({len(base.speakers)}): prune with the "
            "corpus the base was trained on"
        )
    cache = prepare_features(data, features, base.front_end, base.mel_config, base.model.config.use_pitch, progress)
    if cache.speaker_names != base.speakers:
        raise ValueError(
            f"{data}: its speakers ({len(cache.speaker_names)}) are not the base model's ({len(base.speakers)}, in "
            "its order): prune with the corpus the base was trained on"
        )
    return TrainingData.split(cache)


def prune_base(config: PruneConfig, *, progress: bool = True) -> Path:
    """Prune the base with ``config.method`` and write the model folder ``config.out``; returns it."""
    torch.set_num_threads(config.threads)
    technique = get_technique(config.method)
    base = load_bundle(config.model or DEFAULT_BASE, config.device)
    out = Path(config.out)
    features = Path(config.features) if config.features else out.with_name(out.name + ".features.safetensors")
    data = load_training_data(base, config.data, features, progress)
    started = time.perf_counter()
    pruned = technique.run(
        PruneJob(base, data, config.sparsity, config.budget(), config.include, config.exclude, progress)
    )
    seconds = time.perf_counter() - started
    report = sparsity_report(base.model, pruned.model, config.include, config.exclude)
    # A model pruned from the base descends from its training; one trained from scratch keeps only its vocoder.
    kept = (
        base.info if not technique.from_scratch else {k: base.info[k] for k in ("default_vocoder",) if k in base.info}
    )
    info = {k: v for k, v in kept.items() if k != "pruning"}
    info["pruning"] = {
        "method": config.method,
        "from_scratch": technique.from_scratch,
        "target_sparsity": config.sparsity,
        **report,
        "steps": pruned.steps,
        "train_seconds": round(pruned.train_seconds, 3),
        "seconds": round(seconds, 3),
        "learning_rate": config.learning_rate,
        "include": config.include,
        "exclude": config.exclude,
        "base_sha256": base.weights_sha256,
        "corpus": str(config.data),
        "seed": config.seed,
        **pruned.details,
    }
    save_bundle(dataclasses.replace(base, model=pruned.model.eval(), info=info, weights_sha256=""), out)
    return out


def sparsity_report(dense: AcousticModel, pruned: AcousticModel, include, exclude) -> dict:
    """Sparsity reached: per weight matrix of ``dense`` matched by the patterns, the share of its
    entries that are zero or gone in ``pruned``; over them all; and the parameter counts."""
    pruned_layers = dict(pruned.named_modules())
    layers = {}
    targeted = removed = 0
    for name, layer in dense.named_modules():
        if not isinstance(layer, nn.Linear | nn.Conv1d) or not matches(name, include, exclude):
            continue
        kept = int(torch.count_nonzero(pruned_layers[name].weight))
        layers[name] = round(1.0 - kept / layer.weight.numel(), 4)
        targeted += layer.weight.numel()
        removed += layer.weight.numel() - kept
    parameters = sum(p.numel() for p in pruned.parameters())
    nonzero = sum(int(torch.count_nonzero(p)) for p in pruned.parameters())
    return {
        "sparsity": round(removed / max(targeted, 1), 4),
        "layers": layers,
        "parameters": parameters,
        "nonzero_parameters": nonzero,
        "dense_parameters": sum(p.numel() for p in dense.parameters()),
    }
