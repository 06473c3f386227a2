"""Whether what the recognizer heard in a consent recording says the consent phrase: its meaning, word by word.

A word error rate cannot tell a mishearing from a refusal: "I withhold consent to Chorus ..." or "... I
consent to Boris ..." is one word in twenty from the phrase, while Whisper tiny.en hears the clean phrase as
"... I can send to call us using ..." (four). So the heard words are aligned to the phrase's, in order
(:func:`judge_phrase`), and the alignment is read:

* every *content* word of the phrase must be heard. *Function* words ("I", "the", "of", "to" ...) carry no
  consent of their own: missed, added or swapped for one another they count against a small allowance
  (``max_loose_words``), as recognizers drop and confuse them most;
* a heard word the phrase does not have is refused when it is a content word ("Boris", "advertising",
  "but", "false"); a *negation* ("not", "withhold", "revoke", "don't", "unconsenting" ...) never stands for a
  phrase word, so no likeness of sound can hide one;
* the phrase's name (its capitalized word: "Chorus") is matched by sound, since the recognizer spells a
  name it does not know as it likes ("Korus", "call us", "chloros"): the same consonants, by class, and the
  same first vowel. "Boris", "Horace" and "Microsoft" differ in a consonant and are refused. Other content
  words are matched by a looser likeness (most of their sounds in order): in noise Whisper hears "voice" as
  "moist", and a sound-alike of "voice" or "model" changes no one's consent;
* no other person may make the claim: a pronoun of anyone but the speaker ("you", "your", "we", "they",
  "her" ...) is never a loose word, so "You are the owner of this voice and you consent to Chorus ..." read out
  by a victim (an agent reading a script to a caller), "Are you the owner of this voice and do you consent
  ...?" or "... using her voice ..." is refused (``OTHER_PERSONS``), as is an "it" / "its" heard in place of
  the speaker's "I" or of "this" voice ("It is the owner of this voice ...", "... using its voice ..."), and so
  is a recording the recognizer punctuates as a question (a "?" anywhere but in the courtesy tail: "Am I the
  owner of this voice and do I consent ...?"). Small words alone still pass within the allowance ("The owner of
  this voice and I consent ..." drops two); the "?" is Whisper's reading of the intonation, and a question said
  flat is not caught;
* a recognizer also invents words in noise or in the silence after the phrase ("Thank you very much.", a
  "not" nobody said). The courtesies a recording ends with, after everything heard of the phrase, are
  dismissed outright (``COURTESY_TAIL``). When other such words, heard at a low probability, are all that
  is wrong, a second listen decides (``recheck``: the server decodes again another way): the words are
  dismissed only if the second listen hears the phrase with nothing added (its own courtesy tail is not
  dismissed: "very much" there is added words, "Thank you." counts against the allowance). (It once
  took only the same word heard twice to refuse: a "withhold" read in babble and heard as "would hold" the
  second time then passed, bench/consent_denoise.py's calibration run);
* a recognizer's first choice can miss a word that was said by a hair: Whisper tiny.en writes flite-slt's
  "Chorus" as "Boris" or "bars", a noisy "owner" as "older". When all that is wrong is one or two phrase words
  heard as other words in their place (no negation, no turn, nothing added elsewhere), a *forced listen*
  decides (``forced``: the recognizer is fed the phrase and says how likely each word is in this audio): each
  missed word must reach ``forced_probability`` (set on bench/consent.py's calibration split, where "Boris"
  or "Horace" said for "Chorus" reached 0.0081 at most, and a probe of those voices through more channels
  0.0111: "Boris" through an AMR-like codec).

Sounds are espeak-ng's phonemes of the written words (:func:`chorus.text.phonemize.phonemize`), not a
spelling key such as Soundex: spelling puts "chorus" (/k/) with "church" and apart from "Korus" and "call us";
espeak reads each word once (milliseconds) and its phonemes are cached.

The word lists are English's, as the server's recognizer (Whisper tiny.en) is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from chorus.evaluation.asr import Transcript, Word, normalize_for_scoring
from chorus.text.phonemize import phonemize

# Words that carry no consent of their own, as the scoring normalizer writes them. Not here, so refused when
# heard beyond the phrase: modal verbs ("could", "may"), conjunctions that turn a sentence ("but", "if", "or").
FUNCTION_WORDS = frozenset(
    {"i", "me", "my", "mine", "myself", "you", "your", "we", "us", "our", "it", "its", "this", "that", "these"}
    | {"those", "the", "a", "an", "am", "is", "are", "be", "been", "do", "of", "to", "and", "in", "on"}
    | {"at", "for", "with", "by", "as", "so", "uh", "um", "oh"}
    # Courtesies that claim nothing: Whisper tiny.en ends clean synthetic consents with an invented "Thank
    # you." (or "All right.") (bench/consent.py: 6 of 24 clean flite-slt takes before these were loose);
    # after the phrase they are a courtesy tail, elsewhere they count against the allowance.
    | {"thank", "thanks", "hi", "hello", "hey", "okay", "ok", "all", "right", "well", "yes", "yeah", "please"}
)
# "was" is not among them: "I was the owner of this voice" says the speaker no longer is (Whisper heard "was" in
# none of 1,440 owners' consents of bench/consent.py's runs).
# Pronouns of someone other than the speaker: heard beyond the phrase or in place of one of its words, they
# move the claim to another person ("you consent", "we consent", "her voice"), so they are never loose words
# (the "you" of "thank you" aside). They may stand where a misheard content word was ("pour us" for "Chorus"),
# which the forced listen settles. "it" stays loose (Whisper adds it in noise: "I can send it to ..."), but not
# in place of the words that say whose the claim and the voice are (``OWNED``): "It is the owner of this voice
# ...", "... and it consents ...", "... using its voice ..." (``_standing_in``). Cost,
# read again on the transcripts of bench/consent.py's stored runs: 2 of their 229 distinct owners' transcripts,
# accepted before, are refused ("I can send you chorus", "to create us a good voice model").
OTHER_PERSONS = frozenset(
    {"you", "your", "yours", "yourself", "yourselves", "we", "us", "our", "ours", "ourselves", "he", "him"}
    | {"his", "himself", "she", "her", "hers", "herself", "they", "them", "their", "theirs", "themselves"}
)
# The phrase's words that say whose the claim and the voice are: the speaker's own, and "this" voice.
OWNED = frozenset({"i", "me", "my", "mine", "myself", "this"})
NOT_A_PERSON = frozenset({"it", "its", "itself"})
# What Whisper tiny.en appends to a recording after its last word, in noise or in the silence after it ("Thank
# you.", "Thank you very much.", "So.", "All right."): heard after everything heard of the phrase (its last
# word missed or not), such a tail is dismissed outright, not counted against the allowance of loose words (bench/consent.py's
# calibration split: 8 of its 26 refused right phrases, "very much" refused as content, two "Thank you."
# tails past the allowance). Anything else after the phrase is read as before ("... model. Not." is refused).
COURTESY_TAIL = frozenset({"thank", "thanks", "you", "very", "much", "so", "all", "right", "okay", "ok", "bye"})
MAX_TAIL = 8  # words: "Thank you. Thank you very much." is 6; a longer run of them is read as before
# Words that make a consent a refusal, and their stems (withhold, withheld, withholding ...).
NEGATIONS = frozenset(
    {"not", "no", "never", "nor", "neither", "nobody", "nothing", "none", "nowhere", "without", "against"}
)
NEGATING_STEMS = (
    "withh", "revok", "revoc", "refus", "declin", "deny", "deni", "reject", "object", "oppos", "withdr",
    "retract", "rescind", "forbid", "forbad", "prohibit", "disagree", "dissent", "disallow", "disapprov",
    "veto", "resent",
)  # fmt: skip
# A prefix that negates the word it is put on, when that word is (begins as) one of the phrase's.
NEGATING_PREFIXES = ("un", "non", "dis", "mis")
# Words that turn a sentence around: like a negation, they never stand for a phrase word.
TURNS = frozenset(
    {"but", "however", "although", "though", "if", "unless", "except", "only", "until", "false", "untrue", "lie"}
    | {"lying", "pretend", "pretending", "forced", "joke", "joking", "kidding", "fake", "fiction", "quote"}
)
# Contractions as the scoring normalizer writes them ("don't" is "dont"), spelled out so that their "not"
# is a negation and their "am" the phrase's.
CONTRACTIONS = {
    "im": "i am",
    "ive": "i have",
    "dont": "do not",
    "doesnt": "does not",
    "didnt": "did not",
    "wont": "will not",
    "cant": "can not",
    "cannot": "can not",
    "isnt": "is not",
    "arent": "are not",
    "wasnt": "was not",
    "werent": "were not",
    "shouldnt": "should not",
    "wouldnt": "would not",
    "couldnt": "could not",
    "havent": "have not",
    "hasnt": "has not",
    "hadnt": "had not",
    "aint": "am not",
    "mustnt": "must not",
    "neednt": "need not",
    "shant": "shall not",
}

# Alignment costs: a content word missed or added outweighs any number of small ones, so the alignment with
# the fewest content errors wins and, among those, the one with the fewest loose function words.
_CONTENT = 1000.0
_LOOSE = 1.0
_SOUND_ALIKE = 0.25  # a match by sound rather than spelling: preferred to any error, after an exact match
_TWO_TOKENS = 0.3  # one phrase word heard as two ("call us" for "Chorus")
# Looser likeness of a content word: twice the phonemes the two share in order over their lengths (Dice).
# Whisper tiny.en's mishearings of espeak's phrase in noise: "moist" for "voice" 0.57, "longer" for "owner"
# 0.5, "can send" for "consent" 0.86; "builder" for "owner" is 0.25.
SOUND_ALIKE = 0.5


@dataclass(frozen=True)
class PhraseVerdict:
    """What the recognizer heard, read against the phrase.

    heard: the transcript's text; words: the heard words aligned to phrase words, in order (where the phrase
    was said: the consent's speech); missing: phrase words not heard (content words, and function words past
    the allowance); extra: heard words the phrase does not have and the allowance does not cover (normalized:
    "don't" is "do", "not"); negations: those of ``extra`` that negate; persons:
    those of ``extra`` that are another person's (``OTHER_PERSONS``); question: whether the recognizer wrote a "?"
    outside the courtesy tail (it heard a question, not a statement); loose: function words missed, added or
    swapped, within the allowance; dismissed: extra words heard at a low probability and not on the second
    listen (which heard the phrase clean), heard in place of a word the forced listen found, or a courtesy tail
    after the phrase (``COURTESY_TAIL``); rechecked:
    what the second listen heard,
    when there was one; forced: the missed phrase words the forced listen judged, with their probabilities.
    """

    heard: str
    words: tuple[Word, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    negations: tuple[str, ...]
    loose: int
    persons: tuple[str, ...] = ()
    question: bool = False
    dismissed: tuple[str, ...] = ()
    rechecked: str | None = None
    forced: tuple[tuple[str, float], ...] = ()  # phrase words judged on the forced listen, with their probabilities

    @property
    def accepted(self) -> bool:
        return not self.missing and not self.extra and not self.question

    @property
    def heard_content(self) -> bool:
        """Whether every content word of the phrase was heard (what is wrong, if anything, is what was added)."""
        return all(word in FUNCTION_WORDS for word in self.missing)

    def refusal(self, phrase: str) -> str:
        """Why the recording is not the phrase, quoting what was heard ("" when it is)."""
        if self.accepted:
            return ""
        reasons = []
        if self.missing:
            reasons.append(f"it lacks {_quoted(self.missing)}")
        if self.negations:
            reasons.append(f"it says {_quoted(self.negations)}, which makes it a refusal, not a consent")
        if self.persons:
            reasons.append(
                f"it says {_quoted(self.persons)}: the phrase is the speaker's own claim, made with 'I' and 'my'"
            )
        if self.question:
            reasons.append("it was heard as a question; say it as a statement")
        others = [word for word in self.extra if word not in self.negations and word not in self.persons]
        if others:
            reasons.append(f"it adds {_quoted(others)}, which the phrase does not say")
        again = " (and a second listen did not hear the phrase alone either)" if self.rechecked is not None else ""
        return f"the consent recording must read: {phrase!r}; heard: {self.heard[:300]!r}: {'; '.join(reasons)}{again}"


def judge_phrase(
    phrase: str,
    transcript: Transcript,
    recheck: Callable[[], Transcript] | None = None,
    forced: Callable[[], Sequence[float]] | None = None,
    *,
    max_loose_words: int = 4,
    doubtful_probability: float = 0.5,
    forced_probability: float | None = None,
    max_forced_words: int = 2,
    language: str = "en-us",
) -> PhraseVerdict:
    """Whether ``transcript`` says ``phrase`` (see the module's notes).

    recheck: a second listen to the same recording, called only when all that is wrong is extra words each
    heard below ``doubtful_probability``; they are dismissed only if the second listen hears the phrase and
    nothing else: its own courtesy tail is read as words, not dismissed (another word in the same place,
    "would hold" for "withhold", is no dismissal). forced: the
    probability of each whitespace word of
    ``phrase`` in the recording when the recognizer is fed the phrase (``WhisperJudge.word_probabilities``),
    called only when all that is wrong is at most ``max_forced_words`` content words heard as others in their
    place; they count as heard if each reaches ``forced_probability`` (required with ``forced``: the server's
    is ``ConsentSettings.forced_probability``, calibrated by bench/consent.py). ``language``: espeak-ng's, for
    the sounds.
    """
    if forced is not None and forced_probability is None:
        raise ValueError("a forced listen needs its bound (forced_probability)")
    verdict, extra, substitutions = _read(phrase, transcript, max_loose_words, language)
    if forced is not None and substitutions is not None and 0 < len(verdict.missing) <= max_forced_words:
        return _forced_listen(phrase, verdict, substitutions, forced(), forced_probability)
    doubtful = (
        not verdict.missing and not verdict.question and all(word.probability < doubtful_probability for word in extra)
    )
    if recheck is None or verdict.accepted or not doubtful:
        return verdict
    second = recheck()
    # Read strictly: a dismissal needs the phrase and nothing else, so the second listen's own tail counts.
    again, _, _ = _read(phrase, second, max_loose_words, language, dismiss_tail=False)
    if again.accepted:
        return replace(
            verdict,
            extra=(),
            negations=(),
            persons=(),
            dismissed=verdict.dismissed + verdict.extra,
            rechecked=second.text,
        )
    return replace(verdict, rechecked=second.text)


def _forced_listen(
    phrase: str, verdict: PhraseVerdict, missing_at: list[int], probabilities: Sequence[float], least: float
) -> PhraseVerdict:
    """``verdict`` with its missed phrase words (at normalized-phrase places ``missing_at``) taken as heard if
    the forced listen's ``probabilities`` (one per whitespace word of ``phrase``) give each ``least`` or more."""
    places = [k for k, word in enumerate(phrase.split()) for _ in normalize_for_scoring(word).split()]
    if len(places) != len(normalize_for_scoring(phrase).split()) or len(probabilities) != len(phrase.split()):
        return verdict  # the phrase's words do not map one to one onto its normalized words: no forced listen
    found = tuple((word, round(float(probabilities[places[k]]), 4)) for word, k in zip(verdict.missing, missing_at))
    if any(probability < least for _, probability in found):
        return replace(verdict, forced=found)  # for the record; still refused
    return replace(verdict, missing=(), dismissed=verdict.dismissed + verdict.extra, extra=(), persons=(), forced=found)


# -- reading one transcript
@dataclass(frozen=True)
class _Token:
    """One normalized word of a transcript, and the recognizer's word it came from."""

    text: str
    word: Word


def _tokens(transcript: Transcript) -> list[_Token]:
    tokens = []
    for word in transcript.words:
        for text in normalize_for_scoring(word.text).split():
            tokens += [_Token(part, word) for part in CONTRACTIONS.get(text, text).split()]
    return tokens


def _name_words(phrase: str) -> set[str]:
    """The phrase's names: capitalized words inside a sentence ("Chorus"), "I" aside."""
    names, starts_sentence = set(), True
    for raw in phrase.split():
        word = raw.strip(".,;:!?\"'()")
        if word and not starts_sentence and word[0].isupper() and word not in ("I", "I'm"):
            names.update(normalize_for_scoring(word).split())
        starts_sentence = raw.endswith((".", "!", "?"))
    return names


def is_negation(word: str, phrase_words: frozenset[str] = frozenset()) -> bool:
    """Whether normalized ``word`` negates: a negation, a refusal verb, or a negating prefix on one of
    ``phrase_words`` ("unconsenting", "nonconsensual", "disowned", "misusing")."""
    if word in NEGATIONS or word.startswith(NEGATING_STEMS):
        return True
    for prefix in NEGATING_PREFIXES:
        rest = word[len(prefix) :]
        if word.startswith(prefix) and len(rest) >= 4 and any(rest[:4] == p[:4] for p in phrase_words if len(p) >= 4):
            return True
    return False


def _read(
    phrase: str, transcript: Transcript, max_loose_words: int, language: str, dismiss_tail: bool = True
) -> tuple[PhraseVerdict, list[Word], list[int] | None]:
    """One transcript against the phrase, without a second listen (its courtesy tail dismissed if
    ``dismiss_tail``); the recognizer's words that the verdict's ``extra`` came from; and, when every fault is
    a phrase content word heard as one or two other words in its place (none of them a negation or a turn),
    the normalized-phrase places of the missed words (else None): what a forced listen may settle."""
    sides = _Sides.of(phrase, transcript, language)
    alignment = _read_back(sides, _align(sides))
    courtesy = _courtesy_tail(sides, alignment) if dismiss_tail else []
    tail_words = [sides.heard[t].word for t in courtesy]
    for t in courtesy:
        alignment.extra.pop(t, None)
        alignment.loose_extra.pop(t, None)
    missing, extra = alignment.missing, alignment.extra
    loose = len(alignment.loose_missing) + len(alignment.loose_extra)
    if loose > max_loose_words:  # too far from the phrase to call it noise
        missing |= alignment.loose_missing
        extra |= alignment.loose_extra
    standing_in = _standing_in(sides, alignment)
    extra |= {t: sides.heard[t] for t in standing_in}
    texts = tuple(extra[k].text for k in sorted(extra))
    verdict = PhraseVerdict(
        heard=transcript.text,
        words=tuple(reversed(alignment.words)),
        missing=tuple(missing[k] for k in sorted(missing)),
        extra=texts,
        negations=tuple(w for w in texts if is_negation(w, sides.content)),
        loose=loose,
        persons=tuple(extra[k].text for k in sorted(extra) if sides.others[k] or k in standing_in),
        question=any("?" in word.text for word in transcript.words if word not in tail_words),
        dismissed=tuple(sides.heard[t].text for t in courtesy),
    )
    return verdict, [extra[k].word for k in sorted(extra)], _substitutions(sides, missing, extra, alignment.gaps)


def _standing_in(sides: _Sides, alignment: _Alignment) -> list[int]:
    """The heard tokens "it" / "its" that stand where an ``OWNED`` phrase word was: heard as that word (a swap),
    or added beside it where it was missed. Such a token is no loose word; one elsewhere ("I can send it to
    chorus", "... model of it") still is, and counts wherever the alignment put the speaker's "I"s (a review: a
    count of "I"s let "It is the owner ... and I, I consent" pass)."""
    said, owned_missed = sides.said, [k for k, word in alignment.loose_missing.items() if word in OWNED]
    return [
        t
        for t, token in enumerate(sides.heard)
        if token.text in NOT_A_PERSON
        and (
            said[alignment.places[t]] in OWNED
            if t in alignment.places
            else any(alignment.gaps.get(t) in (k, k + 1) for k in owned_missed)
        )
    ]


def _courtesy_tail(sides: _Sides, alignment: _Alignment) -> list[int]:
    """The last heard tokens, up to ``MAX_TAIL``, that stand for no phrase word and are each a courtesy
    (``COURTESY_TAIL``): what follows everything heard of the phrase, whether or not its last word was."""
    unaligned = alignment.extra.keys() | alignment.loose_extra.keys()
    tail: list[int] = []
    for t in reversed(range(len(sides.heard))):
        if t not in unaligned or sides.heard[t].text not in COURTESY_TAIL:
            break
        tail.insert(0, t)
    return tail if len(tail) <= MAX_TAIL else []


@dataclass(frozen=True)
class _Sides:
    """The two sides of an alignment: the phrase's normalized words and the heard tokens, with what the rules
    ask of them."""

    said: list[str]  # the phrase's words, normalized
    content: frozenset[str]  # those that are not function words
    names: set[str]  # those matched by sound alone (:func:`_name_words`)
    heard: list[_Token]
    never: list[bool]  # per heard token: a negation or a turn, which never stands for a phrase word
    others: list[bool]  # per heard token: another person's pronoun, never loose (``OTHER_PERSONS``)
    language: str  # espeak-ng's, for the sounds

    def loose(self, t: int) -> bool:
        """Whether heard token ``t``, added beyond the phrase, is a loose word (a function word that neither
        negates, turns the sentence, nor names another person)."""
        return self.heard[t].text in FUNCTION_WORDS and not self.never[t] and not self.others[t]

    @classmethod
    def of(cls, phrase: str, transcript: Transcript, language: str) -> _Sides:
        said = normalize_for_scoring(phrase).split()
        names = _name_words(phrase)
        content = frozenset(w for w in said if w not in FUNCTION_WORDS)
        heard = _tokens(transcript)
        never = [is_negation(t.text, content) or t.text in TURNS for t in heard]
        others = [
            t.text in OTHER_PERSONS
            and t.text not in said
            and not (t.text == "you" and k and heard[k - 1].text in ("thank", "thanks"))
            for k, t in enumerate(heard)
        ]
        return cls(said, content, names, heard, never, others, language)


def _align(sides: _Sides) -> list[list[tuple[int, int]]]:
    """The cheapest order-preserving alignment (edit distance over words, with a two-words-for-one step), as
    the cell each cell ``[i][j]`` came from: cell ``[i][j]`` aligns the first i heard tokens with the first j
    phrase words."""
    n, m = len(sides.heard), len(sides.said)
    cost = [[0.0] * (m + 1) for _ in range(n + 1)]
    step = [[(0, 0)] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        for j in range(m + 1):
            if i == j == 0:
                continue
            # The first of equal costs wins, so the moves' order is part of the rules.
            cost[i][j], step[i][j] = min(_moves(sides, cost, i, j), key=lambda option: option[0])
    return step


def _moves(sides: _Sides, cost: list[list[float]], i: int, j: int) -> list[tuple[float, tuple[int, int]]]:
    """The ways into cell ``[i][j]`` of the alignment, each with its total cost and the cell it comes from."""
    heard, said, never, others = sides.heard, sides.said, sides.never, sides.others
    options = []
    if j:  # phrase word j-1 not heard
        options.append((cost[i][j - 1] + _miss(said[j - 1]), (i, j - 1)))
    if i:  # heard token i-1 not in the phrase
        options.append((cost[i - 1][j] + (_LOOSE if sides.loose(i - 1) else _CONTENT), (i - 1, j)))
    # A phrase may say "not"; another person's pronoun stands for no phrase word but itself.
    if i and j and (not (never[i - 1] or others[i - 1]) or heard[i - 1].text == said[j - 1]):
        found = _match_cost(heard[i - 1].text, said[j - 1], sides.names, sides.language)
        if found is not None:
            options.append((cost[i - 1][j - 1] + found, (i - 1, j - 1)))
    if i >= 2 and j and said[j - 1] in sides.content and not (never[i - 1] or never[i - 2]):
        found = _two_for_one(sides, i, j)
        if found is not None:
            options.append((cost[i - 2][j - 1] + found + _TWO_TOKENS, (i - 2, j - 1)))
    return options


def _two_for_one(sides: _Sides, i: int, j: int) -> float | None:
    """What it costs (before the two-tokens step's own) to take heard tokens i-2 and i-1 together for content
    word j-1 of the phrase; None when they cannot stand for it. Two tokens for one word only when together they
    sound more like it than either alone: "can send" for "consent", but not "Boris using" for "using"."""
    word, names, language = sides.said[j - 1], sides.names, sides.language
    first, second = sides.heard[i - 2].text, sides.heard[i - 1].text
    joined = f"{first} {second}"
    found = _match_cost(joined, word, names, language)
    if found is not None and _closeness(joined, word, names, language) > max(
        _closeness(first, word, names, language), _closeness(second, word, names, language)
    ):
        return found
    return None


@dataclass
class _Alignment:
    """What each step of the cheapest alignment did, read back from its end; phrase words and heard tokens by
    their places. Content words and loose function words are kept apart, as only the allowance tells whether
    the loose ones count."""

    words: list[Word] = field(default_factory=list)  # heard words aligned to phrase words, the last first
    missing: dict[int, str] = field(default_factory=dict)  # phrase content words not heard
    extra: dict[int, _Token] = field(default_factory=dict)  # heard tokens not in the phrase, but loose ones
    gaps: dict[int, int] = field(default_factory=dict)  # heard token -> the phrase place it was heard before
    loose_missing: dict[int, str] = field(default_factory=dict)  # phrase function words missed or swapped
    loose_extra: dict[int, _Token] = field(default_factory=dict)  # function words heard beyond the phrase
    places: dict[int, int] = field(default_factory=dict)  # heard token -> the phrase word it was heard as


def _read_back(sides: _Sides, step: list[list[tuple[int, int]]]) -> _Alignment:
    """The alignment whose cells came from ``step`` (:func:`_align`), from its last cell to its first."""
    heard, said, content = sides.heard, sides.said, sides.content
    alignment = _Alignment()
    i, j = len(heard), len(said)
    while i or j:
        pi, pj = step[i][j]
        if pj == j:  # a heard token alone
            (alignment.loose_extra if sides.loose(i - 1) else alignment.extra)[i - 1] = heard[i - 1]
            alignment.gaps[i - 1] = j  # j: after phrase word j - 1
        elif pi == i:  # a phrase word alone
            (alignment.loose_missing if said[j - 1] not in content else alignment.missing)[j - 1] = said[j - 1]
        else:
            for token in reversed(heard[pi:i]):
                if not alignment.words or alignment.words[-1] is not token.word:
                    alignment.words.append(token.word)
            alignment.places.update(dict.fromkeys(range(pi, i), j - 1))
            if said[j - 1] not in content and heard[i - 1].text != said[j - 1]:
                alignment.loose_missing[j - 1] = said[j - 1]  # a function word heard as another
        i, j = pi, pj
    return alignment


def _substitutions(
    sides: _Sides, missing: dict[int, str], extra: dict[int, _Token], gaps: dict[int, int]
) -> list[int] | None:
    """The places of the ``missing`` phrase words when all are content words and every ``extra`` token, none
    a negation or a turn, was heard in a missed word's place; else None."""
    # Heard in a missed word's place: just before it (gap k) or just after (gap k + 1), at most two for one.
    # The first missed word in ``missing``'s order that fits takes the token.
    in_place = [next((k for k in missing if gaps.get(t) in (k, k + 1)), None) for t in extra]  # no gap: a swap
    return (
        sorted(missing)
        if all(word in sides.content for word in missing.values())
        and not any(sides.never[t] for t in extra)
        and None not in in_place
        and all(in_place.count(k) <= 2 for k in missing)
        else None
    )


def _miss(word: str) -> float:
    return _LOOSE if word in FUNCTION_WORDS else _CONTENT


def _match_cost(heard: str, said: str, names: set[str], language: str) -> float | None:
    """What it costs to take ``heard`` (one token, or two joined by a space) for phrase word ``said``; None
    when it cannot stand for it."""
    if heard == said:
        return 0.0
    if said in FUNCTION_WORDS:  # one small word for another: a loose word
        return _LOOSE if heard in FUNCTION_WORDS else None
    if heard in FUNCTION_WORDS:
        return None
    closeness = _closeness(heard, said, names, language)
    return _SOUND_ALIKE if closeness >= (1.0 if said in names else SOUND_ALIKE) else None


def _closeness(heard: str, said: str, names: set[str], language: str) -> float:
    """How like content word ``said`` ``heard`` sounds, 0-1: for a name 1 or 0 (the same key or not), for
    another word :func:`_likeness`."""
    a, b = _sounds(heard, language), _sounds(said, language)
    if said in names:
        return float(_name_key(a) == _name_key(b))
    return _likeness(a, b)


# -- sounds
_STRESS_AND_BREAKS = re.compile(r"[ˈˌ\s\-.,;:!?'\"()]")
_VOWELS = set("aeiouyæɐɑɒɔəɘɚɛɜɞɨɪʉʊʌʏᵻøœɤɯ")
_JOINED = {"aɪ", "aʊ", "eɪ", "oʊ", "ɔɪ", "tʃ", "dʒ"}  # one sound in two letters
# Consonants a recognizer or an accent trades for each other: voicing pairs, the liquids, the flap.
_CONSONANT_CLASS = str.maketrans(
    {"b": "p", "d": "t", "ɾ": "t", "ɡ": "k", "g": "k", "v": "f", "ð": "θ", "z": "s", "ʒ": "ʃ", "ɹ": "l", "ŋ": "n"}
)
_VOWEL_CLASS = {
    **dict.fromkeys("ieɛæaɪᵻy", "front"),
    **dict.fromkeys("əʌɐɜɚɘ", "mid"),
    **dict.fromkeys("uʊoɔɑɒ", "back"),
}


@functools.lru_cache(maxsize=4096)
def _sounds(text: str, language: str) -> tuple[str, ...]:
    """espeak-ng's phonemes of ``text``, one string per sound, stress and length left out (``"chorus"``:
    k ɔ ɹ ə s), voicing pairs and liquids as one class."""
    ipa = _STRESS_AND_BREAKS.sub("", phonemize([text], language)[0]).replace("ː", "")
    sounds: list[str] = []
    for char in ipa:
        if sounds and sounds[-1] + char in _JOINED:
            sounds[-1] += char
        else:
            sounds.append(char)
    return tuple(s if s[0] in _VOWELS else s.translate(_CONSONANT_CLASS) for s in sounds)


def _name_key(sounds: tuple[str, ...]) -> tuple[str, ...]:
    """A name as heard: its consonants by class, a cluster of one class as one (the "l" of "chloros"), and the
    class of its first vowel. "Chorus", "Korus", "call us" and "chloros" share one; "Boris" and "Horace" not."""
    consonants = [s for s in sounds if s[0] not in _VOWELS]
    key = [c for index, c in enumerate(consonants) if index == 0 or c != consonants[index - 1]]
    first_vowel = next((_VOWEL_CLASS.get(s[0], s[0]) for s in sounds if s[0] in _VOWELS), "")
    return (*key, first_vowel)


def _likeness(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Twice the sounds ``a`` and ``b`` share in order (their longest common subsequence) over their lengths."""
    if not a or not b:
        return 0.0
    row = [0] * (len(b) + 1)
    for x in a:
        previous_diagonal = 0
        for k, y in enumerate(b, 1):
            previous_diagonal, row[k] = row[k], previous_diagonal + 1 if x == y else max(row[k], row[k - 1])
    return 2 * row[-1] / (len(a) + len(b))


def _quoted(words) -> str:
    return ", ".join(repr(w) for w in words)
