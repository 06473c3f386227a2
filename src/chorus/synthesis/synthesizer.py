"""Text in, audio out, for one user: :class:`Synthesizer`, a face on the engine that serves many.

Text of any length is laid out in sentences (:func:`chorus.synthesis.timeline.layout`) and read through
the engine (:class:`~chorus.synthesis.engine.Engine`, the one synthesis path the server also takes), with
``sentence_silence`` seconds between them; :meth:`Synthesizer.stream` yields each sentence's audio as it is
made. As the server's batcher does, it reads several sentences in one forward (:data:`STREAM_BATCH`), after
the first alone so that the first audio comes soonest; the engine reads each row as it would alone (the
Piper base seeds every row's noise the same way), so a batched sentence differs from its reading alone by
float rounding only. Every result carries word and phoneme timestamps from the durations
the base predicted. Voices live in the engine, named as the server names them: a speaker of the base, a
blend, or an adapted voice loaded by :meth:`Synthesizer.load_voice`.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterable, Iterator, MutableMapping
from pathlib import Path

import torch
from torch import nn

from chorus.adapters import active_adapter, adapter_names
from chorus.adapters.voice import is_voice_folder
from chorus.audio.postfilter import MelPostFilter
from chorus.audio.vocoders import Vocoder
from chorus.models.bundle import ModelBundle, teacher_forced_mel
from chorus.synthesis.bases import Base, open_base
from chorus.synthesis.bases.chorus import ASSETS, ChorusBase
from chorus.synthesis.engine import AdaptedVoice, Engine, EngineVoice, SentenceRequest
from chorus.synthesis.forward import SentenceResult, check_speed
from chorus.synthesis.result import SynthesisResult
from chorus.synthesis.timeline import SENTENCE_SILENCE, Timeline, layout, silence
from chorus.synthesis.voices import Blend, Speaker, SpeakerSpec, check_speaker_type, openai_voice
from chorus.text.ssml import Pause

SAMPLE_VOICE = ASSETS / "samples" / "piper-joe"  # 1 minute of a speaker held out of pretraining
# A Piper joe base speaks joe itself: its demo adapts another held-out speaker.
PIPER_SAMPLE_VOICE = ASSETS / "samples" / "flite-slt"
# Sentences per forward when streaming, after the first (read alone: the first audio comes soonest). On ~500
# words (shipped base, 1 thread, 2 shared cores) batches of 4, 8 and 16 took the same time within 3%, 15-20%
# less than one sentence a forward; a batch is also what a reader waits for between two sentences, and
# what is held in memory at once.
STREAM_BATCH = 8


class LoadedVoices(MutableMapping[str, tuple[nn.Module, str]]):
    """The adapted voices a :class:`Synthesizer` has loaded, by name: ``(the model that holds it, its adapter
    name there)``. Setting one adds a voice already in memory (:meth:`Engine.add_loaded`), e.g. a voice just
    trained: ``tts.voices["adapted"] = (model, adapter)``."""

    def __init__(self, engine: Engine):
        self._engine = engine

    def __getitem__(self, name: str) -> tuple[nn.Module, str]:
        entry = self._engine.cached(name)
        if entry is None:
            raise KeyError(name)
        return (self._engine.model if entry.base is None else entry.base.model), entry.adapter

    def __setitem__(self, name: str, voice: tuple[nn.Module, str]) -> None:
        if not (isinstance(voice, tuple) and len(voice) == 2 and isinstance(voice[0], nn.Module)):
            hint = (
                "; a voice folder is loaded with tts.load_voice(folder, name)" if isinstance(voice, (str, Path)) else ""
            )
            raise TypeError(f"a voice in memory is (model, adapter name), got {type(voice).__name__}{hint}")
        model, adapter = voice
        if adapter not in adapter_names(model):  # else it failed only when it spoke
            raise KeyError(f"no adapter {adapter!r} on that model; it has: {', '.join(adapter_names(model)) or 'none'}")
        self._engine.add_loaded(name, model, adapter)

    def __delitem__(self, name: str) -> None:
        self._engine.remove_voice(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._engine.resident())

    def __len__(self) -> int:
        return len(self._engine.resident())


class Synthesizer:
    """A base (Chorus's acoustic model + vocoder, or a Piper voice) and the voices loaded on it, for one user.
    ``synthesize`` turns text into audio in one of its speakers or in a loaded adapted voice.

    Made from a :class:`~chorus.synthesis.bases.Base`, or from a Chorus model ``bundle`` and its ``vocoder``.
    """

    def __init__(self, base: Base | ModelBundle, vocoder: Vocoder | None = None):
        if isinstance(base, (str, Path)):
            raise TypeError(f"Synthesizer takes a loaded base; for {str(base)!r} use chorus.load_base({str(base)!r})")
        if isinstance(base, ModelBundle):
            if vocoder is None:
                raise ValueError("a Chorus model bundle speaks through a vocoder: give one")
            base = ChorusBase(base, vocoder)
        elif vocoder is not None:
            raise ValueError("a vocoder goes with a Chorus model bundle, not with a base")
        # Voices a user loads stay until removed: pinned, so no budget applies.
        self.engine = Engine(base)
        self.base = base
        self.voices = LoadedVoices(self.engine)

    @property
    def bundle(self) -> ModelBundle:
        """The Chorus base's model bundle (``ValueError`` on a Piper base)."""
        return self.engine.bundle

    @property
    def vocoder(self) -> Vocoder:
        return self._chorus().vocoder

    @property
    def postfilter(self) -> MelPostFilter:
        """What the Chorus base's spectra pass through on their way to the vocoder (set it to
        ``MelPostFilter()`` to hear them raw); the server's batches take the same one."""
        return self._chorus().postfilter

    @postfilter.setter
    def postfilter(self, value: MelPostFilter) -> None:
        self._chorus().postfilter = value

    def _chorus(self) -> ChorusBase:
        if not isinstance(self.base, ChorusBase):
            raise ValueError(f"the {self.base.name} base makes audio itself: it has no vocoder, post-filter or mel")
        return self.base

    def load_voice(self, folder: str | Path, name: str | None = None) -> str:
        """Add the voice saved in ``folder`` (``chorus adapt`` output or a PEFT LoRA); returns its name
        (default: the folder's name). A voice made on another base is refused, naming both."""
        name = name or Path(folder).name
        if name in self.voices:
            raise ValueError(f"a voice named {name!r} is already loaded; give this one another (name=...)")
        self.engine.add_voice(name, folder, pin=True)
        return name

    @property
    def speakers(self) -> list[str]:
        """The base's speakers by name, in the order of their indices."""
        return self.base.speakers

    @property
    def default_speaker(self) -> str:
        """Who speaks when no speaker is named."""
        return self.base.default_speaker

    @property
    def sample_rate(self) -> int:
        """The rate (Hz) of every result's audio: the base's (22,050 for the Chorus base)."""
        return self.base.sample_rate

    def resolve_speaker(self, speaker: SpeakerSpec) -> Speaker | Blend:
        """A speaker (name, index, None for the default, or one of OpenAI's voice names: "alloy" speaks as
        :data:`~chorus.synthesis.voices.OPENAI_VOICE_ALIASES` says) or a blend
        (``"flite-rms(2)+festival-kal(1)"``) as a typed voice, checked before any work (and parsed once: pass
        it on instead of the name). ``KeyError`` for a name the base lacks, ``TypeError`` for what is no name."""
        if isinstance(speaker, numbers.Integral) and not isinstance(speaker, bool):
            speaker = int(speaker)  # a numpy index too
        check_speaker_type(speaker)
        try:
            return self.base.speaker(openai_voice(speaker, self.speakers))
        except KeyError:
            if isinstance(speaker, str) and speaker in self.voices:
                raise KeyError(
                    f"{speaker!r} is a loaded adapted voice, not a speaker: pass voice={speaker!r}"
                ) from None
            if isinstance(speaker, str) and is_voice_folder(speaker):  # a new user's probe: -s voices/joe
                raise KeyError(
                    f"{speaker!r} is an adapted voice's folder, not a speaker: load it with tts.load_voice "
                    "(the command line's --voice)"
                ) from None
            raise

    def _voice(self, speaker: SpeakerSpec, voice: str | None) -> EngineVoice:
        """The engine's voice for the base ``speaker`` or the loaded adapted ``voice`` (which speaks with
        ``speaker``'s row of the table, unless its own speaker vector overrides it)."""
        resolved = self.resolve_speaker(speaker)
        if voice is None:
            return resolved
        if not isinstance(voice, str):
            raise TypeError(f"voice is a loaded voice's name (a str), got {type(voice).__name__}")
        if voice not in self.voices:
            close = [name for name in self.voices if name.lower() == voice.lower()]
            hint = (
                f"; did you mean {close[0]!r}? (voice names keep their case)"
                if close
                else "; a voice folder is loaded first: name = tts.load_voice(folder)"
            )
            raise KeyError(f"unknown voice {voice!r}; loaded voices: {', '.join(self.voices) or 'none'}{hint}")
        if isinstance(resolved, Blend):
            raise ValueError("an adapted voice speaks with one speaker's row, not a blend")
        return AdaptedVoice(voice, speaker=None if speaker is None else resolved.index)

    def _speak(self, texts: list[str], voice: EngineVoice, speed: float, vocode: bool = True) -> list[SentenceResult]:
        """Each of ``texts`` as one sentence, in one batch; raises the error of the first that failed."""
        return [
            _raise_or(r)
            for r in self.engine.synthesize([SentenceRequest(t, voice, speed) for t in texts], vocode=vocode)
        ]

    @torch.no_grad()
    def mel(
        self, texts: list[str], speaker: SpeakerSpec = None, speed: float = 1.0, voice: str | None = None
    ) -> list[torch.Tensor]:
        """Raw log-mels ``[frames, n_mels]`` of the Chorus base for each text (one batched forward), in the
        base ``speaker`` or, if given, the loaded adapted ``voice``. Each text is read as one utterance."""
        self._chorus()
        if isinstance(texts, str):  # else read as a list of its characters
            raise TypeError("texts is a list of sentences: mel([text])")
        return [result.mel for result in self._speak(texts, self._voice(speaker, voice), speed, vocode=False)]

    @torch.no_grad()
    def teacher_forced(
        self,
        text: str,
        recorded_mel: torch.Tensor,
        speaker: SpeakerSpec = None,
        voice: str | None = None,
    ) -> torch.Tensor:
        """Log-mel ``[frames, n_mels]`` of ``text`` with the timing of ``recorded_mel`` ``[frames, n_mels]``
        (a recording of it): how the base ``speaker`` or the loaded ``voice`` would say it at that pace
        (the Chorus base)."""
        base = self._chorus()
        n_mels = base.bundle.mel_config.n_mels
        shape = tuple(getattr(recorded_mel, "shape", ()))
        if not torch.is_tensor(recorded_mel) or len(shape) != 2 or shape[1] != n_mels or not shape[0]:
            # a transposed or batched mel had failed deep in the model, in torch's words
            raise ValueError(f"recorded_mel must be a tensor [frames, {n_mels}] (log-mel, frames first), got {shape}")
        resolved = self.resolve_speaker(speaker)
        if isinstance(resolved, Blend):
            raise ValueError("teacher forcing takes one speaker, not a blend")
        if voice is None:
            with active_adapter(base.model, None):
                return teacher_forced_mel(base.bundle, text, recorded_mel, resolved.index, base.model)
        with self.engine.using([self._voice(speaker, voice)]) as (handles, errors):
            if voice in errors:
                raise errors[voice]
            model, adapter = self.voices[voice]
            with active_adapter(model, adapter):
                return teacher_forced_mel(base.bundle, text, recorded_mel, resolved.index, model)

    def stream(
        self,
        text: str,
        speaker: SpeakerSpec = None,
        speed: float = 1.0,
        voice: str | None = None,
        max_chars: int = 300,
        sentence_silence: float = SENTENCE_SILENCE,
        batch_size: int = STREAM_BATCH,
    ) -> Iterator[SynthesisResult]:
        """One result per sentence of ``text``, each as soon as it is made (timestamps from its own start),
        and one of silence (``text`` empty) for each pause: ``sentence_silence`` seconds between sentences,
        and the ``<break>`` of SSML (text rooted in ``<speak>`` or holding an SSML element:
        :func:`chorus.text.ssml.is_ssml`). Sentences are read ``batch_size`` to a forward after the first (see
        :meth:`stream_pieces`)."""
        _check_text(text)
        yield from self.stream_pieces(layout(text, max_chars, sentence_silence), speaker, speed, voice, batch_size)

    def stream_pieces(
        self,
        pieces: Iterable[str | Pause],
        speaker: SpeakerSpec = None,
        speed: float = 1.0,
        voice: str | None = None,
        batch_size: int = STREAM_BATCH,
    ) -> Iterator[SynthesisResult]:
        """:meth:`stream` of text already laid out (:func:`~chorus.synthesis.timeline.layout`: a caller that
        counts the sentences first lays it out once). The first sentence is read alone, then up to
        ``batch_size`` in one forward; results come in order, each sentence's ``seconds`` its share of its
        forward's time, so they add up. A sentence that cannot be read raises its error after every sentence
        before it was yielded, as reading them one by one would."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        chosen = self._voice(speaker, voice)
        check_speed(speed)  # before the first forward, so a bad speed is no error from inside it
        for group in _batches(pieces, batch_size):
            texts = [piece for piece in group if isinstance(piece, str)]
            started = time.perf_counter()
            spoken = iter(self.engine.synthesize([SentenceRequest(t, chosen, speed) for t in texts]) if texts else [])
            share = (time.perf_counter() - started) / max(len(texts), 1)
            for piece in group:
                if isinstance(piece, Pause):
                    yield SynthesisResult(silence(piece, self.sample_rate), self.sample_rate, 0.0, "")
                    continue
                result = _raise_or(next(spoken))
                result.seconds = share
                yield self.engine.timed(result)

    def synthesize_batch(
        self, texts: list[str], speaker: SpeakerSpec = None, voice: str | None = None, speed: float = 1.0
    ) -> list[SentenceResult]:
        """Each of ``texts`` read as one sentence (no layout: no splitting, no pauses) in the base ``speaker``
        or the loaded adapted ``voice``, all in one batch (a set of short sentences to judge a voice by: one
        forward, not one per text). Raises the error of the first text that could not be read."""
        if isinstance(texts, str):
            raise TypeError("texts is a list of sentences; for one text of any length use synthesize()")
        texts = list(texts)  # any iterable, read once
        for text in texts:
            _check_text(text)
        check_speed(speed)
        return [self.engine.timed(result) for result in self._speak(texts, self._voice(speaker, voice), speed)]

    def synthesize(
        self,
        text: str,
        speaker: SpeakerSpec = None,
        speed: float = 1.0,
        voice: str | None = None,
        sentence_silence: float = SENTENCE_SILENCE,
    ) -> SynthesisResult:
        """Speak ``text`` (any length: read sentence by sentence, ``sentence_silence`` seconds apart) in the
        base ``speaker`` (name, index or blend such as ``"flite-rms(2)+festival-kal(1)"``; None = the default
        speaker) or in the loaded adapted ``voice`` (see :meth:`load_voice`), at ``speed`` (2.0: twice as
        fast, 0.25-4). ``TypeError`` for text that is no string or a speaker or speed of the wrong type;
        ``KeyError`` for an unknown speaker or voice; ``ValueError`` for text with nothing to say, a speed out
        of range, bad SSML."""
        timeline = Timeline(self.sample_rate)
        for result in self.stream(text, speaker, speed, voice, sentence_silence=sentence_silence):
            if result.text:
                timeline.sentence(result)
            else:
                timeline.pause(Pause(len(result.audio) / self.sample_rate))
        if not timeline.speaker:
            raise ValueError(f"nothing speakable in text {text[:80]!r}")
        return timeline.result(text)


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        hint = " (decode bytes first: text.decode())" if isinstance(text, bytes) else ""
        raise TypeError(f"text must be a str, got {type(text).__name__}{hint}")


def _batches(pieces: Iterable[str | Pause], size: int) -> Iterator[list[str | Pause]]:
    """``pieces`` in groups to read in one forward each: the first sentence alone, then ``size`` sentences
    a group; a pause goes with the sentence before it (so it is yielded without waiting for the next forward)."""
    group: list[str | Pause] = []
    sentences, limit = 0, 1
    for piece in pieces:
        if isinstance(piece, str) and sentences == limit:
            yield group
            group, sentences, limit = [], 0, size
        group.append(piece)
        sentences += isinstance(piece, str)
    if group:
        yield group


def _raise_or(result: SentenceResult | Exception) -> SentenceResult:
    if isinstance(result, Exception):
        raise result
    return result


def load_base(
    base: str | Path | None = None,
    vocoder: str | Path | None = None,
    device: str = "cpu",
    config: str | Path | None = None,
) -> Synthesizer:
    """A :class:`Synthesizer` on the base ``base`` names (:func:`~chorus.synthesis.bases.open_base`): None for
    the shipped Chorus base, a Chorus model folder, ``"piper-joe"`` or a Piper ``voice.onnx``.

    ``vocoder`` (the Chorus base's): a saved vocoder folder, a registered name (``"griffin-lim"``),
    ``"neural"`` for the shipped neural vocoder, or None for the model's ``default_vocoder``. ``config``: a Piper
    voice's ``.onnx.json`` when it is not beside its ``.onnx`` (Piper's ``--config``).
    """
    return Synthesizer(open_base(base, vocoder, device, config))
