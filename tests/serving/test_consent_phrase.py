"""The consent recording's phrase check (issue 37): what the words mean, not their word error rate, and one
recording, one claim.

Tables of fake transcripts (words with times and probabilities) against :func:`judge_phrase`; the second
listen faked; then real audio (espeak-ng's consent phrase, reversed speech of another espeak voice, white
noise) through :class:`CustomVoiceChecks` with the shipped Whisper tiny.en. Each case says which hole of the
word-error-rate check (at most 0.35, a fixed negation list, the whole recording embedded) it closes; the
old check had no word transcript, no :func:`judge_phrase` and no ``HeardConsent.speech``, so none of these
passes on it.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from chorus.evaluation.asr import Transcript, WhisperJudge, Word, word_error_rate
from chorus.serving.errors import ApiError
from chorus.serving.onboarding.consent_checks import FIRST_BEAM, CustomVoiceChecks
from chorus.serving.onboarding.consent_phrase import MAX_TAIL, judge_phrase
from chorus.serving.onboarding.consent_speech import HOP, phrase_spans, speech_outside, voiced_frames
from chorus.serving.settings import CONSENT_PHRASES, ConsentSettings
from conftest import CUSTOM_VOICE_SAMPLE

PHRASE = CONSENT_PHRASES["en"]
SAY = "I am the owner of this voice and I consent to {} using this voice to create a synthetic voice model."


def transcript(text: str, unsure: dict[str, float] | None = None, step: float = 0.3) -> Transcript:
    """``text`` as a recognizer's words, one every ``step`` s, each heard at probability 0.9 but those named in
    ``unsure`` (by their text as written, punctuation aside)."""
    unsure = unsure or {}
    words = tuple(
        Word(word, step * k, step * k + 0.8 * step, unsure.get(word.strip(".,").lower(), 0.9))
        for k, word in enumerate(text.split())
    )
    return Transcript(text, words)


def never_called() -> Transcript:
    raise AssertionError("the second listen was not needed")


# Harmless mishearings and owners' wordings: accepted. The old check accepted these too (WER <= 0.33); they
# hold the new one to the owners' side. (The real 20 dB recording, with the "Thank you." Whisper invents after
# it, the old check refused at WER 0.43: test_the_phrase_in_white_noise_is_accepted_with_its_words.)
ACCEPTED = [
    ("the phrase", PHRASE),  # the baseline
    ("I'm for I am", "I'm the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model."),
    ("a dropped 'the' and 'a'", "I am owner of this voice and I consent to Chorus using this voice to create synthetic voice model."),
    ("'to' heard as 'the'", "I am the owner of this voice and I consent the Chorus using this voice to create a synthetic voice model."),
    ("Whisper on the clean consent", "I am the owner of this voice and I can send to call us using this voice to create a synthetic voice model."),
    ("Whisper at 20 dB SNR", "I am the owner of this moist and I can send the chloros using this moist to create a synthetic moist model."),
    ("owner heard as longer", "I am longer of this voice and I consent to Chorus using this voice to create a synthetic voice model."),
    ("'my voice' for 'this voice'", "I am the owner of this voice and I consent to Chorus using my voice to create a synthetic voice model."),
]  # fmt: skip


@pytest.mark.parametrize(("label", "heard"), ACCEPTED, ids=[label for label, _ in ACCEPTED])
def test_harmless_mishearings_are_the_phrase(label, heard):
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert verdict.accepted, verdict.refusal(PHRASE)
    assert verdict.heard == heard and len(verdict.words) >= 18


# Wrong phrases, written before the check was: refused, naming what is missing and what was added.
# (label, heard, a word it must name as missing or None, a word it must name as added or None)
REFUSED = [
    # Old check: accepted (WER 0.05-0.24, no word of its negation list).
    ("withhold", "I am the owner of this voice and I withhold consent to Chorus using this voice to create a synthetic voice model.", None, "withhold"),
    ("revoke", "I am the owner of this voice and I revoke my consent to Chorus using this voice to create a synthetic voice model.", None, "revoke"),
    ("decline", "I am the owner of this voice and I decline to consent to Chorus using this voice to create a synthetic voice model.", None, "decline"),
    ("object", "I am the owner of this voice and I object to Chorus using this voice to create a synthetic voice model.", "consent", "object"),
    ("unconsenting", "I am the owner of this voice and I am unconsenting to Chorus using this voice to create a synthetic voice model.", "consent", "unconsenting"),
    ("another company", SAY.format("Boris"), "chorus", "boris"),
    ("another company", SAY.format("Acme"), "chorus", "acme"),
    ("a sound-alike company", SAY.format("Horace"), "chorus", "horace"),
    ("another purpose", PHRASE[:-1] + " for advertising.", None, "advertising"),
    ("another purpose", "I am the owner of this voice and I consent to Chorus using this voice to impersonate me.", "synthetic", "impersonate"),
    ("the phrase, then turned around", PHRASE[:-1] + ", but I was forced.", None, "forced"),
    ("the phrase, called false", "It is false that I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.", None, "false"),
    # Old check: refused already (its negation list, or WER); kept so that the new one is no weaker.
    ("the phrase, then turned around", "They told me to say I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model, but I do not agree.", None, "but"),
    ("refuse", "I am the owner of this voice and I refuse consent to Chorus using this voice to create a synthetic voice model.", None, "refuse"),
    ("do not", "I am the owner of this voice and I do not consent to Chorus using this voice to create a synthetic voice model.", None, "not"),
    ("don't", "I am the owner of this voice and I don't consent to Chorus using this voice to create a synthetic voice model.", None, "not"),
    ("never", "I am the owner of this voice and I never consent to Chorus using this voice to create a synthetic voice model.", None, "never"),
    ("not the owner", "I am not the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.", None, "not"),
    ("it is not true", "It is not true that I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.", None, "not"),
    ("half the phrase", "I am the owner of this voice and I consent.", "chorus", None),
    ("a different sentence", "The birch canoe slid on the smooth planks.", "owner", "birch"),
    ("nothing", "", "owner", None),
]  # fmt: skip


# The phrase is the speaker's own claim, said as a statement. All of these but "her" and "they" (content words
# then) passed before as a few loose function words (a pronoun swapped, "are" for "am", "do" added: 1 to 4 of the
# allowance of 4), so a victim reading a script aloud ("You are the owner of this voice and you consent ...", an
# agent's question to a caller) made a consent.
# (label, heard, the word it must name)
OTHER_CLAIMANTS = [
    ("said to a listener", "You are the owner of this voice and you consent to Chorus using this voice to create a synthetic voice model.", "you"),
    ("asked of a listener", "Are you the owner of this voice and do you consent to Chorus using this voice to create a synthetic voice model?", "you"),
    ("said for a group", "We are the owner of this voice and we consent to Chorus using this voice to create a synthetic voice model.", "we"),
    ("another one consents", "I am the owner of this voice and you consent to Chorus using this voice to create a synthetic voice model.", "you"),
    ("another one's voice", "I am the owner of this voice and I consent to Chorus using your voice to create a synthetic voice model.", "your"),
    ("her voice", "I am the owner of this voice and I consent to Chorus using her voice to create a synthetic voice model.", "her"),
    ("on their behalf", "I am the owner of this voice and they consent to Chorus using this voice to create a synthetic voice model.", "they"),
    ("no longer the owner", "I was the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.", "was"),
    # A review: "it" in the speaker's place passed as two swaps ("It" for "I", "is" for "am").
    ("it in the speaker's place", "It is the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.", "it"),
    ("it consents", "I am the owner of this voice and it consents to Chorus using this voice to create a synthetic voice model.", "it"),
    # A second review: the first rule counted the speaker's "I"s, and one more anywhere let these pass.
    ("it, with another I", "It is the owner of this voice and I, I consent to Chorus using this voice to create a synthetic voice model.", "it"),
    ("it consents, an I after", "I am the owner of this voice and it consents to Chorus using this voice to create a synthetic voice model, I.", "it"),
    ("its voice", "I am the owner of this voice and I consent to Chorus using its voice to create a synthetic voice model.", "its"),
]  # fmt: skip


@pytest.mark.parametrize(("label", "heard", "word"), OTHER_CLAIMANTS, ids=[label for label, *_ in OTHER_CLAIMANTS])
def test_a_claim_made_for_another_person_is_refused(label, heard, word):
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert not verdict.accepted and word in verdict.extra
    if word != "was":
        assert word in verdict.persons and "the speaker's own claim" in verdict.refusal(PHRASE)


@pytest.mark.parametrize(
    "heard",
    [
        "I am the owner of this voice and I can send it to chorus using this voice to create a synthetic voice model.",
        "I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model of it.",
        "I am the owner of this voice and a consent to chorus using this voice to create a synthetic voice model.",
    ],
)
def test_an_it_beside_the_speakers_own_words_is_loose(heard):
    """Whisper adds "it" in noise ("can send it" for "consent") and hears an owner's "I" as "a" (6 of the 143
    owners' transcripts bench/consent.py's stored runs accept): an "it" away from the speaker's words and "this"
    voice is a loose word, and without an "it", a missed "I" is one too (none of the 143 is refused now)."""
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert verdict.accepted, verdict.refusal(PHRASE)


def test_a_phrase_heard_as_a_question_is_refused():
    """ "Am I the owner ...?" moves no pronoun: "am" and "do" are loose words (3 of 4). Whisper's question mark
    refuses it; no owner's consent of bench/consent.py's stored runs (1,440) was heard with one."""
    heard = (
        "Am I the owner of this voice and do I consent to Chorus using this voice to create a synthetic voice model?"
    )
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert verdict.question and not verdict.accepted and not verdict.missing and not verdict.extra
    assert "heard as a question" in verdict.refusal(PHRASE)
    assert judge_phrase(PHRASE, transcript(heard.replace("?", ".")), never_called).accepted  # the rule is the "?"
    # Wherever Whisper puts it (a review: "?!" and a lone "?" word had passed), but in the courtesy tail.
    for asked in (heard.replace("?", "?!"), heard.replace("?", " ?"), PHRASE.replace("voice and", "voice? And")):
        assert judge_phrase(PHRASE, transcript(asked), never_called).question, asked


@pytest.mark.parametrize(
    "heard",
    [
        "I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model. Thank you. on.",
        "I am the owner of this voice, thank you, and I consent to Chorus using this voice to create a synthetic voice model.",
    ],
)
def test_the_you_of_thank_you_is_no_claimant(heard):
    """Whisper's "Thank you." before a stray word (no courtesy tail then) or inside the phrase: its "you" is a
    loose word, as before."""
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert verdict.accepted, verdict.refusal(PHRASE)


def test_another_persons_word_in_a_misheard_names_place_meets_the_forced_listen():
    """ "pour us" for "Chorus" (Whisper tiny.en on flite-slt): "us" stands where the name was missed, so the
    forced listen decides, as for any other word heard in its place."""
    heard = "I am the owner of this voice and I consent to pour us using this voice to create a synthetic voice model."
    found = judge_phrase(PHRASE, transcript(heard), forced=lambda: [0.5] * len(PHRASE.split()), forced_probability=0.01)
    assert found.accepted and found.forced == (("chorus", 0.5),)
    weak = judge_phrase(
        PHRASE, transcript(heard), forced=lambda: [0.001] * len(PHRASE.split()), forced_probability=0.01
    )
    assert not weak.accepted


@pytest.mark.parametrize(
    ("label", "heard", "missing", "extra"), REFUSED, ids=[f"{label}: {heard[:40]}" for label, heard, *_ in REFUSED]
)
def test_wrong_phrases_are_refused_saying_why(label, heard, missing, extra):
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)  # every word heard surely: no second listen
    assert not verdict.accepted
    message = verdict.refusal(PHRASE)
    assert message.startswith(f"the consent recording must read: {PHRASE!r}; heard: {heard[:300]!r}")
    if missing:
        assert missing in verdict.missing and f"it lacks {verdict.missing[0]!r}" in message
    if extra:
        assert extra in verdict.extra and repr(extra) in message


@pytest.mark.parametrize(
    ("name", "same"),
    [
        ("Korus", True),
        ("Corus", True),
        ("chorus'", True),
        ("Coruss", True),
        ("call us", True),
        ("Boris", False),
        ("Horace", False),
        ("Doris", False),
        ("Microsoft", False),
        ("Keras", False),
    ],
)
def test_the_name_is_matched_by_its_sound(name, same):
    """Old check: every one accepted (one word of twenty, or two). Whisper spells a name it does not know as
    it likes; another name is another company."""
    verdict = judge_phrase(PHRASE, transcript(SAY.format(name)), never_called)
    assert verdict.accepted is same, verdict.refusal(PHRASE)
    assert ("chorus" in verdict.missing) is not same


def test_a_negation_heard_at_a_low_probability_is_heard_again():
    """Old check: a "not" Whisper invented in noise refused the owner; one said softly was refused too, but by
    a list (a "withhold" was not). Now a doubtful word is dismissed only when the second listen hears the
    phrase alone."""
    said = "I am the owner of this voice and I do not consent to Chorus using this voice to create a synthetic voice model."
    first = transcript(said, unsure={"not": 0.2})
    calls = []

    def second_listen(heard: str):
        def listen() -> Transcript:
            calls.append(heard)
            return transcript(heard)

        return listen

    invented = judge_phrase(PHRASE, first, second_listen(PHRASE))
    assert invented.accepted and invented.dismissed == ("not",) and invented.rechecked == PHRASE
    assert calls == [PHRASE]

    confirmed = judge_phrase(PHRASE, first, second_listen(said))
    assert not confirmed.accepted and confirmed.negations == ("not",) and confirmed.dismissed == ()
    assert "a second listen did not hear the phrase alone either" in confirmed.refusal(PHRASE)

    # Any negation confirms a negation: "never" the second time is no better than "not".
    assert not judge_phrase(PHRASE, first, second_listen(said.replace("do not", "never"))).accepted

    # Heard surely, or with something else wrong: refused on the first listen alone.
    assert not judge_phrase(PHRASE, transcript(said), never_called).accepted
    unsure_and_short = transcript(said.replace("synthetic ", ""), unsure={"not": 0.2})
    assert judge_phrase(PHRASE, unsure_and_short, never_called).missing == ("synthetic",)
    # Whisper's "Thank you." after noise: a courtesy tail, dismissed without a second listen.
    assert judge_phrase(PHRASE, transcript(PHRASE + " Thank you.", {"thank": 0.03}), never_called).accepted
    # A second listen that would dismiss a doubtful negation reads its own tail as words: "very much" is added
    # content; "Thank you." counts against the allowance of small words, as anywhere but a first listen's tail.
    unsure_tail = transcript(PHRASE + " Not very much.", {"not": 0.2, "very": 0.2, "much": 0.2})
    assert not judge_phrase(PHRASE, unsure_tail, second_listen(PHRASE + " Very much.")).accepted
    assert judge_phrase(PHRASE, unsure_tail, second_listen(PHRASE)).accepted
    thanks = PHRASE + " Thank you. Thank you."
    assert judge_phrase(PHRASE, unsure_tail, second_listen(thanks)).accepted  # 4 small words: the allowance
    assert not judge_phrase(PHRASE, unsure_tail, second_listen(thanks), max_loose_words=3).accepted


def test_a_refusal_heard_as_other_words_the_second_time_is_still_refused():
    """The attack: "I withhold consent" read in babble. Whisper hears "withhold" unsure, then "would hold" on
    the second listen: not the same word, not a negation, yet not the phrase either (it once passed, in
    bench/consent_denoise.py's calibration run: the second listen only confirmed words heard twice)."""
    said = "I am the owner of this voice and I withhold consent to Chorus using this voice to create a synthetic voice model."
    first = transcript(said.replace("I consent", "I withhold consent"), unsure={"withhold": 0.3})
    heard_again = transcript(said.replace("withhold", "would hold"), unsure={"would": 0.4, "hold": 0.4})
    verdict = judge_phrase(PHRASE, first, lambda: heard_again)
    assert not verdict.accepted and verdict.negations == ("withhold",) and verdict.dismissed == ()
    # An invented word elsewhere the second time is no clean reading either.
    owner_with_noise = transcript(PHRASE.replace("I consent", "I not consent"), unsure={"not": 0.2})
    other_invention = transcript(PHRASE.replace("voice model", "voice model forest"), unsure={"forest": 0.2})
    assert not judge_phrase(PHRASE, owner_with_noise, lambda: other_invention).accepted


def test_the_allowance_of_small_words():
    """Function words missed or added count up to ``max_loose_words``; a sentence of them is not the phrase."""
    padded = (
        "Um so I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model."
    )
    assert judge_phrase(PHRASE, transcript(padded), never_called, max_loose_words=2).accepted
    verdict = judge_phrase(PHRASE, transcript(padded), never_called, max_loose_words=1)
    assert not verdict.accepted and verdict.extra == ("um", "so")


@pytest.mark.parametrize(
    "tail",
    ["Thank you very much.", "Thank you. Thank you.", "So. Thank you. All right.", "Thank you. Thank you very much."],
)
def test_a_courtesy_whisper_adds_after_the_phrase_is_dismissed(tail):
    """bench/consent.py's calibration split: Whisper tiny.en ended right phrases with these; "very much" was
    refused as added content, and two "Thank you." went past the allowance of small words beside a noisy
    phrase's dropped "the" and "a". A tail of courtesies alone is now dismissed and counts against nothing."""
    dropped = "I am owner of this voice and I consent to Chorus using this voice to create synthetic voice model."
    verdict = judge_phrase(PHRASE, transcript(f"{dropped} {tail}"), never_called, max_loose_words=2)
    assert verdict.accepted, verdict.refusal(PHRASE)
    assert verdict.loose == 2 and len(verdict.dismissed) == len(tail.split())


@pytest.mark.parametrize(
    ("tail", "extra"),
    [("Thank you. Not.", "not"), ("Thank you very much, Boris.", "boris"), ("So you know it is false.", "false")],
)
def test_a_tail_with_anything_but_courtesies_is_read_as_before(tail, extra):
    verdict = judge_phrase(PHRASE, transcript(f"{PHRASE} {tail}"), never_called)
    assert not verdict.accepted and extra in verdict.extra


def test_a_tail_after_a_missed_last_word_is_a_tail_too():
    """The tail is what follows everything heard of the phrase: with "model" missed, "very much" is still a
    courtesy, and the verdict names "model" alone. A run of courtesies longer than ``MAX_TAIL`` is read as
    before (a recording of "so" forty times is not the phrase said with manners)."""
    heard = "I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice. Thank you very much."
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert verdict.missing == ("model",) and verdict.extra == () and "very" in verdict.dismissed
    long_tail = judge_phrase(PHRASE, transcript(PHRASE + " So." * (MAX_TAIL + 1)), never_called)
    assert not long_tail.accepted and long_tail.dismissed == ()


def test_a_wrong_name_with_a_courtesy_tail_meets_the_forced_listen_and_its_bound():
    """A tail no longer keeps a misheard name from the forced listen, so wrong names reach it with tails too
    (bench/consent.py's calibration run: "Coral" heard as "quarrel ... So. Thank you. All right."). They are
    refused unless the name itself is likely enough in the recording."""
    heard = transcript(SAY.format("Coral") + " So. Thank you. All right.")
    asked = []

    def forced(probability: float):
        def listen() -> list[float]:
            asked.append(probability)
            return [probability if word == "Chorus" else 0.9 for word in PHRASE.split()]

        return listen

    refused = judge_phrase(PHRASE, heard, never_called, forced(0.004), forced_probability=0.0082)
    assert asked == [0.004] and not refused.accepted and refused.forced == (("chorus", 0.004),)
    assert judge_phrase(PHRASE, heard, never_called, forced(0.05), forced_probability=0.0082).accepted


def test_a_wrong_name_heard_as_a_sound_alike_is_refused_at_the_shipped_bound():
    """The attack bench/consent_forced_probe.py found: festival-ked 220 cents down says "Boris" through an
    AMR-like codec; Whisper writes "bore us" and, fed the phrase, finds "Chorus" there at 0.0111. The bound
    shipped before (0.0082) let it through; the shipped one refuses it."""
    heard = transcript(
        "I am owner of this voice, and I consent to bore us using this voice to create a synthetic voice model."
    )

    def forced() -> list[float]:
        return [0.0111 if word == "Chorus" else 0.9 for word in PHRASE.split()]

    shipped = ConsentSettings().forced_probability
    verdict = judge_phrase(PHRASE, heard, never_called, forced, forced_probability=shipped)
    assert not verdict.accepted and verdict.forced == (("chorus", 0.0111),)
    assert judge_phrase(PHRASE, heard, never_called, forced, forced_probability=0.0082).accepted  # the old bound


def test_courtesies_inside_the_phrase_are_not_a_tail():
    """Only what follows the phrase's last word is a tail: "very much" said inside it is content added."""
    heard = "I am the owner of this voice and I very much consent to Chorus using this voice to create a synthetic voice model."
    verdict = judge_phrase(PHRASE, transcript(heard), never_called)
    assert not verdict.accepted and verdict.extra == ("very", "much")


# -- the checks with a fake recognizer
def checks_hearing(first: Transcript, second: Transcript | None = None) -> CustomVoiceChecks:
    """The server's checks, whose recognizer hears ``first`` with beam search and ``second`` greedily."""

    def transcriber(audio: np.ndarray, rate: int, beam: int) -> Transcript:
        if beam == FIRST_BEAM:
            return first
        assert second is not None, "no second listen expected"
        return second

    return CustomVoiceChecks(None, ConsentSettings(), transcriber=transcriber)  # type: ignore[arg-type]


def test_the_checks_take_the_speaker_from_the_phrase_words_alone():
    """Old check: ``heard`` returned the text and the route embedded the whole recording; now the speech
    is the recording cut to the phrase's words (here: 0.3-6.54 s of 10 s of silence, padded 0.15 s)."""
    rate = 16_000
    heard = transcript(PHRASE)
    words = tuple(Word(w.text, w.start + 0.3, w.end + 0.3, w.probability) for w in heard.words)
    audio = np.zeros(10 * rate, np.float32)  # silence: nothing voiced outside the words
    consent = checks_hearing(Transcript(PHRASE, words)).heard(audio, rate, "en-US")
    assert consent.text == PHRASE and consent.word_error_rate == 0.0 and consent.verdict.accepted
    first, last = words[0].start - 0.15, words[-1].end + 0.15
    assert consent.speech.dtype == np.float32 and abs(consent.speech.size - (last - first) * rate) <= 2


def test_the_checks_hear_a_doubtful_word_twice():
    said = "I am the owner of this voice and I do not consent to Chorus using this voice to create a synthetic voice model."
    audio = np.zeros(16_000 * 7, np.float32)
    doubtful = transcript(said, unsure={"not": 0.1})
    assert checks_hearing(doubtful, transcript(PHRASE)).heard(audio, 16_000, "en").verdict.dismissed == ("not",)
    with pytest.raises(ApiError, match="which makes it a refusal") as refused:
        checks_hearing(doubtful, transcript(said)).heard(audio, 16_000, "en")
    assert refused.value.status == 400 and refused.value.code == "consent_phrase_mismatch"
    assert refused.value.param == "recording"


# -- real audio: espeak-ng's phrase (f4), another voice's speech reversed (m3), Whisper tiny.en
@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The consent phrase and 10 s of another voice reversed (one rate), the server's checks with the shipped
    Whisper, and the words Whisper hears in the clean phrase. espeak-ng's f4 and m3: f4 is the voice whose
    noisy takes Whisper mishears most (the old check's word error rate refused it)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    folder = tmp_path_factory.mktemp("consent_phrase")
    for name, variant, text in (("consent", "f4", PHRASE), ("other", "m3", CUSTOM_VOICE_SAMPLE)):
        subprocess.run(
            ["espeak-ng", "-v", f"en-us+{variant}", "-w", str(folder / f"{name}.wav"), text], check=True, timeout=60
        )
    consent, rate = sf.read(folder / "consent.wav", dtype="float32")
    other, other_rate = sf.read(folder / "other.wav", dtype="float32")
    assert rate == other_rate
    checks = CustomVoiceChecks(None, ConsentSettings())  # type: ignore[arg-type]
    words = checks.heard(consent, rate, "en").verdict.words
    return consent, other[::-1][: 10 * rate].copy(), rate, checks, words


def pause(rate: int, seconds: float = 0.5) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.float32)


@pytest.mark.parametrize("gain_db", [0.0, -14.0])
def test_a_consent_laundering_another_voice_after_the_phrase_is_refused(real, gain_db):
    """The phrase, a pause, then another voice's speech reversed (as loud, and 14 dB quieter): Whisper hears
    the phrase alone (the old check accepted it at WER 0.24 and embedded the other voice with it)."""
    consent, reversed_speech, rate, checks, _ = real
    audio = np.concatenate([consent, pause(rate), reversed_speech * 10 ** (gain_db / 20)])
    with pytest.raises(ApiError, match=r"s of speech outside the phrase; record the phrase alone") as refused:
        checks.heard(audio, rate, "en")
    assert refused.value.code == "consent_extra_speech" and refused.value.param == "recording"
    seconds = float(refused.value.message.split("has ")[1].split(" s")[0])
    assert seconds > 5, refused.value.message  # most of the reversed speech is voiced


def test_a_consent_laundering_another_voice_inside_the_phrase_is_refused(real):
    """The reversed speech before "synthetic": the old check accepted what Whisper heard ("... to create a
    system.", WER 0.29). Refused, as the phrase's last words or as speech beside them."""
    consent, reversed_speech, rate, checks, words = real
    at = int(next(w.start for w in words if w.text.lower().startswith("synthetic")) * rate)
    audio = np.concatenate([consent[:at], pause(rate), reversed_speech, pause(rate), consent[at:]])
    with pytest.raises(ApiError) as refused:
        checks.heard(audio, rate, "en")
    assert refused.value.code in ("consent_phrase_mismatch", "consent_extra_speech"), refused.value.message


def test_speech_hidden_between_two_phrase_words_is_refused(real):
    """Had the recognizer heard the whole phrase around the reversed speech (its words' timestamps leaving
    a long gap), the gap is voiced: refused as extra speech."""
    consent, reversed_speech, rate, _, words = real
    index = next(k for k, w in enumerate(words) if w.text.lower().startswith("synthetic"))
    at = words[index].start
    inserted = np.concatenate([pause(rate), reversed_speech, pause(rate)])
    shift = inserted.size / rate
    heard = tuple(
        w if k < index else Word(w.text, w.start + shift, w.end + shift, w.probability) for k, w in enumerate(words)
    )
    audio = np.concatenate([consent[: int(at * rate)], inserted, consent[int(at * rate) :]])
    with pytest.raises(ApiError, match="speech outside the phrase") as refused:
        checks_hearing(Transcript(PHRASE, heard)).heard(audio, rate, "en")
    assert refused.value.code == "consent_extra_speech"


def test_the_phrase_in_white_noise_is_accepted_with_its_words(real):
    """20 dB SNR white noise: Whisper hears "moist" for "voice", "chloros" for "Chorus" and invents "Thank
    you." (WER 0.43: the old check refused the owner). Accepted, the speech covering every word."""
    consent, _, rate, checks, _ = real
    noise = np.random.default_rng(0).standard_normal(consent.size).astype(np.float32)
    noisy = consent + noise * np.sqrt(np.mean(consent**2) / np.mean(noise**2) / 10 ** (20 / 10))
    heard = checks.heard(noisy, rate, "en")
    assert word_error_rate(PHRASE, heard.text) > 0.35 and heard.verdict.accepted
    settings = ConsentSettings()
    spans = phrase_spans(heard.verdict.words, settings.word_pad_seconds, settings.max_word_seconds, noisy.size / rate)
    assert all(any(s <= (w.start + w.end) / 2 <= e for s, e in spans) for w in heard.verdict.words)
    assert heard.speech.size == sum(int(e * rate) - int(s * rate) for s, e in spans)
    first, last = heard.verdict.words[0], heard.verdict.words[-1]
    assert heard.speech.size / rate >= last.end - first.start


def test_voiced_audio_is_periodic_audio_not_noise(real):
    """The detector: white noise at 15 dB below the phrase's power is not speech; the reversed speech, even
    14 dB quieter than the phrase, is."""
    consent, reversed_speech, rate, _, _ = real
    noise = np.random.default_rng(1).standard_normal(10 * rate).astype(np.float32)
    noise *= np.sqrt(np.mean(consent**2) / np.mean(noise**2) / 10 ** (15 / 10))
    assert voiced_frames(noise, rate).sum() * HOP < 0.1
    quiet = reversed_speech * 10 ** (-14 / 20)
    assert voiced_frames(quiet, rate).sum() * HOP > 5
    assert speech_outside(np.concatenate([consent, quiet]), rate, [(0.0, consent.size / rate)]) > 5


# -- the forced listen: the recognizer fed the phrase decides a word it wrote otherwise
def forced_listen(probabilities: dict[str, float]):
    """A forced listen that finds each phrase word at 0.9 but those named (as written, punctuation aside)."""
    calls = []

    def listen() -> list[float]:
        calls.append(1)
        return [probabilities.get(word.strip(".,").lower(), 0.9) for word in PHRASE.split()]

    listen.calls = calls  # type: ignore[attr-defined]
    return listen


def never_forced() -> list[float]:
    raise AssertionError("the forced listen was not needed")


def test_a_name_written_otherwise_is_settled_by_the_forced_listen():
    """Before: Whisper tiny.en's "Boris" for flite-slt's "Chorus" refused the owner in 12 of 15 conditions
    (bench/consent.py); now the phrase word counts as heard when the recognizer, fed the phrase, finds it
    likely, and stays refused when it does not (a "Boris" said: under 0.006)."""
    heard = transcript(SAY.format("Boris"))
    said = judge_phrase(PHRASE, heard, never_called, forced_listen({"chorus": 0.3}), forced_probability=0.02)
    assert said.accepted and said.forced == (("chorus", 0.3),) and said.dismissed == ("boris",)
    other = judge_phrase(PHRASE, heard, never_called, forced_listen({"chorus": 0.004}), forced_probability=0.02)
    assert not other.accepted and other.missing == ("chorus",) and other.extra == ("boris",)
    assert other.forced == (("chorus", 0.004),)
    # Two words for one ("pour us"), and a word dropped with nothing in its place, are in the phrase word's place.
    shipped = ConsentSettings().forced_probability
    pour_us = transcript(SAY.format("pour us"))
    assert judge_phrase(PHRASE, pour_us, None, forced_listen({"chorus": 0.1}), forced_probability=shipped).accepted
    dropped = "I am the owner of this voice and I consent to using this voice to create a synthetic voice model."
    forced = forced_listen({"chorus": 0.001})
    assert not judge_phrase(PHRASE, transcript(dropped), None, forced, forced_probability=shipped).accepted
    with pytest.raises(ValueError, match="needs its bound"):
        judge_phrase(PHRASE, pour_us, None, forced_listen({"chorus": 0.1}))
    # Two content words misheard are settled; three are another sentence, not a mishearing.
    two = SAY.format("Boris").replace("owner", "builder")
    assert judge_phrase(
        PHRASE, transcript(two), None, forced_listen({"chorus": 0.1, "owner": 0.2}), forced_probability=shipped
    ).accepted
    three = two.replace("synthetic", "musical")
    assert not judge_phrase(PHRASE, transcript(three), None, never_forced, forced_probability=0.0).accepted


@pytest.mark.parametrize(
    "label, heard",
    [
        ("a negation beside the name", SAY.format("Boris").replace("I consent", "I withhold consent")),
        ("a turn beside the name", SAY.format("Boris").replace(" model.", " model, but falsely.")),
        ("words added elsewhere", SAY.format("Boris").replace(" model.", " model for fraud.")),
        ("another purpose", PHRASE.replace("create a synthetic voice model", "sell a political advertisement")),
    ],
)
def test_the_forced_listen_never_hears_over_a_refusal(label, heard):
    """Only words heard in a phrase word's place go to the forced listen: a negation, a turn or a word added
    elsewhere refuses without it, however likely the phrase's words are (and at any bound, 0 included)."""
    verdict = judge_phrase(PHRASE, transcript(heard), never_called, never_forced, forced_probability=0.0)
    assert not verdict.accepted, label


def test_the_checks_settle_a_misheard_name_with_the_forced_listen():
    audio = np.zeros(16_000 * 7, np.float32)

    def transcriber(audio, rate, beam):
        return transcript(SAY.format("Boris"))

    def listener(probability):
        return lambda audio, rate, text: [probability if w == "Chorus" else 0.9 for w in text.split()]

    settings = ConsentSettings()
    heard = CustomVoiceChecks(None, settings, transcriber, forced_listener=listener(0.3)).heard(audio, 16_000, "en")  # type: ignore[arg-type]
    assert heard.verdict.forced == (("chorus", 0.3),)
    with pytest.raises(ApiError, match="it lacks 'chorus'"):
        CustomVoiceChecks(None, settings, transcriber, forced_listener=listener(0.001)).heard(audio, 16_000, "en")  # type: ignore[arg-type]
    with pytest.raises(ApiError, match="it lacks 'chorus'"):  # a transcriber alone: no forced listen
        CustomVoiceChecks(None, settings, transcriber).heard(audio, 16_000, "en")  # type: ignore[arg-type]


def test_the_forced_listen_finds_the_name_said_and_not_another(real, tmp_path):
    """Whisper tiny.en fed the phrase, on espeak-ng's reading of it and of the phrase with "Boris": the name
    said is found over ten times likelier than where "Boris" was said (0.004 against 0.0002 here: Whisper
    writes this "Chorus" as "call us", which the match by sound accepts without a forced listen), and every
    other word of the phrase said reaches the shipped ``forced_probability``."""
    consent, _, rate, _, _ = real
    subprocess.run(["espeak-ng", "-v", "en-us+f4", "-w", str(tmp_path / "boris.wav"), SAY.format("Boris")], check=True)
    boris, boris_rate = sf.read(tmp_path / "boris.wav", dtype="float32")
    whisper = WhisperJudge()
    name = PHRASE.split().index("Chorus")
    said = whisper.word_probabilities(consent, rate, PHRASE)
    other = whisper.word_probabilities(boris, boris_rate, PHRASE)
    assert len(said) == len(other) == len(PHRASE.split())
    least = ConsentSettings().forced_probability
    assert said[name] > 10 * other[name], (said[name], other[name])
    assert min(p for k, p in enumerate(said) if k != name) >= least
