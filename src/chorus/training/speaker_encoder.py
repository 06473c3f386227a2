"""Training the speaker encoder on a corpus of speaker folders, with offline augmentation and 32-bit or
8-bit optimizer states.

Every sub-folder of the corpus with a ``metadata.csv`` is a speaker (the corpus' voices, and the
virtual speakers its sox chains make: ``chorus.corpus.virtual``). Per speaker, ``heldout`` clips are
kept out of training: after the last step they make verification trials (every pair of them, same
and different speakers) whose equal-error point becomes the encoder's same/different threshold.
The training clips are turned into log-mels once, with ``augment_copies`` augmented copies of each
(:class:`~chorus.audio.augment.Augmentation`). Each step takes ``batch_speakers`` speakers x
``per_speaker`` clips, a random ``segment_frames`` crop of each, and the AAM softmax loss.

Optimizers: ``adam`` / ``sgd`` (torch, SGD with momentum 0.9) and ``adam8bit`` / ``sgd8bit``
(bitsandbytes, block-wise dynamic quantization of the states). bitsandbytes keeps tensors under
4,096 values in 32 bits unless told otherwise; here every state of every tensor is 8-bit
(``min_8bit_size=1``), so the 8-bit runs are 8-bit for every state they claim.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus.audio.augment import Augmentation
from chorus.audio.io import load_audio
from chorus.audio.mel import MelConfig, log_mel
from chorus.data.formats import discover
from chorus.speaker.bundle import EncoderBundle, save_encoder
from chorus.speaker.encoder import SpeakerClassifier, SpeakerEncoder, SpeakerEncoderConfig
from chorus.speaker.verification import verification_scores
from chorus.training.efficiency import BNB_MIN_8BIT_SIZE  # every tensor's states in 8 bits
from chorus.training.progress import step_progress

SPEAKER_OPTIMIZERS = ("adam", "adam8bit", "sgd", "sgd8bit")


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
    augment_copies: int = 1
    threads: int = 1
    seed: int = 1234

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = SpeakerEncoderConfig.from_dict(self.encoder)
        if self.optimizer not in SPEAKER_OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(SPEAKER_OPTIMIZERS)}, got {self.optimizer!r}")
        for name in ("steps", "batch_speakers", "per_speaker", "segment_frames", "heldout", "clips_per_speaker"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SpeakerTrainConfig.{name} must be positive")
        if not 0.0 <= self.margin_start <= self.margin_full <= 1.0:
            raise ValueError("SpeakerTrainConfig needs 0 <= margin_start <= margin_full <= 1")
        if self.learning_rate is None:
            self.learning_rate = 1e-3 if self.optimizer.startswith("adam") else 0.05


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
    """Log-mels ``[frames, n_mels]`` by speaker: ``train[s]`` (with augmented copies), ``heldout[s]`` (clean)."""

    speakers: list[str]
    train: list[list[np.ndarray]]
    heldout: list[list[np.ndarray]]
    augmentations: int  # augmented copies made


def prepare_clips(config: SpeakerTrainConfig, mel_config: MelConfig, progress: bool = True) -> SpeakerClips:
    """Read every speaker folder of the corpus, hold clips out, make the features and augmented copies."""
    root = Path(config.corpus)
    folders = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file()) if root.is_dir() else []
    if len(folders) < 2:
        raise ValueError(f"{root}: a speaker encoder needs at least two speaker folders (with a metadata.csv)")
    rng = np.random.default_rng(config.seed)
    augment = Augmentation()
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
            mels = []
            for path in trained:
                audio = load_audio(path, mel_config.sample_rate)
                mels.append(log_mel(audio, mel_config))
                for _ in range(config.augment_copies):
                    mels.append(log_mel(augment.apply(audio, mel_config.sample_rate, rng)[0], mel_config))
                    made += 1
            speakers.append(folder.name)
            train.append(mels)
            heldout.append([log_mel(load_audio(p, mel_config.sample_rate), mel_config) for p in kept])
            bar.update(task, advance=1, status=folder.name)
    return SpeakerClips(speakers, train, heldout, made)


def crop(mel: np.ndarray, frames: int, rng: np.random.Generator) -> np.ndarray:
    """A random ``frames``-long window of ``mel`` (a short clip is repeated to fill it)."""
    if len(mel) < frames:
        mel = np.tile(mel, (int(np.ceil(frames / len(mel))), 1))
    start = int(rng.integers(0, len(mel) - frames + 1))
    return mel[start : start + frames]


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


def train_speaker_encoder(
    config: SpeakerTrainConfig, *, progress: bool = True, clips: SpeakerClips | None = None
) -> Path:
    """Train, calibrate the threshold on the held-out trials and save the encoder folder ``config.out``.

    ``clips``: features already made by :func:`prepare_clips` for this corpus (several encoders
    trained on one corpus share them); made here when None."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    mel_config = MelConfig(n_mels=config.encoder.n_mels)
    if clips is None:
        clips = prepare_clips(config, mel_config, progress)
    classifier = SpeakerClassifier(SpeakerEncoder(config.encoder), len(clips.speakers), config.margin, config.scale)
    encoder = classifier.encoder
    optimizer = speaker_optimizer(
        list(classifier.parameters()), config.optimizer, config.learning_rate, config.weight_decay
    )
    rng = np.random.default_rng(config.seed + 1)
    batch_speakers = min(config.batch_speakers, len(clips.speakers))
    seconds, losses = 0.0, []
    classifier.train()
    with step_progress(f"speaker encoder ({config.optimizer})", progress) as bar:
        task = bar.add_task("steps", total=config.steps, status="")
        for step in range(1, config.steps + 1):
            started = time.perf_counter()
            # Cosine decay of the learning rate to a tenth.
            for group in optimizer.param_groups:
                group["lr"] = config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (step - 1) / config.steps)))
            classifier.head.margin = margin_at(config, step)
            chosen = rng.choice(len(clips.speakers), size=batch_speakers, replace=False)
            mels, labels = [], []
            for speaker in chosen:
                for index in rng.choice(len(clips.train[speaker]), size=config.per_speaker):
                    mels.append(crop(clips.train[speaker][index], config.segment_frames, rng))
                    labels.append(int(speaker))
            loss = classifier(torch.from_numpy(np.stack(mels)), torch.tensor(labels))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seconds += time.perf_counter() - started
            losses.append(loss.item())
            bar.update(task, completed=step, status=f"loss {np.mean(losses[-20:]):.3f}")
            if progress and not bar.console.is_terminal and step % 100 == 0:  # a background run's log
                print(
                    f"step {step}/{config.steps} loss {np.mean(losses[-100:]):.3f} {seconds / step:.2f} s/step",
                    flush=True,
                )
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
        "final_loss": round(float(np.mean(losses[-20:])), 4),
        "calibration": {
            "trials": calibrated.trials,
            "eer": round(calibrated.eer, 4),
            "min_dcf": round(calibrated.min_dcf, 4),
        },
        "corpus": str(config.corpus),
        "recipe": {k: v for k, v in vars(config).items() if k not in ("corpus", "out", "encoder")},
    }
    return save_encoder(bundle, config.out)
