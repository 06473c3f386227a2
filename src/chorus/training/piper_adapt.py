"""Adapting a Piper voice (:class:`~chorus.models.piper_vits.PiperGenerator`) to a new speaker.

Piper's export keeps only the generator's inference direction: no posterior encoder, no discriminators.
Two recipes (:data:`RECIPES`), as named steps:

1. **data**: each recording's phoneme ids and audio at the generator's rate. The ``aligned`` recipe also
   aligns it now (:func:`align_durations`: the base speaks the text, its per-phoneme MFCC templates are
   aligned to the recording by monotonic alignment search); the ``posterior`` recipe aligns as it trains.
2. **model + adapters**: the registry's methods attach by module-name pattern (:data:`PLACEMENTS`), or every
   weight trains on a copy (full fine-tuning, the baseline).
3. **optimizer**: AdamW on the trained tensors (and, for ``posterior``, the posterior encoder's).
4. **step loop**:
   - ``posterior`` (the default; :func:`train_posterior`), VITS's generator step without its duration and
     adversarial terms: a posterior encoder distilled from the base voice
     (:mod:`chorus.training.piper_posterior`) reads each clip's latent; a window of it is decoded and
     compared with the recording (log-mel L1 x ``mel_weight`` + multi-resolution STFT); the flow carries
     the whole latent into the prior's space, where the KL to the text encoder's Gaussians, along the most
     likely monotonic alignment, trains the text side. The posterior trains too and is dropped after.
   - ``aligned`` (the first cut, which makes unintelligible voices; :func:`train`): the text is decoded
     at the recording's aligned durations at noise 0, and a window is compared with the recording.
5. **save**: a voice folder (:func:`chorus.adapters.voice.save_voice`) naming its base and the ONNX file's
   sha256, with the pace its alignments measure (:func:`pace_of`) and the prior noise it speaks at; the
   runtime (:mod:`chorus.synthesis.bases.piper`, which never imports training) speaks it:
   ``chorus synthesize --voice VOICE``.

The duration predictor is not adapted (its training direction is not in the export): an adapted voice
speaks at the base's relative durations, stretched to its own pace.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
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
from chorus.data.check import speech_seconds
from chorus.data.formats import Utterance, discover
from chorus.models.alignment import beta_binomial_log_prior, monotonic_alignment_search
from chorus.models.device import torch_threads
from chorus.models.piper_posterior import PosteriorEncoder
from chorus.models.piper_vits import PiperGenerator, sequence_mask
from chorus.synthesis.bases.piper import installed_joe_is
from chorus.training.adapt import refuse_voice_folder
from chorus.training.loss_log import LossLog
from chorus.training.progress import step_progress
from chorus.training.step_loop import stop_note
from chorus.training.vocoder import (
    adversarial_terms,
    load_discriminators,
    multi_resolution_stft_loss,
    update_discriminator,
)

JOE_DATASET = "piper-joe"  # the held-out dataset (and shipped sample) Piper's joe voice reads
SHIPPED_POSTERIOR = "piper_posterior_joe"  # chorus/assets folder: piper-joe's distilled posterior encoder
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
    # Where multi-speaker VITS conditions on the speaker (flow and decoder; never the text encoder).
    "flow+decoder": lambda: [
        LoraConfig(r=4, alpha=4, targets=_either(FLOW, DECODER)),
        BitFitConfig(targets=DECODER_CONVS),
    ],
    # The decoder stays the base's: a sharper render, but joe's decoder cannot reach a voice far from joe's
    # (flite-slt, development split: similarity 0.735 and 0.707 against flow+decoder's 0.873).
    "flow": lambda: [LoraConfig(r=4, alpha=4, targets=FLOW)],
    "flow+bitfit": lambda: [LoraConfig(r=4, alpha=4, targets=FLOW), BitFitConfig(targets=DECODER_CONVS)],
    "all": lambda: [
        LoraConfig(r=4, alpha=4, targets=_either(TEXT_ENCODER, FLOW, DECODER)),
        BitFitConfig(targets=DECODER_CONVS),
    ],
    "residual": lambda: [
        get_method("residual").config_class(targets=_either(TEXT_ENCODER, DECODER_CONVS), bottleneck=8)
    ],
}


RECIPES = ("posterior", "aligned")


@dataclass
class PiperAdaptConfig:
    """How a Piper voice is adapted. ``placement`` names an entry of :data:`PLACEMENTS`, or ``full``."""

    placement: str = field(default="flow+decoder", metadata={"help": f"one of {', '.join(PLACEMENTS)}, or full"})
    recipe: str = field(
        default="posterior",
        metadata={
            "help": "posterior: a distilled posterior encoder reads each recording's latent (VITS's way); "
            "aligned: the text decoded at durations aligned by MFCC templates (the first cut, which fails)"
        },
    )
    posterior: str | None = field(
        default=None, metadata={"help": "posterior encoder folder (default: the one shipped for piper-joe)"}
    )
    posterior_learning_rate: float = field(default=2e-4, metadata={"help": "the posterior encoder's (VITS's)"})
    mel_weight: float = field(default=45.0, metadata={"help": "weight of the mel L1 (VITS's c_mel; posterior recipe)"})
    kl_weight: float = field(default=1.0, metadata={"help": "weight of the KL to the text prior (posterior recipe)"})
    # Chosen on flite-slt's development clips (never the figures' split), a 300-step "all" voice:
    # WER 43.4 / 38.0 / 36.7 %, MOS 1.87 / 1.87 / 1.80 at 0.667 / 0.333 / 0 (bench/README, "Adapting a Piper
    # voice"). The prior an adapter learns from minutes of speech is wider than the base's own.
    # The default placement was chosen after, on the same clips at this noise: flow+decoder WER 16.9 %,
    # all 38.0 %, text+flow 47.6 %.
    speak_noise_scale: float | None = field(
        default=0.333, metadata={"help": "the prior noise the voice speaks at (recorded in it); None: the base's"}
    )
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
    discriminators: str | None = field(
        default=None,
        metadata={
            "help": "a chorus train-vocoder checkpoint folder whose discriminators judge the decoded windows "
            "(VITS's adversarial and feature-matching terms), trained on along with the voice; None: none "
            "(on flite-slt's development split they cost MOS: 1.89 against 2.07)"
        },
    )
    adversarial_weight: float = field(default=1.0, metadata={"help": "with discriminators (VITS's weight)"})
    feature_matching_weight: float = field(default=2.0, metadata={"help": "with discriminators (VITS's c_fm)"})
    threads: int = field(default=1, metadata={"help": "CPU threads"})
    seed: int = 1234
    log_every: int = field(default=10, metadata={"help": "steps between loss-log rows"})
    max_minutes: float = field(default=math.inf, metadata={"help": "stop after this much training time"})

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe {self.recipe!r}: choose one of {', '.join(RECIPES)}")
        if self.placement not in PLACEMENTS and self.placement != FULL_FINE_TUNING:
            raise ValueError(f"placement {self.placement!r}: choose one of {', '.join(PLACEMENTS)}, or full")
        if self.discriminators and self.recipe != "posterior":
            raise ValueError("discriminators join the posterior recipe's loss only (--recipe posterior)")
        if self.steps < 0 or self.batch_size <= 0 or self.segment_frames <= 0 or self.context_frames < 0:
            raise ValueError("steps >= 0, batch_size > 0, segment_frames > 0 and context_frames >= 0")
        if self.threads < 1 or not self.max_minutes > 0:
            raise ValueError(
                f"threads must be at least 1 and max_minutes more than 0, got {self.threads}, {self.max_minutes}"
            )

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
    durations ``[time]`` (frames per id, summing to the recording's frames; the ``aligned`` recipe's, None
    for the ``posterior`` recipe, which aligns as it trains)."""

    key: str
    ids: torch.Tensor
    audio: torch.Tensor
    durations: torch.Tensor | None
    hop_length: int = 256

    @property
    def frames(self) -> int:
        return len(self.audio) // self.hop_length


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


def prepare_clips(generator: PiperGenerator, utterances: Sequence[Utterance], align: bool = True) -> list[Clip]:
    """Phoneme ids, audio (trimmed to whole hops) and, with ``align``, aligned durations of each utterance."""
    clips = []
    hop = generator.hop_length
    for utterance in utterances:
        ids = torch.tensor(generator.voice.text_ids(utterance.text))
        audio = torch.from_numpy(load_audio(utterance.audio_path, generator.sample_rate)).float()
        audio = audio[: len(audio) // hop * hop]
        durations = align_durations(generator, ids, audio) if align else None
        clips.append(Clip(utterance.key, ids, audio, durations, hop))
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
    fine-tuned copy), the voice folder (None without ``out``), the card, the log rows, and the posterior
    recipe's posterior encoder as it trained on the clips (not part of the voice)."""

    model: PiperGenerator
    voice_dir: Path | None
    card: VoiceCard
    log: list[dict]
    posterior: PosteriorEncoder | None = None


class StepLog:
    """Mean loss terms every ``log_every`` steps, with wall and CPU seconds (on a shared machine the wall
    clock also counts the neighbours), into the loss log; with ``progress``, a progress bar (stderr).
    Use it as a context manager around the step loop."""

    def __init__(self, config: PiperAdaptConfig, log: LossLog | None, progress: bool) -> None:
        self.config, self.log = config, log
        self.rows: list[dict] = []
        self.window: list[dict[str, float]] = []
        self.bar = step_progress(f"adapt the Piper voice ({config.recipe}, {config.placement})", progress)
        self.task = self.bar.add_task("steps", total=config.steps, status="")
        self.started, self.cpu_started = time.perf_counter(), time.process_time()

    def __enter__(self) -> StepLog:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def add(self, step: int, terms: dict[str, torch.Tensor]) -> None:
        self.window.append({k: float(v.detach()) for k, v in terms.items()})
        self.bar.update(self.task, completed=step, status=f"loss {self.window[-1]['loss']:.3f}")
        if step % self.config.log_every and step != self.config.steps:
            return
        row = {
            "step": step,
            "seconds": round(self.seconds, 1),
            "cpu_seconds": round(time.process_time() - self.cpu_started, 1),
        }
        row.update({k: round(float(np.mean([w[k] for w in self.window])), 4) for k in self.window[0]})
        self.rows.append(row)
        self.window = []
        if self.log is not None:
            self.log.append([row])

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def out_of_time(self) -> bool:
        return self.seconds > self.config.max_minutes * 60


def _optimizer(groups: list[dict]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, betas=(0.8, 0.99), weight_decay=0.0)


def train(
    model: PiperGenerator,
    clips: Sequence[Clip],
    trainable: list[torch.nn.Parameter],
    config: PiperAdaptConfig,
    log: LossLog | None = None,
    progress: bool = False,
) -> tuple[list[dict], int, float]:
    """The ``aligned`` recipe's step loop; returns (log rows, steps run, training seconds)."""
    rng = np.random.default_rng(config.seed)
    optimizer = _optimizer([{"params": trainable, "lr": _learning_rate(config)}])
    loss_fn = SegmentLoss(model, config.stft_weight)
    trained = {id(p) for p in trainable}
    # Nothing before the decoder trains: each clip's latent is fixed, computed once.
    upstream = [p for module in (model.enc_p, model.flow) for p in module.parameters() if id(p) in trained]
    fixed, noise = None, torch.Generator().manual_seed(config.seed)
    if not upstream and not config.noise_scale:
        with torch.no_grad():
            fixed = [z for i in range(0, len(clips), 8) for z in clip_latents(model, clips[i : i + 8])]
    step = 0
    model.train()
    with StepLog(config, log, progress) as steps:
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
            steps.add(step, terms)
            if steps.out_of_time:
                break
    model.eval()
    return steps.rows, step, steps.seconds


# ---------------------------------------------------------------- the posterior recipe


def prior_log_likelihood(z_p: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor) -> torch.Tensor:
    """Log-likelihood of every latent frame under every phoneme's Gaussian (VITS's ``neg_cent``):
    z_p ``[batch, inter, frames]``, m_p and logs_p ``[batch, inter, time]`` -> ``[batch, time, frames]``."""
    inverse_variance = torch.exp(-2 * logs_p)
    constant = torch.sum(-0.5 * math.log(2 * math.pi) - logs_p, dim=1)[:, :, None]  # [B, T, 1]
    quadratic = (inverse_variance.transpose(1, 2) @ (-0.5 * z_p.pow(2))) + (
        (m_p * inverse_variance).transpose(1, 2) @ z_p
    )
    mean_term = torch.sum(-0.5 * m_p.pow(2) * inverse_variance, dim=1)[:, :, None]
    return constant + quadratic + mean_term


def prior_kl(
    z_p: torch.Tensor, logs_q: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """VITS's KL term: the posterior's sample z_p (in the prior's space) against the aligned prior, all
    ``[batch, inter, frames]``; summed over channels, averaged over the masked frames ``[batch, 1, frames]``."""
    kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p).pow(2) * torch.exp(-2 * logs_p)
    return (kl * mask).sum() / mask.sum()


def load_posterior(config: PiperAdaptConfig) -> PosteriorEncoder:
    """The configured posterior encoder, or the one shipped for piper-joe."""
    return PosteriorEncoder.load(config.posterior or files("chorus.assets") / SHIPPED_POSTERIOR).float()


def align_to_prior(
    model: PiperGenerator, posterior: PosteriorEncoder, batch: Sequence[Clip], sample: bool = True
) -> tuple[torch.Tensor, ...]:
    """A batch's latents and their alignment to its text: z (the posterior's draw; its mean unless
    ``sample``), logs_q, z_p (z in the
    prior's space), the prior's m_p and logs_p expanded to frames along the most likely monotonic path,
    all ``[batch, inter, frames]``; the frame mask ``[batch, 1, frames]`` and durations ``[batch, time]``."""
    ids = _pad_stack([c.ids for c in batch])
    text_lengths = torch.tensor([len(c.ids) for c in batch])
    frame_lengths = torch.tensor([c.frames for c in batch])
    z, _, logs_q, frame_mask = posterior(_pad_stack([c.audio for c in batch]), frame_lengths, sample)
    _, m_p, logs_p = model.enc_p(ids, sequence_mask(text_lengths, ids.shape[1]))
    z_p = model.flow.encode(z, frame_mask)
    with torch.no_grad():
        path = monotonic_alignment_search(prior_log_likelihood(z_p, m_p, logs_p), text_lengths, frame_lengths)
    m_frames, logs_frames = m_p @ path, logs_p @ path  # [B, inter, T] @ [B, T, F]
    return z, logs_q, z_p, m_frames, logs_frames, frame_mask, path.sum(2)


def posterior_optimizer(
    trainable: list[torch.nn.Parameter], posterior: PosteriorEncoder, config: PiperAdaptConfig
) -> torch.optim.Optimizer:
    """The posterior recipe's optimizer: the voice's tensors at its method's rate, the posterior
    encoder's at ``posterior_learning_rate``."""
    return _optimizer(
        [
            {"params": trainable, "lr": _learning_rate(config)},
            {"params": list(posterior.parameters()), "lr": config.posterior_learning_rate},
        ]
    )


class Adversary:
    """Discriminators that judge the decoded windows against the recordings' (VITS's adversarial and
    feature-matching terms), trained on along with the voice: each call first updates them on the windows
    (least-squares GAN, AdamW as VITS's), then returns the generator's terms through them, frozen."""

    def __init__(self, discriminators: torch.nn.Module, learning_rate: float = 2e-4) -> None:
        self.discriminators = discriminators.train()
        self.optimizer = torch.optim.AdamW(discriminators.parameters(), lr=learning_rate, betas=(0.8, 0.99))

    @classmethod
    def from_checkpoint(cls, folder: str | Path, sample_rate: int) -> Adversary:
        """The discriminators of a vocoder training checkpoint, which must judge ``sample_rate`` audio."""
        discriminators, rate = load_discriminators(folder)
        if rate != sample_rate:
            raise ValueError(
                f"{folder}: its discriminators judge {rate} Hz audio; this base speaks at {sample_rate} Hz"
            )
        return cls(discriminators)

    def __call__(self, generated: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """generated, target ``[batch, samples]`` -> ``adversarial`` and ``feature_matching`` (with gradients
        to ``generated``) and ``discriminator``, the update's loss."""
        loss = update_discriminator(self.discriminators, self.optimizer, target, generated, clip=10.0)
        adversarial, matching = adversarial_terms(self.discriminators, target, generated)
        return {"adversarial": adversarial, "feature_matching": matching, "discriminator": loss.detach()}


def posterior_step_terms(
    model: PiperGenerator,
    posterior: PosteriorEncoder,
    loss_fn: SegmentLoss,
    batch: Sequence[Clip],
    starts: Sequence[int],
    config: PiperAdaptConfig,
    adversary: Adversary | None = None,
) -> dict[str, torch.Tensor]:
    """One step's loss of the posterior recipe on ``batch``, its windows at ``starts`` (latent frames):
    a dict of scalars, ``loss`` (what backward starts from) and its terms ``mel_l1``, ``stft_sc``,
    ``stft_log_mag`` and ``kl`` (and the ``adversary``'s, which it updates, when there is one)."""
    z, logs_q, z_p, m_p, logs_p, frame_mask, _ = align_to_prior(model, posterior, batch)
    kl = prior_kl(z_p, logs_q, m_p, logs_p, frame_mask)
    latents = [z[i, :, : c.frames] for i, c in enumerate(batch)]
    generated = decode_windows(model, latents, starts, config)
    target = target_windows(batch, starts, config, model.hop_length)
    terms = loss_fn(generated, target)
    loss = config.mel_weight * terms["mel_l1"] + config.stft_weight * (terms["stft_sc"] + terms["stft_log_mag"])
    if adversary is not None:
        terms.update(adversary(generated, target))
        loss = (
            loss
            + config.adversarial_weight * terms["adversarial"]
            + config.feature_matching_weight * terms["feature_matching"]
        )
    terms.update(loss=loss + config.kl_weight * kl, kl=kl)
    return terms


def train_posterior(
    model: PiperGenerator,
    posterior: PosteriorEncoder,
    clips: Sequence[Clip],
    trainable: list[torch.nn.Parameter],
    config: PiperAdaptConfig,
    log: LossLog | None = None,
    progress: bool = False,
) -> tuple[list[dict], int, float]:
    """The ``posterior`` recipe's step loop (VITS's generator step without its duration term, and without
    its adversarial ones unless ``config.discriminators`` names some): the posterior encoder reads each
    clip's latent; the decoder renders a window of it, judged
    against the recording (mel L1 x ``mel_weight`` + multi-resolution STFT); the flow carries the whole
    latent to the text prior's space, judged by the KL to the prior along the monotonic alignment.
    The posterior trains fully (it is not part of the voice); the generator trains through the adapters."""
    rng = np.random.default_rng(config.seed)
    posterior.train()
    optimizer = posterior_optimizer(trainable, posterior, config)
    loss_fn = SegmentLoss(model, config.stft_weight)
    adversary = Adversary.from_checkpoint(config.discriminators, model.sample_rate) if config.discriminators else None
    step = 0
    model.train()
    with StepLog(config, log, progress) as steps:
        for step in range(1, config.steps + 1):
            chosen = rng.choice(len(clips), size=min(config.batch_size, len(clips)), replace=False)
            batch = [clips[i] for i in chosen]
            starts = [int(rng.integers(0, max(1, c.frames - config.segment_frames) + 1)) for c in batch]
            terms = posterior_step_terms(model, posterior, loss_fn, batch, starts, config, adversary)
            optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            torch.nn.utils.clip_grad_norm_([*trainable, *posterior.parameters()], 10.0)
            optimizer.step()
            steps.add(step, terms)
            if steps.out_of_time:
                break
    model.eval()
    posterior.eval()
    return steps.rows, step, steps.seconds


@torch.no_grad()
def pace_of(model: PiperGenerator, posterior: PosteriorEncoder, clips: Sequence[Clip]) -> float:
    """The recordings' pace against the duration predictor's (which no adapter changes): frames the
    adapted prior aligns to the text over frames the predictor gives it (noise 0), over all clips. The
    voice speaks at this ``length_scale``."""
    aligned = predicted = 0.0
    for i in range(0, len(clips), 8):
        batch = clips[i : i + 8]
        durations = align_to_prior(model, posterior, batch, sample=False)[-1]
        aligned += float(durations.sum())
        ids = _pad_stack([c.ids for c in batch])
        text_mask = sequence_mask(torch.tensor([len(c.ids) for c in batch]), ids.shape[1])
        hidden = model.enc_p(ids, text_mask)[0]  # the predictor alone: no flow, no latent
        predicted += float(model.predicted_durations(hidden, text_mask).sum())
    return aligned / predicted


# ---------------------------------------------------------------- the recipe


def adapt_piper(
    data: str | Path | Sequence[Utterance],
    generator: PiperGenerator,
    out: str | Path | None,
    config: PiperAdaptConfig,
    base_sha256: str,
    progress: bool = False,
    base_name: str = "",
    notes: dict[str, str] | None = None,
    in_place: bool = False,
) -> PiperAdaptResult:
    """Adapt ``generator`` to the recordings of ``data`` (a dataset folder or utterances) and save the voice
    to ``out`` (its adapters; for full fine-tuning the whole generator; None: not saved). ``base_sha256``
    and ``base_name`` (as ``--base`` names it: ``piper-joe``, a voice file's name): the base, recorded in
    the voice so that it is spoken on that base and refused on another; ``notes``: more for its card (what the
    data check left out). Writes ``out``'s loss log beside it (``<out>.log.csv``). Trains on a copy of
    ``generator`` (the caller's stays bare, and may be adapted again) unless ``in_place`` (a command that loaded it
    for this voice alone); torch's thread count is set back after."""
    utterances = discover(data)[0] if isinstance(data, (str, Path)) else list(data)
    if utterances:  # the dataset's folder: given, or the one holding the clips' wavs/
        clips = utterances[0].audio_path.parent
        folder = Path(data) if isinstance(data, (str, Path)) else clips.parent if clips.name == "wavs" else clips
        refuse_voice_folder(out, folder)
        check_target_and_posterior(folder, base_sha256, config)
    if not in_place and not config.full:  # full fine-tuning trains on a copy of its own
        generator = copy.deepcopy(generator)
    with torch_threads(config.threads):
        return _adapt_piper(utterances, generator, out, config, base_sha256, progress, base_name, notes)


def check_target_and_posterior(folder: Path, base_sha256: str, config: PiperAdaptConfig) -> None:
    """Refuse what would train without a word and make no voice worth having: piper-joe's recordings on the
    installed joe (the base's own voice: it speaks as itself with no voice at all), and the shipped posterior
    encoder, distilled from joe, on another Piper voice (it reads recordings as joe's latents)."""
    shipped_posterior = config.recipe == "posterior" and config.posterior is None
    if not base_sha256 or not (shipped_posterior or folder.resolve().name == JOE_DATASET):
        return
    joe = installed_joe_is(base_sha256)
    if joe and folder.resolve().name == JOE_DATASET:
        raise ValueError(
            f"{folder}: piper-joe's recordings are this base's own voice (Piper's en_US-joe-medium), no voice to "
            "adapt to: it speaks as itself with no voice (chorus synthesize --base piper-joe); adapt another "
            "speaker's recordings (the shipped src/chorus/assets/samples/flite-slt, say)"
        )
    if shipped_posterior and not joe:
        raise ValueError(
            "the shipped posterior encoder was distilled from piper-joe and reads recordings as joe's latents; for "
            "another Piper voice distil its own (python scripts/distill_posterior.py --base VOICE.onnx --out DIR, "
            "about 13 minutes on 2 threads) and give it with --posterior DIR"
        )


def _adapt_piper(
    utterances: list[Utterance],
    generator: PiperGenerator,
    out: str | Path | None,
    config: PiperAdaptConfig,
    base_sha256: str,
    progress: bool,
    base_name: str,
    notes: dict[str, str] | None,
) -> PiperAdaptResult:
    torch.manual_seed(config.seed)
    aligned = config.recipe == "aligned"
    # The aligned recipe's durations come from the base, before any adapter exists.
    clips = prepare_clips(generator, utterances, align=aligned)
    minutes = sum(len(c.audio) for c in clips) / generator.sample_rate / 60
    speech_minutes = sum(speech_seconds(c.audio.numpy(), generator.sample_rate) for c in clips) / 60
    model, trainable = attach_voice(generator, config)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # the log is written beside the voice from step one
    columns = ["step", "seconds", "cpu_seconds", "loss", "mel_l1", "stft_sc", "stft_log_mag"]
    columns += [] if aligned else ["kl"]
    columns += ["adversarial", "feature_matching", "discriminator"] if config.discriminators else []
    log = LossLog(Path(f"{out}.log.csv"), columns) if out else None
    pace, posterior = 1.0, None
    if aligned:
        rows, steps, seconds = train(model, clips, trainable, config, log, progress)
    else:
        posterior = load_posterior(config)
        rows, steps, seconds = train_posterior(model, posterior, clips, trainable, config, log, progress)
        pace = round(pace_of(model, posterior, clips), 4)
    configs = config.method_configs()
    card = VoiceCard(
        name=Path(out).name if out else VOICE,
        methods=[FULL_FINE_TUNING] if config.full else [c.method for c in configs],
        base_model_sha256=base_sha256,
        base_model=base_name,
        data_minutes=round(minutes, 3),
        speech_minutes=round(speech_minutes, 3),
        train_seconds=round(seconds, 1),
        steps=steps,
        trainable_parameters=sum(p.numel() for p in trainable),
        metrics={
            "loss_start": rows[0]["loss"] if rows else None,
            "loss_end": rows[-1]["loss"] if rows else None,
            "train_cpu_seconds": rows[-1]["cpu_seconds"] if rows else 0.0,
        },
        notes={
            "recipe": config.recipe,
            "placement": config.placement,
            "threads": config.threads,
            # A run the time budget cut short says so (the default 10 minutes stopped 1-thread runs at 242-297 steps)
            "stopped": stop_note("time" if steps < config.steps else "steps", steps),
            **({"discriminators": config.discriminators} if config.discriminators else {}),
            **(notes or {}),
        },
        length_scale=pace,
        noise_scale=None if aligned else config.speak_noise_scale,
    )
    voice_dir = None if out is None else save_voice(out, model, VOICE, configs, card, full=config.full)
    return PiperAdaptResult(model, voice_dir, card, rows, posterior)


__all__ = [
    "PLACEMENTS",
    "VOICE",
    "Clip",
    "PiperAdaptConfig",
    "PiperAdaptResult",
    "adapt_piper",
    "align_durations",
    "attach_voice",
    "posterior_optimizer",
    "posterior_step_terms",
    "prepare_clips",
    "train",
]
