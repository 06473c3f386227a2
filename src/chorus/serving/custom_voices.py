"""What OpenAI-style custom voices must pass, and what a new one speaks as before it is refined.

* A consent recording must read the server's phrase for its language: Whisper transcribes it and the word
  error rate against the phrase must be at most ``ConsentSettings.max_word_error_rate`` (Whisper mishears:
  a threshold, not string equality), and it must say no negation the phrase does not ("I do not
  consent ..." is within any useful threshold of the phrase: bench/consent.py).
* A sample must be the consent's speaker: Chorus's speaker encoder embeds both and their cosine must reach
  the encoder's calibrated threshold (its EER point on held-out trials).
* The *instant voice* a sample speaks as the moment its ``POST`` is answered: the base speakers nearest the
  sample in the encoder's space, blended by their similarity (``"a(0.41)+b(0.33)+c(0.26)"``), each speaker
  placed once by having the base say a few sentences (:func:`chorus.speaker.start.speaker_map`, computed on
  first use). Within seconds of its refinement starting, the job replaces it with the base speaker that fits
  the transcribed sample best by mel loss (``JobRunner``): better in bench/short_samples.py, but it needs the
  sample's words and a forward per base speaker, too slow to answer the ``POST`` with (7-39 s measured).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import soxr

from chorus.evaluation.asr import WhisperJudge, normalize_for_scoring, word_error_rate
from chorus.serving.engine import Engine
from chorus.serving.errors import ApiError
from chorus.serving.settings import ConsentSettings
from chorus.speaker.bundle import EncoderBundle, load_encoder, shipped_encoder_dir
from chorus.speaker.start import SpeakerMap, speaker_map

Transcriber = Callable[[np.ndarray, int], str]  # (mono audio [samples], its rate) -> what was said

# Words that turn a consent into a refusal: a word error rate cannot see them (one word in twenty). As the
# scoring normalizer writes them (lower case, no apostrophes: "don't" is "dont").
NEGATIONS = frozenset(
    {"not", "no", "never", "nobody", "neither", "nor", "refuse", "cannot", "without"}
    | {"dont", "doesnt", "didnt", "wont", "cant", "isnt", "arent", "wasnt", "shouldnt", "wouldnt", "havent"}
)


def _negations(text: str) -> set[str]:
    return set(normalize_for_scoring(text).split()) & NEGATIONS


class CustomVoiceChecks:
    """The checks of one server; the judges (Whisper, the speaker encoder) load on first use.

    ``transcriber`` and ``encoder`` replace Whisper tiny.en and the shipped encoder (tests, other languages).
    """

    def __init__(
        self,
        engine: Engine,
        settings: ConsentSettings,
        transcriber: Transcriber | None = None,
        encoder: EncoderBundle | None = None,
    ):
        self.engine = engine
        self.settings = settings
        self._transcriber = transcriber
        self._encoder = encoder
        self._map: SpeakerMap | None = None
        self._lock = threading.Lock()

    # -- consent
    def phrase(self, language: str) -> str:
        """The phrase a consent in ``language`` (BCP 47: ``en``, ``en-US``) reads; 400 for a language
        without one."""
        primary = language.split("-")[0].strip().lower()
        if primary not in self.settings.phrases:
            raise ApiError(
                400,
                f"no consent phrase for language {language[:20]!r}; this server takes "
                f"{', '.join(sorted(self.settings.phrases))}",
                param="language",
                code="unsupported_language",
            )
        return self.settings.phrases[primary]

    def heard(self, audio: np.ndarray, rate: int, language: str) -> tuple[str, float]:
        """What the consent recording says and its word error rate against the phrase; 400 quoting what was
        heard when it is not the phrase."""
        phrase = self.phrase(language)
        with self._lock:  # one Whisper model, used by one request at a time
            transcriber = self._transcriber or WhisperJudge(beam_size=5).transcribe
            self._transcriber = transcriber
            text = transcriber(audio, rate)
        error_rate = word_error_rate(phrase, text)
        negations = _negations(text) - _negations(phrase)
        if negations:  # "I do not consent ..." is a few words from the phrase, and means the opposite
            raise ApiError(
                400,
                f"the consent recording must read: {phrase!r}; heard: {text[:300]!r}, which says "
                f"{', '.join(sorted(negations))!r}: not a consent",
                param="recording",
                code="consent_phrase_mismatch",
            )
        if error_rate > self.settings.max_word_error_rate:
            raise ApiError(
                400,
                f"the consent recording must read: {phrase!r}; heard: {text[:300]!r} (word error rate "
                f"{error_rate:.2f}, at most {self.settings.max_word_error_rate:g})",
                param="recording",
                code="consent_phrase_mismatch",
            )
        return text, error_rate

    # -- speaker
    @property
    def encoder(self) -> EncoderBundle:
        with self._lock:
            if self._encoder is None:
                folder = shipped_encoder_dir()
                if folder is None:
                    raise RuntimeError("no speaker encoder shipped with this Chorus")
                self._encoder = load_encoder(folder)
            return self._encoder

    def embed(self, audio: np.ndarray, rate: int) -> np.ndarray:
        """The speaker of ``audio`` ``[samples]`` at ``rate``: a unit embedding ``[D]``."""
        encoder = self.encoder
        target = encoder.mel_config.sample_rate
        if rate != target:
            audio = soxr.resample(audio, rate, target, quality="HQ")
        return encoder.embed([audio.astype(np.float32)])[0]

    def same_speaker(self, consent: np.ndarray, sample: np.ndarray) -> float:
        """The cosine of the consent's and the sample's speakers; 400 with the score below the threshold."""
        score, same = self.encoder.verify(np.asarray(consent, dtype=np.float32), sample)
        if not same:
            raise ApiError(
                400,
                f"the sample's voice does not match the consent recording's (speaker similarity {score:.3f}, "
                f"at least {self.encoder.threshold:.3f} needed: Chorus's speaker encoder at its calibrated "
                "threshold)",
                param="audio_sample",
                code="speaker_mismatch",
            )
        return score

    # -- the instant voice
    def speaker_map(self) -> SpeakerMap:
        """The base's speakers in the encoder's space (made once, on a private copy of the base)."""
        encoder = self.encoder
        with self._lock:
            if self._map is None:
                self._map = speaker_map(self.engine.base_copy(), encoder)
            return self._map

    def instant_voice(self, embedding: np.ndarray) -> str:
        """The blend of the ``instant_speakers`` base speakers nearest ``embedding`` ``[D]``, each weighted
        by its cosine to it (negative ones left out; the nearest alone when none is positive)."""
        space = self.speaker_map()
        similarity = space.embeddings @ (embedding / max(float(np.linalg.norm(embedding)), 1e-12))
        nearest = np.argsort(-similarity)[: self.settings.instant_speakers]
        weights = [(int(i), float(similarity[i])) for i in nearest if similarity[i] > 0] or [(int(nearest[0]), 1.0)]
        total = sum(w for _, w in weights)
        speakers = self.engine.speakers
        return "+".join(f"{speakers[i]}({max(w / total, 0.001):.3f})" for i, w in weights)
