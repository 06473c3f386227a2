"""The checks of OpenAI-style custom voices against what an attacker and an owner really send.

Issue 37's targets, on the figures' split: impostors accepted <= 1 % under every condition (shared
channels included), laundering 0 %, wrong phrases 0 %; owners accepted >= 99 % clean, >= 97 % at 20 dB,
phone line, quiet mic, room and with a mismatched channel, >= 90 % at 10 dB; Chorus's encoder's EER on
natural-sounding trials <= resemblyzer's.

Speakers (none heard by anything that learned: the held-out voices and sox chains of them):

* **figures**: piper-joe, flite-slt, festival-ked and each through ``FIGURE_CHAINS`` (12 speakers);
* **calibration**: each source voice through ``CALIBRATION_CHAINS`` only (12 other speakers), with sample
  windows from the other half of each dataset. Thresholds are set here and only here.

A speaker's *consent* is its engine reading the phrase (the corpus's recording path, then its chain); its
*samples* are ``--windows`` stretches of 10-14 s of its dataset's recordings (through its chain). Each
``CONDITIONS`` entry is a channel; trials are **shared** (consent and sample both through it: for an
impostor, the shared-line attack) and **mismatched** (a clean consent, a sample through it). Owners:
consent and sample of one speaker; impostors: every other speaker's sample, split into *other voice* and
*sox sibling* (the same source voice under another chain: a near neighbour).

Every trial runs the server's own checks: the phrase check (:class:`CustomVoiceChecks.heard`, Whisper
tiny.en) on the consent, then :class:`chorus.speaker_recognition.voice_match.VoiceMatch` (its channel classes, its
windows, its cohort, :meth:`VoiceMatch.verdict`) with each encoder, and the server's check itself:
:class:`~chorus.speaker_recognition.voice_match.FusedMatch` over the two (``fused``, calibrated here; ``server``, the
same scores judged by the shipped thresholds); each recording is embedded once per band and reused across
its trials, which is all that differs from a request.

Also: laundering (the phrase, then 12 s of the victim's speech reversed, at 0 and -14 dB, or in the
middle), spliced samples (half the owner, half someone else), and ``WRONG`` phrases written after the
phrase check was changed.

    python bench/consent.py --threads 1     # writes consent.md / .json / .png under --out

The calibrated settings go into the shipped cohort with ``scripts/ship_speaker_cohort.py --settings``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from chorus.audio import augment
from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.corpus.build import record_sentences
from chorus.corpus.speakers import get_speaker
from chorus.data.formats import discover
from chorus.evaluation.asr import WhisperJudge
from chorus.serving.errors import ApiError
from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
from chorus.serving.settings import ConsentSettings
from chorus.speaker_recognition.bundle import load_encoder
from chorus.speaker_recognition.embedders import ChorusEmbedder, ResemblyzerEmbedder
from chorus.speaker_recognition.verification import verification_scores
from chorus.speaker_recognition.voice_match import (
    SHIPPED_COHORT,
    FusedMatch,
    MatchSettings,
    MatchVerdict,
    UnusableRecording,
    VoiceMatch,
    fused_consent_match,
    group_keys,
    load_cohort,
)
from run_record import LoadSampler, provenance

SOURCES = ("piper-joe", "flite-slt", "festival-ked")
SHORT = {"piper-joe": "joe", "flite-slt": "slt", "festival-ked": "ked"}
NATURAL = "joe"  # the natural-sounding source (Piper's VITS voice)
FIGURE_CHAINS = {
    "": (),
    "+300c": ("pitch", "300"),
    "-300c": ("pitch", "-300"),
    "spd115": ("speed", "1.15", "tempo", "0.87"),
}
CALIBRATION_CHAINS = {
    "+220c": ("pitch", "220"),
    "-220c": ("pitch", "-220"),
    "spd108": ("speed", "1.08", "tempo", "0.93"),
    "spd092": ("speed", "0.92", "tempo", "1.09"),
}
CONDITIONS = (
    "clean", "white 20 dB", "babble 20 dB", "room noise 20 dB", "white 10 dB", "babble 10 dB", "room noise 10 dB",
    "phone line", "8 kHz", "quiet mic", "room", "mp3", "opus", "amr", "faster speech",
)  # fmt: skip
# Owner targets per condition (mismatched trials: 97 % everywhere but 10 dB, 90 % there; shared trials
# of a condition the issue names none for: reported without a verdict).
OWNER_TARGET = {"clean": 0.99, "white 20 dB": 0.97, "babble 20 dB": 0.97, "room noise 20 dB": 0.97,
                "white 10 dB": 0.90, "babble 10 dB": 0.90, "room noise 10 dB": 0.90, "phone line": 0.97,
                "quiet mic": 0.97, "room": 0.97}  # fmt: skip
IMPOSTOR_TARGET = 0.01
WRONG_CONDITIONS = ("clean", "white 20 dB", "phone line", "amr")
WRONG = {
    "withhold": "I am the owner of this voice and I withhold consent to Chorus using this voice to create a synthetic voice model.",
    "revoke": "I am the owner of this voice and I revoke my consent to Chorus using this voice to create a synthetic voice model.",
    "refuse": "I am the owner of this voice and I refuse to let Chorus use this voice to create a synthetic voice model.",
    "another company": "I am the owner of this voice and I consent to Boris using this voice to create a synthetic voice model.",
    "a company named like it": "I am the owner of this voice and I consent to Coral using this voice to create a synthetic voice model.",
    "a company rhyming with it": "I am the owner of this voice and I consent to Horace using this voice to create a synthetic voice model.",
    "another purpose": "I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model for fraud.",
    "turned around": "They asked me to say I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model, but I do not.",
    "not true": "It is not true that I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.",
    # Written with the rule that the claim is the speaker's own (another person's pronoun, a question).
    "said to a listener": "You are the owner of this voice and you consent to Chorus using this voice to create a synthetic voice model.",
    "asked of a listener": "Are you the owner of this voice, and do you consent to Chorus using this voice to create a synthetic voice model?",
    "another one's voice": "I am the owner of this voice and I consent to Chorus using your voice to create a synthetic voice model.",
}  # fmt: skip


def babble_talkers() -> list[np.ndarray]:
    """Four training-corpus voices reading two sentences each: the crowd of babble noise."""
    texts = ["The station was crowded with people waiting for the late train.", "Please pass the salt and pepper."]
    return [
        np.concatenate(record_sentences(name, texts))
        for name in ("flite-rms", "espeak-us-f2", "flite-awb", "espeak-us-m4")
    ]


def through(condition: str, audio: np.ndarray, rng: np.random.Generator, talkers: list[np.ndarray]) -> np.ndarray:
    """``audio`` (at SAMPLE_RATE) through ``condition``'s channel."""
    rate = SAMPLE_RATE
    if condition == "clean":
        return audio
    if condition.endswith(" dB"):
        kind, snr = condition.rsplit(" ", 2)[0], float(condition.split()[-2])
        if kind == "babble":
            return augment.add_babble(audio, talkers, snr, rng)
        return augment.add_noise(audio, snr, rng, color="room" if kind == "room noise" else kind, rate=rate)
    if condition == "phone line":
        return augment.phone_line(audio, rate)
    if condition == "8 kHz":
        return augment.narrowband(audio, rate)
    if condition == "quiet mic":
        return augment.quiet_mic(audio, rate, rng)
    if condition == "room":
        return augment.reverberate(audio, 0.5, rate, rng)
    if condition in ("mp3", "opus", "amr"):
        return augment.codec_round_trip(audio, rate, condition)
    if condition == "faster speech":
        return augment.change_rate(audio, rate, 1.2)
    raise ValueError(condition)


@dataclass(frozen=True)
class Speaker:
    name: str  # joe, joe+300c ...
    source: str  # piper-joe ...
    chain: tuple[str, ...]
    split: str  # figures / calibration


def speakers() -> list[Speaker]:
    return [
        Speaker(f"{SHORT[source]}{label}", source, chain, split)
        for split, chains in (("figures", FIGURE_CHAINS), ("calibration", CALIBRATION_CHAINS))
        for source in SOURCES
        for label, chain in chains.items()
    ]


def sox(audio: np.ndarray, chain: tuple[str, ...]) -> np.ndarray:
    """``audio`` through a sox chain (as the corpus makes its virtual speakers)."""
    if not chain:
        return audio
    import tempfile

    import soundfile as sf

    from chorus.corpus.speakers import SOX_COMMAND

    with tempfile.TemporaryDirectory(prefix="chorus-consent-") as temp:
        source, target = Path(temp) / "in.wav", Path(temp) / "out.wav"
        sf.write(source, audio, SAMPLE_RATE, subtype="FLOAT")
        subprocess.run([*SOX_COMMAND, str(source), str(target), *chain], check=True, capture_output=True)
        return load_audio(target)


def sample_windows(
    source: str,
    heldout: Path,
    split: str,
    count: int,
    rng: np.random.Generator,
    seconds: tuple[float, float] = (10, 14),
) -> list[np.ndarray]:
    """``count`` disjoint stretches of consecutive recordings of ``source``, each ``seconds`` long (drawn
    uniformly): the first half of its dataset for the figures, the second half for calibration."""
    paths = [u.audio_path for u in discover(heldout / source)[0]]
    half = paths[: len(paths) // 2] if split == "figures" else paths[len(paths) // 2 :]
    block = len(half) // count
    windows = []
    for index in range(count):
        length = float(rng.uniform(*seconds))
        clips: list[np.ndarray] = []
        for path in half[index * block + int(rng.integers(0, max(1, block // 3))) : (index + 1) * block]:
            clips.append(load_audio(path))
            if sum(c.size for c in clips) >= length * SAMPLE_RATE:
                break
        windows.append(np.concatenate(clips)[: int(14 * SAMPLE_RATE)])
    return windows


PARTS = ("resemblyzer", "chorus")  # the two encoders, in the order FusedMatch sums them
FUSED, SERVER = "fused", "server"  # FusedMatch calibrated here / judged by the shipped thresholds


def recording_key(label, audio: np.ndarray) -> str:
    """A cache key for a recording: its label and a digest of its samples. Piper draws its noise unseeded, so
    two processes (the shards of a run) record different audio under one label; keyed by label alone, the
    second shard's cache took the first's channels and bands, and ``--rescore`` of the two failed."""
    return f"{label!r} {hashlib.sha1(np.ascontiguousarray(audio, dtype=np.float32).tobytes()).hexdigest()[:12]}"


class Judges:
    """The server's checks, with each encoder's windows cached per recording and band (saved with
    :meth:`save`, so ``--rescore`` can judge every trial again with another cohort or settings)."""

    def __init__(self, checks: CustomVoiceChecks, matchers: dict[str, VoiceMatch], fused: FusedMatch | None = None):
        self.checks, self.matchers, self.fused = checks, matchers, fused
        self.channels: dict = {}  # (encoder, recording key) -> (audio at its rate, Channel) or UnusableRecording
        self.windows: dict = {}  # (encoder, recording key, band) -> [windows, D]

    def phrase(self, audio: np.ndarray) -> dict:
        """The consent's phrase check: accepted, what was heard, the audio its speaker is taken from."""
        try:
            heard = self.checks.heard(audio, SAMPLE_RATE, "en")
            forced = min((p for _, p in heard.verdict.forced), default=None)
            return {"accepted": True, "heard": heard.text, "speech": heard.speech, "reason": "", "forced": forced}
        except ApiError as error:
            reason = f"{error.code}: {error.message}"
            return {"accepted": False, "heard": "", "speech": audio, "reason": reason, "forced": None}

    def trial(self, name: str, consent_key, consent: np.ndarray, sample_key, sample: np.ndarray) -> dict:
        """Encoder ``name``'s verdict on a consent and a sample, each embedded once per band."""
        consent_key, sample_key = recording_key(consent_key, consent), recording_key(sample_key, sample)
        matcher = self.matchers[name]
        try:
            (ca, a), (sb, b) = self._channel(name, consent_key, consent), self._channel(name, sample_key, sample)
            band = matcher.band(a, b)
            self._window(name, consent_key, ca, band)
            self._window(name, sample_key, sb, band)
        except UnusableRecording as error:
            return {
                "accepted": False,
                "score": float("nan"),
                "unusable": str(error)[:200],
                "keys": [consent_key, sample_key],
            }
        return {**self.judge(name, consent_key, sample_key), "keys": [consent_key, sample_key]}

    def judge_all(self, consent_key, consent: np.ndarray, sample_key, sample: np.ndarray) -> dict:
        """Each encoder's verdict and the fused one, keyed by name."""
        row = {name: self.trial(name, consent_key, consent, sample_key, sample) for name in self.matchers}
        row[FUSED] = self.fused_trial(row)
        return row

    def fused_trial(self, row: dict) -> dict:
        """The server's fused verdict from the two parts' cached verdicts (unusable if either part was)."""
        parts = [row[name] for name in PARTS]
        if not all(np.isfinite(part["score"]) for part in parts):
            return next(part for part in parts if not np.isfinite(part["score"]))
        verdicts = (self.verdict(name, *part["keys"]) for name, part in zip(PARTS, parts, strict=True))
        return {**self.as_row(self.fused.combine(*verdicts)), "keys": parts[1]["keys"]}

    def verdict(self, name: str, consent_key: str, sample_key: str) -> MatchVerdict:
        """Encoder ``name``'s verdict from the cached channels and windows of two recordings."""
        matcher = self.matchers[name]
        (_, a), (_, b) = self.channels[(name, consent_key)], self.channels[(name, sample_key)]
        band = matcher.band(a, b)
        return matcher.verdict(
            self.windows[(name, consent_key, band)], a, self.windows[(name, sample_key, band)], b, band
        )

    def judge(self, name: str, consent_key: str, sample_key: str) -> dict:
        return self.as_row(self.verdict(name, consent_key, sample_key))

    @staticmethod
    def as_row(verdict: MatchVerdict) -> dict:
        return {
            "accepted": verdict.accepted,
            "score": verdict.score,
            "raw": verdict.raw,
            "worst_window": verdict.worst_window,
            "worst_stretch": verdict.worst_stretch,
            "threshold_key": verdict.threshold_key,
        }

    def rescore(self, rows: list[dict]) -> None:
        """Every trial's scores again, from the cache, with the matchers' cohort and settings."""
        for row in rows:
            for name in self.matchers:
                if np.isfinite(row[name]["score"]):
                    row[name] = {**self.judge(name, *row[name]["keys"]), "keys": row[name]["keys"]}
            row[FUSED] = self.fused_trial(row)

    def save(self, path: Path) -> None:
        import pickle

        channels = {k: (None, v[1]) if isinstance(v, tuple) else v for k, v in self.channels.items()}
        path.write_bytes(pickle.dumps({"channels": channels, "windows": self.windows}))

    def load(self, path: Path) -> None:
        import io
        import pickle

        class Renamed(pickle.Unpickler):
            """Caches written before ``chorus.speaker`` became ``chorus.speaker_recognition`` still load."""

            def find_class(self, module: str, name: str):
                if module == "chorus.speaker" or module.startswith("chorus.speaker."):
                    module = "chorus.speaker_recognition" + module[len("chorus.speaker") :]
                return super().find_class(module, name)

        cached = Renamed(io.BytesIO(path.read_bytes())).load()
        self.channels, self.windows = cached["channels"], cached["windows"]

    def _channel(self, name, key, audio):
        if (name, key) not in self.channels:
            try:
                self.channels[(name, key)] = self.matchers[name].channel(audio, SAMPLE_RATE, "recording")
            except UnusableRecording as error:
                self.channels[(name, key)] = error
        found = self.channels[(name, key)]
        if isinstance(found, UnusableRecording):
            raise found
        return found

    def _window(self, name, key, audio, band):
        if (name, key, band) not in self.windows:
            self.windows[(name, key, band)] = self.matchers[name].windows(audio, band, "recording")
        return self.windows[(name, key, band)]


def provisional(cohort, name: str) -> MatchSettings:
    """Settings before calibration: the shipped ones where the cohort has them (their thresholds are
    replaced by the calibrated ones for the figures; raw scores do not depend on them)."""
    return cohort.settings.get(name, MatchSettings())


def matchers_for(cohort, encoder: Path | None) -> Judges:
    """Both encoders' speaker checks on ``cohort`` and their fusion (without a phrase check yet): by default
    the server's own (:func:`fused_consent_match`: resemblyzer and the consent encoder v3, its cohort
    embeddings ``chorus-v3``); with ``encoder``, that Chorus encoder in v3's place, whose embeddings the
    cohort holds as ``chorus``."""
    if encoder is None:
        fused = fused_consent_match(cohort)
        return Judges(None, dict(zip(PARTS, fused.parts, strict=True)), fused)  # type: ignore[arg-type]
    embedders = {"resemblyzer": ResemblyzerEmbedder(), "chorus": ChorusEmbedder(load_encoder(encoder))}
    matchers = {name: VoiceMatch(e, cohort, provisional(cohort, e.name)) for name, e in embedders.items()}
    return Judges(None, matchers, FusedMatch(*matchers.values(), provisional(cohort, FUSED)))  # type: ignore[arg-type]


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    cohort = load_cohort(args.cohort)
    judges = matchers_for(cohort, args.encoder)
    # The server's Whisper, on the benchmark's thread budget.
    whisper = WhisperJudge(beam_size=5, cpu_threads=args.threads)
    # The forced listen at probability 0: every consent it would settle passes here with its probability kept
    # ("forced"), and calibrate_forced() sets the bound on the calibration split's wrong readings.
    judges.checks = checks = CustomVoiceChecks(
        None,  # type: ignore[arg-type]
        ConsentSettings(forced_probability=0.0),
        transcriber=whisper.transcribe_words,
        forced_listener=whisper.word_probabilities,
    )
    matchers = judges.matchers
    phrase = checks.phrase("en")
    talkers = babble_talkers()
    people = speakers()
    started = time.perf_counter()

    consents = {}  # speaker name -> clean consent audio
    for person in people:
        consents[person.name] = sox(record_sentences(get_speaker(person.source), [phrase])[0], person.chain)
    samples: dict[tuple[str, int], np.ndarray] = {}
    for split in ("figures", "calibration"):
        for source in SOURCES:
            windows = sample_windows(source, args.heldout, split, args.windows, rng)
            for person in people:
                if person.split == split and person.source == source:
                    for index, window in enumerate(windows):
                        samples[(person.name, index)] = sox(window, person.chain)
    print(f"recordings made in {time.perf_counter() - started:.0f} s", flush=True)

    phrase_rows, trials = [], []
    # Every condition's mismatched trials take the clean consent; hear each once, first.
    clean = {p.name: judges.phrase(consents[p.name]) for p in people}
    for condition in args.conditions:
        heard_consents = clean if condition == "clean" else {}
        for person in people:
            if condition != "clean":
                heard_consents[person.name] = judges.phrase(through(condition, consents[person.name], rng, talkers))
            verdict = heard_consents[person.name]
            phrase_rows.append({"speaker": person.name, "split": person.split, "condition": condition,
                                "accepted": verdict["accepted"], "forced": verdict["forced"],
                                "heard": verdict["heard"], "reason": verdict["reason"]})  # fmt: skip
        conditioned = {key: through(condition, audio, rng, talkers) for key, audio in samples.items()}
        for person in people:
            for kind in ("shared", "mismatched") if condition != "clean" else ("shared",):
                chosen = heard_consents if kind == "shared" else clean
                consent_key = (condition if kind == "shared" else "clean", person.name)
                consent_audio, phrase_ok = chosen[person.name]["speech"], chosen[person.name]["accepted"]
                phrase_forced = chosen[person.name]["forced"]
                for (other, index), audio in conditioned.items():
                    owner = next(p for p in people if p.name == other)
                    if owner.split != person.split:
                        continue
                    relation = (
                        "owner"
                        if other == person.name
                        else "sox sibling"
                        if owner.source == person.source
                        else "other voice"
                    )
                    row = {"condition": condition, "kind": kind, "split": person.split, "consent": person.name,
                           "sample": other, "window": index, "relation": relation, "phrase_accepted": phrase_ok,
                           "phrase_forced": phrase_forced}  # fmt: skip
                    row |= judges.judge_all(consent_key, consent_audio, (condition, other, index), audio)
                    trials.append(row)
        print(f"{condition}: {len(trials)} trials so far, {time.perf_counter() - started:.0f} s", flush=True)
        args.partial.write_text(json.dumps({"trials": trials, "phrases": phrase_rows}, default=float))

    clean_speech = {name: heard["speech"] for name, heard in clean.items()}
    attacks = attack_trials(judges, people, consents, clean_speech, samples) if args.attacks else []
    wrong = wrong_phrases(judges, rng, talkers) if args.attacks else []
    print(f"attacks and wrong phrases done, {time.perf_counter() - started:.0f} s", flush=True)
    judges.save(args.out / "embeddings.pkl")
    return {
        "phrase": phrase,
        "cohort": {"speakers": len(cohort.speakers), "info": cohort.info},
        "encoders": {
            "chorus": matchers["chorus"].embedder.bundle.weights_sha256,
            "resemblyzer": "resemblyzer 0.1.4 (GE2E)",
        },
        "speakers": [asdict(p) for p in people],
        "windows": args.windows,
        "phrases": phrase_rows,
        "trials": trials,
        "attacks": attacks,
        "wrong": wrong,
        "seconds": round(time.perf_counter() - started, 1),
    }


def attack_trials(judges: Judges, people, consents, clean_speech, samples) -> list[dict]:
    """Laundering (the attacker's phrase, then the victim's speech reversed) and spliced samples (half the
    consent's speaker, half another), on the figures' split, each against the victim's / owner's sample.
    ``consents``: each speaker's clean consent recording; ``clean_speech``: the part of it the phrase check
    kept (what the server takes the consent's speaker from)."""
    figures = [p for p in people if p.split == "figures"]
    rows = []
    victims = [p for p in figures if not p.chain]  # each source voice as recorded
    last = max(index for _, index in samples)  # the victim's sample: another window than the reversed one
    for attacker in figures:
        for victim in victims:
            if victim.source == attacker.source:
                continue
            reversed_speech = samples[(victim.name, 0)][::-1][: 12 * SAMPLE_RATE]
            consent = consents[attacker.name]
            gap = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
            for how, audio in (
                ("appended", np.concatenate([consent, gap, reversed_speech])),
                ("appended -14 dB", np.concatenate([consent, gap, reversed_speech * 10 ** (-14 / 20)])),
                ("in the middle", np.concatenate([consent[: consent.size // 2], gap, reversed_speech, gap, consent[consent.size // 2 :]])),
            ):  # fmt: skip
                verdict = judges.phrase(audio)
                row = {"attack": f"laundering, {how}", "attacker": attacker.name, "victim": victim.name,
                       "phrase_accepted": verdict["accepted"], "phrase_forced": verdict["forced"],
                       "reason": verdict["reason"]}  # fmt: skip
                row |= judges.judge_all(("launder", how, attacker.name, victim.name), verdict["speech"],
                                        ("figures-clean", victim.name, last), samples[(victim.name, last)])  # fmt: skip
                rows.append(row)
    for owner in figures:
        for other in victims:
            if other.source == owner.source:
                continue
            own, theirs = samples[(owner.name, 0)], samples[(other.name, last)]
            spliced = np.concatenate([own[: own.size // 2], theirs[: theirs.size // 2]])
            row = {"attack": "spliced sample", "attacker": owner.name, "victim": other.name, "phrase_accepted": True}
            row |= judges.judge_all(
                ("clean", owner.name), clean_speech[owner.name], ("spliced", owner.name, other.name), spliced
            )
            rows.append(row)
    return rows


def wrong_phrases(judges: Judges, rng, talkers) -> list[dict]:
    """Each ``WRONG`` phrase read by each source voice, clean, at 20 dB white noise, through a phone line and an
    AMR-like codec: all must be refused (the figures); and read through each calibration chain, which sets the
    forced listen's bound. (Clean and 20 dB alone set 0.0082, which "Boris" through the codec passed:
    bench/consent_forced_probe.py.)"""
    rows = []
    for source in SOURCES:
        for kind, text in WRONG.items():
            audio = record_sentences(get_speaker(source), [text])[0]
            readers = {
                "figures": {"": audio},
                "calibration": {c: sox(audio, chain) for c, chain in CALIBRATION_CHAINS.items()},
            }
            for split, chains in readers.items():
                for chain, reading in chains.items():
                    for condition in WRONG_CONDITIONS:
                        verdict = judges.phrase(through(condition, reading, rng, talkers))
                        rows.append({"speaker": SHORT[source] + chain, "split": split, "kind": kind,
                                     "condition": condition, "accepted": verdict["accepted"],
                                     "forced": verdict["forced"], "reason": verdict["reason"]})  # fmt: skip
    return rows


# -- calibration and summary ------------------------------------------------------------------------
def rate(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else float("nan")


# A threshold class needs this many calibration strangers for a threshold of its own (else its groups'):
# the highest of n strangers lies above their 99th percentile (the target: <= 1 % accepted) with probability
# 1 - 0.99^n, 95 % at 300. (The first run took 100: one class of 186 strangers, clean consents and middling
# samples, then let 3.4 % of the figures' strangers in, 4.7 % of one condition's.)
MIN_CLASS_IMPOSTORS = 300


def lowest_safe(scores_by_condition: dict[str, list[float]]) -> float:
    """The lowest score at which no condition's strangers are accepted above 0.5 %."""
    threshold = -np.inf
    for scores in scores_by_condition.values():
        ranked = np.sort(scores)
        if ranked.size:
            allowed = int(np.floor(0.005 * ranked.size))
            threshold = max(threshold, float(ranked[ranked.size - 1 - allowed]) + 1e-4)
    return threshold


def calibrate(trials: list[dict], name: str, base: MatchSettings) -> MatchSettings:
    """Thresholds from the calibration split: the score threshold of each threshold class (``VoiceMatch``'s
    band x SNR groups) and of each group of classes (``group_keys``: one band, one SNR pair) with
    ``MIN_CLASS_IMPOSTORS`` strangers or more is the lowest at which no condition's other voices in it (shared
    and mismatched) are accepted above 0.5 %; a class without its own takes its SNR pair's or its band's,
    whichever is stricter (``MatchSettings.threshold_for``), and its few strangers' own where that is
    stricter still; ``threshold`` is that over all calibration strangers together (pooled), which a class
    whose SNR pair has none takes unless another threshold is stricter. The one-speaker threshold lets 99.5 % of the
    owners' single-speaker samples through.

    Sox siblings are left out: a sibling of a voice the cohort has nothing near (flite-slt) scores far above
    every other trial once normalized (the cohort's spread around it is small), up to the owner's own
    score, so no threshold that refuses them accepts owners; they are reported apart as near neighbours."""
    cal = [t for t in trials if t["split"] == "calibration" and np.isfinite(t[name]["score"])]
    impostors = [t for t in cal if t["relation"] == "other voice"]
    by_class: dict[str, dict[str, list[float]]] = {}
    for t in impostors:  # each stranger counts in its class and in both of the class's groups
        for key in (t[name]["threshold_key"], *group_keys(t[name]["threshold_key"])):
            by_class.setdefault(key, {}).setdefault(t["condition"], []).append(t[name]["score"])
    threshold = round(
        lowest_safe(
            {
                c: [t[name]["score"] for t in impostors if t["condition"] == c]
                for c in {t["condition"] for t in impostors}
            }
        ),
        4,
    )
    thresholds = {
        key: round(lowest_safe(conditions), 4)
        for key, conditions in sorted(by_class.items())
        if sum(map(len, conditions.values())) >= MIN_CLASS_IMPOSTORS
    }
    # A class with too few strangers for its own still refuses those it has: where they reach over what its
    # groups give it, they set its threshold (a group's bigger classes must not hide a harder small one).
    grouped = replace(base, threshold=threshold, thresholds=dict(thresholds))  # before any class's own floor
    for key, conditions in by_class.items():
        if key not in thresholds and "*" not in key:
            own = round(lowest_safe(conditions), 4)
            if own > grouped.threshold_for(key):
                thresholds[key] = own
    owners = np.sort(
        [t[name]["worst_window"] for t in cal if t["relation"] == "owner" and np.isfinite(t[name]["worst_window"])]
    )
    window = float(owners[int(np.floor(0.005 * owners.size))]) - 1e-4 if owners.size else base.window_threshold
    # The stretch margin lets 99.5 % of the owners that pass the score threshold through: how far their
    # worst third falls under their class's threshold.
    chosen = replace(base, threshold=threshold, thresholds=thresholds)
    shortfalls = np.sort([
        chosen.threshold_for(t[name]["threshold_key"]) - t[name]["worst_stretch"]
        for t in cal
        if t["relation"] == "owner" and t[name]["score"] >= chosen.threshold_for(t[name]["threshold_key"])
    ])  # fmt: skip
    margin = (
        float(shortfalls[int(np.ceil(0.995 * shortfalls.size)) - 1]) + 1e-4 if shortfalls.size else base.stretch_margin
    )
    return replace(chosen, window_threshold=round(window, 4), stretch_margin=round(max(margin, 0.0), 4))


def calibrate_forced(wrong: list[dict]) -> float:
    """The forced listen's bound: just above the highest probability it found for a missed phrase word in a
    wrong phrase of the calibration split (ConsentSettings' default where none reached a forced listen)."""
    found = [r["forced"] for r in wrong if r.get("split") == "calibration" and r.get("forced") is not None]
    return round(max(found) + 1e-4, 4) if found else ConsentSettings().forced_probability


def phrase_passes(accepted: bool, forced: float | None, least: float) -> bool:
    """A phrase verdict recorded with the forced listen at 0, judged with its bound at ``least``."""
    return bool(accepted and (forced is None or forced >= least))


def decide(
    result: dict, settings: dict[str, MatchSettings], least: float, bounds: dict[str, float] | None = None
) -> None:
    """Each verdict under the calibrated settings: the phrase check's with the forced listen's bound ``least``
    (``ok`` on phrase and wrong-phrase rows), and each trial's and attack's with its speaker check and the
    phrase check at ``least``, or at ``bounds[name]`` for a check judged with another (the server's, as it
    ships)."""
    bounds = bounds or {}
    for row in [*result["phrases"], *result["wrong"]]:
        row["ok"] = phrase_passes(row["accepted"], row.get("forced"), least)
    for row in [*result["trials"], *result["attacks"]]:
        for name, chosen in settings.items():
            phrase_ok = phrase_passes(row["phrase_accepted"], row.get("phrase_forced"), bounds.get(name, least))
            trial = row[name]
            speaker_ok = (
                np.isfinite(trial["score"]) and trial["score"] >= chosen.threshold_for(trial.get("threshold_key", ""))
                and trial.get("worst_window", np.inf) >= chosen.window_threshold
                and trial.get("worst_stretch", np.inf) >= chosen.threshold_for(trial.get("threshold_key", "")) - chosen.stretch_margin
            )  # fmt: skip
            trial["accepted"] = bool(speaker_ok and phrase_ok)


def eer_of(trials: list[dict], name: str, field: str = "score") -> float:
    rows = [t for t in trials if np.isfinite(t[name].get(field, np.nan))]
    if not rows or all(t["relation"] == "owner" for t in rows) or not any(t["relation"] == "owner" for t in rows):
        return float("nan")
    return verification_scores([t[name][field] for t in rows], [t["relation"] == "owner" for t in rows]).eer


def summarize(result: dict) -> dict:
    trials = [t for t in result["trials"] if t["split"] == "figures"]
    settings = result["calibration"]["settings"]
    summary = {}
    for name in settings:
        table = {}
        for condition in dict.fromkeys(t["condition"] for t in trials):
            for kind in ("shared", "mismatched"):
                rows = [t for t in trials if t["condition"] == condition and t["kind"] == kind]
                if not rows:
                    continue
                owners = [t for t in rows if t["relation"] == "owner"]
                table[f"{condition} / {kind}"] = {
                    "owners": rate(t[name]["accepted"] for t in owners),
                    "owners_n": len(owners),
                    **{
                        relation: rate(t[name]["accepted"] for t in rows if t["relation"] == relation)
                        for relation in ("other voice", "sox sibling")
                    },
                    **{
                        f"{relation}_n": sum(t["relation"] == relation for t in rows)
                        for relation in ("other voice", "sox sibling")
                    },
                    "impostors_n": len(rows) - len(owners),
                }
        natural = [t for t in trials if t["consent"].startswith(NATURAL) and t["sample"].startswith(NATURAL)]
        natural_vs_all = [t for t in trials if t["consent"].startswith(NATURAL)]
        summary[name] = {
            "table": table,
            "eer": eer_of(trials, name),
            "eer_raw": eer_of(trials, name, "raw"),
            "eer_natural": eer_of(natural_vs_all, name),
            "eer_natural_raw": eer_of(natural_vs_all, name, "raw"),
            "eer_natural_siblings": eer_of(natural, name),
            "laundering": rate(a[name]["accepted"] for a in result["attacks"] if a["attack"].startswith("laundering")),
            "laundering_n": sum(a["attack"].startswith("laundering") for a in result["attacks"]),
            "spliced": rate(a[name]["accepted"] for a in result["attacks"] if a["attack"] == "spliced sample"),
            "spliced_n": sum(a["attack"] == "spliced sample" for a in result["attacks"]),
        }
    wrong = [r for r in result["wrong"] if r.get("split", "figures") == "figures"]
    summary["wrong_accepted"] = rate(r["ok"] for r in wrong)
    summary["wrong_n"] = len(wrong)
    summary["right_phrase"] = {
        c: rate(r["ok"] for r in result["phrases"] if r["condition"] == c and r["split"] == "figures")
        for c in dict.fromkeys(r["condition"] for r in result["phrases"])
    }
    return summary


def verdict_of(value: float, target: float, at_most: bool) -> str:
    if not np.isfinite(value):
        return "n/a"
    return "met" if (value <= target if at_most else value >= target) else "**not met**"


def markdown(result: dict, summary: dict) -> str:
    provenance = result["provenance"]
    figures_phrases = [r for r in result["phrases"] if r["split"] == "figures"]
    lines = [
        "# Custom voices: the consent checks against owners and attackers",
        "",
        (f"{len(provenance['runs'])} runs of `bench/consent.py` over disjoint conditions, side by side, merged "
         "(bench/README gives the commands), " if "runs" in provenance else "")
        + f"`python bench/consent.py --threads {provenance['threads']}` at commit `{provenance['commit'][:10]}` "
        f"(src/ {'clean' if provenance['src_clean'] else 'with uncommitted changes to ' + ', '.join(provenance['src_modified'])}), load average sampled during the run "
        f"{provenance['load']}, {result['seconds'] / 60:.0f} min"
        + (f"; speaker scores rescored from its cached embeddings at commit `{provenance['rescored']['commit'][:10]}` "
           f"(src/ {'clean' if provenance['rescored']['src_clean'] else 'modified'}), with the cohort of that commit" if "rescored" in provenance else "")
        + (f"; calibrated and judged again by `--report` at commit `{provenance['reported']['commit'][:10]}` (src/ "
           f"{'clean' if provenance['reported']['src_clean'] else 'modified'}: its shipped thresholds judge the server row)" if "reported" in provenance else "")
        + f". Phrase: {result['phrase']!r}. Cohort: "
        f"{result['cohort']['speakers']} speakers (the base's training voices and Piper joe chains; no held-out "
        "voice). Thresholds calibrated on the calibration split (other sox chains of the held-out voices, the "
        "other half of each dataset); every figure below is the figures' split.",
        "",
        "Calibrated settings: "
        + "; ".join(f"{n}: score >= {s['threshold']:.3f} (pooled; a class with neither a threshold of its own nor one for its SNR pair takes "
                    f"the strictest of all; {len(s.get('thresholds', {}))} classes and groups with their own, {min(s.get('thresholds', {}).values(), default=float('nan')):.2f} to "
                    f"{max(s.get('thresholds', {}).values(), default=float('nan')):.2f}), every window >= {s['window_threshold']:.3f}, each third >= its class's threshold - {s.get('stretch_margin', float('nan')):.3f}"
                    for n, s in result["calibration"]["settings"].items())
        + f"; the forced listen: each settled word's probability >= {result['calibration'].get('forced_probability', float('nan')):.4f}"
        + (f" (the server: its shipped {ConsentSettings().forced_probability:.4f}, with its shipped speaker thresholds)." if SERVER in result["calibration"]["settings"] else "."),
        "",
        "Per-class speaker thresholds (band, consent SNR / sample SNR; `*` a group of classes, whose members without a "
        "threshold of their own take their SNR pair's, or their band's where higher): "
        + "; ".join(f"**{n}** " + ", ".join(f"{k} {v:.2f}" for k, v in s.get("thresholds", {}).items())
                    for n, s in result["calibration"]["settings"].items()),
        "",
    ]  # fmt: skip
    for name in result["calibration"]["settings"]:
        s = summary[name]
        lines += [
            f"## {name}",
            "",
            "| condition / trials | owners accepted (n) | target | other voices accepted (n) | <= 1 % | sox siblings accepted (n) | <= 1 % |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, row in s["table"].items():
            condition, kind = key.split(" / ")
            target = OWNER_TARGET.get(condition) if kind == "shared" else (0.90 if "10 dB" in condition else 0.97)
            owner_verdict = verdict_of(row["owners"], target, False) if target else "reported"
            others, siblings = row.get("other voice_n"), row.get("sox sibling_n")
            lines.append(
                f"| {key} | {100 * row['owners']:.1f} % ({row['owners_n']}) | {f'>= {100 * target:.0f} %: ' + owner_verdict if target else owner_verdict} | "
                f"{100 * row['other voice']:.2f} %{f' ({others})' if others else ''} | {verdict_of(row['other voice'], IMPOSTOR_TARGET, True)} | "
                f"{100 * row['sox sibling']:.1f} %{f' ({siblings})' if siblings else ''} | {verdict_of(row['sox sibling'], IMPOSTOR_TARGET, True)} |"
            )  # fmt: skip
        lines += [
            "",
            f"Laundering accepted: {100 * s['laundering']:.1f} % of {s['laundering_n']} (target 0 %: "
            f"{verdict_of(s['laundering'], 0.0, True)}). Spliced samples (half the owner, half another voice) "
            f"accepted: {100 * s['spliced']:.1f} % of {s['spliced_n']}.",
            "",
            f"EER of every figures trial: {100 * s['eer']:.1f} % s-normalized, {100 * s['eer_raw']:.1f} % raw cosine. "
            f"Natural-sounding consents (joe and its chains) against every sample: {100 * s['eer_natural']:.1f} % "
            f"s-normalized ({100 * s['eer_natural_raw']:.1f} % raw); joe chains among themselves: "
            f"{100 * s['eer_natural_siblings']:.1f} %.",
            "",
        ]
    chorus, resemblyzer = summary.get("chorus"), summary.get("resemblyzer")
    if chorus and resemblyzer:
        lines += [
            f"EER on natural-sounding trials, Chorus's encoder <= resemblyzer's: {100 * chorus['eer_natural']:.1f} % vs "
            f"{100 * resemblyzer['eer_natural']:.1f} %: {verdict_of(chorus['eer_natural'], resemblyzer['eer_natural'], True)}.",
            "",
        ]
    lines += [
        "## Phrase check",
        "",
        f"Wrong phrases ({', '.join(WRONG)}; each source voice, {', '.join(dict.fromkeys(r['condition'] for r in result['wrong']))}) accepted: "
        f"{100 * summary['wrong_accepted']:.1f} % of {summary['wrong_n']} (target 0 %: {verdict_of(summary['wrong_accepted'], 0.0, True)}).",
        "",
        f"The right phrase accepted, per condition (figures' speakers, n = 12 each; the forced listen at this run's "
        f"bound, {result['calibration']['forced_probability']:.4f}): "
        + ", ".join(f"{c} {100 * v:.0f} %" for c, v in summary["right_phrase"].items())
        + ". In all, "
        + "; ".join(
            f"{sum(phrase_passes(r['accepted'], r.get('forced'), bound) for r in figures_phrases)} of "
            f"{len(figures_phrases)} at {label}"
            for label, bound in (
                ("this bound", result["calibration"]["forced_probability"]),
                (f"the server's, {ConsentSettings().forced_probability:.4f}", ConsentSettings().forced_probability),
            )
        )
        + ".",
        "",
        "Refusals of the right phrase:",
        "",
    ]
    refusals = [r for r in result["phrases"] if r["split"] == "figures" and not r["ok"]]
    lines += [
        f"* {r['speaker']}, {r['condition']}: "
        + (r["reason"][:200] or f"the forced listen found a missed word at {r['forced']:.4f}, under the bound")
        for r in refusals
    ] or ["* none"]
    forced = [r for r in result["phrases"] if r["split"] == "figures" and r["ok"] and r.get("forced") is not None]
    lines += ["", f"Right phrases settled by the forced listen: {len(forced)} of "
              f"{sum(r['split'] == 'figures' for r in result['phrases'])}."]  # fmt: skip
    lines += ["", "Wrong phrases accepted:", ""]
    lines += [
        f"* {r['speaker']} {r['kind']} ({r['condition']})"
        for r in result["wrong"]
        if r["ok"] and r.get("split", "figures") == "figures"
    ] or ["* none"]
    lines += ["", "![scores](consent.png)", ""]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in result["calibration"]["settings"] if name != SERVER]  # SERVER's scores are FUSED's
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.5), squeeze=False)
    trials = [t for t in result["trials"] if t["split"] == "figures"]
    for ax, name in zip(axes[0], names, strict=True):
        bins = np.linspace(-6, 12, 73)
        for relation, color in (("owner", "tab:green"), ("sox sibling", "tab:orange"), ("other voice", "tab:blue")):
            scores = [t[name]["score"] for t in trials if t["relation"] == relation and np.isfinite(t[name]["score"])]
            ax.hist(
                np.clip(scores, -6, 12),
                bins=bins,
                alpha=0.6,
                color=color,
                density=True,
                label=f"{relation} ({len(scores)})",
            )
        ax.axvline(
            result["calibration"]["settings"][name]["threshold"],
            color="k",
            linestyle="--",
            label="calibrated threshold",
        )
        ax.set(xlabel="s-normalized score (every condition, shared and mismatched)", ylabel="density", title=name)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(parts: list[dict]) -> dict:
    """One result from runs over disjoint conditions (run side by side: the same code, speakers and seed)."""
    result = dict(parts[0])
    for key in ("phrases", "trials", "attacks", "wrong"):
        result[key] = [row for part in parts for row in part[key]]
    result["seconds"] = max(part["seconds"] for part in parts)
    result["provenance"] = {**parts[0]["provenance"], "runs": [part["provenance"] for part in parts]}
    return result


# What the figures time: the checks as the server runs them.
TIMED_PATH = "CustomVoiceChecks.heard (phrase) + VoiceMatch.verdict (speaker), as the server"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--cohort", type=Path, default=Path("src/chorus/assets/speaker_cohort"))
    parser.add_argument("--encoder", type=Path, help="Chorus speaker encoder folder (default: the shipped one)")
    parser.add_argument("--windows", type=int, default=3, help="sample windows per speaker")
    parser.add_argument("--conditions", type=lambda s: s.split(","), default=list(CONDITIONS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=Path("bench/results/consent"))
    parser.add_argument(
        "--no-attacks", dest="attacks", action="store_false", help="skip laundering, splices, wrong phrases"
    )
    parser.add_argument(
        "--report", action="store_true", help="recalibrate and rewrite md/png from --out's consent.json"
    )
    parser.add_argument(
        "--merge", type=Path, nargs="+", help="consent.json files of runs over other conditions: one report"
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        nargs="+",
        help="embeddings.pkl of the runs behind --out's consent.json: judge every trial again with --cohort",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.partial = args.out / "partial.json"
    if args.report:
        result = json.loads((args.out / "consent.json").read_text())
        result["provenance"]["reported"] = provenance(args.threads, TIMED_PATH)
    elif args.merge:
        result = merge([json.loads(path.read_text()) for path in args.merge])
    else:
        started = provenance(args.threads, TIMED_PATH)
        with LoadSampler() as load:
            result = measure(args)
        result["provenance"] = {**started, "load": load.summary()}
    cohort = load_cohort(args.cohort)
    if args.rescore:
        judges = matchers_for(cohort, args.encoder)
        for path in args.rescore:
            cached = Judges(None, {})  # type: ignore[arg-type]
            cached.load(path)
            judges.channels |= cached.channels
            judges.windows |= cached.windows
        judges.rescore([*result["trials"], *result["attacks"]])
        result["provenance"]["rescored"] = provenance(args.threads, TIMED_PATH)
    judged = [name for name in (*PARTS, FUSED) if name in result["trials"][0]]  # runs before the fusion lack it
    chosen = {name: calibrate(result["trials"], name, provisional(cohort, name)) for name in judged}
    if FUSED in judged:  # the server's check as it ships: the fused scores judged by the shipped thresholds
        for row in [*result["trials"], *result["attacks"]]:
            row[SERVER] = dict(row[FUSED])
        chosen[SERVER] = provisional(load_cohort(SHIPPED_COHORT), FUSED)
    least = calibrate_forced(result["wrong"])
    result["calibration"] = {"settings": {n: asdict(s) for n, s in chosen.items()}, "forced_probability": least}
    decide(result, chosen, least, {SERVER: ConsentSettings().forced_probability})
    result["summary"] = summary = summarize(result)
    (args.out / "consent.json").write_text(json.dumps(result, separators=(",", ":"), default=float))
    plot(result, args.out / "consent.png")
    (args.out / "consent.md").write_text(markdown(result, summary))
    args.partial.unlink(missing_ok=True)
    print(markdown(result, summary))


if __name__ == "__main__":
    main()
