"""Training the Vocos vocoder: data, losses and the loop in one file; checkpoints, the loss log and
the progress bar are every training loop's own (:mod:`chorus.training.checkpoint`,
:mod:`~chorus.training.loss_log`, :mod:`~chorus.training.progress`). :func:`train_vocoder` is a
recipe of named steps: set up the model, the optimizers and the data, then the step loop, which logs,
saves and writes a sample to judge by ear as it goes.

Data: random 0.5-1 s crops of every ``**/wavs/*.wav`` under the data roots (LJSpeech-style
``<speaker>/wavs/``; for the shipped vocoder ``corpus_out/train`` and ``corpus_out/vocoder``), read
from disk on demand; mels are computed on the fly with the same
:class:`~chorus.audio.mel.MelSpectrogram` the acoustic model uses, so vocoder and model agree.
With ``aligned_model`` (fine-tuning, usually with ``init_from``) the vocoder is fed that acoustic
model's teacher-forced log-mels of the clips instead (:class:`AlignedSampler`), and still judged
against the clips themselves.

Loss: L1 between the log-mels of output and input, plus a multi-resolution STFT loss (spectral
convergence + log-magnitude L1 at 3 resolutions, Yamamoto et al., Parallel WaveGAN). Optionally
adversarial training, as HiFi-GAN and Vocos train: a multi-period discriminator on the waveform
(``"period"``, HiFi-GAN's MPD) and a multi-resolution spectrogram discriminator (``"resolution"``,
UnivNet's MRD), both made light for a CPU, with least-squares GAN and feature-matching losses; off by
default in a run from scratch because it multiplies the CPU cost of a step (see
:class:`VocoderTrainConfig`).

Every step's randomness comes from ``(seed, step)`` and the learning rate depends only on the step,
so a resumed run follows exactly the path of an uninterrupted one.

``out_dir`` holds:

* ``vocoder.safetensors`` + ``vocoder.json``: latest weights, ``load_vocoder(out_dir)`` reads them;
* ``checkpoint/``: the same plus the training state (:mod:`chorus.training.checkpoint`: optimizer
  tensors, the discriminators, step, config, optimizer hyperparameters); no pickle anywhere. With
  ``checkpoint_optimizers=False`` it keeps weights only (small enough to commit); a run resumed from it
  starts its Adam moments afresh, which with beta2 = 0.9 are re-estimated within ~20 steps;
* ``loss.csv`` (means over each ``log_every`` steps; ``seconds`` counts from the start of this call)
  and ``loss.png``; ``samples/`` with a reference clip and its resynthesis at each checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from chorus.audio.io import downmix, load_audio, save_audio
from chorus.audio.mel import MelConfig, MelSpectrogram, log_mel
from chorus.audio.vocoders import Vocos, VocosConfig, load_vocoder
from chorus.audio.vocoders.base import WEIGHTS_FILE
from chorus.data.formats import Utterance, discover
from chorus.models.bundle import ModelBundle, load_bundle, teacher_forced_mel
from chorus.training.checkpoint import TrainingState, load_training_state, save_checkpoint
from chorus.training.interrupts import InterruptRequest, RunInterrupted
from chorus.training.loss_log import LossLog, plot_losses
from chorus.training.progress import step_progress

CHECKPOINT = "checkpoint"
PLOTTED = ("loss", "mel_l1", "stft_sc", "stft_log_mag")
ADVERSARIAL_PLOTTED = ("adversarial", "feature_matching", "discriminator")
DISCRIMINATORS = ("period", "resolution")


@dataclass(frozen=True)
class VocoderTrainConfig:
    """Defaults are sized for a CPU run: ~0.3 s/step at 1 thread for the default Vocos."""

    vocoder: VocosConfig = VocosConfig()
    mel: MelConfig = MelConfig()
    batch_size: int = 8
    min_segment_seconds: float = 0.5
    max_segment_seconds: float = 1.0
    learning_rate: float = 1e-3  # beat 5e-4 (mel L1 0.62 vs 0.72 at step 400) on a CPU-sized run
    warmup_steps: int = 200
    # Per-step exponential decay (x0.37 after 10k steps): a function of the step alone, so extending
    # or resuming a run never changes the schedule of the steps already taken.
    lr_decay: float = 0.9999
    betas: tuple[float, float] = (0.8, 0.9)  # HiFi-GAN/Vocos values
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # one loud crop early on must not throw the exp() magnitude head off
    mel_loss_weight: float = 1.0
    stft_loss_weight: float = 1.0
    # (n_fft, hop, window) of Parallel WaveGAN's multi-resolution STFT loss; the discriminator uses them too.
    stft_resolutions: tuple[tuple[int, int, int], ...] = ((512, 50, 240), (1024, 120, 600), (2048, 240, 1200))
    # Adversarial training: any of DISCRIMINATORS; () trains on the reconstruction losses alone.
    discriminators: tuple[str, ...] = ()
    discriminator_channels: int = 8  # the spectrogram discriminator's convs
    # HiFi-GAN's periods, primes so that no two see the same samples side by side; its channels are
    # 32 ... 1024, ~300x the compute of these.
    periods: tuple[int, ...] = (2, 3, 5, 7, 11)
    period_channels: tuple[int, ...] = (16, 32, 64, 64)
    # HiFi-GAN's 1 : 2 : 45 (adversarial : feature matching : mel L1) is 0.022 : 0.044 : 1; the STFT loss
    # here doubles the reconstruction terms, so twice that.
    adversarial_weight: float = 0.05
    feature_matching_weight: float = 0.1
    checkpoint_every: int = 500
    checkpoint_optimizers: bool = True  # False: weights only (see the module docstring)
    log_every: int = 10
    seed: int = 0
    # Fine-tuning: start from this saved vocoder's weights (None: from scratch) ...
    init_from: str | None = None
    # ... and feed it this acoustic model's teacher-forced log-mels of the clips instead of the clips'
    # own (ground-truth-aligned, "GTA", training, as Tacotron 2's WaveNet had), so it learns to turn the
    # model's smoother spectra into the recordings. None: the clips' own log-mels.
    aligned_model: str | None = None
    aligned_clips_per_voice: int = 40
    # Share of each batch drawn from those forced mels; the rest are crops of the data roots with their
    # own mels, so a vocoder tuned to the model's spectra keeps its copy synthesis of real speech.
    aligned_fraction: float = 1.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> VocoderTrainConfig:
        fields = dict(data)
        fields["vocoder"] = VocosConfig(**fields["vocoder"])
        fields["mel"] = MelConfig(**fields["mel"])
        fields["betas"] = tuple(fields["betas"])  # JSON made them lists
        fields["stft_resolutions"] = tuple(tuple(r) for r in fields["stft_resolutions"])
        for name in ("discriminators", "periods", "period_channels"):
            fields[name] = tuple(fields[name])
        return cls(**fields)

    def __post_init__(self) -> None:
        unknown = set(self.discriminators) - set(DISCRIMINATORS)
        if unknown:
            raise ValueError(f"unknown discriminators {sorted(unknown)}; known: {', '.join(DISCRIMINATORS)}")


@dataclass(frozen=True)
class VocoderTrainResult:
    step: int
    losses: dict[str, float]  # means over the last log interval
    steps_per_second: float  # over this call's steps
    out_dir: Path


# --------------------------------------------------------------------------------------------- data


class SegmentSampler:
    """Random crops of every ``**/wavs/*.wav`` under one or more roots, read from disk when needed.

    Files are drawn with probability proportional to duration, so every second of audio is equally
    likely; crops longer than a file are zero-padded; files at another rate are resampled.
    """

    def __init__(self, data_roots: Sequence[Path], sample_rate: int):
        self.files = sorted(path for root in data_roots for path in Path(root).glob("**/wavs/*.wav"))
        if not self.files:
            roots = ", ".join(str(root) for root in data_roots)
            raise FileNotFoundError(f"{roots}: no wavs/*.wav found (expected <speaker>/wavs/*.wav)")
        infos = [sf.info(str(path)) for path in self.files]
        self.rates = [info.samplerate for info in infos]
        self.lengths = [info.frames for info in infos]
        seconds = np.array([info.frames / info.samplerate for info in infos])
        self.weights = seconds / seconds.sum()
        self.sample_rate = sample_rate

    def batch(self, rng: np.random.Generator, batch_size: int, length: int) -> torch.Tensor:
        """``[batch_size, length]`` float32 audio."""
        picks = rng.choice(len(self.files), size=batch_size, p=self.weights)
        return torch.from_numpy(np.stack([self.crop(int(i), length, rng) for i in picks]))

    def crop(self, index: int, length: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """``length`` samples from file ``index``: at a random offset, or from the start without rng."""
        rate = self.rates[index]
        source_length = math.ceil(length * rate / self.sample_rate)
        start = int(rng.integers(0, max(self.lengths[index] - source_length, 0) + 1)) if rng else 0
        audio, _ = sf.read(str(self.files[index]), start=start, frames=source_length, dtype="float32", always_2d=True)
        audio = downmix(audio)
        if rate != self.sample_rate:
            audio = soxr.resample(audio, rate, self.sample_rate)
        audio = audio[:length]
        return np.pad(audio, (0, length - len(audio))).astype(np.float32)


class AlignedSampler:
    """Random crops of (an acoustic model's teacher-forced log-mel of a clip, the clip), frame for frame.

    For each speaker folder under the ``data_roots`` that is one of ``bundle``'s speakers, its first
    ``clips_per_voice`` clips are forced through the model once (:func:`~chorus.synthesis.teacher_forced_mel`)
    and kept in memory: mel ``[frames, n_mels]`` beside audio padded to ``frames * hop`` samples.
    Clips are drawn in proportion to their length, as :class:`SegmentSampler` draws files.
    """

    def __init__(self, data_roots: Sequence[Path], bundle: ModelBundle, clips_per_voice: int, progress: bool = False):
        folders = sorted(
            p
            for root in data_roots
            for p in Path(root).iterdir()
            if (p / "metadata.csv").is_file() and p.name in bundle.speakers
        )
        if not folders:
            raise FileNotFoundError(
                f"{', '.join(str(root) for root in data_roots)}: no speaker folder named after one of the model's speakers "
                f"({', '.join(bundle.speakers[:5])}, ...)"
            )
        self.hop = bundle.mel_config.hop_length
        self.mels: list[torch.Tensor] = []
        self.audio: list[torch.Tensor] = []
        self.skipped: list[str] = []  # clips that could not be read, each "path: why", as pretraining skips them
        voices = [(folder.name, discover(folder)[0]) for folder in folders]
        with step_progress("teacher-forced mels", progress) as bar:
            task = bar.add_task("clips", total=sum(min(len(u), clips_per_voice) for _, u in voices), status="")
            for voice, utterances in voices:
                taken = 0
                for utterance in utterances:
                    if taken == clips_per_voice:
                        break
                    if self._force(bundle, voice, utterance):
                        taken += 1
                        bar.advance(task)
        for line in self.skipped:
            print(f"skipped {line}")
        if not self.mels:
            raise ValueError(f"no clip of {', '.join(str(f) for f in folders)} could be read")
        frames = np.array([len(mel) for mel in self.mels], dtype=np.float64)
        self.weights = frames / frames.sum()

    def _force(self, bundle: ModelBundle, voice: str, utterance: Utterance) -> bool:
        """Keep ``utterance``'s clip and its teacher-forced mel; False (and the reason kept) if its audio cannot
        be read (a metadata line whose file is missing had ended the run 17 clips in)."""
        try:
            audio = load_audio(utterance.audio_path, bundle.mel_config.sample_rate)
        except (OSError, ValueError, RuntimeError) as error:
            message = str(error)  # most name the file themselves
            self.skipped.append(
                message if str(utterance.audio_path) in message else f"{utterance.audio_path}: {message}"
            )
            return False
        mel = teacher_forced_mel(
            bundle,
            utterance.text,
            torch.from_numpy(log_mel(audio, bundle.mel_config)),
            bundle.speaker_index(voice),
        )
        samples = mel.shape[0] * self.hop
        self.mels.append(mel.float())
        self.audio.append(torch.from_numpy(np.pad(audio, (0, max(samples - len(audio), 0)))[:samples]))
        return True

    def batch(self, rng: np.random.Generator, batch_size: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(audio ``[batch_size, frames * hop]``, its teacher-forced log-mel ``[batch_size, frames, n_mels]``)."""
        audio, mels = [], []
        for index in rng.choice(len(self.mels), size=batch_size, p=self.weights):
            mel, clip = self.mels[index], self.audio[index]
            start = int(rng.integers(0, max(len(mel) - frames, 0) + 1))
            mel = mel[start : start + frames]
            # A clip shorter than the crop: pad with its quietest frame (silence), the audio with zeros.
            mel = torch.cat([mel, mel.min(0).values.expand(frames - len(mel), -1)])
            clip = clip[start * self.hop : (start + frames) * self.hop]
            audio.append(F.pad(clip, (0, frames * self.hop - len(clip))))
            mels.append(mel)
        return torch.stack(audio), torch.stack(mels)


# ------------------------------------------------------------------------------------------- losses


def _stft_magnitude(audio: torch.Tensor, n_fft: int, hop: int, win: int) -> torch.Tensor:
    """``[batch, samples]`` -> ``[batch, n_fft // 2 + 1, frames]``.

    Floored at the mel features' 1e-5, not lower: log-magnitude errors in near-silent bins (band
    limits, digital silence) would otherwise dominate the loss.
    """
    window = torch.hann_window(win, device=audio.device)
    spec = torch.stft(audio, n_fft, hop, win, window, center=True, return_complex=True)
    return spec.abs().clamp(min=1e-5)


def multi_resolution_stft_loss(
    predicted: torch.Tensor, target: torch.Tensor, resolutions: tuple[tuple[int, int, int], ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(predicted, target) [batch, samples]`` -> (spectral convergence, log-magnitude L1), each
    averaged over the resolutions. Several resolutions keep any one STFT's time/frequency trade-off
    from being gamed."""
    convergence = magnitude = predicted.new_zeros(())
    for n_fft, hop, win in resolutions:
        p, t = _stft_magnitude(predicted, n_fft, hop, win), _stft_magnitude(target, n_fft, hop, win)
        convergence = convergence + torch.linalg.norm(t - p) / torch.linalg.norm(t)
        magnitude = magnitude + F.l1_loss(p.log(), t.log())
    return convergence / len(resolutions), magnitude / len(resolutions)


def _feature_maps(stack: nn.ModuleList, x: torch.Tensor) -> list[torch.Tensor]:
    """Every conv's output in turn (leaky ReLU between them); the last is the logits."""
    features = []
    for index, conv in enumerate(stack):
        x = conv(x)
        if index < len(stack) - 1:
            x = F.leaky_relu(x, 0.1)
        features.append(x)
    return features


class SpectrogramDiscriminator(nn.Module):
    """UnivNet's multi-resolution discriminator, made light: one 2-D conv stack per STFT resolution.

    The first four convs halve both time and frequency (UnivNet's keep time and use wider kernels,
    ~9x the compute, which at 16 channels made a CPU step 20x slower than the generator alone).
    ``audio [batch, samples]`` -> per resolution, a list of feature maps whose last is the logits.
    """

    def __init__(self, resolutions: tuple[tuple[int, int, int], ...], channels: int):
        super().__init__()
        self.resolutions = resolutions
        self.stacks = nn.ModuleList(
            nn.ModuleList(
                [
                    nn.Conv2d(1, channels, (3, 5), stride=2, padding=(1, 2)),
                    *(nn.Conv2d(channels, channels, (3, 5), stride=2, padding=(1, 2)) for _ in range(3)),
                    nn.Conv2d(channels, channels, 3, padding=1),
                    nn.Conv2d(channels, 1, 3, padding=1),
                ]
            )
            for _ in resolutions
        )

    def forward(self, audio: torch.Tensor) -> list[list[torch.Tensor]]:
        outputs = []
        for (n_fft, hop, win), stack in zip(self.resolutions, self.stacks):
            # [batch, 1, frames, bins]: frequency is the strided axis.
            x = _stft_magnitude(audio, n_fft, hop, win).transpose(1, 2).unsqueeze(1)
            outputs.append(_feature_maps(stack, x))
        return outputs


class PeriodDiscriminator(nn.Module):
    """HiFi-GAN's multi-period discriminator, made light: per period ``p`` the waveform is folded into
    ``[samples / p, p]`` and 2-D convs with ``(5, 1)`` kernels look along each phase of the period, so
    they judge the periodic structure (pitch pulses, their phase) that spectral losses leave loose.
    ``audio [batch, samples]`` -> per period, a list of feature maps whose last is the logits."""

    def __init__(self, periods: tuple[int, ...], channels: tuple[int, ...]):
        super().__init__()
        self.periods = periods

        def stack() -> nn.ModuleList:
            widths = (1, *channels)
            convs = [nn.Conv2d(a, b, (5, 1), stride=(3, 1), padding=(2, 0)) for a, b in zip(widths, widths[1:])]
            return nn.ModuleList([*convs, nn.Conv2d(widths[-1], 1, (3, 1), padding=(1, 0))])

        self.stacks = nn.ModuleList(stack() for _ in periods)

    def forward(self, audio: torch.Tensor) -> list[list[torch.Tensor]]:
        outputs = []
        for period, stack in zip(self.periods, self.stacks):
            x = F.pad(audio, (0, -audio.shape[-1] % period), mode="reflect")
            outputs.append(_feature_maps(stack, x.view(audio.shape[0], 1, -1, period)))  # [batch, 1, samples / p, p]
        return outputs


class Discriminators(nn.Module):
    """The configured discriminators side by side: ``audio [batch, samples]`` -> every sub-discriminator's
    feature maps (last = logits), periods first."""

    def __init__(self, config: VocoderTrainConfig):
        super().__init__()
        self.parts = nn.ModuleDict()
        if "period" in config.discriminators:
            self.parts["period"] = PeriodDiscriminator(config.periods, config.period_channels)
        if "resolution" in config.discriminators:
            self.parts["resolution"] = SpectrogramDiscriminator(config.stft_resolutions, config.discriminator_channels)

    def forward(self, audio: torch.Tensor) -> list[list[torch.Tensor]]:
        return [features for part in self.parts.values() for features in part(audio)]


def discriminator_loss(real: list[list[torch.Tensor]], fake: list[list[torch.Tensor]]) -> torch.Tensor:
    """Least-squares GAN: real logits -> 1, fake logits -> 0."""
    return sum(((1 - r[-1]) ** 2).mean() + (f[-1] ** 2).mean() for r, f in zip(real, fake))


def generator_losses(
    real: list[list[torch.Tensor]], fake: list[list[torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(adversarial, feature matching): fake logits -> 1, and L1 between real and fake feature maps."""
    adversarial = sum(((1 - f[-1]) ** 2).mean() for f in fake)
    matching = sum(F.l1_loss(fm, rm) for r, f in zip(real, fake) for rm, fm in zip(r[:-1], f[:-1]))
    return adversarial, matching


def update_discriminator(
    discriminator: nn.Module, optimizer: torch.optim.Optimizer, real: torch.Tensor, fake: torch.Tensor, clip: float
) -> torch.Tensor:
    """One update of ``discriminator`` on ``real`` audio against ``fake`` (detached here), both
    ``[batch, samples]``, its gradient norm clipped to ``clip``; returns its loss."""
    loss = discriminator_loss(discriminator(real), discriminator(fake.detach()))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(discriminator.parameters(), clip)
    optimizer.step()
    return loss


def adversarial_terms(
    discriminator: nn.Module, real: torch.Tensor, fake: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`generator_losses` of ``fake`` against ``real`` ``[batch, samples]``, with gradients to ``fake``
    only: through a frozen discriminator, whose own gradients would go unused."""
    discriminator.requires_grad_(False)
    with torch.no_grad():
        real_features = discriminator(real)
    terms = generator_losses(real_features, discriminator(fake))
    discriminator.requires_grad_(True)
    return terms


# -------------------------------------------------------------------------------------------- train


def _load_start(config: VocoderTrainConfig) -> Vocos:
    """The vocoder ``config.init_from`` names, checked to have the architecture being trained."""
    start = load_vocoder(config.init_from, mel_config=config.mel)
    if not isinstance(start, Vocos) or start.config != config.vocoder:
        raise ValueError(f"{config.init_from}: not a Vocos vocoder with config {config.vocoder}")
    return start


def _saved_discriminator(state: TrainingState | None) -> dict[str, torch.Tensor]:
    """The discriminators' tensors a checkpoint's training state holds, by their own names (none: empty)."""
    if state is None:
        return {}
    prefix = "discriminator."
    return {key.removeprefix(prefix): value for key, value in state.tensors.items() if key.startswith(prefix)}


def _load_start_discriminator(config: VocoderTrainConfig, discriminator: nn.Module) -> None:
    """When ``config.init_from`` is a training run with these discriminators, start from its trained ones: a
    fresh discriminator would spend its first steps on a generator that is already good."""
    start = Path(config.init_from)  # a run folder, or its checkpoint folder itself
    saved = _saved_discriminator(load_training_state(start / CHECKPOINT) or load_training_state(start))
    own = discriminator.state_dict()
    if saved.keys() == own.keys() and all(saved[key].shape == own[key].shape for key in own):
        discriminator.load_state_dict(saved)


def load_discriminators(folder: str | Path) -> tuple[Discriminators, int]:
    """The discriminators a vocoder training run saved in checkpoint ``folder`` (``chorus train-vocoder``'s
    ``checkpoint/``), as trained, and the sample rate they judge (their run's mel config)."""
    state = load_training_state(folder)
    saved = _saved_discriminator(state)
    if not saved:
        raise ValueError(
            f"{folder}: no discriminators saved there (a chorus train-vocoder checkpoint/ folder holds them)"
        )
    config = VocoderTrainConfig.from_dict(state.meta["config"])
    discriminators = Discriminators(config)
    discriminators.load_state_dict(saved)
    return discriminators, config.mel.sample_rate


def learning_rate(step: int, config: VocoderTrainConfig) -> float:
    """Linear warm-up, then exponential decay; depends on the step alone."""
    return config.learning_rate * min(1.0, (step + 1) / config.warmup_steps) * config.lr_decay**step


def train_vocoder(
    data_roots: Path | Sequence[Path],
    out_dir: Path,
    config: VocoderTrainConfig | None = None,
    steps: int = 20_000,
    resume: bool = False,
    threads: int = 1,
    show_progress: bool = True,
) -> VocoderTrainResult:
    """Train a Vocos vocoder up to ``steps`` total steps; returns the final step and losses.

    ``resume``: continue from ``out_dir/checkpoint`` if there is one (with no checkpoint, start
    fresh). Without it, an existing checkpoint is refused rather than overwritten. On resume the
    saved config is used; passing a different one is an error.
    """
    if steps < 1 or threads < 1:
        raise ValueError(f"steps and threads must be at least 1, got {steps} and {threads}")
    data_roots = [Path(data_roots)] if isinstance(data_roots, str | Path) else [Path(root) for root in data_roots]
    out_dir = Path(out_dir)
    torch.set_num_threads(threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = load_training_state(out_dir / CHECKPOINT)
    config = _run_config(config, state, resume, out_dir)

    torch.manual_seed(config.seed)
    # The model comes before the data: loading an aligned model draws from the same random generator.
    model, discriminator = _setup_model(config, state, out_dir / CHECKPOINT)
    optimizers = _setup_optimizers(config, model, discriminator, state)
    start_step = int(state.meta["step"]) if state is not None else 0
    if start_step >= steps:  # said before the data's setup (GTA's forced mels take minutes)
        print(f"{out_dir / CHECKPOINT} is at step {start_step} already: nothing to train to --steps {steps}")
        return VocoderTrainResult(step=start_step, losses={}, steps_per_second=0.0, out_dir=out_dir)
    data = _setup_data(data_roots, config, show_progress)
    loop = _VocoderLoop(config, out_dir, model, discriminator, optimizers, data, start_step)
    started = time.perf_counter()
    losses = loop.train(steps, started, show_progress)
    elapsed = time.perf_counter() - started
    return VocoderTrainResult(
        step=max(start_step, steps),
        losses=losses,
        steps_per_second=max(steps - start_step, 0) / elapsed,
        out_dir=out_dir,
    )


def _run_config(
    config: VocoderTrainConfig | None, state: TrainingState | None, resume: bool, out_dir: Path
) -> VocoderTrainConfig:
    """The config to train with: a checkpoint's own when resuming (``config``, if given, must equal
    it), else ``config`` or the defaults. A checkpoint and no ``resume``: ``FileExistsError``."""
    if state is None:
        return config or VocoderTrainConfig()
    if not resume:
        raise FileExistsError(f"{out_dir} already holds a vocoder checkpoint; resume it or use another folder")
    saved = VocoderTrainConfig.from_dict(state.meta["config"])
    if config is not None and config != saved:
        changed = ", ".join(
            f.name for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(config, f.name)
        )
        raise ValueError(f"{out_dir / CHECKPOINT}: resuming needs the saved config; these fields differ: {changed}")
    return saved


def _setup_model(
    config: VocoderTrainConfig, state: TrainingState | None, checkpoint: Path
) -> tuple[Vocos, Discriminators | None]:
    """The vocoder, in training mode, and the discriminators when training is adversarial: the
    checkpoint's weights when resuming, else ``init_from``'s when given, else fresh ones."""
    model = Vocos(config.vocoder, config.mel).train()
    discriminator = Discriminators(config) if config.discriminators else None
    if state is not None:
        model.load_state_dict(load_file(str(checkpoint / WEIGHTS_FILE)))
        if discriminator is not None:
            state.restore({}, {"discriminator": discriminator})
    elif config.init_from:
        model.load_state_dict(_load_start(config).state_dict())
        if discriminator is not None:
            _load_start_discriminator(config, discriminator)
    return model, discriminator


def _setup_optimizers(
    config: VocoderTrainConfig, model: Vocos, discriminator: Discriminators | None, state: TrainingState | None
) -> dict[str, torch.optim.AdamW]:
    """AdamW for the vocoder (``"optimizer"``) and the discriminators (``"discriminator_optimizer"``),
    named as the checkpoint stores them; restored from ``state`` where it holds them."""
    adamw = dict(lr=config.learning_rate, betas=config.betas, weight_decay=config.weight_decay)
    optimizers = {"optimizer": torch.optim.AdamW(model.parameters(), **adamw)}
    if discriminator is not None:
        optimizers["discriminator_optimizer"] = torch.optim.AdamW(discriminator.parameters(), **adamw)
    if state is not None:
        # A weights-only checkpoint has no optimizer entries: those optimizers start afresh.
        state.restore({name: o for name, o in optimizers.items() if name in state.meta})
    return optimizers


@dataclass(frozen=True)
class _Batches:
    """Where each step's batch comes from: crops of the data roots, mels computed with ``to_mel``, and
    with an aligned model, a share of its teacher-forced mels (``aligned``)."""

    config: VocoderTrainConfig
    sampler: SegmentSampler
    aligned: AlignedSampler | None
    to_mel: MelSpectrogram
    segment_frames: tuple[int, int]  # shortest and longest crop, in mel frames

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step ``step``'s batch, all its randomness from ``(seed, step)``: audio ``[batch, frames * hop]``,
        the input log-mel ``[batch, frames, n_mels]`` (frame i starts at sample i * hop) and the audio's
        own log-mel, the target ``[batch, frames + 1, n_mels]``."""
        config, hop = self.config, self.config.mel.hop_length
        rng = np.random.default_rng([config.seed, step])
        # One crop length per step: crops must stack.
        frames = int(rng.integers(*self.segment_frames, endpoint=True))
        forced = 0 if self.aligned is None else round(config.batch_size * config.aligned_fraction)
        audios, input_mels = [], []
        if forced < config.batch_size:
            audios.append(self.sampler.batch(rng, config.batch_size - forced, frames * hop))
            with torch.no_grad():
                input_mels.append(self.to_mel(audios[-1])[:, :frames])
        if forced:
            forced_audio, forced_mel = self.aligned.batch(rng, forced, frames)
            audios.append(forced_audio)
            input_mels.append(forced_mel)
        audio, input_mel = torch.cat(audios), torch.cat(input_mels)
        with torch.no_grad():
            target_mel = self.to_mel(audio)
        return audio, input_mel, target_mel


def _setup_data(data_roots: Sequence[Path], config: VocoderTrainConfig, progress: bool) -> _Batches:
    """The clips under ``data_roots`` and, with ``config.aligned_model``, that model's forced mels of them."""
    sampler = SegmentSampler(data_roots, config.mel.sample_rate)
    aligned = None
    if config.aligned_model:
        bundle = load_bundle(config.aligned_model)
        if bundle.mel_config != config.mel:
            raise ValueError(f"{config.aligned_model}: the model's mel settings differ from the vocoder's")
        aligned = AlignedSampler(data_roots, bundle, config.aligned_clips_per_voice, progress)
    hop = config.mel.hop_length
    segment_frames = (
        round(config.min_segment_seconds * config.mel.sample_rate / hop),
        round(config.max_segment_seconds * config.mel.sample_rate / hop),
    )
    return _Batches(config, sampler, aligned, MelSpectrogram(config.mel), segment_frames)


class _VocoderLoop:
    """The step loop and what it works on: a training step (the discriminators', then the vocoder's), the
    loss log every ``log_every`` steps, and every ``checkpoint_every`` steps and at the last a checkpoint
    and a resynthesis of the reference clip to judge by ear."""

    def __init__(
        self,
        config: VocoderTrainConfig,
        out_dir: Path,
        model: Vocos,
        discriminator: Discriminators | None,
        optimizers: dict[str, torch.optim.AdamW],
        data: _Batches,
        start_step: int,
    ):
        self.config, self.out_dir, self.data, self.start_step = config, out_dir, data, start_step
        self.model, self.discriminator, self.optimizers = model, discriminator, optimizers
        self.samples_dir = out_dir / "samples"
        self.samples_dir.mkdir(exist_ok=True)
        self.reference = data.sampler.crop(0, 3 * config.mel.sample_rate)
        save_audio(self.samples_dir / "reference.wav", self.reference, config.mel.sample_rate)
        adversarial = list(ADVERSARIAL_PLOTTED) if discriminator is not None else []
        fields = ["step", "loss", "mel_l1", "stft_sc", "stft_log_mag", *adversarial, "lr", "seconds"]
        self.log = LossLog(out_dir / "loss.csv", fields, resume_step=start_step)

    def train(self, steps: int, started: float, show_progress: bool) -> dict[str, float]:
        """Steps from the start step up to ``steps``; returns the mean losses of the last log interval.
        ``started``: the ``time.perf_counter()`` the log's seconds count from. Ctrl-C ends the step under way,
        logs and saves, and raises :class:`RunInterrupted`."""
        config = self.config
        sums: dict[str, float] = {}  # loss terms summed since the last log line
        summed = 0
        losses: dict[str, float] = {}
        with InterruptRequest() as interrupt, step_progress("vocoder", show_progress) as progress:
            task = progress.add_task("train", total=steps, completed=self.start_step, status="")
            for step in range(self.start_step, steps):
                lr = learning_rate(step, config)
                terms = self._train_step(step, lr)
                done = step + 1
                for name, value in terms.items():
                    sums[name] = sums.get(name, 0.0) + value.item()
                summed += 1
                stopping = interrupt.requested
                # Logged: means over the interval; progress shows the latest interval.
                if done % config.log_every == 0 or done == steps or stopping:
                    losses = {name: total / summed for name, total in sums.items()}
                    sums, summed = {}, 0
                    seconds = time.perf_counter() - started
                    row = {"step": done, **{k: f"{v:.5f}" for k, v in losses.items()}, "lr": f"{lr:.3g}"}
                    self.log.append([{**row, "seconds": f"{seconds:.1f}"}])
                    progress.update(task, status=f"loss {losses['loss']:.3f} mel {losses['mel_l1']:.3f}")
                progress.update(task, completed=done)
                if done % config.checkpoint_every == 0 or done == steps or stopping:
                    self._save_and_judge(done)
                if stopping:
                    raise RunInterrupted(done, self.out_dir / CHECKPOINT)
        return losses

    def _train_step(self, step: int, lr: float) -> dict[str, torch.Tensor]:
        """One step at learning rate ``lr`` on step ``step``'s batch: the discriminators' (when training is
        adversarial), then the vocoder's; returns the vocoder's loss (``"loss"``) and every term."""
        audio, input_mel, target_mel = self.data.batch(step)
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] = lr
        predicted = self.model(input_mel)  # [batch, frames * hop]: the crop's span
        terms = {}
        if self.discriminator is not None:
            terms["discriminator"] = update_discriminator(
                self.discriminator, self.optimizers["discriminator_optimizer"], audio, predicted, self.config.grad_clip
            )
        loss, generator_terms = self._generator_loss(audio, predicted, target_mel)
        terms.update(generator_terms)
        optimizer = self.optimizers["optimizer"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        optimizer.step()
        return {"loss": loss, **terms}

    def _generator_loss(
        self, audio: torch.Tensor, predicted: torch.Tensor, target_mel: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The vocoder's weighted loss and its terms: reconstruction (mel L1 against ``target_mel``
        ``[batch, frames + 1, n_mels]``, multi-resolution STFT against ``audio`` ``[batch, samples]``), and
        when training is adversarial, the adversarial and feature-matching terms."""
        config = self.config
        terms = {"mel_l1": F.l1_loss(self.data.to_mel(predicted), target_mel)}
        terms["stft_sc"], terms["stft_log_mag"] = multi_resolution_stft_loss(predicted, audio, config.stft_resolutions)
        loss = config.mel_loss_weight * terms["mel_l1"] + config.stft_loss_weight * (
            terms["stft_sc"] + terms["stft_log_mag"]
        )
        if self.discriminator is not None:
            terms["adversarial"], terms["feature_matching"] = adversarial_terms(self.discriminator, audio, predicted)
            loss = loss + (
                config.adversarial_weight * terms["adversarial"]
                + config.feature_matching_weight * terms["feature_matching"]
            )
        return loss, terms

    def _save_and_judge(self, done: int) -> None:
        """After step ``done``: the checkpoint, the latest weights, the loss plot, and the reference clip
        resynthesized into ``samples/step_<done>.wav``."""
        config, model = self.config, self.model
        modules = {"discriminator": self.discriminator} if self.discriminator is not None else {}
        saved_optimizers = self.optimizers if config.checkpoint_optimizers else {}
        meta = {"step": done, "config": config.to_dict()}
        save_checkpoint(self.out_dir / CHECKPOINT, model.save, meta, saved_optimizers, modules)
        model.save(self.out_dir)
        plotted = PLOTTED + (ADVERSARIAL_PLOTTED if self.discriminator is not None else ())
        plot_losses(self.log.path, self.out_dir / "loss.png", plotted, title="vocoder training", log_scale=True)
        model.eval()
        with torch.inference_mode():
            resynthesis = model(self.data.to_mel(torch.from_numpy(self.reference)[None]))[0]
        model.train()
        save_audio(self.samples_dir / f"step_{done:06d}.wav", resynthesis.numpy(), config.mel.sample_rate)


def train_vocoder_command(
    data_roots: Sequence[Path],
    out: Path,
    steps: int,
    resume: bool,
    threads: int,
    init_from: Path | None = None,
    aligned_model: Path | None = None,
    aligned_clips: int = 40,
    learning_rate: float | None = None,
    adversarial: bool = False,
    weights_only: bool = False,
    aligned_fraction: float = 1.0,
) -> VocoderTrainResult:
    """``chorus train-vocoder``: train the default CPU-sized Vocos, or fine-tune ``init_from`` (with its
    architecture), optionally on ``aligned_model``'s teacher-forced mels and with both discriminators
    (``adversarial``); returns the run's result."""
    config = None  # a resumed run takes its saved config
    if init_from or aligned_model or learning_rate or adversarial or weights_only:
        config = VocoderTrainConfig(
            aligned_model=str(aligned_model) if aligned_model else None,
            aligned_clips_per_voice=aligned_clips,
            aligned_fraction=aligned_fraction,
            discriminators=DISCRIMINATORS if adversarial else (),
            checkpoint_optimizers=not weights_only,
        )
        if init_from:
            start = load_vocoder(init_from, mel_config=config.mel)  # its architecture; checked when loaded
            config = dataclasses.replace(
                config, init_from=str(init_from), vocoder=getattr(start, "config", config.vocoder)
            )
        if learning_rate:
            config = dataclasses.replace(config, learning_rate=learning_rate)
    return train_vocoder(data_roots, out, config, steps=steps, resume=resume, threads=threads)
