"""What OpenAI-style custom voices must pass, and what a new one speaks as before it is refined.

* A consent recording must read the server's phrase for its language, and nothing else: Whisper transcribes
  it with each word's place, its words must mean the phrase (:mod:`chorus.serving.onboarding.consent_phrase`: every
  content word heard, the name by its sound, no negation nor word the phrase lacks; a word Whisper was unsure
  of is heard again before it refuses), and it must hold no other speech beside the phrase's words
  (:mod:`chorus.serving.onboarding.consent_speech`): the consent's speaker is taken from those words alone.
* A sample must be the consent's speaker, heard through its channel (:mod:`chorus.speaker_recognition.voice_match`): the
  consent's phrase speech and the sample compared in the band both pass, window by window, their score
  normalized against a cohort heard the same way, every window of the sample matching the rest of it, at
  the thresholds calibrated by bench/consent.py (``ConsentSettings.speaker_encoder``: resemblyzer's and Chorus v3's scores fused).
* The *instant voice* a sample speaks as the moment its ``POST`` is answered: the base speakers nearest the
  sample in the encoder's space, blended by their similarity (``"a(0.41)+b(0.33)+c(0.26)"``), each speaker
  placed once by having the base say a few sentences (:func:`chorus.speaker_recognition.start.speaker_map`, computed on
  first use). Within seconds of its refinement starting, the job replaces it with the base speaker that fits
  the transcribed sample best by mel loss (``JobRunner``): better in bench/short_samples.py, but it needs the
  sample's words and a forward per base speaker, too slow to answer the ``POST`` with (7-39 s measured).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import soxr

from chorus.evaluation.asr import Transcript, WhisperJudge, word_error_rate
from chorus.serving.engine import Engine
from chorus.serving.errors import ApiError
from chorus.serving.onboarding.consent_phrase import PhraseVerdict, judge_phrase
from chorus.serving.onboarding.consent_speech import cut, phrase_spans, speech_outside
from chorus.serving.settings import ConsentSettings
from chorus.speaker_recognition.bundle import (
    EncoderBundle,
    load_encoder,
    shipped_encoder_dir,
)
from chorus.speaker_recognition.embedders import ChorusEmbedder, ResemblyzerEmbedder
from chorus.speaker_recognition.start import SpeakerMap, speaker_map
from chorus.speaker_recognition.voice_match import (
    SHIPPED_COHORT,
    FusedMatch,
    MatchVerdict,
    UnusableRecording,
    VoiceMatch,
    fused_consent_match,
    load_cohort,
)

# (mono audio [samples], its rate, beam size 1-5) -> what was said, word by word (WhisperJudge.transcribe_words)
Transcriber = Callable[[np.ndarray, int, int], Transcript]
# (mono audio [samples], its rate, a text) -> how likely each whitespace word of the text is said there
# (WhisperJudge.word_probabilities: the recognizer fed the text)
ForcedListener = Callable[[np.ndarray, int, str], Sequence[float]]

# A consent is heard with beam search; a word it heard at a low probability is heard again by greedy decoding,
# which searches differently and so rarely invents the same word in the same noise.
FIRST_BEAM, SECOND_BEAM = 5, 1


@dataclass(frozen=True)
class HeardConsent:
    """A consent recording that reads the phrase.

    text: what Whisper heard; word_error_rate: of ``text`` against the phrase (kept with the consent for the
    record: the check reads the words' meaning, not this); verdict: the phrase check's reading; speech: the
    recording cut to the phrase's words, the audio the consent's speaker is taken from, mono float32
    ``[samples]`` at the recording's rate.
    """

    text: str
    word_error_rate: float
    verdict: PhraseVerdict
    speech: np.ndarray


class CustomVoiceChecks:
    """The checks of one server; the judges (Whisper, the speaker encoder) load on first use.

    ``transcriber`` and ``encoder`` replace Whisper tiny.en and the shipped encoder (tests, other languages);
    ``forced_listener`` goes with a ``transcriber`` (Whisper's own when both are None; none, so no forced
    listen, when only a transcriber is given).
    """

    def __init__(
        self,
        engine: Engine,
        settings: ConsentSettings,
        transcriber: Transcriber | None = None,
        encoder: EncoderBundle | None = None,
        forced_listener: ForcedListener | None = None,
    ):
        self.engine = engine
        self.settings = settings
        self._transcriber = transcriber
        self._forced_listener = forced_listener
        self._encoder = encoder
        self._map: SpeakerMap | None = None
        self._match: VoiceMatch | FusedMatch | None = None
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

    def heard(self, audio: np.ndarray, rate: int, language: str) -> HeardConsent:
        """The consent recording ``audio`` (mono ``[samples]`` at ``rate``) checked and cut to the phrase's words.

        400 ``consent_phrase_mismatch`` quoting what was heard when it does not say the phrase, or says more;
        400 ``consent_extra_speech`` when it holds voiced audio beside the phrase's words (another voice, speech
        played backwards, humming: one recording, one claim).
        """
        phrase = self.phrase(language)
        settings = self.settings
        with self._lock:  # one Whisper model, used by one request at a time
            if self._transcriber is None:
                whisper = WhisperJudge(beam_size=FIRST_BEAM)
                self._transcriber, self._forced_listener = whisper.transcribe_words, whisper.word_probabilities
            transcriber, forced_listener = self._transcriber, self._forced_listener
            first = transcriber(audio, rate, FIRST_BEAM)

        def second_listen() -> Transcript:
            with self._lock:
                return transcriber(audio, rate, SECOND_BEAM)

        def forced_listen() -> Sequence[float]:
            with self._lock:
                return forced_listener(audio, rate, phrase)

        verdict = judge_phrase(
            phrase,
            first,
            second_listen,
            forced_listen if forced_listener is not None else None,
            max_loose_words=settings.max_loose_words,
            doubtful_probability=settings.doubtful_probability,
            forced_probability=settings.forced_probability,
            max_forced_words=settings.max_forced_words,
        )
        spans = phrase_spans(verdict.words, settings.word_pad_seconds, settings.max_word_seconds, len(audio) / rate)
        # Extra speech first once the phrase's words are all there: what was added then is another recording
        # (Whisper transcribes reversed speech as anything, or as nothing), and "record the phrase alone" says so.
        outside = speech_outside(audio, rate, spans) if verdict.heard_content else 0.0
        if outside > settings.max_extra_speech_seconds:
            raise ApiError(
                400,
                f"the consent recording has {outside:.1f} s of speech outside the phrase; record the phrase alone "
                f"(heard: {first.text[:300]!r})",
                param="recording",
                code="consent_extra_speech",
            )
        if not verdict.accepted:
            raise ApiError(400, verdict.refusal(phrase), param="recording", code="consent_phrase_mismatch")
        return HeardConsent(
            text=first.text,
            word_error_rate=word_error_rate(phrase, first.text),
            verdict=verdict,
            speech=cut(audio, rate, spans),
        )

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

    @property
    def voice_match(self) -> VoiceMatch | FusedMatch:
        """The speaker check (:mod:`chorus.speaker_recognition.voice_match`) with ``settings.speaker_encoder`` and the
        shipped cohort, made on first use."""
        with self._lock:
            if self._match is None:
                cohort = load_cohort(self.settings.cohort or SHIPPED_COHORT)
                name = self.settings.speaker_encoder
                if name == "resemblyzer":
                    self._match = VoiceMatch(ResemblyzerEmbedder(), cohort)
                elif name == "chorus":
                    self._match = VoiceMatch(
                        ChorusEmbedder(self._encoder or load_encoder(shipped_encoder_dir())), cohort
                    )
                else:
                    self._match = fused_consent_match(cohort)
            return self._match

    def same_speaker(
        self, consent: np.ndarray, consent_rate: int, sample: np.ndarray, sample_rate: int
    ) -> MatchVerdict:
        """Whether ``sample`` is the speaker of ``consent`` (the consent's phrase speech, :meth:`heard`'s
        ``speech``), both mono ``[samples]``; 400 saying why when it is not, or when a recording's channel
        leaves too little of the voice to tell."""
        try:
            verdict = self.voice_match.match(consent, consent_rate, sample, sample_rate)
        except UnusableRecording as error:
            raise ApiError(400, str(error), param="audio_sample", code="recording_unusable") from None
        if not verdict.accepted:
            settings = self.voice_match.settings
            raise ApiError(
                400,
                f"{verdict.reason} (speaker score {verdict.score:.2f}, at least "
                f"{settings.threshold_for(verdict.threshold_key):.2f} needed; the sample's least consistent window "
                f"{verdict.worst_window:.2f}, at least {settings.window_threshold:.2f}; its third least like the "
                f"consent {verdict.worst_stretch:.2f}; compared in {verdict.band[0]:.0f}-"
                f"{verdict.band[1] or self.voice_match.embedder.rate / 2:.0f} Hz against a cohort heard the same way)",
                param="audio_sample",
                code="speaker_mismatch",
            )
        return verdict

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
