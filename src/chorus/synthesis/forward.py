"""The one synthesis path: sentences of any number of requests and voices -> one forward -> audio.

:func:`infer_batch` reads sentences ``(text, voice, speed)`` in one forward of the acoustic model:

* only base speakers: the plain model, each row with its own speaker id;
* one adapted voice for every row: its adapter active for the whole batch, or merged into the base
  weights (``merge_adapter`` ... ``unmerge_all``) when all its methods merge and the batch is large
  enough for the merge to pay;
* anything else: the voice bank (:mod:`chorus.adapters.bank`) of the distinct adapted voices, each
  row routed to its own voice by gather + batched matmul, ``BASE`` rows to the base with their
  speaker id;
* blends beside adapted voices: two forwards (``"split"``), since a blend's vector would bypass an
  adapted voice's own speaker vector.

Rows of different speeds share the forward (``length_scale`` per row). A row that cannot be read
(unspeakable text, a bad speed) fails alone; if a batched forward itself fails, its rows are retried one
by one so only the culprit fails (:func:`read_sentences`). :func:`vocode_batch` then turns the log-mels
into audio through the base's post-filter and the vocoder, rows of equal length together (so no padding
ever reaches the vocoder), scaled rather than clipped.

The routing of rows to voices (:func:`routed`) and the batch's checks and failure isolation
(:func:`read_sentences`) are every base's: the Piper base (:mod:`chorus.synthesis.bases.piper`) runs its
generator through the same two. Bases are spoken through :class:`~chorus.synthesis.engine.Engine`, which
holds its lock over the forward only.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np
import torch
from torch import nn

from chorus.adapters.bank import banked, pack_bank
from chorus.adapters.inject import active_adapter, merge_adapter, set_active, unmerge_all
from chorus.adapters.layer import BASE
from chorus.audio.postfilter import MelPostFilter
from chorus.models.acoustic import AcousticModel
from chorus.synthesis.result import SynthesisResult
from chorus.synthesis.voices import VoiceHandle
from chorus.text import TextFrontEnd
from chorus.text.sentences import MAX_SPEED, MIN_SPEED

MERGE_MIN_BATCH = 8  # below this a merge + unmerge costs more than the adapter math it saves


class RowOutput(NamedTuple):
    """One row of a forward: its raw log-mel ``[frames, n_mels]`` and the frames of each input symbol
    (the durations the model predicted, for timestamps)."""

    mel: torch.Tensor
    frames: list[int]


@dataclass
class Sentence:
    """One sentence to read: its ``text``, who reads it, and at what ``speed`` (2.0: twice as fast)."""

    text: str
    voice: VoiceHandle
    speed: float = 1.0


@dataclass(eq=False)
class SentenceResult(SynthesisResult):
    """A :class:`SynthesisResult` of one sentence plus how it was made: ``mel`` the raw log-mel
    ``[frames, n_mels]``, ``frames`` the frames of each input symbol, ``symbols`` the model's input,
    ``batch_size`` the rows of its forward, ``path`` ``"base"``, ``"active"``, ``"merged"``, ``"bank"`` or
    ``"split"``. Its ``words`` and ``phonemes`` are filled by :meth:`timed`."""

    mel: torch.Tensor | None = None
    frames: list[int] | None = None
    symbols: str = ""
    batch_size: int = 1
    path: str = ""

    def timed(self, front_end: TextFrontEnd, seconds_per_frame: float) -> SentenceResult:
        """Itself with every word's and phoneme's start and end (from the predicted durations)."""
        self.words, self.phonemes = front_end.timings(self.text, self.frames, seconds_per_frame, self.symbols)
        return self


def check_speed(speed: object) -> None:
    """``TypeError`` for a speed that is no number, ``ValueError`` outside :data:`MIN_SPEED`-:data:`MAX_SPEED`."""
    if isinstance(speed, bool) or not isinstance(speed, numbers.Real):
        raise TypeError(f"speed must be a number (2: twice as fast), got {type(speed).__name__} {speed!r:.40}")
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise ValueError(f"speed must be from {MIN_SPEED:g} to {MAX_SPEED:g} (2: twice as fast), got {speed!r}")


def _encode(front_end: TextFrontEnd, texts: list[str]) -> list[list[int] | Exception]:
    """Symbol ids per text; one unspeakable text does not spoil the others."""
    try:
        return list(front_end.encode(texts))
    except Exception:  # noqa: BLE001 - one text is bad: encode each to find which
        return [_encode_one(front_end, text) for text in texts]


def _encode_one(front_end: TextFrontEnd, text: str) -> list[int] | Exception:
    try:
        return front_end.encode([text])[0]
    except Exception as error:  # noqa: BLE001 - reported to that sentence
        return error


def infer_mels(
    model: AcousticModel, ids: list[list[int]], speakers: list[int | torch.Tensor], speeds: list[float]
) -> list[RowOutput]:
    """One forward: ids per row -> a :class:`RowOutput` per row. A speaker is a row of the table or a
    vector ``[speaker_dim]`` (a blend)."""
    device = model.mel_mean.device
    if any(isinstance(s, torch.Tensor) for s in speakers):
        if not all(isinstance(s, torch.Tensor) for s in speakers):
            raise ValueError("a forward takes speaker rows or blend vectors, not both")
        condition = {"speaker_vectors": torch.stack([s.to(device) for s in speakers])}
    else:
        condition = {"speaker_ids": torch.tensor(speakers, device=device)}
    lengths = torch.tensor([len(seq) for seq in ids])
    phonemes = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
    for row, seq in enumerate(ids):
        phonemes[row, : len(seq)] = torch.tensor(seq)
    scales = [1.0 / s for s in speeds]
    # The model scales durations elementwise, so a [batch, 1] tensor gives each row its own speed.
    length_scale = scales[0] if len(set(scales)) == 1 else torch.tensor(scales, device=device).unsqueeze(1)
    with torch.no_grad():
        out = model.infer(phonemes.to(device), lengths.to(device), length_scale=length_scale, **condition)
        mels = model.denormalize_mel(out.mel)
    return [
        RowOutput(mels[row, : int(mask.sum())].clone(), [int(d) for d in out.durations[row, : len(ids[row])].tolist()])
        for row, mask in enumerate(out.frame_mask)
    ]


@contextmanager
def routed(model: nn.Module, voices: Sequence[VoiceHandle], merge: bool | str) -> Iterator[str]:
    """``model`` set up so that each row of the forward run inside speaks with its own voice's adapter;
    yields the path taken (``"base"``, ``"active"``, ``"merged"`` or ``"bank"``, see the module docstring)
    and puts the model back as it was. Any base's forward runs inside it: the routing is by adapter name,
    whatever the model."""
    adapters = list(dict.fromkeys(v.adapter for v in voices))
    if adapters == [None]:
        with active_adapter(model, None):
            yield "base"
        return
    if len(adapters) == 1:
        name, mergeable = adapters[0], voices[0].mergeable
        if mergeable and (merge is True or (merge == "auto" and len(voices) >= MERGE_MIN_BATCH)):
            merge_adapter(model, name)
            try:
                yield "merged"
            finally:
                unmerge_all(model)
                set_active(model, None)  # merge_adapter activated it
            return
        with active_adapter(model, name):
            yield "active"
        return
    bank = pack_bank(model, [a for a in adapters if a is not None])
    try:
        with banked(model, bank, [BASE if v.adapter is None else v.adapter for v in voices]):
            yield "bank"
    finally:
        bank.remove()


def _forward(
    model: AcousticModel, voices: list[VoiceHandle], ids: list[list[int]], speeds: list[float], merge: bool | str
) -> tuple[list[RowOutput], str]:
    """The rows' outputs and the path taken (see the module docstring)."""
    blends = [row for row, v in enumerate(voices) if v.speaker_vector is not None]
    if blends and len(blends) < len(voices):
        rest = [row for row in range(len(voices)) if row not in set(blends)]
        outputs: list[RowOutput | None] = [None] * len(voices)
        for rows in (blends, rest):
            part, _ = _forward(
                model, [voices[r] for r in rows], [ids[r] for r in rows], [speeds[r] for r in rows], merge
            )
            for row, output in zip(rows, part):
                outputs[row] = output
        return outputs, "split"
    if blends:
        with active_adapter(model, None):
            return infer_mels(model, ids, [v.speaker_vector for v in voices], speeds), "base"
    with routed(model, voices, merge) as path:
        return infer_mels(model, ids, [v.speaker_id for v in voices], speeds), path


Encoded = TypeVar("Encoded")


def read_sentences(
    sentences: Sequence[Sentence],
    encode: Callable[[list[str]], list[Encoded | Exception]],
    forward: Callable[[list[Sentence], list[Encoded]], list[SentenceResult]],
) -> list[SentenceResult | Exception]:
    """What every base does with a batch: check each sentence (text, speed), ``encode`` the texts (what the
    model reads, or the exception, per text), then ``forward`` the rows that encoded as one batch (a result
    without audio or with it, per row). If a batched forward fails, its rows are retried one by one, so only
    the culprit fails. Returns a result or the exception per sentence, in order."""
    results: list[SentenceResult | Exception | None] = [None] * len(sentences)
    live = []
    for index, sentence in enumerate(sentences):
        try:
            if not isinstance(sentence.text, str):
                raise TypeError(f"text must be a string, got {type(sentence.text).__name__}")
            check_speed(sentence.speed)
            live.append(index)
        except Exception as error:  # noqa: BLE001 - reported to that sentence
            results[index] = error
    encoded = {}
    for index, item in zip(live, encode([sentences[i].text for i in live]) if live else []):
        if isinstance(item, Exception):
            results[index] = item
        else:
            encoded[index] = item
    groups = [list(encoded)] if encoded else []
    while groups:
        group = groups.pop()
        try:
            outputs = forward([sentences[i] for i in group], [encoded[i] for i in group])
        except Exception as error:  # noqa: BLE001 - isolate the failing row
            if len(group) == 1:
                results[group[0]] = error
            else:
                groups.extend([i] for i in group)
            continue
        for index, output in zip(group, outputs):
            results[index] = output
    return results


def infer_batch(
    model: AcousticModel, front_end: TextFrontEnd, sentences: Sequence[Sentence], merge: bool | str = "auto"
) -> list[SentenceResult | Exception]:
    """Read ``sentences`` in one forward of the acoustic model (see the module docstring): a
    :class:`SentenceResult` without audio yet (``mel``, ``frames``, ``symbols``, ``path``) or the exception,
    per sentence, in order. ``merge``: ``"auto"`` merges a single mergeable voice for batches of at least
    :data:`MERGE_MIN_BATCH` rows, True always, False never."""

    def forward(rows: list[Sentence], ids: list[list[int]]) -> list[SentenceResult]:
        outputs, path = _forward(model, [s.voice for s in rows], ids, [float(s.speed) for s in rows], merge)
        return [
            SentenceResult(
                np.zeros(0, np.float32),
                0,
                0.0,
                sentence.voice.key,
                text=sentence.text,
                mel=output.mel,
                frames=output.frames,
                symbols=front_end.symbols.decode(seq),
                batch_size=len(rows),
                path=path,
            )
            for sentence, seq, output in zip(rows, ids, outputs)
        ]

    return read_sentences(sentences, lambda texts: _encode(front_end, texts), forward)


def vocode_mels(vocoder, mels: list[torch.Tensor]) -> list[np.ndarray]:
    """Audio ``[samples]`` per log-mel ``[frames, n_mels]``; mels of the same length go through the
    vocoder together (no padding); a wave that overshoots is scaled to a 0.99 peak rather than clipped."""
    audio: list[np.ndarray | None] = [None] * len(mels)
    groups: dict[int, list[int]] = {}
    for row, mel in enumerate(mels):
        groups.setdefault(mel.shape[0], []).append(row)
    with torch.no_grad():
        for rows in groups.values():
            batch = vocoder(torch.stack([mels[row] for row in rows])).float().cpu().numpy()
            for row, wave in zip(rows, batch):
                peak = float(np.abs(wave).max()) if wave.size else 0.0
                if peak > 0.99:
                    wave = wave * (0.99 / peak)
                audio[row] = wave.astype(np.float32)
    return audio


def vocode_batch(
    vocoder, postfilter: MelPostFilter, sample_rate: int, results: list[SentenceResult | Exception]
) -> list[SentenceResult | Exception]:
    """Fill each result's ``audio`` from its mel (post-filtered, then vocoded); a row the vocoder fails
    on becomes its exception, the others are spoken."""
    rows = [i for i, r in enumerate(results) if isinstance(r, SentenceResult)]
    filtered = [postfilter(results[i].mel) for i in rows]
    try:
        audio: list[np.ndarray | Exception] = vocode_mels(vocoder, filtered)
    except Exception:  # noqa: BLE001 - vocode each row to find the failing one
        audio = [_vocode_one(vocoder, mel) for mel in filtered]
    out = list(results)
    for index, wave in zip(rows, audio):
        if isinstance(wave, Exception):
            out[index] = wave
        else:
            out[index].audio, out[index].sample_rate = wave, sample_rate
    return out


def _vocode_one(vocoder, mel: torch.Tensor) -> np.ndarray | Exception:
    try:
        return vocode_mels(vocoder, [mel])[0]
    except Exception as error:  # noqa: BLE001 - reported to that sentence
        return error


def stamp(results: list[SentenceResult | Exception], started: float) -> list[SentenceResult | Exception]:
    """Set every result's ``seconds`` to the time since ``started`` (``time.perf_counter()``)."""
    elapsed = time.perf_counter() - started
    for result in results:
        if isinstance(result, SentenceResult):
            result.seconds = elapsed
    return results
