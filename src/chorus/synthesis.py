"""Text in, audio out: the acoustic model + a vocoder, with timing for the real-time factor.

Text of any length is split into sentences (:func:`chorus.text.sentences.split_sentences`) and read one
sentence at a time, with ``sentence_silence`` seconds between them; :meth:`Synthesizer.stream` yields
each sentence's audio as it is made. Every result carries word and phoneme timestamps from the durations
the model predicted.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import active_adapter
from chorus.adapters.voice import apply_voice, read_voice
from chorus.atomic import atomic_write
from chorus.audio.encode import encode_whole, format_for
from chorus.audio.postfilter import MelPostFilter
from chorus.audio.vocoders import Vocoder, load_vocoder
from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle, load_bundle, teacher_forced_mel
from chorus.models.speaker_mix import is_mix
from chorus.text.sentences import speech_pieces
from chorus.text.ssml import Pause
from chorus.text.timestamps import Timestamp

ASSETS = Path(__file__).parent / "assets"
DEFAULT_BASE = ASSETS / "base"
DEFAULT_VOCODER = ASSETS / "vocoder"
SAMPLE_VOICE = ASSETS / "samples" / "piper-joe"  # 1 minute of a speaker held out of pretraining


SENTENCE_SILENCE = 0.2  # seconds between sentences


@dataclass
class SynthesisResult:
    audio: np.ndarray  # [samples] float32 in [-1, 1]
    sample_rate: int
    seconds: float  # wall time spent synthesizing
    speaker: str
    words: list[Timestamp] = field(default_factory=list)  # start/end of every spoken word
    phonemes: list[Timestamp] = field(default_factory=list)  # start/end of every phoneme symbol
    text: str = ""

    def to_bytes(self, audio_format: str = "wav", sample_rate: int | None = None) -> bytes:
        """The audio as one file of ``audio_format`` (wav, flac, mp3, opus, aac, pcm), at ``sample_rate``
        (default: the model's; Opus takes 8-48 kHz in five steps)."""
        return encode_whole(self.audio, self.sample_rate, audio_format, sample_rate)

    def save(self, path: str | Path, audio_format: str | None = None, sample_rate: int | None = None) -> Path:
        """Write the audio to ``path``, in ``audio_format`` or the one its suffix names; returns the path."""
        path = Path(path)
        data = self.to_bytes(format_for(path, audio_format), sample_rate)
        atomic_write(path, lambda temp: Path(temp).write_bytes(data))
        return path

    to_file = save

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
        # The base's spectra pass through its post-filter on their way to the vocoder (set it to
        # MelPostFilter() to hear them raw); the server's batches take the same one.
        self.postfilter: MelPostFilter = bundle.postfilter
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

    def resolve_speaker(self, speaker: str | int | None) -> int | str:
        """A speaker's index, or a validated blend (``"flite-rms(2)+festival-kal(1)"``) as it is."""
        if isinstance(speaker, str) and is_mix(speaker):
            self.bundle.speaker_mix(speaker)  # raises for a bad blend, before any work
            return speaker
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
        ``speaker`` or, if given, the loaded adapted ``voice``. Each text is read as one utterance."""
        return [mel for mel, _, _ in self._mel_and_durations(texts, speaker, length_scale, voice)]

    def _mel_and_durations(
        self, texts: list[str], speaker: str | int | None, length_scale: float, voice: str | None
    ) -> list[tuple[torch.Tensor, list[int], str]]:
        """(log-mel ``[frames, n_mels]``, frames per symbol, symbols) of each text."""
        model, using_voice = self._model_for(voice)
        ids = self.bundle.front_end.encode(texts)
        lengths = torch.tensor([len(i) for i in ids])
        phonemes = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for row, seq in enumerate(ids):
            phonemes[row, : len(seq)] = torch.tensor(seq)
        device = model.mel_mean.device
        resolved = self.resolve_speaker(speaker)
        if isinstance(resolved, str):  # a blend of speakers: one vector for every row
            condition = {"speaker_vectors": self.bundle.speaker_mix(resolved).to(device).expand(len(ids), -1)}
        else:
            condition = {"speaker_ids": torch.full((len(ids),), resolved, dtype=torch.long, device=device)}
        with using_voice:
            out = model.infer(phonemes.to(device), lengths.to(device), length_scale=length_scale, **condition)
        mels = model.denormalize_mel(out.mel)
        symbols = self.bundle.front_end.symbols
        return [
            (
                mels[row, : int(mask.sum())],
                [int(d) for d in out.durations[row, : len(ids[row])].tolist()],
                symbols.decode(ids[row]),
            )
            for row, mask in enumerate(out.frame_mask)
        ]

    @torch.no_grad()
    def teacher_forced(
        self, text: str, recorded_mel: torch.Tensor, speaker: str | int | None = None, voice: str | None = None
    ) -> torch.Tensor:
        """Log-mel ``[frames, n_mels]`` of ``text`` with the timing of ``recorded_mel`` ``[frames, n_mels]``
        (a recording of it): how the base ``speaker`` or the loaded ``voice`` would say it at that pace."""
        model, using_voice = self._model_for(voice)
        resolved = self.resolve_speaker(speaker)
        if isinstance(resolved, str):
            raise ValueError("teacher forcing takes one speaker, not a blend")
        with using_voice:
            return teacher_forced_mel(self.bundle, text, recorded_mel, resolved, model)

    @torch.no_grad()
    def _sentence(
        self, text: str, speaker: str | int | None, length_scale: float, voice: str | None
    ) -> SynthesisResult:
        started = time.perf_counter()
        mel, frames, symbols = self._mel_and_durations([text], speaker, length_scale, voice)[0]
        audio = self.vocoder(self.postfilter(mel).unsqueeze(0))[0].float().cpu().numpy()
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        if peak > 0.99:  # the vocoder may overshoot; scale rather than clip
            audio = audio * (0.99 / peak)
        elapsed = time.perf_counter() - started
        config = self.bundle.mel_config
        words, phonemes = self.bundle.front_end.timings(text, frames, config.hop_length / config.sample_rate, symbols)
        resolved = self.resolve_speaker(speaker)
        name = voice or (resolved if isinstance(resolved, str) else self.speakers[resolved])
        return SynthesisResult(audio.astype(np.float32), self.sample_rate, elapsed, name, words, phonemes, text)

    def stream(
        self,
        text: str,
        speaker: str | int | None = None,
        length_scale: float = 1.0,
        voice: str | None = None,
        max_chars: int = 300,
    ) -> Iterator[SynthesisResult]:
        """One result per sentence of ``text``, each as soon as it is made (timestamps from its own start).
        SSML (text starting with ``<speak``, :mod:`chorus.text.ssml`) is read too: a ``<break>`` comes as
        a result of silence (``text`` empty)."""
        for piece in speech_pieces(text, max_chars):
            if isinstance(piece, Pause):
                yield SynthesisResult(np.zeros(piece.samples(self.sample_rate), np.float32), self.sample_rate, 0.0, "")
            else:
                yield self._sentence(piece, speaker, length_scale, voice)

    def synthesize(
        self,
        text: str,
        speaker: str | int | None = None,
        length_scale: float = 1.0,
        voice: str | None = None,
        sentence_silence: float = SENTENCE_SILENCE,
    ) -> SynthesisResult:
        """Speak ``text`` (any length: read sentence by sentence, ``sentence_silence`` seconds apart) in the
        base ``speaker`` (name, index or blend such as ``"flite-rms(2)+festival-kal(1)"``; None = the default
        speaker) or in the loaded adapted ``voice`` (see :meth:`load_voice`)."""
        if sentence_silence < 0:
            raise ValueError(f"sentence_silence must be >= 0 seconds, got {sentence_silence}")
        gap = np.zeros(int(round(sentence_silence * self.sample_rate)), dtype=np.float32)
        parts, words, phonemes, seconds, offset, name = [], [], [], 0.0, 0, ""
        after_pause = True  # no sentence silence before the first sentence, nor after an SSML break
        for result in self.stream(text, speaker, length_scale, voice):
            if not result.text:  # an SSML break: its own silence instead of the sentence silence
                parts.append(result.audio)
                offset += len(result.audio)
                after_pause = True
                continue
            if not after_pause:
                parts.append(gap)
                offset += len(gap)
            after_pause = False
            shift = offset / self.sample_rate
            words += [w.shifted(shift) for w in result.words]
            phonemes += [p.shifted(shift) for p in result.phonemes]
            parts.append(result.audio)
            offset += len(result.audio)
            seconds += result.seconds
            name = result.speaker
        if not name:
            raise ValueError(f"nothing speakable in text {text[:80]!r}")
        return SynthesisResult(np.concatenate(parts), self.sample_rate, seconds, name, words, phonemes, text)


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
