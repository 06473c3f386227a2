"""Synthesis: text in, audio out, through one path for the library and the server.

* :mod:`~chorus.synthesis.voices` -- who speaks: a base speaker, a blend, and a voice's handle in a forward;
* :mod:`~chorus.synthesis.forward` -- sentences of any requests and voices -> one forward -> audio;
* :mod:`~chorus.synthesis.bases` -- the bases behind one interface: Chorus's acoustic model + vocoder, and
  a Piper voice's generator, opened by name (``--base``);
* :mod:`~chorus.synthesis.engine` -- :class:`~chorus.synthesis.engine.Engine`: a resident base and its
  voices (an adapter cache), which the server batches requests into;
* :mod:`~chorus.synthesis.timeline` -- sentences and pauses laid out in an answer, timestamps shifted;
* :mod:`~chorus.synthesis.synthesizer` -- :class:`Synthesizer`, the engine's face for one user, and
  :func:`load_base`.
"""

from chorus.synthesis.bases.chorus import ASSETS, DEFAULT_BASE, DEFAULT_VOCODER
from chorus.synthesis.result import SynthesisResult
from chorus.synthesis.synthesizer import PIPER_SAMPLE_VOICE, SAMPLE_VOICE, Synthesizer, load_base
from chorus.synthesis.timeline import SENTENCE_SILENCE

__all__ = [
    "ASSETS",
    "DEFAULT_BASE",
    "DEFAULT_VOCODER",
    "PIPER_SAMPLE_VOICE",
    "SAMPLE_VOICE",
    "SENTENCE_SILENCE",
    "SynthesisResult",
    "Synthesizer",
    "load_base",
]
