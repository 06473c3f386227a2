"""A trained speaker encoder as it is used: its network, mel settings and calibrated threshold;
embedding clips, scoring and verifying pairs; its folder on disk (``encoder.safetensors`` +
``config.json``) and the one that ships with Chorus.

The folder's ``config.json`` names its ``format`` and the encoder's sizes, never a module path, so a
folder written before the encoder moved packages loads unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from chorus.atomic import atomic_write_folder, recover_interrupted_write
from chorus.audio.io import load_audio
from chorus.audio.mel import MelConfig, log_mel
from chorus.models.bundle import file_sha256
from chorus.speaker_recognition.encoder import SpeakerEncoder, SpeakerEncoderConfig

ENCODER_FORMAT = "chorus-speaker-encoder"
WEIGHTS, CONFIG = "encoder.safetensors", "config.json"
SHIPPED_ENCODER = Path(__file__).resolve().parents[1] / "assets" / "speaker_encoder"  # the default encoder
# The GPU-trained encoder v3 (checkpoints/speaker-encoder-v3), shipped for the consent check's fused score only:
# the default encoder above still starts voices, whose figures were measured with it.
SHIPPED_CONSENT_ENCODER = Path(__file__).resolve().parents[1] / "assets" / "speaker_encoder_v3"
CONSENT_ENCODER_NAME = "chorus-v3"  # its name in the cohort's embeddings and settings
LONGEST_PASS_SECONDS = 60.0  # embedded in one pass up to this; a longer clip in pieces (see EncoderBundle.embed)


@dataclass
class EncoderBundle:
    """A trained encoder with what it needs to embed audio: its mel settings and the threshold of
    same/different calibrated on held-out trials (the EER point). ``info``: how it was made."""

    encoder: SpeakerEncoder
    mel_config: MelConfig = field(default_factory=MelConfig)
    threshold: float = 0.5
    info: dict = field(default_factory=dict)
    weights_sha256: str = ""  # of encoder.safetensors when loaded from disk: what embeddings were made with

    @torch.no_grad()
    def embed(self, clips: Sequence[np.ndarray | str | Path]) -> np.ndarray:
        """``[N, D]`` unit embeddings, one row per clip (arrays at the mel settings' rate, or files), in order."""
        self.encoder.eval()
        device = next(self.encoder.parameters()).device
        rows = []
        for clip in clips:
            audio = load_audio(clip, self.mel_config.sample_rate) if isinstance(clip, str | Path) else clip
            rows.append(self._embed_audio(np.asarray(audio), device))
        return np.stack(rows) if rows else np.zeros((0, self.encoder.config.embedding_dim), np.float32)

    def _embed_audio(self, audio: np.ndarray, device: torch.device) -> np.ndarray:
        """``[D]``: one pass for a clip up to ``LONGEST_PASS_SECONDS``; a longer one in equal pieces under it,
        their embeddings weighted by length and made unit again (one pass over 10 minutes had held 1.8 GB)."""
        longest = int(LONGEST_PASS_SECONDS * self.mel_config.sample_rate)
        pieces = np.array_split(audio, -(-audio.size // longest)) if audio.size > longest else [audio]
        rows = []
        for piece in pieces:
            mel = torch.from_numpy(log_mel(piece, self.mel_config)).unsqueeze(0).to(device)
            rows.append(self.encoder(mel)[0].cpu().numpy())
        if len(rows) == 1:
            return rows[0]
        total = np.average(np.stack(rows), axis=0, weights=[piece.size for piece in pieces])
        return (total / np.linalg.norm(total)).astype(np.float32)

    def score(self, a: np.ndarray, b: np.ndarray) -> float:
        """Cosine similarity of two embeddings (unit vectors: their dot product)."""
        return float(np.dot(a, b))

    def verify(self, a: np.ndarray, b: np.ndarray) -> tuple[float, bool]:
        """The score of two embeddings ``[D]`` and whether it reaches the calibrated threshold (same speaker)."""
        score = self.score(a, b)
        return score, score >= self.threshold


def save_encoder(bundle: EncoderBundle, folder: str | Path) -> Path:
    """``encoder.safetensors`` + ``config.json``, written atomically."""

    def write(temp: Path) -> None:
        state = {k: v.detach().contiguous().cpu() for k, v in bundle.encoder.state_dict().items()}
        save_file(state, str(temp / WEIGHTS), metadata={"format": ENCODER_FORMAT})
        config = {
            "format": ENCODER_FORMAT,
            "version": 1,
            "encoder": bundle.encoder.config.to_dict(),
            "mel": bundle.mel_config.to_dict(),
            "threshold": bundle.threshold,
            "info": bundle.info,
        }
        (temp / CONFIG).write_text(json.dumps(config, indent=2))

    return atomic_write_folder(Path(folder), write)


def shipped_encoder_dir() -> Path | None:
    """The encoder folder that ships with Chorus, None where it is absent (a source checkout without it)."""
    return SHIPPED_ENCODER if (SHIPPED_ENCODER / CONFIG).is_file() else None


def load_encoder(folder: str | Path, device: str = "cpu") -> EncoderBundle:
    """An encoder folder written by :func:`save_encoder`; ``ValueError`` naming the problem otherwise."""
    folder = Path(folder)
    recover_interrupted_write(folder)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{folder}: not a speaker encoder folder ({error})") from None
    if not isinstance(config, dict) or config.get("format") != ENCODER_FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise ValueError(f"{folder / CONFIG}: format {found!r} is not {ENCODER_FORMAT!r}")
    missing = [key for key in ("encoder", "mel", "threshold") if key not in config]
    if missing:  # a bare KeyError had said only "error: encoder"
        raise ValueError(f"{folder / CONFIG}: no {', '.join(missing)} in it")
    encoder = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config["encoder"])).to(device)
    try:
        encoder.load_state_dict(load_file(str(folder / WEIGHTS), device=device))
    except Exception as error:  # safetensors' own errors for a damaged file, RuntimeError for shapes
        raise ValueError(f"{folder / WEIGHTS}: cannot load the encoder's weights ({error})") from None
    return EncoderBundle(
        encoder.eval(),
        MelConfig(**config["mel"]),
        float(config["threshold"]),
        config.get("info", {}),
        file_sha256(folder / WEIGHTS),
    )
