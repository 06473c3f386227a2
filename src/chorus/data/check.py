"""Dataset validation: every problem a dataset has, with its file and line, before anything trains on it.

:func:`check_dataset` reads the metadata with :func:`chorus.data.formats.discover`, phonemizes every
text with the same :class:`~chorus.text.TextFrontEnd` that training uses, and reads every clip once.
Nothing in here raises on bad input: a broken line, a missing or undecodable file, a text with nothing
to say, each becomes a :class:`Problem`, and :meth:`DatasetReport.valid_utterances` keeps the rest.
:func:`format_report` renders a report for ``chorus data check DIR``.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import soundfile as sf
from rich.console import RenderableType
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from chorus.audio.io import AudioTooLong, decode_with_av, downmix
from chorus.audio.speech_activity import DIGITAL_ZERO_DB, SpeechActivity, speech_activity
from chorus.data.formats import AUDIO_SUFFIXES, DatasetFormatError, Utterance, audio_path, discover
from chorus.text import TextFrontEnd
from chorus.text.symbols import PAD, PUNCTUATION, WORD_BOUNDARY

# Every kind of problem, with the one-line explanation used in reports.
PROBLEM_KINDS: dict[str, str] = {
    "format": "no dataset could be read here",
    "metadata": "a metadata line that cannot be used",
    "empty_dataset": "the metadata lists no utterances",
    "missing_audio": "the audio file named by a metadata line does not exist",
    "unreadable_audio": "the audio file cannot be decoded (or holds NaN/inf samples)",
    "empty_audio": "the audio file has no samples",
    "low_sample_rate": "recorded at too low a rate: a phone line's 8 kHz lacks the voice's upper band",
    "clipped": "too many samples at full scale",
    "silent": "no audible signal",
    "no_speech": "a voice-activity detector hears too little of it as speech: a tone, music, noise, or a whisper?",
    "too_short": "shorter than the minimum clip length",
    "too_long": "longer than the maximum clip length",
    "empty_text": "the transcript is empty",
    "unspeakable_text": "the transcript has nothing to pronounce",
    "text_error": "the transcript could not be phonemized",
    "text_length": "the transcript does not fit the clip's duration",
    "transcript_not_heard": "Whisper does not hear the transcript in the clip (chorus data check --listen)",
}

# Characters of the phoneme string that are not phones of their own: word gaps, pause punctuation,
# stress and length marks, and diacritics that modify the phone before them.
_NOT_PHONES = frozenset(PAD + WORD_BOUNDARY + PUNCTUATION + "ˈˌːˑ\u0329\u0303ʰʲʷ")
# Texts go to the phonemizer in chunks so the progress bar moves on large datasets.
_PHONEMIZE_CHUNK = 256
# Clips this long are reported as too long without being decoded, so one stray hour-long recording
# cannot exhaust memory.
_MAX_DECODED_SECONDS = 600.0
# Energy is measured in 25 ms frames, a common speech-analysis frame.
_FRAME_SECONDS = 0.025


# What a voice needs, of speech in its usable clips (as the voice-activity detector hears it): `chorus adapt` and the
# server's uploads refuse less (AdaptConfig.min_minutes, UploadLimits.min_total_seconds), and `chorus data check`
# says so of one speaker's folder. It was 30 s of audio; the detector hears 83-85 % of the tests' espeak-ng
# clips as speech (a reviewer's probe: the silence before, after and between sentences is the rest), so 25 s of
# speech asks about what 30 s of audio did. Silence, room tone, noise or music around the words is not counted.
VOICE_MIN_SPEECH_SECONDS = 25.0

# A clip whose energy above NARROW_BAND_HZ is this far under its whole energy holds nothing up there: a phone
# line's or an 8 kHz recording resampled up (a voice learnt from it sounds as muffled). Not a problem, since
# the corpus has such a voice of its own (flite's kal, an 8 kHz diphone voice): said, not refused. Set on the
# corpus's 36 training voices, 5 clips each (bench/narrow_band.py: the middle of the gap between every
# whole-band clip, at its rate, 16 or 48 kHz, -48.4 dB or more, and every narrow one, -60.2 dB or less:
# flite-kal's own clips and each clip through a phone line or 8 kHz and back, saved as 16-bit). 16-bit rounding
# fills the upper band against a quiet voice, about a dB for each dB quieter: the held-out voices through a
# phone line 20 dB quieter read -66 to -60 dB, still warned of; much quieter ones would pass unwarned.
NARROW_BAND_HZ = 4_200.0
NARROW_BAND_DB = -54.0

# Recordings whose speech stands less than NOISY_SNR_DB above what their pauses hold are warned of (a voice
# learns a recording's noise), not refused. The speech and the pauses are told apart by a voice-activity
# detector (chorus.audio.speech_activity); a clip tells its noise where it has MIN_NOISE_WINDOWS windows inside
# pauses, and the dataset's ratio is the median of its usable clips' where MIN_NOISY_CLIPS clips tell one. Set
# on the corpus's 36 training voices, 12 clips each as a dataset (bench/speech_activity.py: the middle of the
# gap between the clean voices that tell a ratio, 37.0 dB or more, and the voices at 20 dB SNR of white, pink or
# room noise, 25.5 dB or less; an earlier draw of the noise read 21.9 dB there, and the rule gave 29 dB). A
# crowd's babble is speech to the detector: at 10 dB no pause is left to measure.
NOISY_SNR_DB = 31.0
MIN_NOISE_WINDOWS = 3
MIN_NOISY_CLIPS = 3

# DatasetReport.warning_notes(): what a voice card's notes may warn of
WARNING_NAMES = ("narrow_band", "noisy", "unlisted")


@dataclass(frozen=True)
class CheckConfig:
    """Thresholds of :func:`check_dataset`; the defaults suit read speech for a 22,050 Hz model."""

    min_seconds: float = 0.3
    max_seconds: float = 20.0
    min_sample_rate: int = 16_000
    clip_level: float = 0.999  # |sample| at or above this counts as clipped
    max_clipped_fraction: float = 0.001
    # Of a clip's sound (SpeechActivity.sound_seconds: a pause's silence or room noise is none), what a
    # voice-activity detector must hear as speech (bench/speech_activity.py: the middle of the gap between the
    # corpus's speech clips, clean or noisy, 0.79 or more, and tones, chords, hum and noise, 0.02 or less).
    min_heard_fraction: float = 0.4
    silence_dbfs: float = -60.0  # whole-clip RMS below this is silence...
    quiet_frame_dbfs: float = -40.0  # ...and so is a clip with no 25 ms frame louder than this
    min_phonemes_per_second: float = 4.0
    max_phonemes_per_second: float = 30.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset.

    ``source`` is where to look: ``path/metadata.csv:12`` for a metadata line or its text, the audio
    file's path for a problem with the audio. ``kind`` is a key of :data:`PROBLEM_KINDS`;
    ``utterance`` is the utterance it disqualifies, None for dataset-level problems.
    """

    source: str
    kind: str
    message: str
    utterance: Utterance | None = field(default=None, repr=False)


@dataclass
class SpeakerReport:
    """What one speaker contributes: clips listed and usable, and their durations."""

    speaker: str
    clips: int = 0
    valid_clips: int = 0
    seconds: float = 0.0  # all decodable audio
    valid_seconds: float = 0.0  # audio of the valid clips only
    # The valid clips' speech: what a voice-activity detector hears as speech in each (silence, room tone, noise
    # or music around and between the words not counted).
    valid_speech_seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)

    @property
    def minutes(self) -> float:
        return self.seconds / 60

    @property
    def valid_minutes(self) -> float:
        return self.valid_seconds / 60

    @property
    def valid_speech_minutes(self) -> float:
        return self.valid_speech_seconds / 60


@dataclass
class DatasetReport:
    """The result of :func:`check_dataset`.

    ``problems`` lists dataset and metadata problems first, then each utterance's in metadata order;
    ``durations`` maps :attr:`Utterance.key` to seconds for every decodable clip, ``speech_durations`` to
    the seconds a voice-activity detector hears as speech in it (0 for a silent one, or one left out for another
    problem of its audio).
    """

    root: Path
    utterances: list[Utterance]
    problems: list[Problem]
    speakers: dict[str, SpeakerReport]
    durations: dict[str, float]
    speech_durations: dict[str, float]
    narrow_band: frozenset[str] = frozenset()  # keys of the clips with nothing above NARROW_BAND_HZ
    snr_db: dict[str, float] = field(default_factory=dict)  # key -> speech over the noise between words, in dB

    @property
    def ok(self) -> bool:
        return not self.problems

    def with_problems(self, extra: list[Problem]) -> DatasetReport:
        """This report with ``extra`` problems found after it (listening to the clips), the counts redone and
        the problems in the order the report keeps: dataset and metadata ones first, then each utterance's."""
        position = {u.key: n for n, u in enumerate(self.utterances)}
        problems = sorted(self.problems + extra, key=lambda p: -1 if p.utterance is None else position[p.utterance.key])
        speakers = _speaker_reports(self.utterances, problems, self.durations, self.speech_durations)
        return replace(self, problems=problems, speakers=speakers)

    def speech_seconds(self, keys: Iterable[str]) -> float:
        """The speech the detector heard in the clips of these :attr:`Utterance.key` s (an undecodable one: 0):
        what `chorus adapt` counts against a voice's minimum and writes on its card."""
        return sum(self.speech_durations.get(key, 0.0) for key in keys)

    def valid_utterances(self) -> list[Utterance]:
        """The utterances that have no problem, in metadata order."""
        bad = {p.utterance.key for p in self.problems if p.utterance is not None}
        return [u for u in self.utterances if u.key not in bad]

    def warning_notes(self) -> dict[str, str]:
        """What the usable clips are warned of, not refused for, by name (:data:`WARNING_NAMES`): ``narrow_band``
        (:meth:`narrow_band_note`), ``noisy`` (:meth:`noisy_note`) and ``unlisted`` (:meth:`unlisted_note`)."""
        notes = zip(WARNING_NAMES, (self.narrow_band_note(), self.noisy_note(), self.unlisted_note()), strict=True)
        return {name: note for name, note in notes if note is not None}

    def unlisted_note(self) -> str | None:
        """A warning where the folders of the listed clips hold audio files no metadata line names (a new user's
        probe: a minute of audio went unused without a word); else None."""
        # As written, not resolved: a subset made of links (data.subsets) names its own folder, not the corpus's.
        listed = {u.audio_path.absolute() for u in self.utterances}
        unlisted = sorted(
            path
            for folder in {path.parent for path in listed}
            for path in folder.iterdir()
            if path.suffix.lower() in AUDIO_SUFFIXES and path.absolute() not in listed
        )
        if not unlisted:
            return None
        named = ", ".join(path.name for path in unlisted[:3]) + (
            f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else ""
        )
        return f"{len(unlisted)} audio file(s) beside the clips have no line in the metadata and are not used: {named}"

    def noisy_note(self) -> str | None:
        """A warning where the usable clips' speech stands less than NOISY_SNR_DB above what their pauses hold
        (the median of the clips that tell it, where MIN_NOISY_CLIPS do), naming the three that stand least;
        else None."""
        measured = {u: self.snr_db[u.key] for u in self.valid_utterances() if u.key in self.snr_db}
        if (snr := dataset_snr_db(list(measured.values()))) is None or snr >= NOISY_SNR_DB:
            return None
        least = sorted(measured, key=measured.get)[:3]
        named = ", ".join(f"{u.audio_path.name} {measured[u]:.0f} dB" for u in least)
        level = f"stands {snr:.0f} dB above" if snr >= 0 else f"is {-snr:.0f} dB under"
        return (
            f"the speech {level} what its pauses hold (noise, hum, music or echo; the median of {len(measured)} "
            f"clips; the least: {named}; clean recordings {NOISY_SNR_DB:g} dB or more): a voice learns what its "
            "recordings hold besides the voice; record in a quieter room, or closer to the microphone, where you can"
        )

    def narrow_band_note(self) -> str | None:
        """A warning where most usable clips hold nothing above NARROW_BAND_HZ, else None."""
        valid = [u.key for u in self.valid_utterances()]
        narrow = sum(key in self.narrow_band for key in valid)
        if not valid or 2 * narrow <= len(valid):
            return None
        return (
            f"{narrow} of the {len(valid)} usable clips hold nothing above {NARROW_BAND_HZ / 1000:g} kHz: recorded "
            "through a phone line, or at 8 kHz and resampled up? A voice learnt from them sounds as muffled; record "
            "directly, not through a phone line, where you can"
        )

    def problem_counts(self) -> Counter[str]:
        """Number of problems of each kind."""
        return Counter(p.kind for p in self.problems)

    def summary(self) -> str:
        """One paragraph: speakers, clips, minutes, and problems by kind."""
        valid = len(self.valid_utterances())
        valid_minutes = sum(s.valid_minutes for s in self.speakers.values())
        speech_minutes = sum(s.valid_speech_minutes for s in self.speakers.values())
        text = (
            f"{len(self.speakers)} speaker(s), {len(self.utterances)} clip(s), {valid} valid "
            f"({valid_minutes:.1f} min usable, {speech_minutes:.1f} min of it speech)"
        )
        if not self.problems:
            return text + "; no problems."
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(self.problem_counts().items()))
        # The speakers' tables count problems of their clips; a bad metadata line is no clip's (it named none).
        unclipped = sum(p.utterance is None for p in self.problems)
        besides = f" ({unclipped} of the metadata or folder, not of a clip)" if unclipped else ""
        return text + f"; {len(self.problems)} problem(s){besides}: {counts}."

    def to_markdown(self) -> str:
        """The report as Markdown: summary, a per-speaker table and every problem."""
        lines = [
            f"# Dataset check: `{self.root}`",
            "",
            self.summary(),
            "",
            "| Speaker | Clips | Valid | Minutes | Valid minutes | Speech minutes | Clip problems |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for s in self.speakers.values():
            lines.append(
                f"| {_md(s.speaker)} | {s.clips} | {s.valid_clips} | {s.minutes:.2f} | "
                f"{s.valid_minutes:.2f} | {s.valid_speech_minutes:.2f} | {len(s.problems)} |"
            )
        if self.problems:
            lines += ["", "## Problems", "", "| Source | Kind | Message |", "|---|---|---|"]
            lines += [f"| `{_md(p.source)}` | {p.kind} | {_md(p.message)} |" for p in self.problems]
        return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Escape a value for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class _AudioStats:
    """What the checks need to know about one decoded clip."""

    seconds: float
    speech_seconds: float  # what a voice-activity detector hears as speech
    narrow_band: bool = False  # nothing above NARROW_BAND_HZ
    snr_db: float | None = None  # speech over the noise between words, where the clip has pauses to tell it


def check_dataset(
    root: str | Path, *, progress: bool = True, jobs: int = 1, config: CheckConfig = CheckConfig()
) -> DatasetReport:
    """Validate the dataset at ``root`` (any layout :func:`~chorus.data.formats.discover` reads).

    ``jobs`` clips are decoded at once (threads: libsndfile and numpy release the GIL). Never raises
    for bad data; see :data:`PROBLEM_KINDS` for what is reported.
    """
    root = Path(root)
    try:
        utterances, metadata_problems = discover(root)
    except (DatasetFormatError, OSError) as error:
        return DatasetReport(root, [], [Problem(str(root), "format", str(error))], {}, {}, {})
    problems = [Problem(p.source, "metadata", p.message) for p in metadata_problems]
    if not utterances:
        problems.append(Problem(str(root), "empty_dataset", "no utterances listed in the metadata"))

    with Progress(disable=not progress, transient=True) as bar:
        text_task = bar.add_task("phonemizing", total=len(utterances))
        phoneme_counts = _count_phonemes([u.text for u in utterances], lambda n: bar.advance(text_task, n))
        audio_task = bar.add_task("reading audio", total=len(utterances))

        def audio(utt: Utterance) -> tuple[_AudioStats | None, list[Problem]]:
            try:
                return _check_audio(utt, config)
            finally:
                bar.advance(audio_task)

        if jobs > 1:
            with ThreadPoolExecutor(jobs) as pool:
                audio_results = list(pool.map(audio, utterances))
        else:
            audio_results = [audio(u) for u in utterances]

    durations: dict[str, float] = {}
    speech: dict[str, float] = {}
    narrow: set[str] = set()
    snr: dict[str, float] = {}
    for utt, count, (stats, audio_problems) in zip(utterances, phoneme_counts, audio_results, strict=True):
        problems += _check_text(utt, count)
        problems += audio_problems
        if stats is not None:
            durations[utt.key], speech[utt.key] = stats.seconds, stats.speech_seconds
            if stats.narrow_band:
                narrow.add(utt.key)
            if stats.snr_db is not None:
                snr[utt.key] = stats.snr_db
            if isinstance(count, int) and count > 0 and not audio_problems:
                problems += _check_rate(utt, count, stats, config)
    speakers = _speaker_reports(utterances, problems, durations, speech)
    return DatasetReport(root, utterances, problems, speakers, durations, speech, frozenset(narrow), snr)


def _count_phonemes(texts: list[str], advance: Callable[[int], None]) -> list[int | str]:
    """Phones in each text's phonemization, or the error message where phonemizing it failed."""
    front_end = TextFrontEnd()
    counts: list[int | str] = []
    with warnings.catch_warnings():
        # Dropped characters are expected in raw transcripts; what matters here is what is left.
        warnings.simplefilter("ignore")
        for start in range(0, len(texts), _PHONEMIZE_CHUNK):
            chunk = texts[start : start + _PHONEMIZE_CHUNK]
            try:
                phonemes: list[str | Exception] = list(front_end.to_phonemes(chunk))
            except Exception:  # one odd text must not sink its chunk: retry one by one to find it
                phonemes = []
                for text in chunk:
                    try:
                        phonemes.append(front_end.to_phonemes([text])[0])
                    except Exception as error:
                        phonemes.append(error)
            for item in phonemes:
                if isinstance(item, Exception):
                    counts.append(f"{type(item).__name__}: {item}")
                else:
                    known, _ = front_end.symbols.encode(item)
                    counts.append(sum(1 for i in known if front_end.symbols.symbols[i] not in _NOT_PHONES))
            advance(len(chunk))
    return counts


def _check_text(utt: Utterance, count: int | str) -> list[Problem]:
    if not utt.text.strip():
        return [Problem(utt.source, "empty_text", f"utterance {utt.id!r} has an empty transcript", utt)]
    if isinstance(count, str):
        return [Problem(utt.source, "text_error", f"cannot phonemize {utt.text!r}: {count}", utt)]
    if count == 0:
        return [Problem(utt.source, "unspeakable_text", f"nothing to pronounce in {utt.text!r}", utt)]
    return []


def _check_rate(utt: Utterance, count: int, stats: _AudioStats, config: CheckConfig) -> list[Problem]:
    """A transcript that is far too long or short for the speech in its clip is usually the wrong one."""
    # The speech a voice-activity detector hears: a long pause inside a clip is none of it.
    if stats.speech_seconds <= 0:  # no speech: the silence and no-speech checks speak for such a clip
        return []
    rate = count / stats.speech_seconds
    if config.min_phonemes_per_second <= rate <= config.max_phonemes_per_second:
        return []
    return [
        Problem(
            utt.source,
            "text_length",
            f"{count} phonemes in {stats.speech_seconds:.2f} s of speech = {rate:.1f}/s "
            f"(expected {config.min_phonemes_per_second:g}-{config.max_phonemes_per_second:g}/s): "
            f"wrong transcript or audio?",
            utt,
        )
    ]


def _check_audio(utt: Utterance, config: CheckConfig) -> tuple[_AudioStats | None, list[Problem]]:
    """Decode one clip and test it; stats are None when it could not be decoded."""
    path = utt.audio_path
    where = str(path)

    def problem(kind: str, message: str) -> Problem:
        return Problem(where, kind, message, utt)

    if not path.is_file():
        # The metadata line is what to fix (or the file to add), so it is the source.
        beside = audio_path(path.parent.parent, utt.id)
        hint = f" (there is {beside}: move the clips into {path.parent.name}/)" if beside.is_file() else ""
        return None, [Problem(utt.source, "missing_audio", f"audio file {path} not found{hint}", utt)]
    try:
        info = sf.info(where)
        if info.frames > 0 and info.frames / info.samplerate > _MAX_DECODED_SECONDS:
            seconds = info.frames / info.samplerate
            return (
                _AudioStats(seconds, 0.0),
                [problem("too_long", f"{seconds:.1f} s long (maximum {config.max_seconds:g} s)")],
            )
        audio, rate = sf.read(where, dtype="float32", always_2d=True)
    except Exception as error:  # libsndfile, OS and header errors alike: try FFmpeg's decoders, as training reads
        try:
            decoded = decode_with_av(path, max_seconds=_MAX_DECODED_SECONDS)
        except AudioTooLong as too_long:
            return _AudioStats(too_long.seconds, 0.0), [
                problem("too_long", f"{too_long.seconds:.1f} s long (maximum {config.max_seconds:g} s)")
            ]
        if decoded is None:
            empty = path.stat().st_size == 0
            return None, [problem("unreadable_audio", "an empty file" if empty else f"cannot decode: {error}")]
        audio, rate = decoded
    if audio.size == 0:
        return None, [problem("empty_audio", "no samples")]
    if not np.isfinite(audio).all():
        return None, [problem("unreadable_audio", "contains NaN or infinite samples")]

    seconds = len(audio) / rate
    problems = []
    if rate < config.min_sample_rate:
        problems.append(problem("low_sample_rate", f"{rate} Hz (minimum {config.min_sample_rate} Hz)"))
    if seconds < config.min_seconds:
        problems.append(problem("too_short", f"{seconds:.2f} s long (minimum {config.min_seconds:g} s)"))
    if seconds > config.max_seconds:
        problems.append(problem("too_long", f"{seconds:.1f} s long (maximum {config.max_seconds:g} s)"))
    # Clipping is judged per channel: averaging to mono would hide a clipped channel.
    clipped = float(np.mean(np.abs(audio) >= config.clip_level))
    if clipped > config.max_clipped_fraction:
        problems.append(
            problem("clipped", f"{clipped:.2%} of samples at full scale (maximum {config.max_clipped_fraction:.2%})")
        )

    return _judge_sound(audio, rate, problems, problem, config)


def _judge_sound(
    audio: np.ndarray, rate: int, problems: list[Problem], problem: Callable[[str, str], Problem], config: CheckConfig
) -> tuple[_AudioStats, list[Problem]]:
    """The sound's own checks of a decoded clip ``audio`` ``[samples, channels]`` (silent, no speech heard) after
    its ``problems`` so far, and what it tells where it passes every one (its band, its noise)."""
    seconds = len(audio) / rate
    mono = downmix(audio).astype(np.float64)
    if not mono.any() and not audio.any():
        problems.append(problem("silent", "every sample is zero"))
        return _AudioStats(seconds, 0.0), problems
    frame_db, rms_db = _levels(mono, rate)
    loudest = float(frame_db.max())
    if _silent(rms_db, loudest, config):
        problems.append(problem("silent", _why_silent(audio, rms_db, loudest, config)))
        return _AudioStats(seconds, 0.0), problems
    if problems:  # a clip left out already is not judged further (nor its speech counted)
        return _AudioStats(seconds, 0.0), problems
    heard = speech_activity(mono, rate)
    if no_speech := _why_no_speech(heard, config):
        return _AudioStats(seconds, heard.speech_seconds), [problem("no_speech", no_speech)]
    narrow = upper_band_db(mono, rate) < NARROW_BAND_DB
    return _AudioStats(seconds, heard.speech_seconds, narrow, clip_snr_db(heard)), problems


def clip_snr_db(heard: SpeechActivity) -> float | None:
    """A clip's speech over the noise between its words, in dB, where it has MIN_NOISE_WINDOWS windows inside
    pauses to tell the noise by; else None."""
    return heard.snr_db if heard.noise_windows >= MIN_NOISE_WINDOWS else None


def dataset_snr_db(clips_snr_db: list[float]) -> float | None:
    """The recordings' speech over their noise: the median of their clips' (:func:`clip_snr_db`) where at least
    MIN_NOISY_CLIPS tell one; else None."""
    return float(np.median(clips_snr_db)) if len(clips_snr_db) >= MIN_NOISY_CLIPS else None


def heard_fraction(mono: np.ndarray, rate: int) -> float:
    """What a voice-activity detector hears as speech of ``mono`` ``[samples]``'s sound
    (:attr:`~chorus.audio.speech_activity.SpeechActivity.sound_seconds`; 0 where it has none): the statistic
    ``CheckConfig.min_heard_fraction`` bounds."""
    heard = speech_activity(mono, rate) if len(mono) else None
    return heard.speech_seconds / heard.sound_seconds if heard and heard.sound_seconds else 0.0


def _why_no_speech(heard: SpeechActivity, config: CheckConfig) -> str | None:
    """The "no_speech" problem's message where the detector heard too little of a clip's sound as speech, else
    None."""
    if heard.speech_seconds >= config.min_heard_fraction * heard.sound_seconds:
        return None
    return (
        f"a voice-activity detector hears {heard.speech_seconds:.1f} s of speech in its {heard.sound_seconds:.1f} s "
        f"of sound (it must hear at least {config.min_heard_fraction:.0%}): a tone, music, noise, or a whisper? "
        "Export the recording of the speech"
    )


def upper_band_db(mono: np.ndarray, rate: int, block: int = 1 << 15) -> float:
    """The energy of ``mono`` ``[samples]`` above NARROW_BAND_HZ against its whole energy, in dB: Welch's way,
    over Hann-windowed blocks of ``block`` samples that overlap by half, so that a long clip needs no transform
    of its whole length (a 10-minute one would take gigabytes). The window matters: a block cut square leaks
    a phone band's energy above 4.2 kHz at -40 to -50 dB, where the whole clip's transform reads -80."""
    length = min(block, len(mono))
    if length < 2:
        return 0.0  # nothing to tell a band from
    window = np.hanning(length)
    above_band = np.fft.rfftfreq(length, 1 / rate) > NARROW_BAND_HZ
    above = total = 0.0
    starts = list(range(0, len(mono) - length + 1, length // 2))
    if starts[-1] + length < len(mono):
        starts.append(len(mono) - length)  # the clip's end, in a last block of its own
    for start in starts:
        power = np.abs(np.fft.rfft(window * mono[start : start + length])) ** 2
        above += float(power[above_band].sum())
        total += float(power.sum())
    return float(10 * np.log10(above / (total + 1e-30) + 1e-30))


_LEVEL_BLOCK_FRAMES = 1024  # frames squared at once: a long float32 recording is never copied whole as float64


def _levels(mono: np.ndarray, rate: int) -> tuple[np.ndarray, float]:
    """(the level of each 25 ms frame of ``mono`` ``[samples]`` in dBFS ``[frames]``, the whole clip's RMS
    level in dBFS), block by block."""
    frame = max(1, round(_FRAME_SECONDS * rate))
    energies = []
    for start in range(0, len(mono), frame * _LEVEL_BLOCK_FRAMES):
        block = np.asarray(mono[start : start + frame * _LEVEL_BLOCK_FRAMES], dtype=np.float64)
        block = np.pad(block, (0, -len(block) % frame))  # the last frame's zeros add no energy
        energies.append(np.mean(block.reshape(-1, frame) ** 2, axis=1))
    energy = np.concatenate(energies)
    # The tiny floor only keeps log10 finite for frames of digital silence.
    return 10 * np.log10(energy + 1e-20), float(10 * np.log10(energy.sum() * frame / len(mono) + 1e-20))


def channels_cancel(audio: np.ndarray, mix_rms_db: float, config: CheckConfig = CheckConfig()) -> bool:
    """Whether ``audio`` ``[samples, channels]`` is audible in a channel while its mono mix, at ``mix_rms_db``, is
    20 dB or more under it: one channel the other inverted, which the mix cancels."""
    if audio.ndim < 2 or audio.shape[1] < 2:
        return False
    power = np.einsum("ij,ij->j", audio, audio, dtype=np.float64) / len(audio)  # no float64 copy of the audio
    loudest = float(10 * np.log10(power.max() + 1e-20))
    return loudest > config.silence_dbfs and loudest - mix_rms_db >= 20


def _why_silent(audio: np.ndarray, rms_db: float, loudest: float, config: CheckConfig) -> str:
    """The "silent" problem's message for ``audio`` ``[samples, channels]`` whose mono mix is: its levels, and
    what to do where the clip is not empty but quiet, or loud channels cancel in the mix."""
    levels = f"RMS {rms_db:.0f} dBFS, loudest 25 ms frame {loudest:.0f} dBFS"
    if channels_cancel(audio, rms_db, config):
        return f"{levels} mixed to mono: its channels cancel (one is the other inverted?); export one channel"
    quiet = f"{levels} (silence below {config.silence_dbfs:g} / {config.quiet_frame_dbfs:g} dBFS)"
    return f"{quiet}; if it holds speech, raise its level (normalize it)" if loudest > DIGITAL_ZERO_DB else quiet


def _silent(rms_db: float, loudest_frame_db: float, config: CheckConfig) -> bool:
    return rms_db < config.silence_dbfs or loudest_frame_db < config.quiet_frame_dbfs


def tenths_down(seconds: float) -> str:
    """``seconds`` to a tenth, rounded down: a refusal never shows a shortfall as the minimum itself."""
    return f"{math.floor(seconds * 10) / 10:.1f}"


def speech_seconds(mono: np.ndarray, rate: int, config: CheckConfig = CheckConfig()) -> float:
    """Seconds of ``mono`` ``[samples]`` a voice-activity detector hears as speech, as the data check counts
    them (0 for what it calls silent): what an upload's minimum is held to, as the onboarding job's data check
    holds it. Silence, room tone, noise or music before, after or between the words is not counted."""
    return heard_speech(mono, rate, config)[0]


def heard_speech(mono: np.ndarray, rate: int, config: CheckConfig = CheckConfig()) -> tuple[float, str | None]:
    """(:func:`speech_seconds`, the "no_speech" problem's message or None: why the data check would leave
    ``mono`` ``[samples]`` out as holding too little speech) from one pass of the detector; (0, None) for what
    the check calls silent (:func:`silence_problem` says why). An upload refuses what its job would leave out."""
    if not len(mono) or not np.any(mono):
        return 0.0, None
    frame_db, rms_db = _levels(mono, rate)
    if _silent(rms_db, float(frame_db.max()), config):
        return 0.0, None
    heard = speech_activity(mono, rate)
    return heard.speech_seconds, _why_no_speech(heard, config)


def silence_problem(mono: np.ndarray, rate: int, config: CheckConfig = CheckConfig()) -> str | None:
    """Why the data check calls ``mono`` ``[samples]`` silent (its "silent" problem's message), or None."""
    if not len(mono) or not np.any(mono):
        return "every sample is zero"
    frame_db, rms_db = _levels(mono, rate)
    loudest = float(frame_db.max())
    return _why_silent(mono[:, None], rms_db, loudest, config) if _silent(rms_db, loudest, config) else None


def _speaker_reports(
    utterances: list[Utterance], problems: list[Problem], durations: dict[str, float], speech: dict[str, float]
) -> dict[str, SpeakerReport]:
    reports = {name: SpeakerReport(name) for name in sorted({u.speaker for u in utterances})}
    bad = set()
    for p in problems:
        if p.utterance is not None:
            reports[p.utterance.speaker].problems.append(p)
            bad.add(p.utterance.key)
    for utt in utterances:
        report = reports[utt.speaker]
        seconds = durations.get(utt.key, 0.0)
        report.clips += 1
        report.seconds += seconds
        if utt.key not in bad:
            report.valid_clips += 1
            report.valid_seconds += seconds
            report.valid_speech_seconds += speech.get(utt.key, 0.0)
    return reports


def format_report(report: DatasetReport, max_problems: int = 50) -> list[RenderableType]:
    """Rich renderables for a terminal: summary, per-speaker table, problem counts, problem list.

    At most ``max_problems`` problems are listed (all when it is 0 or less); the counts cover all.
    """
    out: list[RenderableType] = [Text(f"Dataset check: {report.root}", style="bold")]
    if report.speakers:
        speakers = Table(title="Speakers", title_justify="left")
        for name in ("Speaker", "Clips", "Valid", "Minutes", "Valid minutes", "Speech minutes", "Clip problems"):
            speakers.add_column(name, justify="left" if name == "Speaker" else "right")
        for s in report.speakers.values():
            speakers.add_row(
                s.speaker,
                str(s.clips),
                str(s.valid_clips),
                f"{s.minutes:.2f}",
                f"{s.valid_minutes:.2f}",
                f"{s.valid_speech_minutes:.2f}",
                str(len(s.problems)),
                style="red" if s.problems else None,
            )
        out.append(speakers)
    if report.problems:
        kinds = Table(title="Problems by kind", title_justify="left")
        for name in ("Kind", "Count", "Meaning"):
            kinds.add_column(name, justify="right" if name == "Count" else "left")
        for kind, count in sorted(report.problem_counts().items()):
            kinds.add_row(kind, str(count), PROBLEM_KINDS[kind])
        out.append(kinds)
        shown = report.problems if max_problems <= 0 else report.problems[:max_problems]
        listing = Table(title="Problems", title_justify="left")
        listing.add_column("Source", overflow="fold")
        listing.add_column("Kind", style="yellow")
        listing.add_column("Message", overflow="fold")
        for p in shown:
            listing.add_row(p.source, p.kind, p.message)
        out.append(listing)
        if len(shown) < len(report.problems):
            out.append(
                Text(
                    f"... and {len(report.problems) - len(shown)} more (raise --max-problems to list them)", style="dim"
                )
            )
    out.append(Text(report.summary(), style="green" if report.ok else "red"))
    return out
