"""Does each clip say its transcript? Whisper reads the transcript against the audio.

The data check catches a transcript whose length does not fit its clip; a wrong transcript of about the
right length (an off-by-one line in ``metadata.csv``, a clip re-recorded with other words) passes it and
teaches a voice wrong sounds. Recognizing each clip and scoring the transcript by word error rate would
not tell them apart either: Whisper tiny.en mishears the synthetic voices here often (word error rates
of 0.3-1.0 on some right transcripts). Instead Whisper is *fed* the transcript (teacher forcing,
:meth:`~chorus.evaluation.asr.WhisperJudge.word_probabilities`) and says how likely each of its words is
given the audio, and given silence: a sentence of common words is likely whatever the audio (Whisper's
own language model), so what counts is how much more likely the audio makes it.

A clip's score is that difference per word, in nats: the mean natural log of its words' probabilities
given the clip, less the same given ``SILENCE_SECONDS`` of silence (each floored at ``PROBABILITY_FLOOR``).
A right transcript scores well above 0, one the audio does not say about 0. ``NOT_HEARD_BELOW`` is set by
``bench/transcripts_heard.py`` on the training corpus's voices and its figures are on held-out ones
(bench/README.md, "Transcripts a clip does not say").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from chorus.audio.io import load_audio
from chorus.data.check import DatasetReport, Problem
from chorus.data.formats import Utterance
from chorus.evaluation.asr import WHISPER_SAMPLE_RATE, WhisperJudge
from chorus.text.normalize import normalize_text

PROBABILITY_FLOOR = 1e-9  # one word Whisper cannot find at all weighs at most ln(1e-9) = -20.7
SILENCE_SECONDS = 1.0
# The lowest score of a right transcript over 288 clips of the corpus's 36 voices (3.37), rounded down to the
# next half nat: bench/transcripts_heard.py. Wrong transcripts there scored -2.35 to 1.29.
NOT_HEARD_BELOW = 3.0


def _mean_log_probability(judge: WhisperJudge, encoding: tuple[object, int], text: str) -> float:
    probabilities = judge.text_probabilities(encoding, text)
    return float(np.mean(np.log(np.maximum(probabilities, PROBABILITY_FLOOR))))


def transcript_score(
    judge: WhisperJudge, audio: np.ndarray, sample_rate: int, text: str, silence: tuple[object, int] | None = None
) -> float:
    """How much more likely ``audio`` ``[samples]`` makes each word of ``text`` (its spoken form: numbers and
    abbreviations written out) than silence does: the mean natural log of Whisper's probability of each
    word given the audio, less the same given silence (``silence``: :func:`silence_encoding`, else made here)."""
    spoken = normalize_text(text, warn=False)
    if not spoken.split():
        raise ValueError(f"{text!r}: no words to listen for")
    if silence is None:
        silence = silence_encoding(judge)
    heard = _mean_log_probability(judge, judge.encode(audio, sample_rate), spoken)
    return heard - _mean_log_probability(judge, silence, spoken)


def silence_encoding(judge: WhisperJudge) -> tuple[object, int]:
    """Whisper's encoding of ``SILENCE_SECONDS`` of silence, once for many clips."""
    return judge.encode(np.zeros(round(SILENCE_SECONDS * WHISPER_SAMPLE_RATE), dtype=np.float32), WHISPER_SAMPLE_RATE)


def listen(
    utterances: Sequence[Utterance],
    judge: WhisperJudge | None = None,
    advance: Callable[[], None] | None = None,
) -> list[float]:
    """Each utterance's :func:`transcript_score`, in order (``advance`` is called after each: a progress bar)."""
    judge = judge or WhisperJudge(beam_size=1)
    silence = silence_encoding(judge)
    scores = []
    for utterance in utterances:
        audio = load_audio(utterance.audio_path, WHISPER_SAMPLE_RATE)
        scores.append(transcript_score(judge, audio, WHISPER_SAMPLE_RATE, utterance.text, silence))
        if advance is not None:
            advance()
    return scores


def not_heard(report: DatasetReport, advance: Callable[[], None] | None = None) -> list[Problem]:
    """A ``transcript_not_heard`` problem for each of the report's usable clips whose transcript Whisper does
    not hear in it."""
    clips = report.valid_utterances()
    return [
        Problem(
            clip.source,
            "transcript_not_heard",
            f"Whisper does not hear {clip.text!r} in {clip.audio_path.name} (score {score:.1f}; a right "
            f"transcript scores {NOT_HEARD_BELOW:g} or more): another clip's line, or other words?",
            clip,
        )
        for clip, score in zip(clips, listen(clips, advance=advance), strict=True)
        if score < NOT_HEARD_BELOW
    ]
