"""Adapting a Piper voice (:class:`~chorus.models.piper_vits.PiperGenerator`) to a new speaker, without a
posterior encoder.

Piper's export keeps only the generator's inference direction, so VITS's own recipe (a posterior
encoder gives each recording's latent, monotonic alignment search aligns it to the text prior) is not
available. This recipe replaces both:

1. **data**: each recording's phoneme durations come from aligning it to the base voice's own rendering of
   the same text: the base speaks the text (noise 0), each phoneme id's mean MFCC over the frames it
   spoke becomes a template, and monotonic alignment search (:mod:`chorus.models.alignment`, with its
   near-diagonal beta-binomial prior) assigns the recording's frames to those templates. MFCCs are
   normalized per utterance (mean and variance), which removes most of the difference between two
   speakers' vocal tracts and channels while keeping which phoneme is said.
2. **model + adapters**: the registry's methods attach by module-name pattern (:data:`PLACEMENTS`), or every
   weight trains on a copy (full fine-tuning, the baseline).
3. **optimizer**: AdamW on the trained tensors alone.
4. **step loop**: the text is decoded with the recording's durations at noise 0, so the generated audio
   lines up with the recording frame for frame; a random window of ``segment_frames`` latent frames per
   clip goes through the HiFi-GAN decoder (as VITS trains it) and is compared with the same samples of the
   recording: log-mel L1 plus a multi-resolution STFT loss. When nothing before the decoder trains, each
   clip's latent is computed once and reused.
5. **save**: a voice folder (:func:`chorus.adapters.voice.save_voice`) naming its base and the ONNX file's
   sha256; the runtime (:mod:`chorus.synthesis.bases.piper`, which never imports training) speaks it:
   ``chorus synthesize --voice VOICE``.

The duration predictor is not adapted: an adapted voice speaks at the base voice's pace.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from chorus.adapters import (
    FULL_FINE_TUNING,
    MethodConfig,
    active_adapter,
    add_adapter,
    get_method,
    mark_trainable,
    set_active,
)
from chorus.adapters.bitfit import BitFitConfig
from chorus.adapters.lora import LoraConfig
from chorus.adapters.voice import VoiceCard, save_voice
from chorus.audio.io import load_audio
from chorus.audio.mel import MelConfig, MelSpectrogram
from chorus.data.formats import Utterance, discover
from chorus.models.alignment import beta_binomial_log_prior, monotonic_alignment_search
from chorus.models.piper_vits import PiperGenerator
from chorus.training.loss_log import LossLog
from chorus.training.vocoder import multi_resolution_stft_loss

VOICE = "voice"  # the adapter's name inside the generator while it trains

# Module-name patterns of the generator's parts (Piper's names; see chorus.models.piper_vits).
TEXT_ENCODER = r"enc_p\.(encoder\.attn_layers\.\d+\.conv_[qkvo]|proj)"  # attention 1x1 convs, prior projection
FLOW = r"flow\.flows\.\d+\.(pre|post|enc\.(in_layers|res_skip_layers)\.\d+)"  # couplings' WaveNets
DECODER_CONVS = r"dec\.(conv_pre|resblocks\.\d+\.convs[12]?\.\d+)"  # HiFi-GAN convs with a bias
DECODER = r"dec\.(conv_pre|conv_post|resblocks\.\d+\.convs[12]?\.\d+)"  # ... and the output conv (no bias)


def _either(*patterns: str) -> str:
    return "|".join(f"(?:{pattern})" for pattern in patterns)


# Where a voice's tensors go, by name: each a list of method configs for :func:`add_adapter`. The
# decoder's ConvTranspose1d upsamplers are left alone (no method wraps them); BitFit on the decoder's
# biases includes ``dec.conv_pre``'s, a per-voice vector added to every frame of the decoder's input:
# the nearest thing to a speaker vector a single-speaker VITS has (it has no speaker conditioning).
PLACEMENTS: dict[str, Callable[[], list[MethodConfig]]] = {
    "decoder": lambda: [LoraConfig(r=16, alpha=16, targets=DECODER), BitFitConfig(targets=DECODER_CONVS)],
    "text+flow": lambda: [LoraConfig(r=4, alpha=4, targets=_either(TEXT_ENCODER, FLOW))],
    "all": lambda: [
        LoraConfig(r=4, alpha=4, targets=_either(TEXT_ENCODER, FLOW, DECODER)),
        BitFitConfig(targets=DECODER_CONVS),
    ],
    "residual": lambda: [
        get_method("residual").config_class(targets=_either(TEXT_ENCODER, DECODER_CONVS), bottleneck=8)
    ],
}


@dataclass
class PiperAdaptConfig:
    """How a Piper voice is adapted. ``placement`` names an entry of :data:`PLACEMENTS`, or ``full``."""

    placement: str = field(default="all", metadata={"help": f"one of {', '.join(PLACEMENTS)}, or full"})
    steps: int = field(default=300, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=4, metadata={"help": "clips per step (one window each)"})
    segment_frames: int = field(
        default=32, metadata={"help": "latent frames decoded per clip and step (x256 samples; VITS's 8192)"}
    )
    context_frames: int = field(
        default=4, metadata={"help": "frames decoded each side of the window and dropped: no edge effects in the loss"}
    )
    learning_rate: float | None = field(
        default=None, metadata={"help": "default: the first method's (registry); 5e-5 for full fine-tuning"}
    )
    noise_scale: float = field(
        default=0.0,
        metadata={
            "help": "prior noise of the training latents; 0: the prior's mean (the target lines up best), "
            "else the latents vary as at inference (Piper's default 0.667), which the adapted layers then learn"
        },
    )
    stft_weight: float = field(default=1.0, metadata={"help": "weight of the multi-resolution STFT loss"})
    threads: int = field(default=1, metadata={"help": "CPU threads"})
    seed: int = 1234
    log_every: int = field(default=10, metadata={"help": "steps between loss-log rows"})
    max_minutes: float = field(default=math.inf, metadata={"help": "stop after this much training time"})

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS and self.placement != FULL_FINE_TUNING:
            raise ValueError(f"placement {self.placement!r}: choose one of {', '.join(PLACEMENTS)}, or full")
        if self.steps < 0 or self.batch_size <= 0 or self.segment_frames <= 0 or self.context_frames < 0:
            raise ValueError("steps >= 0, batch_size > 0, segment_frames > 0 and context_frames >= 0")

    @property
    def full(self) -> bool:
        return self.placement == FULL_FINE_TUNING

    def method_configs(self) -> list[MethodConfig]:
        return [] if self.full else PLACEMENTS[self.placement]()


STFT_RESOLUTIONS = ((512, 128, 512), (1024, 256, 1024), (2048, 512, 2048))


# ---------------------------------------------------------------- data


@dataclass
class Clip:
    """One recording ready to train on: ids ``[time]``, audio ``[frames * hop]`` at the generator's rate,
    durations ``[time]`` (frames per id, summing to the recording's frames)."""

    key: str
    ids: torch.Tensor
    audio: torch.Tensor
    durations: torch.Tensor

    @property
    def frames(self) -> int:
        return int(self.durations.sum())


def _mfcc(audio: torch.Tensor, mel: MelSpectrogram, coefficients: int = 20) -> torch.Tensor:
    """audio ``[samples]`` (a whole number of hops) -> ``[samples // hop, coefficients - 1]`` MFCCs without c0,
    each normalized over the utterance (zero mean, unit variance)."""
    log_mel = mel(audio)[:-1]  # centered frames: samples // hop + 1; the last starts past the audio
    n = log_mel.shape[1]
    # DCT-II basis (orthonormal), as MFCCs take it of the log-mel bands.
    k = torch.arange(coefficients, dtype=log_mel.dtype)[:, None]
    basis = torch.cos(math.pi / n * (torch.arange(n, dtype=log_mel.dtype)[None, :] + 0.5) * k) * math.sqrt(2 / n)
    cepstra = (log_mel @ basis.T)[:, 1:]
    return (cepstra - cepstra.mean(0)) / (cepstra.std(0) + 1e-5)


@torch.no_grad()
def align_durations(generator: PiperGenerator, ids: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
    """Frames per phoneme id of a recording: ids ``[time]``, audio ``[frames * hop]`` -> durations ``[time]``
    (long, each >= 1, summing to ``frames``).

    The base voice speaks ``ids`` at noise 0; each id's template is its mean MFCC over the frames it spoke;
    monotonic alignment search assigns the recording's frames to the templates (Gaussian log-likelihood,
    unit variance, plus the beta-binomial near-diagonal prior).
    """
    with active_adapter(generator, None):
        spoken = generator(ids[None], torch.tensor([len(ids)]), noise_scale=0.0, length_scale=1.0, noise_w=0.0)
    mel = MelSpectrogram(MelConfig(sample_rate=generator.sample_rate, hop_length=generator.hop_length))
    base = _mfcc(spoken.audio[0], mel)  # [base frames, c]
    owner = torch.repeat_interleave(torch.arange(len(ids)), spoken.durations[0])  # [base frames]
    templates = torch.zeros(len(ids), base.shape[1]).index_add_(0, owner, base)
    templates = templates / spoken.durations[0].clamp_min(1)[:, None].float()
    target = _mfcc(audio, mel)  # [frames, c]
    frames = target.shape[0]
    if frames < len(ids):
        raise ValueError(f"{frames} frames of audio cannot hold {len(ids)} phoneme ids")
    log_prob = -0.5 * torch.cdist(templates, target).pow(2)  # [time, frames]
    text_lengths, frame_lengths = torch.tensor([len(ids)]), torch.tensor([frames])
    log_prob = log_prob[None] + beta_binomial_log_prior(text_lengths, frame_lengths, len(ids), frames)
    path = monotonic_alignment_search(log_prob, text_lengths, frame_lengths)[0]
    return path.sum(1).long()


def prepare_clips(generator: PiperGenerator, utterances: Sequence[Utterance]) -> list[Clip]:
    """Phoneme ids, audio (trimmed to whole hops) and aligned durations of each utterance."""
    clips = []
    hop = generator.hop_length
    for utterance in utterances:
        ids = torch.tensor(generator.voice.text_ids(utterance.text))
        audio = torch.from_numpy(load_audio(utterance.audio_path, generator.sample_rate)).float()
        audio = audio[: len(audio) // hop * hop]
        clips.append(Clip(utterance.key, ids, audio, align_durations(generator, ids, audio)))
    return clips


# ---------------------------------------------------------------- model + adapters


def attach_voice(
    generator: PiperGenerator, config: PiperAdaptConfig
) -> tuple[PiperGenerator, list[torch.nn.Parameter]]:
    """The model that trains and its trained tensors: ``generator`` with adapter ``VOICE`` added and
    active (its base weights frozen), or for full fine-tuning a copy with every weight trainable."""
    if config.full:
        model = copy.deepcopy(generator)
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        return model, list(model.parameters())
    add_adapter(generator, VOICE, config.method_configs())
    set_active(generator, VOICE)
    return generator, mark_trainable(generator, VOICE)


def _learning_rate(config: PiperAdaptConfig) -> float:
    if config.learning_rate is not None:
        return config.learning_rate
    return 5e-5 if config.full else get_method(config.method_configs()[0].method).learning_rate


# ---------------------------------------------------------------- step loop


class SegmentLoss(torch.nn.Module):
    """generated, target ``[batch, samples]`` -> dict of ``mel_l1``, ``stft_sc``, ``stft_log_mag`` and ``loss``."""

    def __init__(self, generator: PiperGenerator, stft_weight: float) -> None:
        super().__init__()
        self.mel = MelSpectrogram(MelConfig(sample_rate=generator.sample_rate, hop_length=generator.hop_length))
        self.stft_weight = stft_weight

    def forward(self, generated: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        mel_l1 = F.l1_loss(self.mel(generated), self.mel(target))
        convergence, magnitude = multi_resolution_stft_loss(generated, target, STFT_RESOLUTIONS)
        loss = mel_l1 + self.stft_weight * (convergence + magnitude)
        return {"loss": loss, "mel_l1": mel_l1, "stft_sc": convergence, "stft_log_mag": magnitude}


def _pad_stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(list(tensors), batch_first=True)


def clip_latents(
    model: PiperGenerator, clips: Sequence[Clip], noise_scale: float = 0.0, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """Each clip's decoder input at its own durations (prior noise ``noise_scale``): a list of ``[inter, frames]``."""
    z, frame_lengths, _ = model.latent(
        _pad_stack([c.ids for c in clips]),
        torch.tensor([len(c.ids) for c in clips]),
        durations=_pad_stack([c.durations for c in clips]),
        noise_scale=noise_scale,
        generator=generator,
    )
    return [z[i, :, : int(frame_lengths[i])] for i in range(len(clips))]


def decode_windows(
    model: PiperGenerator, latents: Sequence[torch.Tensor], starts: Sequence[int], config: PiperAdaptConfig
) -> torch.Tensor:
    """Decode ``segment_frames`` latent frames of each clip from ``starts`` (with ``context_frames`` more
    each side where the clip has them, dropped after) -> audio ``[batch, segment_frames * hop]``."""
    hop, size, context = model.hop_length, config.segment_frames, config.context_frames
    windows, offsets = [], []
    for z, start in zip(latents, starts):
        low, high = max(0, start - context), min(z.shape[1], start + size + context)
        window = z[:, low:high]
        # Pad short clips (and windows at the clip's edges) to one length: zero latent frames, as the
        # generator's own padding is; their samples are dropped below.
        windows.append(F.pad(window, (0, size + 2 * context - window.shape[1])))
        offsets.append(start - low)
    audio = model.dec(torch.stack(windows))  # [batch, (size + 2 context) * hop]
    return torch.stack([a[o * hop : (o + size) * hop] for a, o in zip(audio, offsets)])


def target_windows(clips: Sequence[Clip], starts: Sequence[int], config: PiperAdaptConfig, hop: int) -> torch.Tensor:
    """The recordings' samples under each window -> ``[batch, segment_frames * hop]`` (zero past a clip's end)."""
    size = config.segment_frames * hop
    return torch.stack(
        [
            F.pad(c.audio[s * hop : s * hop + size], (0, size - len(c.audio[s * hop : s * hop + size])))
            for c, s in zip(clips, starts)
        ]
    )


@dataclass
class PiperAdaptResult:
    """What :func:`adapt_piper` returns: the model (the generator with its voice active, or the fully
    fine-tuned copy), the voice folder (None for full fine-tuning unless saved), the card, the log rows."""

    model: PiperGenerator
    voice_dir: Path | None
    card: VoiceCard
    log: list[dict]


def train(
    model: PiperGenerator,
    clips: Sequence[Clip],
    trainable: list[torch.nn.Parameter],
    config: PiperAdaptConfig,
    log: LossLog | None = None,
    progress: bool = False,
) -> tuple[list[dict], int, float]:
    """The step loop; returns (log rows, steps run, training seconds)."""
    rng = np.random.default_rng(config.seed)
    optimizer = torch.optim.AdamW(trainable, lr=_learning_rate(config), betas=(0.8, 0.99), weight_decay=0.0)
    loss_fn = SegmentLoss(model, config.stft_weight)
    trained = {id(p) for p in trainable}
    # Nothing before the decoder trains: each clip's latent is fixed, computed once.
    upstream = [p for module in (model.enc_p, model.flow) for p in module.parameters() if id(p) in trained]
    fixed, noise = None, torch.Generator().manual_seed(config.seed)
    if not upstream and not config.noise_scale:
        with torch.no_grad():
            fixed = [z for i in range(0, len(clips), 8) for z in clip_latents(model, clips[i : i + 8])]
    rows, window, step = [], [], 0
    started, cpu_started = time.perf_counter(), time.process_time()
    model.train()
    for step in range(1, config.steps + 1):
        chosen = rng.choice(len(clips), size=min(config.batch_size, len(clips)), replace=False)
        batch = [clips[i] for i in chosen]
        if fixed is not None:
            latents = [fixed[i] for i in chosen]
        else:
            with torch.set_grad_enabled(bool(upstream)):
                latents = clip_latents(model, batch, config.noise_scale, noise)
        starts = [int(rng.integers(0, max(1, c.frames - config.segment_frames) + 1)) for c in batch]
        generated = decode_windows(model, latents, starts, config)
        terms = loss_fn(generated, target_windows(batch, starts, config, model.hop_length))
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()
        window.append({k: float(v.detach()) for k, v in terms.items()})
        if step % config.log_every == 0 or step == config.steps:
            # CPU seconds beside wall seconds: on a shared machine the wall clock also counts the neighbours.
            row = {
                "step": step,
                "seconds": round(time.perf_counter() - started, 1),
                "cpu_seconds": round(time.process_time() - cpu_started, 1),
            }
            row.update({k: round(float(np.mean([w[k] for w in window])), 4) for k in window[0]})
            rows.append(row)
            window = []
            if log is not None:
                log.append([row])
            if progress:
                print(row, flush=True)
        if time.perf_counter() - started > config.max_minutes * 60:
            break
    model.eval()
    return rows, step, time.perf_counter() - started


# ---------------------------------------------------------------- the recipe


def adapt_piper(
    data: str | Path | Sequence[Utterance],
    generator: PiperGenerator,
    out: str | Path | None,
    config: PiperAdaptConfig,
    base_sha256: str = "",
    progress: bool = False,
    base_name: str = "",
) -> PiperAdaptResult:
    """Adapt ``generator`` to the recordings of ``data`` (a dataset folder or utterances) and save the voice
    to ``out`` (adapters only; None: not saved). ``base_sha256`` and ``base_name`` (as ``--base`` names it:
    ``piper-joe``, a voice file's name): the base, recorded in the voice so that it is spoken on that base
    and refused on another. Writes ``out``'s loss log beside it (``<out>.log.csv``)."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    utterances = discover(data)[0] if isinstance(data, (str, Path)) else list(data)
    clips = prepare_clips(generator, utterances)  # durations from the base, before any adapter exists
    minutes = sum(len(c.audio) for c in clips) / generator.sample_rate / 60
    model, trainable = attach_voice(generator, config)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # the log is written beside the voice from step one
    log = (
        LossLog(Path(f"{out}.log.csv"), ["step", "seconds", "cpu_seconds", "loss", "mel_l1", "stft_sc", "stft_log_mag"])
        if out
        else None
    )
    rows, steps, seconds = train(model, clips, trainable, config, log, progress)
    configs = config.method_configs()
    card = VoiceCard(
        name=Path(out).name if out else VOICE,
        methods=[FULL_FINE_TUNING] if config.full else [c.method for c in configs],
        base_model_sha256=base_sha256,
        base_model=base_name,
        data_minutes=round(minutes, 3),
        train_seconds=round(seconds, 1),
        steps=steps,
        trainable_parameters=sum(p.numel() for p in trainable),
        metrics={
            "loss_start": rows[0]["loss"] if rows else None,
            "loss_end": rows[-1]["loss"] if rows else None,
            "train_cpu_seconds": rows[-1]["cpu_seconds"] if rows else 0.0,
        },
        notes={"recipe": "piper_adapt", "placement": config.placement, "threads": config.threads},
    )
    voice_dir = None if out is None or config.full else save_voice(out, model, VOICE, configs, card)
    return PiperAdaptResult(model, voice_dir, card, rows)


__all__ = [
    "PLACEMENTS",
    "VOICE",
    "Clip",
    "PiperAdaptConfig",
    "PiperAdaptResult",
    "adapt_piper",
    "align_durations",
    "attach_voice",
    "prepare_clips",
    "train",
]
