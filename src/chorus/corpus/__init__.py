"""The offline synthetic multi-speaker corpus: speaker registry, sentence text and builder.

``build_corpus(OUT)`` reads the shipped sentences with every registered speaker (espeak-ng, flite,
festival, Piper joe and sox-shifted virtual speakers) into ``OUT/train`` and ``OUT/heldout``.
"""

from chorus.corpus.build import (
    CorpusSummary,
    RequirementsError,
    SpeakerResult,
    build_corpus,
    check_requirements,
)
from chorus.corpus.speakers import (
    SPEAKERS,
    SpeakerSpec,
    get_speaker,
    heldout_speakers,
    pretraining_speakers,
)
from chorus.corpus.text import benchmark_sentences, training_sentences

__all__ = [
    "SPEAKERS",
    "CorpusSummary",
    "RequirementsError",
    "SpeakerResult",
    "SpeakerSpec",
    "benchmark_sentences",
    "build_corpus",
    "check_requirements",
    "get_speaker",
    "heldout_speakers",
    "pretraining_speakers",
    "training_sentences",
]
