"""Synthesis: text in, audio out, through one path for the library and the server.

* :mod:`~chorus.synthesis.voices` -- who speaks: a base speaker, a blend, and a voice's handle in a forward;
* :mod:`~chorus.synthesis.forward` -- sentences of any requests and voices -> one forward -> audio;
* :mod:`~chorus.synthesis.timeline` -- sentences and pauses laid out in an answer, timestamps shifted;
* :mod:`~chorus.synthesis.synthesizer` -- :class:`Synthesizer`, the library's entry point, and :func:`load_base`.
"""

from chorus.synthesis.result import SynthesisResult
from chorus.synthesis.synthesizer import (
    ASSETS,
    DEFAULT_BASE,
    DEFAULT_VOCODER,
    SAMPLE_VOICE,
    Synthesizer,
    load_base,
)
from chorus.synthesis.timeline import SENTENCE_SILENCE

__all__ = [
    "ASSETS",
    "DEFAULT_BASE",
    "DEFAULT_VOCODER",
    "SAMPLE_VOICE",
    "SENTENCE_SILENCE",
    "SynthesisResult",
    "Synthesizer",
    "load_base",
]
