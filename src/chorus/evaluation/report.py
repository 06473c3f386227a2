"""Run the judges over many synthesized clips and report per-item scores and means (``chorus eval``).

Each :class:`EvalItem` is a synthesized clip and its text, optionally with a real clip of the same
sentence (MCD, F0 RMSE, voicing error), real clips of the target speaker (speaker similarity) and the
time synthesis took (real-time factor). Every clip also gets a predicted naturalness score (MOS, from
distillmos), which needs nothing but the clip. All audio is analysed at the model rate, 22,050 Hz.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import soxr
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.data.formats import AUDIO_SUFFIXES
from chorus.evaluation.asr import WhisperJudge, char_errors, word_errors
from chorus.evaluation.features import F0Method, analyse_pair
from chorus.evaluation.mcd import mcd_on_alignment
from chorus.evaluation.naturalness import INSTALL_HINT, NaturalnessJudge, naturalness_available
from chorus.evaluation.pitch import pitch_errors_on_alignment
from chorus.evaluation.rate import real_time_factor, speaking_rate
from chorus.evaluation.similarity import EncoderJudge, SpeakerJudge, cosine_similarity, mean_embedding

AudioSource = str | os.PathLike | np.ndarray


class EvaluationError(ValueError):
    """An item or input that cannot be judged; the message names the item or file."""


@dataclass
class EvalItem:
    """One synthesized clip to judge.

    ``audio``, ``reference`` and ``speaker_references`` are file paths or mono arrays ``[samples]``;
    arrays are at ``sample_rate``. ``reference`` says the same sentence as ``audio``.
    """

    id: str
    audio: AudioSource
    text: str
    reference: AudioSource | None = None
    speaker_references: Sequence[AudioSource] = ()
    synthesis_seconds: float | None = None
    sample_rate: int = SAMPLE_RATE


def default_naturalness() -> NaturalnessJudge | None:
    """The naturalness judge when distillmos is installed; otherwise None, with a warning saying how."""
    if naturalness_available():
        return NaturalnessJudge()
    warnings.warn(f"no predicted MOS: {INSTALL_HINT}", stacklevel=3)
    return None


@dataclass
class Judges:
    """Which judges run. ``None`` switches a model judge off; pass loaded judges to reuse them across
    calls (each loads its model on first use). ``reference`` switches MCD/F0 off even when items have
    a reference clip. ``f0_method`` as in :func:`~chorus.evaluation.features.world_features`."""

    whisper: WhisperJudge | None = field(default_factory=WhisperJudge)
    speaker: SpeakerJudge | None = field(default_factory=SpeakerJudge)
    naturalness: NaturalnessJudge | None = field(default_factory=default_naturalness)
    reference: bool = True
    f0_method: F0Method = "harvest"
    encoder: EncoderJudge | None = None  # Chorus's own speaker encoder, beside resemblyzer


@dataclass
class EvalRow:
    """Scores of one item; ``None`` where the judge did not run or the item lacked its input.

    ``f0_rmse_hz`` is NaN when no aligned frame is voiced in both clips. Edit and length counts are
    kept so that corpus error rates can be recomputed from the JSON.
    """

    id: str
    text: str
    audio_seconds: float
    speech_seconds: float
    words_per_second: float
    phonemes_per_second: float
    transcript: str | None = None
    wer: float | None = None
    cer: float | None = None
    word_edits: int | None = None
    reference_words: int | None = None
    char_edits: int | None = None
    reference_chars: int | None = None
    speaker_similarity: float | None = None
    encoder_similarity: float | None = None  # by Chorus's speaker encoder
    mos: float | None = None
    mcd_db: float | None = None
    f0_rmse_hz: float | None = None
    voicing_error: float | None = None
    synthesis_seconds: float | None = None
    rtf: float | None = None


# Per-item metrics that are averaged: (summary label, per-item column header, format).
_METRICS: dict[str, tuple[str, str, str]] = {
    "wer": ("WER", "WER", "{:.1%}"),
    "cer": ("CER", "CER", "{:.1%}"),
    "speaker_similarity": ("speaker similarity", "spk sim", "{:.3f}"),
    "encoder_similarity": ("speaker similarity (Chorus encoder)", "enc sim", "{:.3f}"),
    "mos": ("predicted MOS", "MOS", "{:.2f}"),
    "mcd_db": ("MCD (dB)", "MCD dB", "{:.2f}"),
    "f0_rmse_hz": ("F0 RMSE (Hz)", "F0 RMSE", "{:.1f}"),
    "voicing_error": ("voicing error", "V/UV err", "{:.1%}"),
    "words_per_second": ("words per second", "words/s", "{:.2f}"),
    "phonemes_per_second": ("phonemes per second", "phon/s", "{:.1f}"),
    "rtf": ("real-time factor", "RTF", "{:.3f}"),
}


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


@dataclass
class EvalReport:
    """Per-item rows and the judges' settings; means and corpus error rates are computed from rows."""

    rows: list[EvalRow]
    settings: dict = field(default_factory=dict)
    # Yardsticks judged on the same texts by the same judges (``chorus eval``: the start speaker on the
    # base, Piper joe): name -> ``{"items", "corpus_wer", "mean_mos", "mean_speaker_similarity"}``.
    beside: dict[str, dict[str, float]] = field(default_factory=dict)

    def means(self) -> dict[str, float]:
        """Mean of each metric over the items that have it (NaN values skipped); absent metrics left out."""
        result = {}
        for name in _METRICS:
            values = [v for row in self.rows if (v := getattr(row, name)) is not None and math.isfinite(v)]
            if values:
                result[name] = float(np.mean(values))
        return result

    def _corpus_rate(self, edits: str, length: str) -> float | None:
        counted = [row for row in self.rows if getattr(row, edits) is not None]
        if not counted:
            return None
        return sum(getattr(r, edits) for r in counted) / sum(getattr(r, length) for r in counted)

    @property
    def corpus_wer(self) -> float | None:
        """Sum of word edits over sum of reference words (None without the Whisper judge)."""
        return self._corpus_rate("word_edits", "reference_words")

    @property
    def corpus_cer(self) -> float | None:
        """Sum of character edits over sum of reference characters."""
        return self._corpus_rate("char_edits", "reference_chars")

    def summary(self) -> dict[str, float | int]:
        """Item count, corpus WER/CER and the means, keyed by field name."""
        result: dict[str, float | int] = {"items": len(self.rows)}
        if self.silent_items:  # left out of the mean MOS, which a silent failure would otherwise lift or lower
            result["items_without_speech"] = self.silent_items
        if self.corpus_wer is not None:
            result["corpus_wer"] = self.corpus_wer
            result["corpus_cer"] = self.corpus_cer
        result.update({f"mean_{name}": value for name, value in self.means().items()})
        return result

    def to_dict(self) -> dict:
        """JSON-ready: ``summary``, ``settings`` and ``rows`` (non-finite numbers become null)."""
        rows = [{k: _finite_or_none(v) for k, v in asdict(row).items()} for row in self.rows]
        beside = {name: {k: _finite_or_none(v) for k, v in values.items()} for name, values in self.beside.items()}
        return {"summary": self.summary(), "settings": self.settings, "beside": beside, "rows": rows}

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @property
    def silent_items(self) -> int:
        """Clips in which no speech was heard: no MOS is judged for them (silence had scored 1.97)."""
        return sum(row.speech_seconds == 0 for row in self.rows)

    def _summary_lines(self) -> list[tuple[str, str]]:
        lines = [("items", str(len(self.rows)))]
        if self.silent_items:
            lines.append(("items without speech (no MOS)", str(self.silent_items)))
        if self.corpus_wer is not None:
            lines += [("corpus WER", f"{self.corpus_wer:.1%}"), ("corpus CER", f"{self.corpus_cer:.1%}")]
        lines += [
            (f"mean {_METRICS[name][0]}", _METRICS[name][2].format(value)) for name, value in self.means().items()
        ]
        return lines

    def _item_columns(self) -> list[str]:
        return [name for name in _METRICS if any(getattr(row, name) is not None for row in self.rows)]

    def _item_cells(self, row: EvalRow, columns: list[str], transcript: bool) -> list[str]:
        cells = [row.id]
        for name in columns:
            value = getattr(row, name)
            cells.append("-" if value is None or not math.isfinite(value) else _METRICS[name][2].format(value))
        return [*cells, row.transcript or ""] if transcript else cells

    def _item_header(self, columns: list[str], transcript: bool) -> list[str]:
        header = ["id", *(_METRICS[name][1] for name in columns)]
        return [*header, "transcript"] if transcript else header

    def to_markdown(self) -> str:
        """A summary table (corpus rates and means) and a per-item table."""
        columns = self._item_columns()
        lines = ["# Chorus evaluation", ""]
        if self.settings:
            lines += ["Judges: " + ", ".join(f"{k} = {v}" for k, v in self.settings.items()), ""]
        lines += _markdown_table(["metric", "value"], [list(line) for line in self._summary_lines()])
        if self.beside:
            lines += ["", "## Beside", ""]
            lines += _markdown_table(self._beside_header(), self._beside_rows())
        lines += ["", "## Per item", ""]
        transcript = any(row.transcript is not None for row in self.rows)
        lines += _markdown_table(
            self._item_header(columns, transcript), [self._item_cells(row, columns, transcript) for row in self.rows]
        )
        return "\n".join(lines) + "\n"

    def _beside_header(self) -> list[str]:
        return ["clips", "items", "WER", "predicted MOS", "speaker similarity"]

    def _beside_rows(self) -> list[list[str]]:
        def cell(values: dict, key: str, spec: str) -> str:
            value = values.get(key)
            return "-" if value is None or not math.isfinite(value) else spec.format(value)

        rows = []
        for name, values in {"these clips": self.summary(), **self.beside}.items():
            rows.append(
                [
                    name,
                    str(int(values.get("items", 0))),
                    cell(values, "corpus_wer", "{:.1%}"),
                    cell(values, "mean_mos", "{:.2f}"),
                    cell(values, "mean_speaker_similarity", "{:.3f}"),
                ]
            )
        return rows

    def rich_tables(self) -> list[Table]:
        """The same tables for the terminal; transcripts only go to the files (too wide here)."""
        summary = Table("metric", "value", title="Chorus evaluation")
        for name, value in self._summary_lines():
            summary.add_row(name, value)
        tables = [summary]
        if self.beside:
            beside = Table(*self._beside_header(), title="Beside (same texts, same judges)")
            for row in self._beside_rows():
                beside.add_row(*row)
            tables.append(beside)
        columns = self._item_columns()
        items = Table(*self._item_header(columns, transcript=False), title="Per item")
        for row in self.rows:
            items.add_row(*self._item_cells(row, columns, transcript=False))
        return [*tables, items]

    def write(self, out: str | os.PathLike) -> list[Path]:
        """Write ``out``: Markdown if it ends in ``.md``, JSON if ``.json``, otherwise a folder with
        ``report.md`` and ``report.json``. Returns the files written."""
        targets = report_files(out)
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(
                self.to_json() if target.suffix.lower() == ".json" else self.to_markdown(), encoding="utf-8"
            )
        return targets


def report_files(out: str | os.PathLike) -> list[Path]:
    """The files :meth:`EvalReport.write` writes for ``out``: ``out`` itself where it ends in ``.md`` or
    ``.json``, else ``report.md`` and ``report.json`` in the folder ``out``. ``ValueError`` for a file of
    another kind ("report.txt" had become a folder of that name; "run-1.5" is a folder)."""
    out = Path(out)
    if out.suffix.lower() in (".md", ".json"):
        return [out]
    if out.suffix[1:].isalpha() and not out.is_dir():
        raise ValueError(f"{out}: a report is written as .md or .json, or into a folder (a name with no suffix)")
    return [out / "report.md", out / "report.json"]


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        # A bare '|' inside a transcript would split its cell.
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *map(line, rows)]


def _load(source: AudioSource, sample_rate: int) -> np.ndarray:
    """Audio ``[samples]`` at :data:`SAMPLE_RATE` from a path (errors name the file) or an array."""
    if isinstance(source, np.ndarray):
        audio = np.asarray(source, dtype=np.float32).reshape(-1)
        if sample_rate != SAMPLE_RATE and audio.size:
            audio = soxr.resample(audio, sample_rate, SAMPLE_RATE, quality="HQ")
        return audio
    return load_audio(source, SAMPLE_RATE)


class _SpeakerReferences:
    """Embeds each reference file once per evaluation: items usually share one speaker's clips."""

    def __init__(self, judge: SpeakerJudge | EncoderJudge):
        self.judge = judge
        self._files: dict[Path, np.ndarray] = {}

    def embedding(self, sources: Sequence[AudioSource], sample_rate: int) -> np.ndarray:
        embeddings = []
        for source in sources:
            if isinstance(source, np.ndarray):
                embeddings.append(self.judge.embed(_load(source, sample_rate), SAMPLE_RATE))
                continue
            key = Path(source).resolve()
            if key not in self._files:
                self._files[key] = self.judge.embed(load_audio(key, SAMPLE_RATE), SAMPLE_RATE)
            embeddings.append(self._files[key])
        return mean_embedding(embeddings)


def _judge_item(
    item: EvalItem,
    judges: Judges,
    speaker_refs: _SpeakerReferences | None,
    encoder_refs: _SpeakerReferences | None = None,
) -> EvalRow:
    audio = _load(item.audio, item.sample_rate)
    if not audio.size:
        raise ValueError("synthesized audio is empty")
    rate = speaking_rate(audio, item.text, SAMPLE_RATE)
    row = EvalRow(
        id=item.id,
        text=item.text,
        audio_seconds=len(audio) / SAMPLE_RATE,
        speech_seconds=rate.speech_seconds,
        words_per_second=rate.words_per_second,
        phonemes_per_second=rate.phonemes_per_second,
    )
    if judges.whisper is not None:
        row.transcript = judges.whisper.transcribe(audio, SAMPLE_RATE)
        words = word_errors(item.text, row.transcript)
        chars = char_errors(item.text, row.transcript)
        row.wer, row.word_edits, row.reference_words = words.rate, words.edits, words.reference_length
        row.cer, row.char_edits, row.reference_chars = chars.rate, chars.edits, chars.reference_length
    if speaker_refs is not None and item.speaker_references:
        reference = speaker_refs.embedding(item.speaker_references, item.sample_rate)
        row.speaker_similarity = cosine_similarity(speaker_refs.judge.embed(audio, SAMPLE_RATE), reference)
    if encoder_refs is not None and item.speaker_references:
        reference = encoder_refs.embedding(item.speaker_references, item.sample_rate)
        row.encoder_similarity = cosine_similarity(encoder_refs.judge.embed(audio, SAMPLE_RATE), reference)
    if judges.naturalness is not None and row.speech_seconds > 0:  # silence had a MOS (1.97), in the mean too
        row.mos = judges.naturalness.score(audio, SAMPLE_RATE)
    if judges.reference and item.reference is not None:
        synth, ref, alignment = analyse_pair(
            audio, _load(item.reference, item.sample_rate), SAMPLE_RATE, f0_method=judges.f0_method
        )
        row.mcd_db = mcd_on_alignment(synth, ref, alignment)
        pitch = pitch_errors_on_alignment(synth, ref, alignment)
        row.f0_rmse_hz, row.voicing_error = pitch.f0_rmse_hz, pitch.voicing_error
    if item.synthesis_seconds is not None:
        row.synthesis_seconds = item.synthesis_seconds
        row.rtf = real_time_factor(item.synthesis_seconds, row.audio_seconds)
    return row


def evaluate_pairs(items: Sequence[EvalItem], judges: Judges | None = None, progress: bool = True) -> EvalReport:
    """Judge every item (see :class:`Judges` for what runs) with a progress bar unless ``progress``
    is False. Raises :class:`EvaluationError` naming the item (and file) that could not be judged."""
    judges = judges if judges is not None else Judges()
    speaker_refs = _SpeakerReferences(judges.speaker) if judges.speaker is not None else None
    encoder_refs = _SpeakerReferences(judges.encoder) if judges.encoder is not None else None
    rows = []
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("judging", total=len(items))
        for item in items:
            bar.update(task, description=f"judging {item.id}")
            try:
                rows.append(_judge_item(item, judges, speaker_refs, encoder_refs))
            except (ValueError, OSError) as error:
                raise EvaluationError(f"item {item.id!r}: {error}") from error
            bar.advance(task)
    settings: dict = {}
    if judges.whisper is not None:
        settings["asr"] = f"whisper {judges.whisper.name} (beam {judges.whisper.beam_size})"
    if judges.speaker is not None:
        settings["speaker"] = "resemblyzer d-vector cosine"
    if judges.naturalness is not None:
        settings["naturalness"] = "distillmos predicted MOS (1-5)"
    if judges.reference:
        settings["reference"] = f"MCD and F0 (WORLD {judges.f0_method}), DTW on mel-cepstra"
    return EvalReport(rows=rows, settings=settings)


def read_eval_metadata(path: Path) -> list[tuple[str, str]]:
    """``(id, text)`` pairs from a ``id|text`` (or LJSpeech ``id|text|normalized``) file."""
    if not path.is_file():
        raise EvaluationError(f"{path}: metadata file not found (expected 'id|text' lines)")
    try:
        # utf-8-sig: a byte-order mark from Windows editors would otherwise join the first id.
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise EvaluationError(f"{path}: cannot read ({error})") from error
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split("|")]
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise EvaluationError(f"{path}:{number}: expected 'id|text', got {line!r}")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise EvaluationError(f"{path}: no 'id|text' lines")
    return pairs


def _audio_files(folder: Path) -> dict[str, Path]:
    """``id -> path`` for the audio files in an LJSpeech-style folder (``wavs/``) or a flat one."""
    if not folder.is_dir():
        raise EvaluationError(f"{folder}: not a folder")
    wavs = folder / "wavs" if (folder / "wavs").is_dir() else folder
    files = {p.stem: p for p in sorted(wavs.iterdir()) if p.suffix.lower() in AUDIO_SUFFIXES}
    if not files:
        raise EvaluationError(f"{wavs}: no audio files ({', '.join(AUDIO_SUFFIXES)})")
    return files


def speaker_reference_files(references: Path | None, limit: int = 64) -> list[Path]:
    """Up to ``limit`` clips spread evenly over the sorted folder of a speaker's real clips (none without
    a folder): the speaker reference of similarity."""
    paths = list(_audio_files(Path(references)).values()) if references is not None else []
    if not paths:
        return []
    picks = np.linspace(0, len(paths) - 1, min(len(paths), limit)).round().astype(int)
    return [paths[i] for i in np.unique(picks)]


def evaluate_folder(
    audio_dir: Path,
    metadata: Path | None = None,
    references: Path | None = None,
    *,
    max_speaker_references: int = 64,
    judges: Judges | None = None,
    progress: bool = True,
) -> EvalReport:
    """``chorus eval``: judge ``audio_dir/<id>.wav`` against the texts in ``metadata`` (default
    ``audio_dir/metadata.csv``); :meth:`EvalReport.write` saves the result.

    ``references`` is an optional LJSpeech-style folder of the target speaker's real clips: a clip
    with an item's id is that sentence's reference (MCD, F0), and up to ``max_speaker_references``
    clips spread evenly over the sorted folder form the speaker reference (similarity; each clip is
    embedded once, ~0.1 s). ``judges`` defaults to all of them (:class:`Judges`).
    """
    audio_dir = Path(audio_dir)
    if not audio_dir.is_dir():
        raise EvaluationError(f"{audio_dir}: not a folder")
    pairs = read_eval_metadata(Path(metadata) if metadata is not None else audio_dir / "metadata.csv")
    reference_files: dict[str, Path] = _audio_files(Path(references)) if references is not None else {}
    speaker_references = speaker_reference_files(references, max_speaker_references)
    items = []
    for utt_id, text in pairs:
        candidates = [audio_dir / f"{utt_id}{suffix}" for suffix in AUDIO_SUFFIXES]
        audio = next((path for path in candidates if path.is_file()), candidates[0])
        if not audio.is_file():
            raise EvaluationError(f"{audio}: audio file not found for id {utt_id!r} listed in the metadata")
        items.append(
            EvalItem(
                id=utt_id,
                audio=audio,
                text=text,
                reference=reference_files.get(utt_id),
                speaker_references=speaker_references,
            )
        )
    return evaluate_pairs(items, judges=judges, progress=progress)
