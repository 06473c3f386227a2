"""Dataset layouts Chorus reads.

* LJSpeech-style folder: ``metadata.csv`` with ``id|text`` or ``id|text|normalized`` lines and audio
  in ``wavs/<id>.wav`` (or any format of :data:`AUDIO_SUFFIXES`; an id written with its suffix,
  ``clip1.wav|...``, names its file). A first line that names columns (``id|text``) is a header, not a
  clip. The folder's name is the speaker.
* Multi-speaker: a folder of such folders (one speaker each), or one ``metadata.csv`` whose lines are
  ``id|speaker|text`` with audio in ``wavs/``.

Parsing never reads audio; problems are reported with file and line by :mod:`chorus.data.check`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Every format Chorus reads: libsndfile's, then FFmpeg's through PyAV (chorus.audio.io.load_audio).
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".aac", ".webm", ".aiff", ".aif")
# What a header row's columns say (a spreadsheet's export: "id|text", "file_name|transcription").
_HEADER_IDS = {"id", "ids", "file", "filename", "file_name", "name", "path", "audio", "audio_file", "wav", "utterance"}
_HEADER_TEXTS = {"text", "transcript", "transcription", "sentence", "normalized", "normalized_text", "speaker"}


class DatasetFormatError(ValueError):
    """A dataset folder or metadata file that cannot be parsed; the message names file and line."""


@dataclass(frozen=True)
class Utterance:
    id: str
    speaker: str
    text: str
    audio_path: Path
    source: str  # "metadata.csv:12", for error messages

    @property
    def key(self) -> str:
        return f"{self.speaker}/{self.id}"


@dataclass(frozen=True)
class MetadataProblem:
    source: str
    message: str


def clip_names(utt_id: str) -> list[str]:
    """The file names the clip of ``utt_id`` may have, in the order they are looked for: the id itself where it is
    a file's name, then the id with each suffix of :data:`AUDIO_SUFFIXES`, in lower and in upper case (cameras
    and Windows tools write ``.WAV``); each as written, then in Unicode's composed and decomposed forms (macOS
    writes a file's "é" as "e" and an accent, where an editor writes the metadata's as one character). A folder
    and an uploaded archive look alike."""
    names = []
    for spelling in dict.fromkeys([utt_id, unicodedata.normalize("NFC", utt_id), unicodedata.normalize("NFD", utt_id)]):
        named = [spelling] if Path(spelling).suffix.lower() in AUDIO_SUFFIXES else []
        names += named + [f"{spelling}{spelled}" for suffix in AUDIO_SUFFIXES for spelled in (suffix, suffix.upper())]
    return names


def audio_path(wavs: Path, utt_id: str) -> Path:
    """The clip of ``utt_id`` in ``wavs``: the first of :func:`clip_names` that exists; where none does (then
    reported missing), the id as written when it is a file's name, else ``<id>.wav``."""
    found = next((wavs / name for name in clip_names(utt_id) if (wavs / name).is_file()), None)
    if found is not None:
        return found
    return wavs / (utt_id if Path(utt_id).suffix.lower() in AUDIO_SUFFIXES else f"{utt_id}.wav")


def names_columns(fields: list[str]) -> bool:
    """Whether a metadata line's first two ``fields`` are column names ("id|text", "filename|transcript")."""
    return len(fields) >= 2 and fields[0].casefold() in _HEADER_IDS and fields[1].casefold() in _HEADER_TEXTS


def is_header(fields: list[str], wavs: Path) -> bool:
    """Whether a metadata line's ``fields`` name columns rather than a clip: they name columns
    (:func:`names_columns`) and no clip of that id exists."""
    return names_columns(fields) and not audio_path(wavs, fields[0]).is_file()


def _separator_hint(line: str) -> str:
    """What a line without '|' may have used instead, to say so."""
    for separator, name in (("\t", "tabs"), (",", "commas"), (";", "semicolons")):
        if separator in line:
            return f" (it seems separated by {name}; LJSpeech's separator is '|')"
    return " (an id alone: write 'id|' for Whisper to transcribe its clip)" if " " not in line.strip() else ""


def _metadata_text(metadata: Path) -> list[str]:
    """The lines of a ``metadata.csv``; :class:`DatasetFormatError` naming it where it cannot be read as UTF-8."""
    try:
        # utf-8-sig: editors on Windows start CSVs with a byte-order mark, which would otherwise
        # become part of the first utterance id.
        text = metadata.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        bom = error.object[:2] in (b"\xff\xfe", b"\xfe\xff")
        raise DatasetFormatError(
            f"{metadata}: not UTF-8 text ({'UTF-16' if bom else f'byte {error.object[error.start]:#04x} at {error.start}'}"
            "); save it as UTF-8"
        ) from error
    except OSError as error:
        raise DatasetFormatError(f"{metadata}: cannot read ({error})") from error
    if "\x00" in text:  # UTF-16 of plain letters without a byte-order mark reads as UTF-8 with NULs between
        raise DatasetFormatError(f"{metadata}: not UTF-8 text (NUL characters: UTF-16?); save it as UTF-8")
    return text.splitlines()


def read_metadata(folder: Path, speaker: str | None = None) -> tuple[list[Utterance], list[MetadataProblem]]:
    """Parse ``folder/metadata.csv``. ``speaker`` names the speaker for 2/3-column files.

    3-column lines are ``id|text|normalized`` in a single-speaker folder (the normalized text is
    used) and ``id|speaker|text`` in a multi-speaker file (``speaker`` is None).
    """
    metadata = folder / "metadata.csv"
    if not metadata.is_file():
        raise DatasetFormatError(f"{folder}: no metadata.csv (expected 'id|text' lines and wavs/)")
    lines = _metadata_text(metadata)
    utterances, problems, seen = [], [], set()
    first = next((number for number, line in enumerate(lines, start=1) if line.strip()), 0)
    for number, line in enumerate(lines, start=1):
        where = f"{metadata}:{number}"
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("|")]
        if number == first and is_header(fields, folder / "wavs"):
            continue
        if len(fields) == 2:
            utt_id, text, utt_speaker = fields[0], fields[1], speaker
        elif len(fields) == 3 and speaker is not None:
            utt_id, text, utt_speaker = fields[0], fields[2] or fields[1], speaker
        elif len(fields) == 3:
            utt_id, utt_speaker, text = fields
        else:
            hint = _separator_hint(line) if len(fields) == 1 else ""
            problems.append(MetadataProblem(where, f"expected 2 or 3 '|'-separated fields, found {len(fields)}{hint}"))
            continue
        if not utt_id:
            problems.append(MetadataProblem(where, "empty utterance id"))
            continue
        if _outside_wavs(utt_id):
            # Read as a path, it names a file outside the dataset, which a voice made from it would carry away.
            problems.append(
                MetadataProblem(where, f"id {utt_id!r} names a file outside wavs/ (an id is a clip's name)")
            )
            continue
        if utt_speaker is None or not utt_speaker:
            problems.append(MetadataProblem(where, "empty speaker name"))
            continue
        path = audio_path(folder / "wavs", utt_id)
        if path.name == utt_id:  # written with its suffix: the id is the file's stem, as everywhere else
            utt_id = path.stem
        key = (utt_speaker, unicodedata.normalize("NFC", utt_id))  # one clip, however its id's accents are spelled
        if key in seen:
            problems.append(MetadataProblem(where, f"duplicate id {utt_id!r}"))
            continue
        seen.add(key)
        utterances.append(Utterance(utt_id, utt_speaker, text, path, where))
    return utterances, problems


def _is_multi_speaker(metadata: Path) -> bool:
    """Whether a root ``metadata.csv``'s 3-field lines are ``id|speaker|text``, not ``id|text|normalized``.

    A speaker field is one token that differs from the text; LJSpeech's normalized column mostly
    repeats the text, which has spaces. The majority of lines decides, so that a one-word line like
    ``LJ|1990|nineteen ninety`` or one malformed line cannot flip the whole file.
    """
    rows = [
        [f.strip() for f in line.split("|")]
        for line in metadata.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    ]
    rows = [row for row in rows if len(row) == 3]
    speakerish = sum(
        1
        for _, middle, last in rows
        if middle and not any(c.isspace() for c in middle) and middle.casefold() != last.casefold()
    )
    return 2 * speakerish > len(rows)


def discover(root: str | Path) -> tuple[list[Utterance], list[MetadataProblem]]:
    """All utterances under ``root`` in any supported layout, plus metadata-level problems.

    Raises :class:`DatasetFormatError` when ``root`` holds no dataset at all; in a folder of
    speaker folders, one unreadable ``metadata.csv`` is reported as a problem instead.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetFormatError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
    if (root / "metadata.csv").is_file():
        try:
            multi = _is_multi_speaker(root / "metadata.csv")
        except OSError as error:
            raise DatasetFormatError(f"{root / 'metadata.csv'}: cannot read ({error})") from error
        return read_metadata(root, speaker=None if multi else root.resolve().name)  # "." has no name of its own
    speakers = sorted(p for p in root.iterdir() if p.is_dir() and (p / "metadata.csv").is_file())
    if not speakers:
        raise DatasetFormatError(
            f"{root}: no metadata.csv here nor in any sub-folder "
            "(expected an LJSpeech-style folder or a folder of them)"
        )
    utterances, problems = [], []
    for folder in speakers:
        try:
            found, bad = read_metadata(folder, speaker=folder.name)
        except DatasetFormatError as error:
            # One speaker's broken file should not hide every other speaker's data.
            problems.append(MetadataProblem(str(folder / "metadata.csv"), str(error)))
            continue
        utterances += found
        problems += bad
    return utterances, problems


def metadata_lines(metadata: Path) -> list[tuple[str, str]]:
    """``(id, text)`` of each clip's line (``id|`` leaves the text to Whisper). A line without '|' is no
    such line (a comma-separated file: the data check names it), and a header row is no clip."""
    rows = []
    for line in _metadata_text(metadata):
        if "|" in line:
            utt_id, _, text = line.partition("|")
            rows.append((utt_id.strip(), text.rsplit("|", 1)[-1].strip()))
    if rows and is_header(list(rows[0]), metadata.parent / "wavs"):
        rows = rows[1:]
    return rows


def _outside_wavs(utt_id: str) -> bool:
    """Whether ``utt_id``, read as a path below ``wavs/``, names a file outside it (absolute, or through '..')."""
    return PurePosixPath(utt_id).is_absolute() or ".." in PurePosixPath(utt_id).parts


def needs_transcripts(folder: str | Path) -> bool:
    """Whether ``folder`` holds recordings without (some of) their transcripts."""
    folder = Path(folder)
    metadata = folder / "metadata.csv"
    if metadata.is_file():
        try:
            return any(not text for _, text in metadata_lines(metadata))
        except DatasetFormatError:
            return False  # unreadable: the data check names it as the dataset's problem
    if not folder.is_dir() or any(folder.rglob("metadata.csv")):
        return False  # a dataset of another layout (speaker folders): the data check says what it holds
    return any(p.suffix.lower() in AUDIO_SUFFIXES for p in folder.rglob("*") if p.is_file())
