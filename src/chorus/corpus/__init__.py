"""The offline synthetic multi-speaker corpus: voice registry, sentence text and builder.

``build_corpus(OUT)`` reads the shipped sentences with every registered voice (espeak-ng, flite,
festival, Piper joe and sox-shifted virtual speakers) into ``OUT/train`` and ``OUT/heldout``.
"""

from chorus.corpus.build import (
                                 CorpusSummary,
                                 RequirementsError,
                                 VoiceResult,
                                 build_corpus,
                                 check_requirements,
)
from chorus.corpus.text import benchmark_sentences, training_sentences
from chorus.corpus.voices import (
                                 VOICES,
                                 VoiceSpec,
                                 get_voice,
                                 heldout_voices,
                                 pretraining_voices,
)

__all__ = ["VOICES", "CorpusSummary", "RequirementsError", "VoiceResult", "VoiceSpec", "benchmark_sentences",
           "build_corpus", "check_requirements", "get_voice", "heldout_voices",
           "pretraining_voices", "training_sentences"]
