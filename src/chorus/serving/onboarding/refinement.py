"""Whether a sample's refined voice may replace its instant voice: it must keep the words as well as it
gains the likeness.

The onboarding job keeps a refinement only if it improved the mel loss on the held-out part of the sample
(:class:`chorus.serving.onboarding.job_runner.JobRunner`), and mel loss measures likeness, not words: one probe voice
lowered it and went from a word error rate of 0.08 to 0.31. So both voices read :data:`CHECK_SENTENCES`
(each voice's in one batched forward and vocoder pass, Griffin-Lim as the job has no other vocoder),
Whisper transcribes them, and the refined voice is kept only if its corpus word error rate is at most the
instant voice's plus ``ConsentSettings.max_refined_wer_increase``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chorus.audio.vocoders import load_vocoder
from chorus.evaluation.asr import WhisperJudge, corpus_word_error_rate
from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle
from chorus.synthesis import Synthesizer

Transcriber = Callable[[np.ndarray, int], str]  # (mono audio [samples], its rate) -> what was said

# Short everyday sentences, none of them in the base's or the tests' training texts: what a voice is asked
# to say, not what it learned from.
CHECK_SENTENCES = (
    "Could you call me back after lunch?",
    "The train leaves at half past seven.",
    "I left my keys on the kitchen table.",
    "Please turn off the lights when you go.",
)


@dataclass(frozen=True)
class WordCheck:
    """Corpus word error rates of :data:`CHECK_SENTENCES` read by the ``instant`` and the ``refined`` voice,
    each at most 1 (see :meth:`RefinementCheck.__call__`), and the increase the refined one may have."""

    instant: float
    refined: float
    max_increase: float

    @property
    def kept(self) -> bool:
        """Whether the refined voice reads well enough to replace the instant one."""
        return self.refined <= self.instant + self.max_increase + 1e-9  # 0.08 + 0.05 is 0.13000000000000003

    def __str__(self) -> str:
        return (
            f"word error rate on {len(CHECK_SENTENCES)} check sentences {self.instant:.2f} (instant voice) -> "
            f"{self.refined:.2f} (refined), at most +{self.max_increase:g} (Whisper)"
        )


class RefinementCheck:
    """Judges a refined voice against its instant voice by the words Whisper hears in each.

    ``transcriber`` replaces Whisper tiny.en (tests); it is called on the instant voice's clips, in the
    order of :data:`CHECK_SENTENCES`, then on the refined voice's.
    """

    def __init__(self, max_increase: float, transcriber: Transcriber | None = None):
        self.max_increase = max_increase
        self.transcriber = transcriber

    def __call__(self, bundle: ModelBundle, model: AcousticModel, adapter: str, instant: str) -> WordCheck:
        """The check of the voice ``adapter`` of ``model`` (``adapt``'s result: ``bundle.model`` itself for
        adapters, a trained copy for full fine-tuning) against ``instant``, the base speaker or blend of
        ``bundle`` the voice speaks as now. A rate is capped at 1: past every word wrong, Whisper's
        hallucinated words say nothing more of a voice, and two unintelligible voices tie."""
        tts = Synthesizer(bundle, load_vocoder("griffin-lim", mel_config=bundle.mel_config))
        tts.voices["refined"] = (model, adapter)  # the voice as it is in memory, not reloaded from disk
        texts = list(CHECK_SENTENCES)
        spoken = tts.synthesize_batch(texts, speaker=instant) + tts.synthesize_batch(texts, voice="refined")
        # One thread, as the job's training: it shares the server's CPUs with speech.
        transcribe = self.transcriber or WhisperJudge(cpu_threads=1).transcribe
        heard = [transcribe(result.audio, result.sample_rate) for result in spoken]
        instant_rate, refined_rate = (
            min(1.0, corpus_word_error_rate(texts, part)) for part in (heard[: len(texts)], heard[len(texts) :])
        )
        return WordCheck(instant_rate, refined_rate, self.max_increase)
