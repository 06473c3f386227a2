"""Pretraining the multi-speaker base, as a recipe of named steps: set up data, model and optimizer,
then the step loop, which evaluates and saves as it goes.

Resumable from its last checkpoint; DDP-ready: under ``torchrun`` each process trains on its own
share of the batches (gloo on CPU, NCCL on GPU) and rank 0 writes checkpoints and logs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from chorus.atomic import recover_interrupted_write
from chorus.audio.mel import MelConfig
from chorus.data.batching import collate, make_batches
from chorus.data.check import DatasetReport, check_dataset
from chorus.data.features import FeatureCache, build_feature_cache
from chorus.data.formats import discover
from chorus.models.acoustic import AcousticModel, build_model
from chorus.models.bundle import ModelBundle, load_bundle, write_bundle_files
from chorus.models.config import AcousticConfig
from chorus.models.losses import compute_losses, step_inputs
from chorus.text import TextFrontEnd
from chorus.training.checkpoint import load_training_state, save_checkpoint
from chorus.training.interrupts import InterruptRequest, RunInterrupted
from chorus.training.loss_log import LossLog, plot_losses
from chorus.training.progress import step_progress

# How a base speaks and which voices show it, not how it was trained: a warm-started run keeps its base's until
# they are chosen anew.
SYNTHESIS_SETTINGS = ("default_vocoder", "postfilter", "showcase_speakers")
# log.csv: one row per evaluation and split (train, val), mean losses since the last one.
LOG_FIELDS = ["step", "split", "total", "mel", "prior", "duration", "lr", "seconds"]
PLOTTED = ("mel", "prior", "duration")


@dataclass
class PretrainConfig:
    """Recipe of a pretraining run. ``model`` sizes are fixed once a run has started."""

    # Corpus roots, each a folder of LJSpeech-style speaker folders (one name a string): ``train/`` alone, or
    # ``train/`` and ``natural/`` of ``chorus corpus build`` (no speaker name in two of them).
    data: str | list[str]
    out: str  # run folder: features cache, checkpoint/, log.csv, loss.png
    model: AcousticConfig = field(default_factory=AcousticConfig)
    steps: int = 30_000
    max_frames: int = 4_800  # padded mel frames per batch (per process)
    learning_rate: float = 1e-3
    warmup_steps: int = 1_000
    anneal_from: int | None = None  # from this step the learning rate falls linearly to 0 at ``steps``
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    alignment_prior_steps: int = 3_000  # near-diagonal alignment prior, faded out linearly by this step
    val_per_speaker: int = 2  # utterances per speaker kept out for validation
    eval_every: int = 250
    save_every: int = 500
    threads: int = 2
    seed: int = 1234
    device: str = "cpu"
    default_speaker: str | None = None
    # A new run starts from this base folder's weights (a warm start, not a resume: the optimizer, the step
    # and the learning rate's schedule start afresh); speakers it knows keep their vectors, and a corpus
    # speaker it does not know starts at the mean of them. Its model sizes, phonemes and mel settings rule.
    init_from: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.data, str):
            self.data = [self.data]
        if not self.data:
            raise ValueError("PretrainConfig.data names no corpus folder")
        if isinstance(self.model, dict):
            self.model = AcousticConfig.from_dict(self.model)
        for name in ("steps", "max_frames", "eval_every", "save_every", "threads", "warmup_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"PretrainConfig.{name} must be positive")
        if self.anneal_from is not None and not 0 <= self.anneal_from < self.steps:
            raise ValueError(
                f"PretrainConfig.anneal_from must lie in 0..{self.steps - 1} (steps), got {self.anneal_from}"
            )


def learning_rate_at(step: int, config: PretrainConfig) -> float:
    """Linear warmup, then inverse-square-root decay (the Transformer schedule); with ``anneal_from``,
    a linear fall from that step's rate to 0 at ``config.steps`` (the decay phase of a
    warmup-stable-decay schedule). The noise of a large step size hides progress an underfit model
    has made; annealing it away cashes that in, so a resumed run can end with an anneal."""

    def transformer(step: int) -> float:
        step = max(step, 1)
        return config.learning_rate * min(step / config.warmup_steps, math.sqrt(config.warmup_steps / step))

    if config.anneal_from is None or step <= config.anneal_from:
        return transformer(step)
    remaining = (config.steps - step) / (config.steps - config.anneal_from)
    return transformer(config.anneal_from) * max(remaining, 0.0)


def alignment_prior_weight(step: int, config: PretrainConfig) -> float:
    """1 at the start, falling linearly to 0 at ``alignment_prior_steps``: the search leans on a
    diagonal prior only while the model's own prior means are still uninformative."""
    if config.alignment_prior_steps <= 0:
        return 0.0
    return max(0.0, 1.0 - step / config.alignment_prior_steps)


class _Distributed:
    """Rank/world bookkeeping and this process's device; a single process when not under torchrun."""

    def __init__(self, device: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = torch.device(device)
        if self.world > 1 and self.device.type == "cuda":
            # One GPU per process: rank-local index from torchrun.
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if self.world > 1 and not dist.is_initialized():
            # Rank 0 may spend a long time checking data and building features while the others wait.
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", timeout=timedelta(hours=4))

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is set in any process (every process calls it at the same step)."""
        return flag if self.world == 1 else self.mean(float(flag)) > 0

    def mean(self, value: float) -> float:
        if self.world == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return float(tensor.item()) / self.world


def corpus_digest(data: str | Path | list[str] | list[Path]) -> str:
    """What a feature cache is made from, by content (wherever the folder is): every metadata line (speaker,
    clip, text), the size of its audio file (-1: missing), and the lines the metadata reader refused. Cheap:
    metadata and file sizes, no audio read. ``DatasetFormatError`` when ``data`` holds no dataset. Several
    folders: the digest of their digests in order (one folder's is its own, as caches before them recorded)."""
    if isinstance(data, list):
        if len(data) == 1:
            return corpus_digest(data[0])
        return hashlib.sha256(" ".join(corpus_digest(folder) for folder in data).encode()).hexdigest()
    utterances, problems = discover(data)
    digest = hashlib.sha256()
    for utterance in utterances:
        size = utterance.audio_path.stat().st_size if utterance.audio_path.is_file() else -1
        digest.update(f"{utterance.key}|{utterance.text}|{size}\n".encode())
    for problem in problems:  # by where in the corpus, not by how DATA was spelled (relative, absolute, moved)
        file, colon, line = problem.source.rpartition(":")
        if not (colon and line.isdigit()):  # a whole metadata.csv refused: its path alone
            file, line = problem.source, ""
        digest.update(f"refused {os.path.relpath(file, data)}:{line}\n".encode())
    return digest.hexdigest()


def prepare_features(
    data: str | Path | list[str] | list[Path],
    path: Path,
    front_end: TextFrontEnd,
    mel_config: MelConfig,
    with_pitch: bool = False,
    progress: bool = True,
) -> FeatureCache:
    """The feature cache at ``path``, built from the corpus ``data`` (one folder or several) the first time;
    ``ValueError`` if the cache was made with other text or mel settings, or from another corpus (or this one
    since changed: a fixed line, a clip added); it had been trained on whatever ``data`` named, and said to be
    ``data``. Several folders must not share a speaker name (one speaker's clips would merge unsaid)."""
    folders = [Path(folder) for folder in (data if isinstance(data, list) else [data])]
    digest = corpus_digest(folders)
    if path.is_file():
        cache = FeatureCache.load(path)
        if cache.meta.get("front_end") != front_end.to_dict() or cache.meta.get("mel") != mel_config.to_dict():
            raise ValueError(f"{path} was made with other text or mel settings; delete it to rebuild")
        if cache.meta.get("corpus", digest) != digest:  # caches before this check recorded none
            raise ValueError(
                f"{path} was made from another corpus than {data} (or from it before it changed): a run trains on "
                f"one corpus. Give a new --out, or delete {path} (and {path.parent / 'checkpoint'}, to start over)"
            )
        return cache
    utterances, problems = [], []
    for folder, report in zip(folders, _checked_folders(folders, progress), strict=True):
        for problem in report.problems:
            problems.append(problem)
            print(f"skipped {problem.source}: {problem.message}")
        if report.problems:
            print(f"skipped {len(report.problems)} problem(s) in {folder}: {report.summary()} Training on the rest.")
        utterances += report.valid_utterances()
    cache, skipped = build_feature_cache(utterances, front_end, mel_config, with_pitch=with_pitch, progress=progress)
    cache.meta["corpus"] = digest
    for line in skipped:
        print(f"skipped {line}")
    if skipped:
        print(f"skipped {len(skipped)} clip(s) whose features could not be made. Training on the rest.")
    cache.save(path)
    return cache


def _checked_folders(folders: list[Path], progress: bool) -> list[DatasetReport]:
    """Each corpus folder's data check (its rules, missing, silent, clipped, mis-transcribed ..., decide what
    is trained on); ``ValueError`` for a folder with no speaker at all, or a speaker name in two folders."""
    reports, seen = [], {}
    for folder in folders:
        report = check_dataset(folder, progress=progress)
        if not report.speakers and report.problems:
            message = report.problems[0].message
            raise ValueError(message if message.startswith(str(folder)) else f"{folder}: {message}")
        for name in report.speakers:
            if name in seen:
                raise ValueError(f"speaker {name!r} is in both {seen[name]} and {folder}: one speaker, one folder")
            seen[name] = folder
        reports.append(report)
    return reports


def split_validation(cache: FeatureCache, per_speaker: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation): ``per_speaker`` random utterances of every speaker for validation."""
    rng = np.random.default_rng(seed)
    validation = []
    for speaker in range(len(cache.speaker_names)):
        members = np.flatnonzero(cache.speakers == speaker)
        count = min(per_speaker, len(members) - 1)  # every speaker keeps at least one training clip
        if count > 0:
            validation += list(rng.choice(members, size=count, replace=False))
    validation = np.sort(np.asarray(validation, dtype=np.int64))
    train = np.setdiff1d(np.arange(len(cache)), validation)
    return train, validation


@torch.no_grad()
def evaluate(
    model: AcousticModel,
    cache: FeatureCache,
    indices: np.ndarray,
    device: torch.device,
    max_frames: int,
    prior_weight: float = 0.0,
) -> dict[str, float]:
    model.eval()
    totals: dict[str, float] = {}
    batches = make_batches(cache.frames()[indices], max_frames, shuffle=False)
    for batch_positions in batches:
        batch = collate(cache, indices[batch_positions]).to(device)
        inputs = step_inputs(model, batch)
        losses = compute_losses(
            model, model(**inputs, alignment_prior_weight=prior_weight), inputs["mel"], inputs["text_lengths"]
        )
        for name, value in losses.items():
            totals[name] = totals.get(name, 0.0) + float(value) * len(batch_positions)
    model.train()
    return {name: value / len(indices) for name, value in totals.items()}


def base_optimizer(model: AcousticModel, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """The base's AdamW: weight decay on weight matrices only (not on embeddings, norms or biases)."""
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "embedding" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() > 1 and "embedding" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate,
        betas=(0.9, 0.98),
        eps=1e-9,
    )


def _check_resume_matches(
    bundle: ModelBundle, cache: FeatureCache, front_end: TextFrontEnd, mel_config: MelConfig
) -> None:
    """A resumed model must see the speakers, phoneme ids and mel settings it was trained with."""
    if bundle.speakers != cache.speaker_names:
        raise ValueError(
            "the checkpoint's speakers differ from the corpus' (a speaker folder was added, "
            "removed or renamed); start a new run folder"
        )
    for name, ours, theirs in (
        ("phoneme table / text front end", bundle.front_end.to_dict(), front_end.to_dict()),
        ("mel settings", bundle.mel_config.to_dict(), mel_config.to_dict()),
    ):
        if ours != theirs:
            raise ValueError(f"the checkpoint's {name} differ from this Chorus version's; start a new run folder")


@dataclass
class _Corpus:
    """The run's data: the checked corpus' features and which of its utterances train and validate."""

    front_end: TextFrontEnd
    mel_config: MelConfig
    cache: FeatureCache
    train: np.ndarray  # [utterances] indices into ``cache``
    validation: np.ndarray  # [utterances] indices into ``cache``, ``val_per_speaker`` per speaker
    default_speaker: str


@dataclass
class _Position:
    """Where a run stands. A checkpoint saves it and resuming restores it, so a resumed run continues at
    the same step, epoch and batch of that epoch's order."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    step_seconds: float = 0.0  # time inside training steps, summed over the runs (this process)
    started: float = 0.0  # ``time.perf_counter()`` at which the runs' summed wall clock would have been 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def pretrain(config: PretrainConfig, *, progress: bool = True) -> Path:
    """Train (or resume) a base model; returns the checkpoint folder ``OUT/checkpoint``.

    Resuming continues exactly where the checkpoint was taken: same step, learning rate, optimizer
    moments, epoch and position in that epoch's batch order.
    """
    run = _Distributed(config.device)
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed + run.rank)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = out / "checkpoint"
    recover_interrupted_write(checkpoint_dir)
    trained = checkpoint_dir if (checkpoint_dir / "config.json").is_file() else config.init_from
    if trained is not None:  # the model is the checkpoint's or the warm start's base's: its features and recipe too
        model = json.loads((Path(trained) / "config.json").read_text(encoding="utf-8"))["model"]
        config = replace(config, model=AcousticConfig.from_dict(model))

    corpus = _setup_data(config, run, out / "features.safetensors", progress)
    bundle = _setup_model(config, corpus, checkpoint_dir, run.device)
    optimizer, position = _setup_optimizer(bundle.model, config, checkpoint_dir)
    _PretrainLoop(config, run, out, corpus, bundle, optimizer, position).train(progress)
    if run.world > 1:
        dist.destroy_process_group()
    return checkpoint_dir


def _setup_data(config: PretrainConfig, run: _Distributed, features: Path, progress: bool) -> _Corpus:
    """The corpus' features (rank 0 builds the cache while the others wait, then every rank loads it),
    split into training and validation utterances."""
    front_end, mel_config = TextFrontEnd(), MelConfig()
    if run.main:
        prepare_features(config.data, features, front_end, mel_config, config.model.use_pitch, progress)
    run.barrier()
    cache = prepare_features(config.data, features, front_end, mel_config)  # built: loaded and checked
    train, validation = split_validation(cache, config.val_per_speaker, config.seed)
    default_speaker = config.default_speaker or cache.speaker_names[0]
    if default_speaker not in cache.speaker_names:
        raise ValueError(f"default speaker {default_speaker!r} is not in the corpus")
    return _Corpus(front_end, mel_config, cache, train, validation, default_speaker)


def _setup_model(config: PretrainConfig, corpus: _Corpus, checkpoint_dir: Path, device: torch.device) -> ModelBundle:
    """The bundle to train, in training mode: the checkpoint's when there is one, else a new model sized
    for the corpus' symbols and speakers, with the corpus' normalization statistics in its buffers."""
    if (checkpoint_dir / "config.json").is_file():
        bundle = load_bundle(checkpoint_dir, device)
        _check_resume_matches(bundle, corpus.cache, corpus.front_end, corpus.mel_config)
    elif config.init_from is not None:
        base = load_bundle(config.init_from, device)
        default = config.default_speaker or base.default_speaker  # the base's, unless another is asked for
        bundle = warm_start(base, corpus.cache.speaker_names, default)
        if default not in bundle.speakers:
            raise ValueError(f"the base's default speaker {default!r} is not in the corpus: give --default-speaker")
        _check_resume_matches(bundle, corpus.cache, corpus.front_end, corpus.mel_config)
    else:
        cache = corpus.cache
        model_config = AcousticConfig(
            **{
                **config.model.to_dict(),
                "n_symbols": len(corpus.front_end.symbols),
                "n_speakers": len(cache.speaker_names),
            }
        )
        model = build_model(model_config, device)
        mean, std = cache.mel_statistics()
        model.mel_mean.copy_(torch.from_numpy(mean))
        model.mel_std.copy_(torch.from_numpy(std))
        if model_config.use_pitch:
            model.pitch_stats.copy_(torch.tensor(cache.pitch_statistics()))
        bundle = ModelBundle(model, corpus.front_end, corpus.mel_config, cache.speaker_names, corpus.default_speaker)
    bundle.model.train()
    return bundle


def warm_start(base: ModelBundle, speakers: list[str], default_speaker: str) -> ModelBundle:
    """A bundle for ``speakers`` with every weight and buffer of ``base`` (its mel statistics too: its decoder
    speaks in them): a speaker ``base`` knows keeps its vector, a new one starts at the mean of ``base``'s
    (the voice in the middle of those it learned). It speaks as ``base`` does (its vocoder, post-filter and
    showcase voices, :data:`SYNTHESIS_SETTINGS`) until they are chosen anew for it. ``base`` is left as it was."""
    old = base.model
    config = AcousticConfig(**{**old.config.to_dict(), "n_speakers": len(speakers)})
    model = build_model(config, next(old.parameters()).device)
    state = {name: value for name, value in old.state_dict().items() if name != "speaker_embedding.weight"}
    loaded = model.load_state_dict(state, strict=False)
    if loaded.missing_keys != ["speaker_embedding.weight"] or loaded.unexpected_keys:  # nothing else may differ
        raise ValueError(f"cannot warm-start from this base: {loaded}")
    with torch.no_grad():
        known = old.speaker_embedding.weight
        index = {name: row for row, name in enumerate(base.speakers)}
        for row, name in enumerate(speakers):
            source = known[index[name]] if name in index else known.mean(dim=0)
            model.speaker_embedding.weight[row].copy_(source)
    settings = {key: base.info[key] for key in SYNTHESIS_SETTINGS if key in base.info}
    return ModelBundle(model, base.front_end, base.mel_config, list(speakers), default_speaker, settings)


def _setup_optimizer(
    model: AcousticModel, config: PretrainConfig, checkpoint_dir: Path
) -> tuple[torch.optim.AdamW, _Position]:
    """The optimizer and the run's position: both as the checkpoint left them, or fresh."""
    optimizer = base_optimizer(model, config.learning_rate, config.weight_decay)
    position, elapsed = _Position(), 0.0
    state = load_training_state(checkpoint_dir)
    if state is not None:
        state.restore({"optimizer": optimizer})
        meta = state.meta
        position = _Position(
            step=meta["step"],
            epoch=meta.get("epoch", 0),
            batch_in_epoch=meta.get("batch_in_epoch", 0),
            step_seconds=meta["step_seconds"],
        )
        elapsed = meta.get("elapsed_seconds", position.step_seconds)
    position.started = time.perf_counter() - elapsed
    return optimizer, position


class _PretrainLoop:
    """The step loop and what it works on: train steps over each epoch's batches, evaluate and log every
    ``eval_every`` steps, save every ``save_every`` steps and at the last. Rank 0 logs and saves."""

    def __init__(
        self,
        config: PretrainConfig,
        run: _Distributed,
        out: Path,
        corpus: _Corpus,
        bundle: ModelBundle,
        optimizer: torch.optim.AdamW,
        position: _Position,
    ):
        self.config, self.run, self.out, self.corpus = config, run, out, corpus
        self.bundle, self.model, self.optimizer, self.position = bundle, bundle.model, optimizer, position
        self.trained: torch.nn.Module = self.model  # what the steps call: the model, under DDP its wrapper
        if run.world > 1:
            self.trained = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[run.device.index] if run.device.type == "cuda" else None
            )
        self.log = LossLog(out / "log.csv", LOG_FIELDS, resume_step=position.step) if run.main else None
        self.running: dict[str, float] = {}  # training losses summed since the last evaluation
        self.running_steps = 0

    def train(self, progress: bool) -> None:
        """Step from the run's position to ``config.steps``, epoch by epoch; ``progress``: show a bar. Ctrl-C
        ends the step under way, logs and saves, and raises :class:`RunInterrupted`."""
        config, position = self.config, self.position
        if position.step >= config.steps:
            if self.run.main:
                print(
                    f"{self.out / 'checkpoint'} is at step {position.step} already: nothing to train to --steps {config.steps}"
                )
            return
        with InterruptRequest() as interrupt, step_progress("pretrain", progress and self.run.main) as bar:
            task = bar.add_task("steps", total=config.steps, completed=position.step, status="")
            while position.step < config.steps:
                batches = self._epoch_batches()
                while position.batch_in_epoch < len(batches) and position.step < config.steps:
                    values = self._train_step(batches[position.batch_in_epoch])
                    for name, value in values.items():
                        self.running[name] = self.running.get(name, 0.0) + value
                    self.running_steps += 1
                    bar.update(
                        task,
                        completed=position.step,
                        status=f"mel {values['mel']:.3f} prior {values['prior']:.3f} dur {values['duration']:.3f}",
                    )
                    stopping = self.run.any(interrupt.requested)
                    # Logged at the last step and at an interrupt too: a run shorter than eval_every had left
                    # an empty log.csv and no loss.png.
                    if position.step % config.eval_every == 0 or position.step == config.steps or stopping:
                        self._evaluate_and_log(bar.tasks[0].fields["status"], printed=not bar.console.is_terminal)
                    if position.step % config.save_every == 0 or position.step == config.steps or stopping:
                        self._save(epoch_done=position.batch_in_epoch == len(batches))
                    if stopping:
                        raise RunInterrupted(position.step, self.out / "checkpoint")
                if position.batch_in_epoch >= len(batches):
                    position.epoch, position.batch_in_epoch = position.epoch + 1, 0

    def _epoch_batches(self) -> list[np.ndarray]:
        """This process's share of the current epoch's batches, each an array of positions in ``train``."""
        train, world = self.corpus.train, self.run.world
        batches = make_batches(
            self.corpus.cache.frames()[train], self.config.max_frames, seed=self.config.seed + self.position.epoch
        )
        # Every process takes the same number of batches, so DDP's collective steps stay in lockstep.
        per_process = len(batches) // world
        if per_process == 0:
            raise ValueError(
                f"{len(batches)} batch(es) per epoch cannot feed {world} processes: lower max_frames or add data"
            )
        return batches[self.run.rank :: world][:per_process]

    def _train_step(self, positions: np.ndarray) -> dict[str, float]:
        """One optimizer step on the batch at ``positions`` of ``train``; returns its losses by name."""
        config, model, optimizer, position = self.config, self.model, self.optimizer, self.position
        started = time.perf_counter()
        batch = collate(self.corpus.cache, self.corpus.train[positions]).to(self.run.device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(position.step + 1, config)
        inputs = step_inputs(model, batch)
        prior_weight = alignment_prior_weight(position.step, config)
        losses = compute_losses(
            model, self.trained(**inputs, alignment_prior_weight=prior_weight), inputs["mel"], inputs["text_lengths"]
        )
        optimizer.zero_grad(set_to_none=True)
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        position.step += 1
        position.batch_in_epoch += 1
        position.step_seconds += time.perf_counter() - started
        return {name: value.item() for name, value in losses.items()}

    def _evaluate_and_log(self, status: str, printed: bool) -> None:
        """Log the mean training losses since the last evaluation (over all processes) and, with a
        validation set, its losses; ``printed``: also print a progress line (for a background run's log
        file, where a live bar never renders)."""
        step, step_seconds = self.position.step, self.position.step_seconds
        if self.run.main and printed:
            print(f"step {step}/{self.config.steps} {status} {step_seconds / max(step, 1):.2f} s/step", flush=True)
        train_means = {k: self.run.mean(v / self.running_steps) for k, v in self.running.items()}
        self.running, self.running_steps = {}, 0
        if not self.run.main:
            return
        rows = [("train", train_means)]
        if len(self.corpus.validation):
            # Validated with the alignment prior the step just taken trained with.
            prior_weight = alignment_prior_weight(step - 1, self.config)
            validation = evaluate(
                self.model,
                self.corpus.cache,
                self.corpus.validation,
                self.run.device,
                self.config.max_frames,
                prior_weight,
            )
            rows.append(("val", validation))
        lr = self.optimizer.param_groups[0]["lr"]
        self.log.append(
            {
                "step": step,
                "split": split,
                **{name: f"{means[name]:.4f}" for name in ("total", *PLOTTED)},
                "lr": f"{lr:.6f}",
                "seconds": f"{step_seconds:.0f}",
            }
            for split, means in rows
        )

    def _save(self, epoch_done: bool) -> None:
        """Rank 0 writes the checkpoint (bundle, optimizer, position) and plots the losses; every rank
        waits for it. ``epoch_done``: the step ended its epoch, so a resumed run starts the next one."""
        if self.run.main:
            config, position = self.config, self.position
            epoch, batch_in_epoch = (position.epoch + 1, 0) if epoch_done else (position.epoch, position.batch_in_epoch)
            elapsed = position.elapsed()
            self.bundle.info = {
                **{key: self.bundle.info[key] for key in SYNTHESIS_SETTINGS if key in self.bundle.info},
                "steps": position.step,
                "step_seconds": round(position.step_seconds, 1),
                "elapsed_seconds": round(elapsed, 1),
                "world_size": self.run.world,
                "device": str(self.run.device),
                "corpus": list(config.data),
                "utterances": len(self.corpus.cache),
                "recipe": {k: v for k, v in asdict(config).items() if k not in ("data", "out")},
            }
            save_checkpoint(
                self.out / "checkpoint",
                lambda temp: write_bundle_files(self.bundle, temp),
                {
                    "step": position.step,
                    "epoch": epoch,
                    "batch_in_epoch": batch_in_epoch,
                    "step_seconds": position.step_seconds,
                    "elapsed_seconds": elapsed,
                },
                {"optimizer": self.optimizer},
            )
            plot_losses(self.out / "log.csv", self.out / "loss.png", PLOTTED, title="pretraining")
        self.run.barrier()
