"""Training the speaker encoder on a corpus of speaker folders, with channel augmentation and 32-bit or
8-bit optimizer states, resumable from its checkpoint.

Every sub-folder of the corpus with a ``metadata.csv`` is a speaker (the corpus' voices, the virtual
speakers its sox chains make: ``chorus.corpus.virtual``, and the encoder's own natural-sounding
speakers: ``chorus.corpus.speakers.ENCODER_SPEAKERS``). Per speaker, ``heldout`` clips are kept out of
training: after the last step they make verification trials (every pair of them, same and different
speakers) whose equal-error point becomes the encoder's same/different threshold.

The training clips are kept as audio. Each step takes ``batch_speakers`` speakers x ``per_speaker``
clips and a random window of each, long enough for ``segment_frames`` mel frames; a share
``augment_share`` of the windows goes through :class:`~chorus.audio.augment.Augmentation` on the fly
(a room, noise of several kinds or other training speakers' babble, a microphone, a phone line, 8 kHz
or a codec), the rest stays clean, and the log-mel of each is cropped to ``segment_frames``; then the
AAM softmax loss. On the fly, every crop meets a new channel (a 2.3 s window costs ~25 ms of
augmentation and mel on one thread against ~3.5 s for the step's forward and backward pass, see
``runs/speaker_encoder_v2``); ``augment_copies`` fixed augmented copies per clip, made once before
training, is the older recipe the shipped encoder used.

Every step's randomness comes from ``(seed, step)`` and the learning rate and margin depend only on
the step, so a run resumed from its checkpoint (``out/checkpoint``: the encoder, the AAM head and the
optimizer state in safetensors, no pickle) follows the path of an uninterrupted one. ``out/loss.csv``
and ``out/loss.png`` are the loss curve (means over ``log_every`` steps).

The steps run on ``device`` (a GPU: ``cuda``); the crops are always made on the CPU, by ``workers``
data-loader processes when there are any (:class:`TrainingBatches`: step ``k``'s batch is drawn from
``(seed, k)`` whichever process makes it, so the batches are the same for any number of workers).
``max_minutes`` bounds the steps' wall clock: the run measures its pace, plans how many steps fit and
runs its learning-rate and margin schedules over that plan. ``init`` starts from another run's
encoder and AAM head (same speakers) with a fresh optimizer and schedule, e.g. to go on with another
optimizer than the one the checkpoint's state belongs to.

Optimizers: ``adam`` / ``sgd`` (torch, SGD with momentum 0.9) and ``adam8bit`` / ``sgd8bit``
(bitsandbytes, block-wise dynamic quantization of the states). bitsandbytes keeps tensors under
4,096 values in 32 bits unless told otherwise; here every state of every tensor is 8-bit
(``min_8bit_size=1``), so the 8-bit runs are 8-bit for every state they claim.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from chorus.audio.augment import Augmentation
from chorus.audio.io import load_audio
from chorus.audio.mel import MelConfig, log_mel
from chorus.data.formats import discover
from chorus.speaker_recognition.bundle import CONFIG, WEIGHTS, EncoderBundle, load_encoder, save_encoder
from chorus.speaker_recognition.encoder import SpeakerClassifier, SpeakerEncoder, SpeakerEncoderConfig
from chorus.speaker_recognition.verification import VerificationScores, verification_scores
from chorus.training.checkpoint import TrainingState, load_training_state, save_checkpoint
from chorus.training.efficiency import BNB_MIN_8BIT_SIZE, import_bitsandbytes  # every tensor's states in 8 bits
from chorus.training.interrupts import InterruptRequest, RunInterrupted
from chorus.training.loss_log import LossLog, plot_losses
from chorus.training.progress import step_progress

SPEAKER_OPTIMIZERS = ("adam", "adam8bit", "sgd", "sgd8bit")
CHECKPOINT = "checkpoint"
# Fields a resumed run may change: how long it runs, where and how it saves, not what it learns from.
RESUMABLE_CHANGES = (
    "out",
    "steps",
    "checkpoint_every",
    "log_every",
    "threads",
    "device",
    "workers",
    "max_minutes",
    "checkpoint_minutes",
    "report_seconds",
)
# A budgeted run (``max_minutes``) measures its pace once this share of the budget has passed, and no
# earlier than the end of the data loader's first round of batches (all workers start at once, so the
# first batches come together and would make the pace look faster than it is).
PLAN_AFTER = 0.15


@dataclass
class SpeakerTrainConfig:
    corpus: str
    out: str
    encoder: SpeakerEncoderConfig = field(default_factory=SpeakerEncoderConfig)
    optimizer: str = "adam"
    steps: int = 2_000
    batch_speakers: int = 16
    per_speaker: int = 2
    segment_frames: int = 200  # 2.3 s at hop 256 / 22,050 Hz
    learning_rate: float | None = None  # None: 1e-3 for Adam, 0.05 for SGD
    weight_decay: float = 1e-4
    margin: float = 0.2
    # The margin is 0 (a plain cosine softmax) for the first ``margin_start`` of the steps, then grows
    # linearly to ``margin`` by ``margin_full``. With a margin from the start, or ramping from step 0,
    # training at 252 speakers collapsed to chance (every embedding orthogonal to every class centre,
    # loss ~11.5, EER 40-50%); the margin only sharpens classes that are already apart.
    margin_start: float = 0.5
    margin_full: float = 0.8
    scale: float = 30.0
    clips_per_speaker: int = 40  # at most, for training
    heldout: int = 4  # clips per speaker kept for the calibration trials
    augment_share: float = 0.7  # of the training crops, augmented on the fly; the rest stay clean
    augmentation: Augmentation = field(default_factory=Augmentation)
    augment_copies: int = 0  # fixed augmented copies per clip, made before training (the shipped recipe: 1)
    # Steps of linear learning-rate warm-up before the cosine decay: a fresh Adam state's first steps
    # move every weight by about the learning rate whatever its gradient, which unsettles a trained
    # encoder (``init``). 0: none (the recipe the encoders were trained with).
    warmup_steps: int = 0
    checkpoint_every: int = 100
    log_every: int = 10
    threads: int = 1
    device: str = "cpu"  # where the steps run: cpu, cuda or cuda:N; the crops are made on the CPU
    # Data-loader processes making the training crops while the steps run; 0: the training process
    # makes each step's crops itself. On one CPU thread a 32-crop step's crops cost ~2.2 s beside
    # ~3.5 s for its forward and backward pass; on a GPU the pass takes milliseconds, so the crops are
    # nearly all the work and are spread over processes.
    workers: int = 0
    # Wall-clock budget of the steps, in minutes (None: none). The run measures its pace, plans how many
    # of ``steps`` fit, runs the learning-rate and margin schedules over that plan and stops at it (or
    # at the budget); the checkpoint's metadata keeps the plan (``planned_steps``).
    max_minutes: float | None = None
    checkpoint_minutes: float | None = None  # also checkpoint when this much wall clock has passed
    # A progress line (step, loss, steps/s, data wait) every this many seconds when the progress bar is
    # not on a terminal (a background run's log); 0: every 100 steps.
    report_seconds: float = 0.0
    seed: int = 1234

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = SpeakerEncoderConfig.from_dict(self.encoder)
        if isinstance(self.augmentation, dict):  # from a checkpoint's JSON: tuples came back as lists
            self.augmentation = Augmentation(
                **{k: tuple(v) if isinstance(v, list) else v for k, v in self.augmentation.items()}
            )
        if self.optimizer not in SPEAKER_OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(SPEAKER_OPTIMIZERS)}, got {self.optimizer!r}")
        for name in (
            "steps",
            "batch_speakers",
            "per_speaker",
            "segment_frames",
            "heldout",
            "clips_per_speaker",
            "checkpoint_every",
            "log_every",
            "threads",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SpeakerTrainConfig.{name} must be positive")
        if not 0.0 <= self.augment_share <= 1.0 or self.augment_copies < 0:
            raise ValueError("SpeakerTrainConfig needs 0 <= augment_share <= 1 and augment_copies >= 0")
        if not 0.0 <= self.margin_start <= self.margin_full <= 1.0:
            raise ValueError("SpeakerTrainConfig needs 0 <= margin_start <= margin_full <= 1")
        if self.workers < 0 or self.warmup_steps < 0 or self.report_seconds < 0:
            raise ValueError("SpeakerTrainConfig needs workers, warmup_steps and report_seconds >= 0")
        for name in ("max_minutes", "checkpoint_minutes"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"SpeakerTrainConfig.{name} must be positive (or None)")
        if self.learning_rate is None:
            self.learning_rate = 1e-3 if self.optimizer.startswith("adam") else 0.05

    def to_dict(self) -> dict:
        """JSON-able fields (the encoder and augmentation as dicts)."""
        return dataclasses.asdict(self)


def margin_at(config: SpeakerTrainConfig, step: int, planned: int | None = None) -> float:
    """The AAM margin at ``step`` (1-based) of ``planned`` steps (default ``config.steps``): 0 until
    ``margin_start``, ``margin`` from ``margin_full``; with no ramp (``margin_start == margin_full``),
    ``margin`` from ``margin_start`` on: ``0, 0`` puts it on from the first step (classes already apart)."""
    done = (step - 1) / (planned or config.steps)
    if config.margin_full <= config.margin_start:
        return config.margin if done >= config.margin_start else 0.0
    ramp = config.margin_full - config.margin_start
    return config.margin * min(1.0, max(0.0, (done - config.margin_start) / ramp))


def learning_rate_at(config: SpeakerTrainConfig, step: int, planned: int | None = None) -> float:
    """The learning rate at ``step`` (1-based) of ``planned`` steps (default ``config.steps``): cosine
    decay to a tenth over the steps, scaled by a linear warm-up over the first ``warmup_steps``."""
    steps = planned or config.steps
    lr = config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (step - 1) / steps)))
    return lr * min(1.0, step / config.warmup_steps) if config.warmup_steps else lr


def speaker_optimizer(params, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer ``name`` (see :data:`SPEAKER_OPTIMIZERS`)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    try:
        bitsandbytes = import_bitsandbytes()
    except ImportError as error:
        raise ImportError(f"optimizer {name!r} needs bitsandbytes: pip install 'chorus-tts[memory]'") from error
    if name == "adam8bit":
        return bitsandbytes.optim.Adam8bit(params, lr=lr, weight_decay=weight_decay, min_8bit_size=BNB_MIN_8BIT_SIZE)
    if name == "sgd8bit":
        return bitsandbytes.optim.SGD8bit(
            params, lr=lr, momentum=0.9, weight_decay=weight_decay, min_8bit_size=BNB_MIN_8BIT_SIZE
        )
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(SPEAKER_OPTIMIZERS)}")


@dataclass
class SpeakerClips:
    """Clips by speaker: ``train[s]`` audio ``[samples]`` float16 at the mel rate (with any fixed
    augmented copies), ``heldout[s]`` clean log-mels ``[frames, n_mels]``."""

    speakers: list[str]
    train: list[list[np.ndarray]]
    heldout: list[list[np.ndarray]]
    augmentations: int  # fixed augmented copies made


def speaker_folders(corpus: str | Path) -> list[Path]:
    """The speaker folders of a corpus (every sub-folder with a ``metadata.csv``), in name order: the
    order of the speakers' labels."""
    root = Path(corpus)
    if not root.is_dir():
        raise ValueError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
    folders = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file())
    if len(folders) < 2:
        raise ValueError(f"{root}: a speaker encoder needs at least two speaker folders (with a metadata.csv)")
    return folders


def split_clips(folder: Path, config: SpeakerTrainConfig, rng: np.random.Generator) -> tuple[list[Path], list[Path]]:
    """One speaker's clips, shuffled by ``rng``: (``heldout`` calibration clips, at most
    ``clips_per_speaker`` training clips). :func:`prepare_clips` calls it for each folder in turn with
    one generator from ``seed``; with no fixed augmented copies (which draw from it too) a caller that
    does the same gets the same split without reading any audio."""
    utterances, _ = discover(folder)
    paths = [u.audio_path for u in utterances]
    rng.shuffle(paths)
    if len(paths) < config.heldout + 1:
        raise ValueError(f"{folder}: {len(paths)} clips; at least {config.heldout + 1} needed")
    return paths[: config.heldout], paths[config.heldout : config.heldout + config.clips_per_speaker]


def prepare_clips(config: SpeakerTrainConfig, mel_config: MelConfig, progress: bool = True) -> SpeakerClips:
    """Read every speaker folder of the corpus, hold clips out, make their features and any fixed copies.

    Training audio is kept in float16 (half the memory of float32: ~1.6 GB for 270 speakers x 44 clips
    of ~3.4 s; 11 bits of mantissa are far below any augmentation's noise)."""
    folders = speaker_folders(config.corpus)
    rng = np.random.default_rng(config.seed)
    speakers, train, heldout, made = [], [], [], 0
    with step_progress("speaker features", progress) as bar:
        task = bar.add_task("speakers", total=len(folders), status="")
        for folder in folders:
            kept, trained = split_clips(folder, config, rng)
            clips = []
            for path in trained:
                audio = _clip(path, mel_config)
                clips.append(audio.astype(np.float16))
                for _ in range(config.augment_copies):
                    copy = config.augmentation.apply(audio, mel_config.sample_rate, rng)[0]
                    clips.append(copy.astype(np.float16))
                    made += 1
            speakers.append(folder.name)
            train.append(clips)
            heldout.append([log_mel(_clip(p, mel_config), mel_config) for p in kept])
            bar.update(task, advance=1, status=folder.name)
    return SpeakerClips(speakers, train, heldout, made)


def _clip(path: Path, mel_config: MelConfig) -> np.ndarray:
    """The clip at ``path`` at the mel settings' rate; ``ValueError`` naming an empty one (its crops had divided
    by its length: a ZeroDivisionError from deep in training)."""
    audio = load_audio(path, mel_config.sample_rate)
    if not audio.size:
        raise ValueError(f"{path}: an empty clip (no samples); remove it, or its metadata line")
    return audio


def crop(mel: np.ndarray, frames: int, rng: np.random.Generator) -> np.ndarray:
    """A random ``frames``-long window of ``mel`` (a short clip is repeated to fill it)."""
    if len(mel) < frames:
        mel = np.tile(mel, (int(np.ceil(frames / len(mel))), 1))
    start = int(rng.integers(0, len(mel) - frames + 1))
    return mel[start : start + frames]


def window(audio: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """A random ``samples``-long float32 window of ``audio`` (a short clip is repeated to fill it)."""
    if len(audio) < samples:
        audio = np.tile(audio, int(np.ceil(samples / len(audio))))
    start = int(rng.integers(0, len(audio) - samples + 1))
    return audio[start : start + samples].astype(np.float32)


def training_crop(
    clips: SpeakerClips,
    speaker: int,
    config: SpeakerTrainConfig,
    mel_config: MelConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[str]]:
    """One training example of ``speaker``: a ``[segment_frames, n_mels]`` log-mel of a random window of
    one of its clips, augmented with probability ``augment_share`` (babble from other speakers' clips),
    and what was done to it."""
    rate, hop = mel_config.sample_rate, mel_config.hop_length
    audio = clips.train[speaker][int(rng.integers(len(clips.train[speaker])))]
    done: list[str] = []
    if rng.random() < config.augment_share:
        # 25% more audio than the crop needs: a faster speed or tempo shortens it.
        samples = int(1.25 * config.segment_frames * hop)
        count = min(4, len(clips.train))
        others = [s for s in rng.choice(len(clips.train), size=count, replace=False) if s != speaker][:3]
        talkers = [window(clips.train[s][int(rng.integers(len(clips.train[s])))], samples, rng) for s in others]
        piece, done = config.augmentation.apply(window(audio, samples, rng), rate, rng, talkers)
    else:
        piece = window(audio, config.segment_frames * hop, rng)
    return crop(log_mel(piece, mel_config), config.segment_frames, rng), done


def training_batch(
    clips: SpeakerClips, config: SpeakerTrainConfig, mel_config: MelConfig, step: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Step ``step``'s batch, drawn from ``default_rng([seed, step])`` alone: ``batch_speakers`` speakers
    x ``per_speaker`` crops (:func:`training_crop`) as float32 log-mels ``[batch, segment_frames,
    n_mels]``, their int64 speaker labels ``[batch]``, and how many of the crops were augmented."""
    rng = np.random.default_rng([config.seed, step])
    chosen = rng.choice(len(clips.speakers), size=min(config.batch_speakers, len(clips.speakers)), replace=False)
    mels, labels, augmented = [], [], 0
    for speaker in chosen:
        for _ in range(config.per_speaker):
            mel, done = training_crop(clips, int(speaker), config, mel_config, rng)
            mels.append(mel)
            labels.append(int(speaker))
            augmented += bool(done)
    return np.stack(mels), np.array(labels, dtype=np.int64), augmented


class TrainingBatches(IterableDataset):
    """The batches of steps ``first..last`` (:func:`training_batch`), in step order, for a
    ``DataLoader(batch_size=None)``. With ``W`` workers, worker ``w`` makes steps ``first + w``,
    ``first + w + W``, ...; the loader takes the workers' batches round-robin, so they arrive in step
    order, and each step's batch is seeded by ``(seed, step)``, not by the process that made it: the
    same batches for any number of workers, and a resumed run's are the uninterrupted run's."""

    def __init__(self, clips: SpeakerClips, config: SpeakerTrainConfig, mel_config: MelConfig, first: int, last: int):
        self.clips, self.config, self.mel_config = clips, config, mel_config
        self.first, self.last = first, last

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        worker = get_worker_info()
        offset, stride = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        for step in range(self.first + offset, self.last + 1, stride):
            yield training_batch(self.clips, self.config, self.mel_config, step)


def _crop_worker_init(_worker_id: int) -> None:
    # One thread per worker (the log-mel's STFT is torch's): the workers already fill the cores.
    torch.set_num_threads(1)
    # Ctrl-C reaches the whole process group: the training process ends its step and saves; a worker that
    # stopped on it would make the loader fail first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _as_made(batch: tuple[np.ndarray, np.ndarray, int]) -> tuple[np.ndarray, np.ndarray, int]:
    # Numpy arrays, not tensors, leave the workers: pickled through the loader's pipe instead of
    # torch's shared-memory files, which a small /dev/shm (a container's 64 MB) cannot hold.
    return batch


def _warm_crop_code(clips: SpeakerClips, config: SpeakerTrainConfig, mel_config: MelConfig) -> None:
    """One window through every effect and the log-mel, in this process, before workers fork from it:
    numba compiles librosa's phase vocoder (the tempo effect) on its first call, 8 s on one busy
    core, which every worker would otherwise spend on its own; forked, they inherit the compiled code.
    Its own generator: the training batches' randomness is untouched."""
    every = dataclasses.replace(config.augmentation, speed=1.0, tempo=1.0, reverb=1.0, noise=1.0, mic=1.0, channel=1.0)
    audio = clips.train[0][0].astype(np.float32)
    talkers = [clips.train[-1][0].astype(np.float32)]
    log_mel(every.apply(audio, mel_config.sample_rate, np.random.default_rng(0), talkers)[0], mel_config)


def training_batches(
    clips: SpeakerClips, config: SpeakerTrainConfig, mel_config: MelConfig, first: int
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """The batches of steps ``first..config.steps`` (:class:`TrainingBatches`), made ahead by
    ``config.workers`` processes (forked: they share the clips' memory instead of each unpickling a
    copy) or, with none, in this process as they are asked for."""
    dataset = TrainingBatches(clips, config, mel_config, first, config.steps)
    if config.workers == 0:
        return iter(dataset)
    if config.augment_share > 0:
        _warm_crop_code(clips, config, mel_config)
    loader = DataLoader(
        dataset,
        batch_size=None,
        collate_fn=_as_made,
        num_workers=config.workers,
        worker_init_fn=_crop_worker_init,
        prefetch_factor=2,
        multiprocessing_context="fork",
    )
    return iter(loader)


def calibration_trials(bundle: EncoderBundle, clips: SpeakerClips) -> tuple[list[float], list[bool]]:
    """Every pair of held-out clips: (cosine scores, same speaker?)."""
    device = next(bundle.encoder.parameters()).device
    embeddings, owners = [], []
    with torch.no_grad():
        for speaker, mels in enumerate(clips.heldout):
            for mel in mels:
                embeddings.append(bundle.encoder(torch.from_numpy(mel).unsqueeze(0).to(device))[0].cpu().numpy())
                owners.append(speaker)
    scores, same = [], []
    for i, j in itertools.combinations(range(len(embeddings)), 2):
        scores.append(float(np.dot(embeddings[i], embeddings[j])))
        same.append(owners[i] == owners[j])
    return scores, same


def _resumed_config(config: SpeakerTrainConfig, saved: dict, folder: Path) -> None:
    """Refuse to resume with a config that differs from the saved one in what the run learns from, naming each
    difference with both values (the corpus by the folder it is: a relative and an absolute path to it agree)."""
    before = SpeakerTrainConfig(**saved)

    def value(config: SpeakerTrainConfig, name: str) -> object:
        return Path(config.corpus).resolve() if name == "corpus" else getattr(config, name)

    changed = [
        f"{f.name} ({str(value(before, f.name))[:80]} saved, {str(value(config, f.name))[:80]} given)"
        for f in dataclasses.fields(config)
        if f.name not in RESUMABLE_CHANGES and value(config, f.name) != value(before, f.name)
    ]
    if changed:
        raise ValueError(f"{folder}: resuming needs the saved recipe; these fields differ: {'; '.join(changed)}")


def checkpoint_folder(folder: str | Path) -> Path:
    """A checkpoint folder, or the run folder holding one in ``checkpoint/``."""
    return Path(folder) / CHECKPOINT if (Path(folder) / CHECKPOINT).is_dir() else Path(folder)


def _torch_device(name: str) -> torch.device:
    """``name`` as a torch device, refused plainly when it is a GPU this machine lacks."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA GPU is available here (torch {torch.__version__})")
    return device


def train_speaker_encoder(
    config: SpeakerTrainConfig,
    *,
    progress: bool = True,
    clips: SpeakerClips | None = None,
    resume: str | Path | None = None,
    init: str | Path | None = None,
    on_save: Callable[[Path], None] | None = None,
) -> Path:
    """Train, calibrate the threshold on the held-out trials and save the encoder folder ``config.out``.

    ``clips``: features already made by :func:`prepare_clips` for this corpus (several encoders
    trained on one corpus share them); made here when None. ``resume``: a checkpoint folder (or a
    run folder holding ``checkpoint/``) to continue from, up to ``config.steps`` in all; its recipe
    must match ``config`` but for :data:`RESUMABLE_CHANGES` (a longer run stretches the learning
    rate's and margin's schedules from there on). ``init``: a checkpoint folder (or run folder) of the
    same encoder architecture and speakers whose encoder and AAM head this run starts from, with a
    fresh optimizer, step count and schedules and any recipe (give it ``margin_start = margin_full =
    0``: its classes are already apart, so the margin can be on from the first step). ``out/checkpoint``
    is written every ``checkpoint_every`` steps (and ``checkpoint_minutes``) and at the end;
    ``on_save(out)`` is called after each checkpoint and once the calibrated encoder is in ``out``."""
    if resume is not None and init is not None:
        raise ValueError("give resume (the same run, on) or init (a new run from its weights), not both")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    # The steps' order is the random numbers' order: a loaded encoder, then the fresh model, draw from
    # torch's generator, and so does a data loader when it starts its workers.
    recipe = _SpeakerEncoderRecipe(config, progress, on_save)
    recipe.load_start(resume, init)
    recipe.setup_data(clips)
    recipe.setup_model()
    recipe.start_batches()
    recipe.setup_optimizer()
    recipe.train()
    return recipe.save_and_judge()


@dataclass
class _Start:
    """The checkpoint a resumed or initialized run starts from: its folder, training state and encoder."""

    folder: Path
    state: TrainingState
    encoder: EncoderBundle


@dataclass
class _Plan:
    """The steps the schedules run over: ``config.steps``, or for a budgeted run (``max_minutes``) as many as
    fit. A budgeted run plans once it knows its pace, then again every PLAN_AFTER of its budget from the
    mean pace so far (a machine's pace drifts), and stops at its plan or at its budget."""

    steps: int  # the plan
    most: int  # config.steps: no plan goes past it
    budget: float | None  # seconds; None: no budget
    round_steps: int  # steps in one round of the data loader (one batch from each worker)
    first_round: int  # the last step of the loader's first round
    started: float  # when the loop started (time.perf_counter)
    planned_at: float  # when the plan was last made
    round_done: tuple[int, float] | None = None  # (step, time) at the end of the first round
    pace: float = 0.0  # seconds per step, as last measured

    @classmethod
    def of(cls, config: SpeakerTrainConfig, start_step: int, now: float) -> _Plan:
        """The plan of a loop that starts after ``start_step`` at ``now``: all of ``config.steps`` until timed."""
        budget = 60.0 * config.max_minutes if config.max_minutes else None
        rounds = max(config.workers, 1)
        return cls(config.steps, config.steps, budget, rounds, start_step + rounds, now, now)

    def replan(self, step: int, now: float) -> bool:
        """Plan again as ``step`` starts at ``now`` when it is time to; whether it was. The pace is timed from
        the end of the loader's first round (its first batches come together and would make the pace look
        faster than it is), over a whole round at least."""
        if self.budget is None or self.round_done is None:
            return False
        round_step, round_time = self.round_done
        if step - 1 - round_step < self.round_steps or now - self.planned_at < PLAN_AFTER * self.budget:
            return False
        self.pace = (now - round_time) / (step - 1 - round_step)
        self.steps = min(self.most, step - 1 + max(1, int((self.budget - (now - self.started)) / self.pace)))
        self.planned_at = now
        return True

    def step_done(self, step: int, now: float) -> bool:
        """Note that ``step`` ended at ``now``; whether it is the run's last."""
        if step == self.first_round:
            self.round_done = (step, now)
        return step >= self.steps or (self.budget is not None and now - self.started >= self.budget)


class _LossRows:
    """``loss.csv``: a row every ``log_every`` steps (and at the last) of the means since the row before."""

    def __init__(self, path: Path, resume_step: int):
        self.log = LossLog(path, ["step", "loss", "margin", "lr", "augmented", "seconds"], resume_step=resume_step)
        self.losses: list[float] = []
        self.augmented, self.crops = 0, 0

    def add(self, loss: float, augmented: int, crops: int) -> None:
        """A step's loss, and how many of its ``crops`` were ``augmented``."""
        self.losses.append(loss)
        self.augmented, self.crops = self.augmented + augmented, self.crops + crops

    def write(self, step: int, margin: float, lr: float, seconds: float) -> None:
        """The row of ``step``; the next row's means start."""
        row = {
            "step": step,
            "loss": f"{np.mean(self.losses):.4f}",
            "margin": f"{margin:.3f}",
            "lr": f"{lr:.3g}",
            "augmented": f"{self.augmented / self.crops:.2f}",
            "seconds": f"{seconds:.1f}",
        }
        self.log.append([row])
        self.losses, self.augmented, self.crops = [], 0, 0


@dataclass
class _Reports:
    """The progress lines of a run whose bar is not on a terminal (a background run's log): one every
    ``report_seconds`` (0: every 100 steps), with the pace and the share of time spent waiting for data
    since the line before."""

    every: float  # seconds; 0: every 100 steps
    last: float  # when the last line was printed (or the loop started)
    last_step: int
    waited: float = 0.0  # seconds spent waiting for batches since the last line

    def due(self, step: int, now: float) -> bool:
        """Whether ``step``, ended at ``now``, gets a line."""
        return now - self.last >= self.every if self.every else step % 100 == 0

    def line(
        self, step: int, now: float, planned: int, losses: list[float], lr: float, margin: float, since: float
    ) -> str:
        """The line for ``step``, ended at ``now``, ``since`` seconds into the loop; the next line's counts start."""
        rate = (step - self.last_step) / (now - self.last)
        text = (
            f"step {step}/{planned} loss {np.mean(losses[-100:]):.3f} lr {lr:.3g} "
            f"margin {margin:.3f} {rate:.2f} steps/s "
            f"(data wait {self.waited / (now - self.last):.0%}) {since:.0f} s"
        )
        self.last, self.last_step, self.waited = now, step, 0.0
        return text


class _SpeakerEncoderRecipe:
    """:func:`train_speaker_encoder`'s run as named steps, in the shape of torchtune's recipes: load where it
    starts, set up the data, the model and the optimizer, the step loop, then save and judge. One instance is
    one run; :func:`train_speaker_encoder` calls each step once, in that order."""

    def __init__(self, config: SpeakerTrainConfig, progress: bool, on_save: Callable[[Path], None] | None):
        self.config, self.progress, self.on_save = config, progress, on_save
        self.device = _torch_device(config.device)
        self.mel_config = MelConfig(n_mels=config.encoder.n_mels)
        self.out = Path(config.out)
        self.start: _Start | None = None
        self.resuming, self.init = False, None
        self.start_step, self.step, self.seconds = 0, 0, 0.0
        self.losses: list[float] = []  # every step's loss, rounded, over every session of the run
        self.initialized_from: dict | None = None

    def load_start(self, resume: str | Path | None, init: str | Path | None) -> None:
        """The checkpoint ``resume`` (the same run, on) or ``init`` (its weights alone) names; neither: a fresh run.
        Refused when there is none, when a resumed run's recipe differs, or when ``init``'s encoder is not the
        one configured."""
        self.resuming, self.init = resume is not None, init
        here = self.out / CHECKPOINT
        existing = load_training_state(here) if here.is_dir() else None
        if existing is not None and (resume is None or checkpoint_folder(resume).resolve() != here.resolve()):
            # It had been overwritten without a word: its checkpoint, encoder and loss curve.
            raise ValueError(
                f"{self.out} holds a run already (its checkpoint at step {existing.meta['step']}): "
                f"--resume {self.out} goes on with it; give another --out for a new run"
            )
        if resume is None and init is None:
            return
        folder = checkpoint_folder(resume if resume is not None else init)
        state = load_training_state(folder)
        if state is None:
            raise ValueError(f"{resume if resume is not None else init}: no speaker encoder checkpoint to start from")
        if resume is not None:
            _resumed_config(self.config, state.meta["config"], folder)
            if self.config.steps < int(state.meta["step"]):
                raise ValueError(
                    f"{folder}: its checkpoint is at step {state.meta['step']}; --steps {self.config.steps} is fewer"
                )
        self.start = _Start(folder, state, load_encoder(folder))
        if init is not None and self.start.encoder.encoder.config != self.config.encoder:
            raise ValueError(f"{folder}: its encoder is not the one configured ({self.start.encoder.encoder.config})")

    def setup_data(self, clips: SpeakerClips | None) -> None:
        """The corpus' clips: ``clips`` when given, else read and held out here."""
        self.clips = clips if clips is not None else prepare_clips(self.config, self.mel_config, self.progress)

    def setup_model(self) -> None:
        """The encoder and its AAM head over the corpus' speakers, from the starting checkpoint's weights when
        there is one; a resumed run also takes up its step, wall clock and losses."""
        config = self.config
        self.classifier = SpeakerClassifier(
            SpeakerEncoder(config.encoder), len(self.clips.speakers), config.margin, config.scale
        )
        if self.start is None:
            return
        meta = self.start.state.meta
        if meta["speakers"] != self.clips.speakers:
            raise ValueError(f"{self.start.folder}: saved for other speakers than the corpus {config.corpus} has")
        self.classifier.encoder.load_state_dict(self.start.encoder.encoder.state_dict())
        self.start.state.restore({}, {"head": self.classifier.head})
        if self.resuming:
            self.start_step, self.seconds, self.losses = int(meta["step"]), float(meta["seconds"]), meta["losses"]
            self.initialized_from = meta.get("initialized_from")  # a run begun from another's weights still was
        else:
            self.initialized_from = {"folder": str(self.init), "step": int(meta["step"])}

    def start_batches(self) -> None:
        """The batches of the steps to come (:func:`training_batches`)."""
        # The crop workers start here, forked (sharing the clips' memory), before the model moves to the
        # device: they never touch CUDA, which a child forked from a process that uses it must not.
        self.batches = training_batches(self.clips, self.config, self.mel_config, self.start_step + 1)

    def setup_optimizer(self) -> None:
        """The model on its device, then the optimizer (with a resumed run's state)."""
        self.classifier.to(self.device)
        # The optimizer after the move: its state lives beside the parameters (restored states are cast).
        self.optimizer = speaker_optimizer(
            list(self.classifier.parameters()),
            self.config.optimizer,
            self.config.learning_rate,
            self.config.weight_decay,
        )
        if self.resuming:
            self.start.state.restore({"optimizer": self.optimizer})

    def train(self) -> None:
        """The steps after ``start_step`` up to the plan's last (or the budget's end): each logged to
        ``loss.csv``, reported, and checkpointed as the config says."""
        config = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        rows = _LossRows(self.out / "loss.csv", self.start_step)
        self.classifier.train()
        self.step = self.start_step  # the last step done, should none be left to do
        self.last_saved = time.perf_counter()
        self.plan = _Plan.of(config, self.start_step, self.last_saved)
        reports = _Reports(config.report_seconds, self.last_saved, self.start_step)
        with (
            InterruptRequest() as interrupt,
            step_progress(f"speaker encoder ({config.optimizer})", self.progress) as bar,
        ):
            task = bar.add_task("steps", total=config.steps, status="", completed=self.start_step)
            for step in range(self.start_step + 1, config.steps + 1):
                self.step = step
                started = time.perf_counter()
                if self.plan.replan(step, started):
                    bar.update(task, total=self.plan.steps)
                    if self.progress:
                        print(
                            f"pace {self.plan.pace:.3f} s/step: {self.plan.steps} steps planned in {config.max_minutes:g} min",
                            flush=True,
                        )
                lr = self._set_schedules(step)
                mels, labels, made = next(self.batches)
                reports.waited += time.perf_counter() - started
                loss = self._optimizer_step(mels, labels)
                now = time.perf_counter()
                self.seconds += now - started
                self.losses.append(round(loss, 5))
                rows.add(loss, made, len(labels))
                last = self.plan.step_done(step, now)
                bar.update(task, completed=step, status=f"loss {np.mean(self.losses[-20:]):.3f}")
                stopping = interrupt.requested
                if step % config.log_every == 0 or last or stopping:
                    rows.write(step, self.classifier.head.margin, lr, self.seconds)
                if self.progress and not bar.console.is_terminal and reports.due(step, now):  # a background run's log
                    margin, since = self.classifier.head.margin, now - self.plan.started
                    print(reports.line(step, now, self.plan.steps, self.losses, lr, margin, since), flush=True)
                if self._checkpoint_due(step, now, last) or stopping:
                    self._save_checkpoint(step, rows.log.path)
                if stopping:  # not calibrated: a resumed run calibrates when it ends
                    raise RunInterrupted(
                        step, self.out / CHECKPOINT, f"the same command with --resume {self.out} goes on"
                    )
                if last:
                    break
        del self.batches  # stops the crop workers before calibration

    def _set_schedules(self, step: int) -> float:
        """Set ``step``'s learning rate and AAM margin, over the plan; the learning rate."""
        lr = learning_rate_at(self.config, step, self.plan.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.classifier.head.margin = margin_at(self.config, step, self.plan.steps)
        return lr

    def _optimizer_step(self, mels: np.ndarray, labels: np.ndarray) -> float:
        """One step on log-mels ``[batch, segment_frames, n_mels]`` of speakers ``labels`` ``[batch]``; its loss."""
        loss = self.classifier(torch.from_numpy(mels).to(self.device), torch.from_numpy(labels).to(self.device))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()  # waits for the step: the caller's timing is the step's

    def _checkpoint_due(self, step: int, now: float, last: bool) -> bool:
        """Whether ``step``, ended at ``now``, is checkpointed: every ``checkpoint_every`` steps, the last, and when
        ``checkpoint_minutes`` have passed since the last checkpoint."""
        minutes = self.config.checkpoint_minutes
        timed = minutes is not None and now - self.last_saved >= 60.0 * minutes
        return step % self.config.checkpoint_every == 0 or last or timed

    def _save_checkpoint(self, step: int, loss_csv: Path) -> None:
        """``out/checkpoint`` (encoder, AAM head, optimizer state and the run's metadata) and the loss curve."""
        meta = {"step": step, "seconds": self.seconds, "losses": self.losses, "speakers": self.clips.speakers}
        meta["config"] = self.config.to_dict()
        meta["planned_steps"] = self.plan.steps
        if self.initialized_from is not None:
            meta["initialized_from"] = self.initialized_from
        save_checkpoint(
            self.out / CHECKPOINT,
            functools.partial(save_encoder, EncoderBundle(self.classifier.encoder, self.mel_config)),
            meta,
            {"optimizer": self.optimizer},
            {"head": self.classifier.head},
        )
        plot_losses(loss_csv, self.out / "loss.png", ["loss"], title=f"speaker encoder ({self.config.optimizer})")
        self.last_saved = time.perf_counter()
        if self.on_save is not None:
            self.on_save(self.out)

    def save_and_judge(self) -> Path:
        """Calibrate the same/different threshold at the equal-error point of the held-out trials and put the
        encoder, with what made it, into ``out``; ``out``."""
        bundle = EncoderBundle(self.classifier.encoder.eval(), self.mel_config)
        scores, same = calibration_trials(bundle, self.clips)
        calibrated = verification_scores(scores, same)
        bundle.threshold = calibrated.eer_threshold
        bundle.info = self._encoder_info(calibrated)
        # save_encoder swaps in a whole folder; the encoder's two files join the run's own (checkpoint,
        # loss curve) in ``out`` instead, weights first, so its config never names weights not yet there.
        written = save_encoder(bundle, self.out.with_name(f".{self.out.name}.encoder-{os.getpid()}"))
        for name in (WEIGHTS, CONFIG):
            os.replace(written / name, self.out / name)
        written.rmdir()
        if self.on_save is not None:
            self.on_save(self.out)
        return self.out

    def _encoder_info(self, calibrated: VerificationScores) -> dict:
        """The encoder's ``info``: how it was trained, and its calibration."""
        config, clips = self.config, self.clips
        return {
            "steps": self.step,
            "train_seconds": round(self.seconds, 1),
            "optimizer": config.optimizer,
            "device": config.device,
            "speakers": len(clips.speakers),
            "train_clips": sum(len(m) for m in clips.train),
            "augmented_copies": clips.augmentations,
            "augment_share": config.augment_share,
            "resumed_from_step": self.start_step or None,
            "initialized_from": self.initialized_from,
            "final_loss": round(float(np.mean(self.losses[-20:])), 4),
            "calibration": {
                "trials": calibrated.trials,
                "eer": round(calibrated.eer, 4),
                "min_dcf": round(calibrated.min_dcf, 4),
            },
            "corpus": str(config.corpus),
            "recipe": {k: v for k, v in config.to_dict().items() if k not in ("corpus", "out", "encoder")},
        }
