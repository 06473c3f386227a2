"""What every base is to the rest of Chorus: sentences of many requests and voices in, audio and word
timestamps out.

A base is the model every voice of it is made on: its weights never change for a voice; a voice's adapter is
added to :attr:`Base.model` by name (:func:`~chorus.adapters.voice.apply_voice`) and each row of a forward
is routed to its voice's adapter (:func:`~chorus.synthesis.forward.routed`). The engine
(:class:`~chorus.synthesis.engine.Engine`) holds a base and its voices; it calls :meth:`Base.infer` under
its lock (everything that reads the model and its adapters) and :meth:`Base.finish` outside it (what does
not: a separate vocoder), and :meth:`Base.timed` for a result's timestamps when someone asks for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from chorus.synthesis.forward import Sentence, SentenceResult
from chorus.synthesis.voices import Blend, Speaker, SpeakerSpec
from chorus.text import TextFrontEnd


class Base(ABC):
    """A base behind the one interface. Attributes every kind sets:

    ``name``: how ``--base`` names it and how a voice folder records it (``"chorus"``, ``"piper-joe"``, a
    Piper voice file's name); ``sha256``: the identity of its weights, recorded in its voices so that
    loading one on another base is refused; ``model``: the module voices' adapters go into;
    ``front_end``: how text becomes the symbols its results' timestamps are counted in;
    ``seconds_per_frame``: the time of one duration unit.
    """

    kind: ClassVar[str]  # the plug-in's name in the registry (chorus.synthesis.bases.BASES)
    name: str
    sha256: str
    model: nn.Module
    front_end: TextFrontEnd
    sample_rate: int
    seconds_per_frame: float

    @property
    @abstractmethod
    def speakers(self) -> list[str]:
        """The base's own speakers (a row each of its speaker table; a single-speaker base has one)."""

    @property
    @abstractmethod
    def default_speaker(self) -> str: ...

    @abstractmethod
    def speaker(self, spec: SpeakerSpec) -> Speaker | Blend:
        """``spec`` (a name, an index, a blend as written, None for the default) as a typed voice;
        ``KeyError`` for a speaker the base lacks, ``ValueError`` for a blend it cannot make."""

    def is_speaker(self, name: str) -> bool:
        """Whether ``name`` is one of the base's speakers or a valid blend of them."""
        try:
            self.speaker(name)
        except (KeyError, ValueError):
            return False
        return True

    @abstractmethod
    def infer(self, sentences: Sequence[Sentence], merge: bool | str = "auto") -> list[SentenceResult | Exception]:
        """Read ``sentences`` (each with its voice's :class:`~chorus.synthesis.voices.VoiceHandle` and speed) in
        one batch: a result per sentence, or the exception that sentence alone raised. Everything that
        reads :attr:`model` happens here (the engine holds its lock over it). ``merge``: see
        :func:`~chorus.synthesis.forward.routed`."""

    def finish(self, results: list[SentenceResult | Exception]) -> list[SentenceResult | Exception]:
        """What is left to make each result's ``audio`` without :attr:`model` (a separate vocoder); the engine
        calls it outside its lock. A base whose forward makes audio has nothing left to do."""
        return results

    def timed(self, result: SentenceResult) -> SentenceResult:
        """``result`` with its words' and phonemes' start and end, from the durations its forward predicted."""
        return result.timed(self.front_end, self.seconds_per_frame)

    @abstractmethod
    def with_model(self, model: nn.Module) -> Base:
        """The same base around another ``model`` of the same layout (a fully fine-tuned voice: a model of
        its own, spoken as this base speaks)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device
