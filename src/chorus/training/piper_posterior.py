"""Distilling a posterior encoder for a Piper voice (:class:`~chorus.models.piper_posterior.PosteriorEncoder`).

Piper's export keeps no posterior encoder, but the generator tells exactly what one must answer: the voice
speaks a sentence from a latent ``z`` it drew, so (audio, ``z``) pairs come for free. The encoder learns to
read ``z`` back from the audio (Gaussian negative log-likelihood of the drawn ``z``), and then reads a new
speaker's recordings into the same latent space, where the voice's flow and decoder can learn them
(:mod:`chorus.training.piper_adapt`, the ``posterior`` recipe).

1. **data**: the voice reads training sentences (never a sentence a held-out speaker reads, so nothing of
   the held-out datasets enters), each at a random noise scale and pace, so the encoder sees latents as
   varied as inference draws; audio and latents are kept in memory.
2. **model**: a fresh encoder; 3. **optimizer**: AdamW; 4. **step loop**: random windows of
   ``segment_frames`` frames; 5. **save**: ``posterior.safetensors`` + ``posterior.json`` (a model card).
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus.corpus.build import heldout_sentence_ids
from chorus.corpus.text import training_sentences
from chorus.models.piper_posterior import PosteriorConfig, PosteriorEncoder
from chorus.models.piper_vits import PiperGenerator
from chorus.text.normalize import normalize_text
from chorus.training.loss_log import LossLog


@dataclass
class DistillConfig:
    """How a posterior encoder is distilled from a Piper voice."""

    sentences: int = field(default=400, metadata={"help": "sentences the voice reads"})
    steps: int = field(default=1500, metadata={"help": "optimizer steps"})
    batch_size: int = 16
    segment_frames: int = field(default=96, metadata={"help": "latent frames per training window"})
    learning_rate: float = 2e-4
    noise_scales: tuple[float, float] = field(default=(0.3, 1.0), metadata={"help": "range of prior noise drawn"})
    length_scales: tuple[float, float] = field(default=(0.8, 1.25), metadata={"help": "range of paces drawn"})
    n_layers: int = 8
    threads: int = 2
    seed: int = 1234
    log_every: int = 25


def distillation_sentences(count: int, seed: int = 1234) -> list[str]:
    """``count`` training sentences that no held-out speaker reads, in a fixed shuffled order."""
    reserved = heldout_sentence_ids()
    pool = [text for sentence_id, text in training_sentences() if sentence_id not in reserved]
    random.Random(seed).shuffle(pool)
    return [normalize_text(text, warn=False) for text in pool[:count]]


@torch.inference_mode()
def spoken_latents(
    generator: PiperGenerator, texts: list[str], config: DistillConfig
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The voice reads each text -> ``(audio [frames * hop], z [inter, frames])`` pairs."""
    rng = np.random.default_rng(config.seed)
    noise = torch.Generator().manual_seed(config.seed)
    pairs = []
    for text in texts:
        ids = torch.tensor([generator.voice.text_ids(text)])
        z, frames, _ = generator.latent(
            ids,
            torch.tensor([ids.shape[1]]),
            noise_scale=float(rng.uniform(*config.noise_scales)),
            length_scale=float(rng.uniform(*config.length_scales)),
            noise_w=generator.voice.noise_w,
            generator=noise,
        )
        audio = generator.dec(z)[0]
        pairs.append((audio, z[0]))
    return pairs


def gaussian_nll(z: torch.Tensor, m: torch.Tensor, logs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood (less the constant) of z under N(m, exp(logs)) over masked frames."""
    nll = logs + 0.5 * (z - m).pow(2) * torch.exp(-2 * logs)
    return (nll * mask).sum() / (mask.sum() * z.shape[1])


def _windows(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], size: int, hop: int, rng: np.random.Generator, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = rng.integers(0, len(pairs), size=count)
    audio, latents = [], []
    for index in chosen:
        clip, z = pairs[int(index)]
        start = int(rng.integers(0, max(1, z.shape[1] - size) + 1))
        window = z[:, start : start + size]
        samples = clip[start * hop : (start + size) * hop]
        latents.append(torch.nn.functional.pad(window, (0, size - window.shape[1])))
        audio.append(torch.nn.functional.pad(samples, (0, size * hop - len(samples))))
    return torch.stack(audio), torch.stack(latents)


def distill_posterior(
    generator: PiperGenerator, config: DistillConfig, out: str | Path, base_name: str = "", progress: bool = False
) -> PosteriorEncoder:
    """Distil, save into ``out`` (with ``<out>/loss.csv``) and return the encoder."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    texts = distillation_sentences(config.sentences, config.seed)
    pairs = spoken_latents(generator, texts, config)
    speak_seconds = time.perf_counter() - started
    hop = generator.hop_length
    encoder = PosteriorEncoder(PosteriorConfig(generator.config.inter_channels, hop, n_layers=config.n_layers)).train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=config.learning_rate, betas=(0.8, 0.99))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log = LossLog(out / "loss.csv", ["step", "seconds", "nll", "mean_abs_error"])
    rng = np.random.default_rng(config.seed)
    window: list[tuple[float, float]] = []
    for step in range(1, config.steps + 1):
        audio, z = _windows(pairs, config.segment_frames, hop, rng, config.batch_size)
        _, m, logs, mask = encoder(audio)
        loss = gaussian_nll(z, m, logs, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 5.0)
        optimizer.step()
        window.append((float(loss.detach()), float((z - m).detach().abs().mean())))
        if step % config.log_every == 0 or step == config.steps:
            row = {
                "step": step,
                "seconds": round(time.perf_counter() - started, 1),
                "nll": round(float(np.mean([w[0] for w in window])), 4),
                "mean_abs_error": round(float(np.mean([w[1] for w in window])), 4),
            }
            log.append([row])
            window = []
            if progress:
                print(row, flush=True)
    encoder.eval()
    text_hash = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    encoder.save(
        out,
        {
            "base": base_name,
            "recipe": "chorus.training.piper_posterior.distill_posterior",
            "settings": asdict(config),
            "sentences_sha256_16": text_hash,
            "data": f"{len(texts)} training sentences read by the base voice itself (no held-out speaker's "
            "sentence), at random noise scales and paces; the encoder learns the latents the voice drew",
            "speak_seconds": round(speak_seconds, 1),
            "total_seconds": round(time.perf_counter() - started, 1),
        },
    )
    return encoder


__all__ = ["DistillConfig", "distill_posterior", "distillation_sentences", "gaussian_nll", "spoken_latents"]
