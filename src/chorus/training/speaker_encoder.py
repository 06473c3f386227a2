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
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus.audio.augment import Augmentation
from chorus.audio.io import load_audio
from chorus.audio.mel import MelConfig, log_mel
from chorus.data.formats import discover
from chorus.speaker.bundle import CONFIG, WEIGHTS, EncoderBundle, load_encoder, save_encoder
from chorus.speaker.encoder import SpeakerClassifier, SpeakerEncoder, SpeakerEncoderConfig
from chorus.speaker.verification import verification_scores
from chorus.training.checkpoint import load_training_state, save_checkpoint
from chorus.training.efficiency import BNB_MIN_8BIT_SIZE  # every tensor's states in 8 bits
from chorus.training.loss_log import LossLog, plot_losses
from chorus.training.progress import step_progress

SPEAKER_OPTIMIZERS = ("adam", "adam8bit", "sgd", "sgd8bit")
CHECKPOINT = "checkpoint"
# Fields a resumed run may change: how long it runs and how it saves, not what it learns from.
RESUMABLE_CHANGES = ("out", "steps", "checkpoint_every", "log_every", "threads")


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
    checkpoint_every: int = 100
    log_every: int = 10
    threads: int = 1
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
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SpeakerTrainConfig.{name} must be positive")
        if not 0.0 <= self.augment_share <= 1.0 or self.augment_copies < 0:
            raise ValueError("SpeakerTrainConfig needs 0 <= augment_share <= 1 and augment_copies >= 0")
        if not 0.0 <= self.margin_start <= self.margin_full <= 1.0:
            raise ValueError("SpeakerTrainConfig needs 0 <= margin_start <= margin_full <= 1")
        if self.learning_rate is None:
            self.learning_rate = 1e-3 if self.optimizer.startswith("adam") else 0.05

    def to_dict(self) -> dict:
        """JSON-able fields (the encoder and augmentation as dicts)."""
        return dataclasses.asdict(self)


def margin_at(config: SpeakerTrainConfig, step: int) -> float:
    """The AAM margin at ``step`` (1-based): 0 until ``margin_start``, ``margin`` from ``margin_full``."""
    done = (step - 1) / config.steps
    ramp = max(config.margin_full - config.margin_start, 1e-9)
    return config.margin * min(1.0, max(0.0, (done - config.margin_start) / ramp))


def speaker_optimizer(params, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer ``name`` (see :data:`SPEAKER_OPTIMIZERS`)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    try:
        import bitsandbytes
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


def prepare_clips(config: SpeakerTrainConfig, mel_config: MelConfig, progress: bool = True) -> SpeakerClips:
    """Read every speaker folder of the corpus, hold clips out, make their features and any fixed copies.

    Training audio is kept in float16 (half the memory of float32: ~1.6 GB for 270 speakers x 44 clips
    of ~3.4 s; 11 bits of mantissa are far below any augmentation's noise)."""
    root = Path(config.corpus)
    folders = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file()) if root.is_dir() else []
    if len(folders) < 2:
        raise ValueError(f"{root}: a speaker encoder needs at least two speaker folders (with a metadata.csv)")
    rng = np.random.default_rng(config.seed)
    speakers, train, heldout, made = [], [], [], 0
    with step_progress("speaker features", progress) as bar:
        task = bar.add_task("speakers", total=len(folders), status="")
        for folder in folders:
            utterances, _ = discover(folder)
            paths = [u.audio_path for u in utterances]
            rng.shuffle(paths)
            if len(paths) < config.heldout + 1:
                raise ValueError(f"{folder}: {len(paths)} clips; at least {config.heldout + 1} needed")
            kept, trained = paths[: config.heldout], paths[config.heldout : config.heldout + config.clips_per_speaker]
            clips = []
            for path in trained:
                audio = load_audio(path, mel_config.sample_rate)
                clips.append(audio.astype(np.float16))
                for _ in range(config.augment_copies):
                    copy = config.augmentation.apply(audio, mel_config.sample_rate, rng)[0]
                    clips.append(copy.astype(np.float16))
                    made += 1
            speakers.append(folder.name)
            train.append(clips)
            heldout.append([log_mel(load_audio(p, mel_config.sample_rate), mel_config) for p in kept])
            bar.update(task, advance=1, status=folder.name)
    return SpeakerClips(speakers, train, heldout, made)


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
    """Refuse to resume with a config that differs from the saved one in what the run learns from."""
    before = SpeakerTrainConfig(**saved)
    changed = [
        f.name
        for f in dataclasses.fields(config)
        if f.name not in RESUMABLE_CHANGES and getattr(config, f.name) != getattr(before, f.name)
    ]
    if changed:
        raise ValueError(f"{folder}: resuming needs the saved recipe; these fields differ: {', '.join(changed)}")


def train_speaker_encoder(
    config: SpeakerTrainConfig,
    *,
    progress: bool = True,
    clips: SpeakerClips | None = None,
    resume: str | Path | None = None,
) -> Path:
    """Train, calibrate the threshold on the held-out trials and save the encoder folder ``config.out``.

    ``clips``: features already made by :func:`prepare_clips` for this corpus (several encoders
    trained on one corpus share them); made here when None. ``resume``: a checkpoint folder (or a
    run folder holding ``checkpoint/``) to continue from, up to ``config.steps`` in all; its recipe
    must match ``config`` but for :data:`RESUMABLE_CHANGES` (a longer run stretches the learning
    rate's and margin's schedules from there on). ``out/checkpoint`` is written every
    ``checkpoint_every`` steps and at the end."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    mel_config = MelConfig(n_mels=config.encoder.n_mels)
    out = Path(config.out)
    state, start_folder = None, None
    if resume is not None:
        start_folder = Path(resume) / CHECKPOINT if (Path(resume) / CHECKPOINT).is_dir() else Path(resume)
        state = load_training_state(start_folder)
        if state is None:
            raise ValueError(f"{resume}: no speaker encoder checkpoint to resume from")
        _resumed_config(config, state.meta["config"], start_folder)
    if clips is None:
        clips = prepare_clips(config, mel_config, progress)
    classifier = SpeakerClassifier(SpeakerEncoder(config.encoder), len(clips.speakers), config.margin, config.scale)
    encoder = classifier.encoder
    optimizer = speaker_optimizer(
        list(classifier.parameters()), config.optimizer, config.learning_rate, config.weight_decay
    )
    start_step, seconds, losses = 0, 0.0, []
    if state is not None:
        if state.meta["speakers"] != clips.speakers:
            raise ValueError(f"{start_folder}: saved for other speakers than the corpus {config.corpus} has")
        encoder.load_state_dict(load_encoder(start_folder).encoder.state_dict())
        state.restore({"optimizer": optimizer}, {"head": classifier.head})
        start_step, seconds, losses = int(state.meta["step"]), float(state.meta["seconds"]), state.meta["losses"]
    batch_speakers = min(config.batch_speakers, len(clips.speakers))
    out.mkdir(parents=True, exist_ok=True)
    log = LossLog(out / "loss.csv", ["step", "loss", "margin", "lr", "augmented", "seconds"], resume_step=start_step)
    logged: list[float] = []
    augmented = 0
    classifier.train()
    with step_progress(f"speaker encoder ({config.optimizer})", progress) as bar:
        task = bar.add_task("steps", total=config.steps, status="", completed=start_step)
        for step in range(start_step + 1, config.steps + 1):
            started = time.perf_counter()
            rng = np.random.default_rng([config.seed, step])
            # Cosine decay of the learning rate to a tenth.
            lr = config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (step - 1) / config.steps)))
            for group in optimizer.param_groups:
                group["lr"] = lr
            classifier.head.margin = margin_at(config, step)
            chosen = rng.choice(len(clips.speakers), size=batch_speakers, replace=False)
            mels, labels = [], []
            for speaker in chosen:
                for _ in range(config.per_speaker):
                    mel, done = training_crop(clips, int(speaker), config, mel_config, rng)
                    mels.append(mel)
                    labels.append(int(speaker))
                    augmented += bool(done)
            loss = classifier(torch.from_numpy(np.stack(mels)), torch.tensor(labels))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seconds += time.perf_counter() - started
            losses.append(round(loss.item(), 5))
            logged.append(loss.item())
            bar.update(task, completed=step, status=f"loss {np.mean(losses[-20:]):.3f}")
            if step % config.log_every == 0 or step == config.steps:
                row = {
                    "step": step,
                    "loss": f"{np.mean(logged):.4f}",
                    "margin": f"{classifier.head.margin:.3f}",
                    "lr": f"{lr:.3g}",
                    "augmented": f"{augmented / (len(logged) * len(mels)):.2f}",
                    "seconds": f"{seconds:.1f}",
                }
                log.append([row])
                logged, augmented = [], 0
            if progress and not bar.console.is_terminal and step % 100 == 0:  # a background run's log
                print(
                    f"step {step}/{config.steps} loss {np.mean(losses[-100:]):.3f} {seconds / step:.2f} s/step",
                    flush=True,
                )
            if step % config.checkpoint_every == 0 or step == config.steps:
                meta = {"step": step, "seconds": seconds, "losses": losses, "speakers": clips.speakers}
                meta["config"] = config.to_dict()
                save_checkpoint(
                    out / CHECKPOINT,
                    functools.partial(save_encoder, EncoderBundle(encoder, mel_config)),
                    meta,
                    {"optimizer": optimizer},
                    {"head": classifier.head},
                )
                plot_losses(log.path, out / "loss.png", ["loss"], title=f"speaker encoder ({config.optimizer})")
    bundle = EncoderBundle(encoder.eval(), mel_config)
    scores, same = calibration_trials(bundle, clips)
    calibrated = verification_scores(scores, same)
    bundle.threshold = calibrated.eer_threshold
    bundle.info = {
        "steps": config.steps,
        "train_seconds": round(seconds, 1),
        "optimizer": config.optimizer,
        "speakers": len(clips.speakers),
        "train_clips": sum(len(m) for m in clips.train),
        "augmented_copies": clips.augmentations,
        "augment_share": config.augment_share,
        "resumed_from_step": start_step or None,
        "final_loss": round(float(np.mean(losses[-20:])), 4),
        "calibration": {
            "trials": calibrated.trials,
            "eer": round(calibrated.eer, 4),
            "min_dcf": round(calibrated.min_dcf, 4),
        },
        "corpus": str(config.corpus),
        "recipe": {k: v for k, v in config.to_dict().items() if k not in ("corpus", "out", "encoder")},
    }
    # save_encoder swaps in a whole folder; the encoder's two files join the run's own (checkpoint,
    # loss curve) in ``out`` instead, weights first, so its config never names weights not yet there.
    written = save_encoder(bundle, out.with_name(f".{out.name}.encoder-{os.getpid()}"))
    for name in (WEIGHTS, CONFIG):
        os.replace(written / name, out / name)
    written.rmdir()
    return out
