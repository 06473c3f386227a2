"""Is a voice sample the consenting speaker? A check that hears the voice, not the channel.

A raw cosine of two speaker embeddings is lifted by whatever the two recordings share: two strangers
through one phone line score as one speaker (the shipped encoder: 272 of 272 impostor pairs above its
threshold, issue 37). So:

1. **One band.** Each recording's channel is estimated (:mod:`chorus.speaker_recognition.channel`); both are cut
   to the band they share, so an owner's clean consent and phone-line sample are compared as two phone
   recordings, not as two channels.
2. **Several windows.** Each recording is embedded window by window (:mod:`chorus.speaker_recognition.embedders`);
   its embedding is the windows' mean.
3. **A cohort heard the same way (adaptive s-norm).** The score is compared with what each side scores
   against a cohort of other speakers heard through the *other* side's channel: the same band, and noise
   at the other side's SNR. A trial through a phone line is judged against strangers through a phone
   line, so the channel lifts the impostor and the cohort alike.
   ``s = ((raw - mean_a) / sd_a + (raw - mean_b) / sd_b) / 2`` over the ``top`` highest cohort scores of
   each side (adaptive: the cohort speakers that most resemble it). Embedding the cohort anew for every
   trial takes 20-40 s on a CPU core, so it is embedded once per *channel class* (``BANDS`` x ``SNRS``,
   pink noise) and shipped; a trial is cut to its class's band and takes the nearest SNR's cohort.
4. **One speaker throughout.** Every window of the sample is scored against the rest of the sample the
   same way; and each third of the sample (``STRETCHES``) against the consent, which must reach the trial's
   threshold less ``stretch_margin``. The first alone let a sample of half the owner and half another
   voice through (the rest of the sample is half each window's own voice); the second refuses it, the other
   voice's stretch scoring as a stranger does.
5. **Too little voice to tell** (a band narrower than ``min_band_hz`` or an SNR under ``min_snr_db``) is
   refused as such, not guessed.

The thresholds are set on a calibration split of bench/consent.py's trials, never on its figures'
split, and stored with the cohort (``cohort.json``): one per *threshold class* (the band both were cut to,
and each side's SNR as clean, middling or noisy, :func:`threshold_key`) that the calibration filled with
enough strangers; for any other its SNR pair's (every class of that pair of SNR groups, set on their
strangers together), or its band's where that is stricter; and where its SNR pair had too few strangers (a
noisy side), the strictest threshold of all, the one set on all calibration strangers together (each
condition's hardest) included. One threshold for every channel was set by the
hardest (a crowd of voices shared by both recordings lifts strangers to 8.5 where clean pairs stay under -0.6)
and refused three owners in four on clean recordings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from chorus.audio.augment import add_babble, add_noise, mu_law, reverberate
from chorus.evaluation.similarity import mean_embedding
from chorus.speaker_recognition.bundle import CONSENT_ENCODER_NAME, SHIPPED_CONSENT_ENCODER, load_encoder
from chorus.speaker_recognition.channel import Channel, estimate_channel, limit_band
from chorus.speaker_recognition.embedders import ChorusEmbedder, ResemblyzerEmbedder, WindowEmbedder

SHIPPED_COHORT = Path(__file__).resolve().parents[1] / "assets" / "speaker_cohort"
# Channel classes, widest first: a whole band (the embedder's Nyquist), a wideband call, a narrowband
# (8 kHz) recording, a landline. A trial takes the widest class inside the band both recordings share.
BANDS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.0, 5500.0), (0.0, 3900.0), (300.0, 3400.0))
SNRS: tuple[float, ...] = (60.0, 30.0, 20.0, 15.0, 10.0, 5.0)  # 60: clean (no noise added)
# Every cohort voice is heard through several channels at once, pooled into each class: adaptive s-norm
# takes each side's highest cohort scores, so a trial is normalized by the strangers heard most like it, with
# no estimate of which channel it came through. Beside pink noise: two simulated rooms (a shared room lifted
# impostors as a shared line did), a crowd of other voices in place of the noise (a shared crowd is voices
# the encoder hears), and a 5-bit mu-law quantizer (a codec's noise follows the voice). The crowd is the
# cohort's natural-sounding Piper voices (``CROWD``), none of bench/consent.py's babble talkers.
VARIANTS: tuple[str, ...] = ("", "room 0.35 s", "room 0.8 s", "babble", "mu-law 5 bit")
STRETCHES = 3  # a sample's thirds, each scored against the consent (the one-speaker check)
CROWD = (
    4  # talkers in the babble: the last CROWD cohort clips (scripts/ship_speaker_cohort.py puts the Piper voices last)
)


class UnusableRecording(ValueError):
    """A recording whose channel leaves too little of the voice to tell who speaks (or no speech at all)."""


@dataclass(frozen=True)
class MatchSettings:
    """How a sample is matched to a consent with one encoder.

    threshold: the least s-normalized score of the same speaker where ``thresholds`` has nothing for the
    trial's class (:func:`threshold_key`); ``thresholds`` holds one per class where the calibration had enough
    strangers in it, and one per *group* of classes (:func:`group_keys`: every class of one band, every class
    of one pair of SNR groups), and a class without its own takes its SNR pair's, or its band's where that is
    higher; where its SNR pair has none, the strictest of them all and ``threshold`` (set on all strangers
    together); stretch_margin: how far under the trial's threshold each third of
    the sample may score against the consent; window_threshold: the least score of any
    one sample window against the rest of the sample; top: cohort scores per side in the adaptive
    s-norm; min_band_hz: the narrowest band (its high edge) a speaker is told from; min_snr_db: the
    noisiest recording.
    """

    threshold: float = 3.0
    window_threshold: float = 0.0
    top: int = 10
    min_band_hz: float = 2500.0
    min_snr_db: float = 3.0
    thresholds: dict[str, float] = field(default_factory=dict)  # per threshold_key and per group_keys' group
    stretch_margin: float = 2.0

    def threshold_for(self, key: str) -> float:
        if key in self.thresholds:
            return self.thresholds[key]
        # A class too rare in the calibration for a threshold of its own (a whole-band pair) took the pooled
        # one, set by the hardest condition of all: shared crowds and lines lift strangers to it where clean
        # pairs of the same band stay far under, so it refused owners the calibration never showed at risk
        # (issue 37: 9 of 9 whole-band clean owners). Now it takes its SNR pair's group, or its band's if that
        # is stricter. Noise is what lifts strangers, so a class whose SNR pair has no group (a noisy side: no
        # calibration has filled one) takes the strictest threshold set anywhere, the pooled one included: its
        # band's alone was set on cleaner strangers, and a group's can lie above the pooled one.
        band, pair = group_keys(key) or (None, None)
        if pair not in self.thresholds:
            return max([self.threshold, *self.thresholds.values()])
        return max(self.thresholds[pair], self.thresholds.get(band, -np.inf))


@dataclass(frozen=True)
class MatchVerdict:
    """The score of consent vs sample and why it was accepted or not."""

    score: float  # s-normalized
    raw: float  # the plain cosine, for the record
    accepted: bool
    band: tuple[float, float]  # the channel class both were cut to
    cohort_snr: tuple[float, float]  # the SNR classes the consent's and the sample's cohorts were heard at
    consent_channel: Channel
    sample_channel: Channel
    worst_window: float  # the lowest one-speaker score among the sample's windows
    worst_stretch: float  # the lowest score of a third of the sample against the consent
    windows: int
    reason: str = ""
    threshold_key: str = ""  # the class whose threshold judged it


def class_key(band: tuple[float, float], snr: float, variant: str = "") -> str:
    return f"{band[0]:.0f}-{band[1]:.0f}@{snr:.0f}" + (f" {variant}" if variant else "")


def band_class(low_hz: float, high_hz: float, nyquist: float) -> tuple[float, float]:
    """The widest of ``BANDS`` no wider than ``[low_hz, high_hz]``; ``(0, 0)`` stands for the whole band up
    to ``nyquist``. Slack for the estimate: 5 % at the high edge (15 % of Nyquist for the whole band), 150 Hz
    at the low one (a whole-band voice reads 60-100 Hz there, a 300 Hz high-pass 170-200 Hz). A class
    narrower than the recordings costs a little of the voice; a wider one would compare them with a
    cohort that kept what they lost, so the narrowest class takes whatever fits no other."""
    for low, high in BANDS:
        top = high or nyquist
        if low_hz <= low + 150.0 and top <= high_hz * 1.05 + (0.0 if high else 0.15 * nyquist):
            return low, high
    return BANDS[-1]


def snr_class(snr_db: float) -> float:
    return min(SNRS, key=lambda c: abs(c - snr_db))


def snr_group(snr_db: float) -> str:
    """A recording's SNR as a threshold class sees it: ``clean`` (25 dB and over), ``noisy`` (under 12.5 dB),
    else ``middling``. Coarser than the cohort's classes, so that each holds enough calibration trials."""
    return "clean" if snr_db >= 25.0 else "noisy" if snr_db < 12.5 else "middling"


def threshold_key(band: tuple[float, float], consent_snr_db: float, sample_snr_db: float) -> str:
    """The class a trial's threshold is calibrated for: the band both were cut to and each side's SNR group."""
    return f"{band[0]:.0f}-{band[1]:.0f} {snr_group(consent_snr_db)}/{snr_group(sample_snr_db)}"


def describe_class(key: str) -> str:
    """Threshold class ``key`` in words: "0-0 clean/middling" is "the whole band, a clean first recording and a
    middling second one" (SNR groups: :func:`snr_group`)."""
    band, _, snrs = key.partition(" ")
    low, _, high = band.partition("-")
    first, _, second = snrs.partition("/")
    where = "the whole band" if high == "0" else f"{low}-{high} Hz"
    return f"{where}, a {first} first recording and a {second} second one"


def group_keys(key: str) -> tuple[str, ...]:
    """The two groups of classes threshold class ``key`` belongs to: all of its band (``"0-5500 *"``), and all
    of its pair of SNR groups (``"* clean/middling"``); none for a key that is no class ("")."""
    band, _, snrs = key.partition(" ")
    return (f"{band} *", f"* {snrs}") if snrs else ()


def _resampled(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    return audio if rate == target else soxr.resample(audio, rate, target, quality="HQ").astype(np.float32)


def _cut(audio: np.ndarray, rate: int, band: tuple[float, float]) -> np.ndarray:
    return limit_band(audio, rate, band[0], band[1] or rate / 2)


def _through(
    variant: str, clip: np.ndarray, snr: float, rate: int, rng, crowd: list[np.ndarray], own: int
) -> np.ndarray:
    """A cohort ``clip`` heard through ``variant`` at ``snr`` (``own``: its index among ``crowd`` if it is
    one of them, so a voice is never its own crowd)."""
    if variant.startswith("room"):
        clip = reverberate(clip, float(variant.split()[1]), rate, rng)
    if snr < SNRS[0]:
        if variant == "babble":
            return add_babble(clip, [t for i, t in enumerate(crowd, -len(crowd)) if i != own], snr, rng)
        clip = add_noise(clip, snr, rng, color="pink")
    return mu_law(clip, bits=5) if variant == "mu-law 5 bit" else clip


@dataclass
class Cohort:
    """Other speakers' clips (``[samples]`` at ``rate``, one per speaker), each encoder's embeddings of
    them per channel class (``embeddings[encoder][class_key] -> [speakers, D]``), and each encoder's
    settings calibrated with them."""

    clips: list[np.ndarray]
    rate: int
    speakers: list[str]
    embeddings: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    settings: dict[str, MatchSettings] = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def embed_classes(self, embedder: WindowEmbedder, progress: Callable[[str], None] = lambda key: None) -> None:
        """Embed every clip in every channel class and ``VARIANTS`` (seeded) for ``embedder``; classes it
        already has are kept."""
        clips = [_resampled(c, self.rate, embedder.rate) for c in self.clips]
        table = self.embeddings.setdefault(embedder.name, {})
        for variant in VARIANTS:
            rng = np.random.default_rng(0)
            for band in BANDS:
                for snr in SNRS:
                    key = class_key(band, snr, variant)
                    if key in table or (variant == "babble" and snr >= SNRS[0]):  # a clean crowd is no crowd
                        continue
                    rows = []
                    for index, clip in enumerate(clips):
                        heard = _through(variant, clip, snr, embedder.rate, rng, clips[-CROWD:], index - len(clips))
                        rows.append(mean_embedding(embedder.windows(_cut(heard, embedder.rate, band))))
                    table[key] = np.stack(rows)
                    progress(key)

    def save(self, folder: str | Path) -> None:
        """``cohort.json``, the clips as 16-bit FLAC and ``embeddings-<encoder>.npz`` under ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        entries = []
        for index, (speaker, clip) in enumerate(zip(self.speakers, self.clips, strict=True)):
            name = f"{index:02d}-{speaker}.flac"
            sf.write(folder / name, clip, self.rate, subtype="PCM_16")
            entries.append({"speaker": speaker, "file": name})
        for encoder, table in self.embeddings.items():
            np.savez_compressed(
                folder / f"embeddings-{encoder}.npz", **{k: v.astype(np.float16) for k, v in table.items()}
            )
        config = {
            "format": "chorus-speaker-cohort",
            "clips": entries,
            "encoders": sorted(self.embeddings),
            "settings": {name: asdict(s) for name, s in self.settings.items()},
            "info": self.info,
        }
        (folder / "cohort.json").write_text(json.dumps(config, indent=2) + "\n")


def load_cohort(folder: str | Path = SHIPPED_COHORT) -> Cohort:
    """A cohort folder written by :meth:`Cohort.save`."""
    folder = Path(folder)
    config = json.loads((folder / "cohort.json").read_text())
    clips, rates = [], set()
    for entry in config["clips"]:
        audio, rate = sf.read(folder / entry["file"], dtype="float32")
        clips.append(audio if audio.ndim == 1 else audio.mean(axis=1))
        rates.add(rate)
    if len(rates) != 1:
        raise ValueError(f"{folder}: cohort clips at several rates {sorted(rates)}")
    embeddings = {}
    for encoder in config.get("encoders", []):
        with np.load(folder / f"embeddings-{encoder}.npz") as table:
            embeddings[encoder] = {k: table[k].astype(np.float32) for k in table.files}
    settings = {name: MatchSettings(**values) for name, values in config.get("settings", {}).items()}
    speakers = [e["speaker"] for e in config["clips"]]
    return Cohort(clips, rates.pop(), speakers, embeddings, settings, config.get("info", {}))


NOT_THE_VOICE = "the sample's voice does not match the consent recording's"
A_PART_DIFFERS = (
    "part of the sample does not match the rest or the consent: another voice in it, or too little speech in that "
    "part to tell (a sample of 10 s or more is judged surely)"
)


def refusal(score: float, worst_window: float, worst_stretch: float, key: str, settings: MatchSettings) -> str:
    """Why a trial with these s-normalized scores is refused under ``settings`` ("" when it is accepted):
    :data:`NOT_THE_VOICE` or :data:`A_PART_DIFFERS`."""
    threshold = settings.threshold_for(key)
    if score < threshold:
        return NOT_THE_VOICE
    if worst_window < settings.window_threshold or worst_stretch < threshold - settings.stretch_margin:
        # Each third and window is judged too: a second voice in it, or (in a clip of a few seconds) too little
        # speech in one part to tell whose it is.
        return A_PART_DIFFERS
    return ""


class VoiceMatch:
    """Matches samples to consents with one encoder and one cohort (no state changes: thread-safe)."""

    def __init__(self, embedder: WindowEmbedder, cohort: Cohort, settings: MatchSettings | None = None):
        if embedder.name not in cohort.embeddings:
            raise ValueError(
                f"the cohort has no embeddings by the {embedder.name!r} encoder "
                f"(it has {', '.join(sorted(cohort.embeddings)) or 'none'}): run scripts/ship_speaker_cohort.py"
            )
        if settings is None and embedder.name not in cohort.settings:
            raise ValueError(f"the cohort has no calibrated settings for the {embedder.name!r} encoder")
        self.embedder = embedder
        self.table = cohort.embeddings[embedder.name]
        self.settings = settings or cohort.settings[embedder.name]

    def channel(self, audio: np.ndarray, rate: int, what: str) -> tuple[np.ndarray, Channel]:
        """``audio`` at the embedder's rate and its channel; ``UnusableRecording`` naming ``what`` when the
        channel leaves too little of the voice."""
        audio = _resampled(audio, rate, self.embedder.rate)
        channel = estimate_channel(audio, self.embedder.rate)
        if channel.high_hz < self.settings.min_band_hz or channel.snr_db < self.settings.min_snr_db:
            raise UnusableRecording(
                f"the {what} leaves too little of the voice to tell who is speaking ({channel.describe()}; a "
                f"band up to at least {self.settings.min_band_hz:.0f} Hz and {self.settings.min_snr_db:g} dB "
                "SNR are needed): record it again closer to the microphone, away from noise"
            )
        return audio, channel

    def windows(self, audio: np.ndarray, band: tuple[float, float], what: str) -> np.ndarray:
        """``[windows, D]`` of ``audio`` (at the embedder's rate) cut to ``band``."""
        try:
            return self.embedder.windows(_cut(audio, self.embedder.rate, band))
        except ValueError as error:
            raise UnusableRecording(f"the {what}: {error}") from None

    def cohort(self, band: tuple[float, float], snr_db: float) -> np.ndarray:
        """``[voices x variants, D]``: the cohort heard in ``band`` at the SNR class nearest ``snr_db``, every
        variant the cohort has pooled."""
        keys = [class_key(band, snr_class(snr_db), variant) for variant in VARIANTS]
        return np.concatenate([self.table[key] for key in keys if key in self.table])

    def _norm(self, scores: np.ndarray) -> tuple[float, float]:
        """Mean and deviation of the ``top`` highest cohort scores ``[speakers]``."""
        top = np.sort(scores)[-self.settings.top :]
        return float(top.mean()), max(float(top.std()), 1e-3)

    def snorm(self, raw: float, a: np.ndarray, b: np.ndarray, cohort_a: np.ndarray, cohort_b: np.ndarray) -> float:
        """Adaptive s-norm of ``raw = a . b``: ``a`` against ``cohort_a`` ``[speakers, D]`` (strangers heard
        as ``b`` is), ``b`` against ``cohort_b``."""
        mean_a, sd_a = self._norm(cohort_a @ a)
        mean_b, sd_b = self._norm(cohort_b @ b)
        return ((raw - mean_a) / sd_a + (raw - mean_b) / sd_b) / 2

    def band(self, a: Channel, b: Channel) -> tuple[float, float]:
        """The channel class two recordings are compared in: the widest inside the band both pass."""
        return band_class(max(a.low_hz, b.low_hz), min(a.high_hz, b.high_hz), self.embedder.rate / 2)

    def match(self, consent: np.ndarray, consent_rate: int, sample: np.ndarray, sample_rate: int) -> MatchVerdict:
        """Score ``sample`` (mono ``[samples]``) against ``consent``; ``UnusableRecording`` for a recording
        whose channel leaves too little of the voice."""
        consent, a = self.channel(consent, consent_rate, "consent recording")
        sample, b = self.channel(sample, sample_rate, "sample")
        band = self.band(a, b)
        return self.verdict(
            self.windows(consent, band, "consent recording"), a, self.windows(sample, band, "sample"), b, band
        )

    def verdict(
        self, consent_windows: np.ndarray, a: Channel, sample_windows: np.ndarray, b: Channel, band: tuple[float, float]
    ) -> MatchVerdict:
        """The verdict on window embeddings ``[W, D]`` of a consent (channel ``a``) and a sample (``b``),
        both cut to ``band`` (bench/consent.py reuses embeddings across trials through this)."""
        ea, eb = mean_embedding(consent_windows), mean_embedding(sample_windows)
        heard_as_sample, heard_as_consent = self.cohort(band, b.snr_db), self.cohort(band, a.snr_db)
        raw = float(ea @ eb)
        score = self.snorm(raw, ea, eb, heard_as_sample, heard_as_consent)
        worst = self.worst_window(sample_windows, heard_as_sample)
        stretch = min(
            self.snorm(float(ea @ part), ea, part, heard_as_sample, heard_as_consent)
            for part in map(mean_embedding, np.array_split(sample_windows, min(STRETCHES, len(sample_windows))))
        )
        key = threshold_key(band, a.snr_db, b.snr_db)
        reason = refusal(score, worst, stretch, key, self.settings)
        return MatchVerdict(
            round(score, 4), round(raw, 4), not reason, band, (snr_class(a.snr_db), snr_class(b.snr_db)), a, b,
            round(worst, 4), round(stretch, 4), len(sample_windows), reason, key,
        )  # fmt: skip

    def worst_window(self, windows: np.ndarray, cohort: np.ndarray) -> float:
        """The lowest s-normalized score of a window ``[D]`` against the mean of the sample's other windows
        (``windows`` ``[W, D]``; ``cohort`` ``[speakers, D]`` heard as the sample); inf under 3 windows."""
        if len(windows) < 3:
            return float("inf")
        total = windows.sum(axis=0)
        worst = float("inf")
        for window in windows:
            rest = (total - window) / max(float(np.linalg.norm(total - window)), 1e-12)
            worst = min(worst, self.snorm(float(window @ rest), window, rest, cohort, cohort))
        return worst


class FusedMatch:
    """Two encoders' checks as one: their s-normalized scores summed (equal weights: each is already in its
    cohort's standard deviations), judged by settings calibrated for the sum on bench/consent.py's
    calibration split (bench/consent_fusion.py). Classes are the second encoder's. On bench/consent.py's
    figures split, resemblyzer + Chorus v3 took 70.1 % of owners against resemblyzer's 57.0 % and accepted
    the same strangers (bench/README)."""

    def __init__(self, first: VoiceMatch, second: VoiceMatch, settings: MatchSettings):
        self.parts = (first, second)
        self.settings = settings
        self.embedder = second.embedder  # whose band a verdict reports

    def match(self, consent: np.ndarray, consent_rate: int, sample: np.ndarray, sample_rate: int) -> MatchVerdict:
        """As :meth:`VoiceMatch.match` (``UnusableRecording`` from either part), on the summed scores."""
        return self.combine(*(part.match(consent, consent_rate, sample, sample_rate) for part in self.parts))

    def combine(self, first: MatchVerdict, second: MatchVerdict) -> MatchVerdict:
        """The fused verdict from the two parts' verdicts on one consent and sample (bench/consent.py
        judges cached verdicts through this, as the server does)."""
        score = first.score + second.score
        worst, stretch = first.worst_window + second.worst_window, first.worst_stretch + second.worst_stretch
        reason = refusal(score, worst, stretch, second.threshold_key, self.settings)
        return replace(
            second,
            score=round(score, 4),
            accepted=not reason,
            worst_window=round(worst, 4),
            worst_stretch=round(stretch, 4),
            reason=reason,
        )


def fused_consent_match(cohort: Cohort | None = None) -> FusedMatch:
    """The server's default speaker check: resemblyzer's and Chorus's consent encoder's (v3) checks fused,
    on ``cohort`` (default: the shipped one) and its ``fused`` settings. Both parts are judged by the fused
    settings only; their own thresholds do not count."""
    cohort = cohort or load_cohort()
    v3 = ChorusEmbedder(load_encoder(SHIPPED_CONSENT_ENCODER), name=CONSENT_ENCODER_NAME)
    parts = [VoiceMatch(embedder, cohort, MatchSettings()) for embedder in (ResemblyzerEmbedder(), v3)]
    return FusedMatch(*parts, cohort.settings["fused"])
