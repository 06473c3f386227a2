"""Text in, audio out: the acoustic model + a vocoder, with timing for the real-time factor."""

from __future__ import annotations

import copy
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import active_adapter
from chorus.adapters.voice import apply_voice, read_voice
from chorus.audio.vocoders import Vocoder, load_vocoder
from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle, load_bundle

ASSETS = Path(__file__).parent / "assets"
DEFAULT_BASE = ASSETS / "base"
DEFAULT_VOCODER = ASSETS / "vocoder"
SAMPLE_VOICE = ASSETS / "samples" / "piper-joe"  # 1 minute of a speaker held out of pretraining


@dataclass
class SynthesisResult:
    audio: np.ndarray  # [samples] float32 in [-1, 1]
    sample_rate: int
    seconds: float  # wall time spent synthesizing
    speaker: str

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def real_time_factor(self) -> float:
        """Synthesis time / audio duration; below 1 is faster than real time."""
        return self.seconds / max(self.duration, 1e-9)


class Synthesizer:
    """A loaded base model and vocoder. ``synthesize`` turns text into audio in one of its
    speakers or in a loaded adapted voice."""

    def __init__(self, bundle: ModelBundle, vocoder: Vocoder):
        if vocoder.mel_config != bundle.mel_config:
            raise ValueError(f"vocoder mel settings {vocoder.mel_config} differ from the model's {bundle.mel_config}")
        self.bundle = bundle
        self.vocoder = vocoder.eval()
        # Adapted voices by name: (the model that holds it, its adapter name there). Adapter voices
        # live inside bundle.model; fully fine-tuned ones are models of their own.
        self.voices: dict[str, tuple[AcousticModel, str]] = {}

    def load_voice(self, folder: str | Path, name: str | None = None) -> str:
        """Add the voice saved in ``folder`` (``chorus adapt`` output or a PEFT LoRA); returns its name
        (default: the folder's name)."""
        name = name or Path(folder).name
        if name in self.voices:
            raise ValueError(f"a voice named {name!r} is already loaded")
        voice = read_voice(folder)
        model = copy.deepcopy(self.bundle.model) if voice.full else self.bundle.model
        # Adapter names become module keys, which cannot hold dots; user-facing names may.
        adapter = f"voice{len(self.voices)}"
        apply_voice(model, voice, adapter, self.bundle.weights_sha256)
        self.voices[name] = (model if voice.full else self.bundle.model, adapter)
        return name

    def _model_for(self, voice: str | None) -> tuple[AcousticModel, AbstractContextManager]:
        if voice is None:
            return self.bundle.model, active_adapter(self.bundle.model, None)
        if voice not in self.voices:
            raise KeyError(f"unknown voice {voice!r}; loaded voices: {', '.join(self.voices) or 'none'}")
        model, adapter = self.voices[voice]
        return model, active_adapter(model, adapter)

    @property
    def speakers(self) -> list[str]:
        return list(self.bundle.speakers)

    @property
    def sample_rate(self) -> int:
        return self.bundle.mel_config.sample_rate

    def resolve_speaker(self, speaker: str | int | None) -> int:
        if speaker is None:
            return self.bundle.speaker_index(self.bundle.default_speaker)
        if isinstance(speaker, int) or (
            isinstance(speaker, str) and speaker.isdigit() and speaker not in self.speakers
        ):
            index = int(speaker)
            if not 0 <= index < len(self.speakers):
                raise KeyError(f"speaker index {index} out of range 0..{len(self.speakers) - 1}")
            return index
        return self.bundle.speaker_index(speaker)

    @torch.no_grad()
    def mel(
        self, texts: list[str], speaker: str | int | None = None, length_scale: float = 1.0, voice: str | None = None
    ) -> list[torch.Tensor]:
        """Raw log-mels ``[frames, n_mels]`` for each text (one batched forward), in the base
        ``speaker`` or, if given, the loaded adapted ``voice``."""
        model, using_voice = self._model_for(voice)
        ids = self.bundle.front_end.encode(texts)
        lengths = torch.tensor([len(i) for i in ids])
        phonemes = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for row, seq in enumerate(ids):
            phonemes[row, : len(seq)] = torch.tensor(seq)
        device = model.mel_mean.device
        speakers = torch.full((len(ids),), self.resolve_speaker(speaker), dtype=torch.long, device=device)
        with using_voice:
            out = model.infer(phonemes.to(device), lengths.to(device), speaker_ids=speakers, length_scale=length_scale)
        mels = model.denormalize_mel(out.mel)
        return [mels[row, : int(mask.sum())] for row, mask in enumerate(out.frame_mask)]

    @torch.no_grad()
    def synthesize(
        self, text: str, speaker: str | int | None = None, length_scale: float = 1.0, voice: str | None = None
    ) -> SynthesisResult:
        """Speak ``text`` in the base speaker ``speaker`` (name or index; None = the default speaker)
        or in the loaded adapted ``voice`` (see :meth:`load_voice`)."""
        started = time.perf_counter()
        mel = self.mel([text], speaker, length_scale, voice)[0]
        audio = self.vocoder(mel.unsqueeze(0))[0].float().cpu().numpy()
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        if peak > 0.99:  # the vocoder may overshoot; scale rather than clip
            audio = audio * (0.99 / peak)
        elapsed = time.perf_counter() - started
        name = voice or self.speakers[self.resolve_speaker(speaker)]
        return SynthesisResult(audio.astype(np.float32), self.sample_rate, elapsed, name)


def load_base(path: str | Path | None = None, vocoder: str | Path | None = None, device: str = "cpu") -> Synthesizer:
    """The shipped base model (or the model folder at ``path``) and a vocoder.

    ``vocoder``: a saved vocoder folder, a registered name (``"griffin-lim"``), ``"neural"`` for the
    shipped neural vocoder, or None for the model's ``default_vocoder`` (chosen on the judges when it
    was shipped; Griffin-Lim when the model names none).
    """
    bundle = load_bundle(path or DEFAULT_BASE, device)
    vocoder = vocoder or bundle.info.get("default_vocoder", "griffin-lim")
    if str(vocoder) == "neural":
        vocoder = DEFAULT_VOCODER
    return Synthesizer(bundle, load_vocoder(vocoder, mel_config=bundle.mel_config, device=device))
