"""Feature cache: phoneme ids and log-mels for a whole dataset, computed once and kept in one file.

Training reads only this cache, so audio decoding, resampling, STFTs and phonemization are paid once.
The cache is a safetensors file of concatenated arrays plus offsets, and a JSON sidecar with the
speaker names, utterance keys and the text front end / mel settings it was made with (a cache made
with other settings is refused rather than silently mixed).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.progress import Progress
from safetensors.numpy import load_file, save_file

from chorus.audio.io import AudioError, load_audio
from chorus.audio.mel import MelConfig, MelSpectrogram
from chorus.audio.pitch import frame_log_f0
from chorus.data.formats import Utterance
from chorus.text import TextFrontEnd

CACHE_VERSION = 1


@dataclass
class FeatureCache:
    """All utterances of a dataset as flat arrays.

    ``mels[mel_offsets[i]:mel_offsets[i+1]]`` is utterance i's ``[frames, n_mels]`` log-mel (float16);
    ``phonemes[text_offsets[i]:text_offsets[i+1]]`` its symbol ids; ``speakers[i]`` its speaker index
    into ``speaker_names``; ``pitch`` (optional) the frame-level log F0 on the mel grid.
    """

    mels: np.ndarray
    mel_offsets: np.ndarray
    phonemes: np.ndarray
    text_offsets: np.ndarray
    speakers: np.ndarray
    speaker_names: list[str]
    keys: list[str]
    meta: dict
    pitch: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def frames(self) -> np.ndarray:
        return np.diff(self.mel_offsets)

    def text_lengths(self) -> np.ndarray:
        return np.diff(self.text_offsets)

    def item(self, index: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
        """(phoneme ids ``[text]``, log-mel ``[frames, n_mels]`` float32, speaker index, log F0 ``[frames]``)."""
        phonemes = self.phonemes[self.text_offsets[index] : self.text_offsets[index + 1]]
        frames = slice(self.mel_offsets[index], self.mel_offsets[index + 1])
        pitch = None if self.pitch is None else self.pitch[frames].astype(np.float32)
        return phonemes.astype(np.int64), self.mels[frames].astype(np.float32), int(self.speakers[index]), pitch

    def pitch_statistics(self) -> tuple[float, float]:
        """Mean and standard deviation of log F0 over frames of utterances that have any voicing."""
        if self.pitch is None:
            raise ValueError("this feature cache has no pitch; rebuild it with pitch")
        voiced = self.pitch[self.pitch > 0].astype(np.float64)
        return float(voiced.mean()), float(max(voiced.std(), 1e-3))

    def mel_statistics(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-bin mean and standard deviation over every frame ``([n_mels], [n_mels])``."""
        mean = np.zeros(self.mels.shape[1], dtype=np.float64)
        square = np.zeros_like(mean)
        for start in range(0, len(self.mels), 1 << 18):
            chunk = self.mels[start : start + (1 << 18)].astype(np.float64)
            mean += chunk.sum(0)
            square += (chunk**2).sum(0)
        mean /= len(self.mels)
        std = np.sqrt(np.maximum(square / len(self.mels) - mean**2, 1e-6))
        return mean.astype(np.float32), std.astype(np.float32)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {
            "mels": self.mels,
            "mel_offsets": self.mel_offsets,
            "phonemes": self.phonemes,
            "text_offsets": self.text_offsets,
            "speakers": self.speakers,
        }
        if self.pitch is not None:
            tensors["pitch"] = self.pitch
        # safetensors writes an array's raw buffer: a column-major array would come back scrambled.
        tensors = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
        temp = path.with_suffix(".tmp")
        save_file(tensors, str(temp))
        sidecar = {"version": CACHE_VERSION, "speaker_names": self.speaker_names, "keys": self.keys, "meta": self.meta}
        path.with_suffix(".json.tmp").write_text(json.dumps(sidecar))
        os.replace(path.with_suffix(".json.tmp"), path.with_suffix(".json"))
        os.replace(temp, path)

    @classmethod
    def load(cls, path: str | Path) -> FeatureCache:
        path = Path(path)
        sidecar = json.loads(path.with_suffix(".json").read_text())
        if sidecar.get("version") != CACHE_VERSION:
            raise ValueError(f"{path}: feature cache version {sidecar.get('version')} != {CACHE_VERSION}")
        arrays = load_file(str(path))
        return cls(
            arrays["mels"],
            arrays["mel_offsets"],
            arrays["phonemes"],
            arrays["text_offsets"],
            arrays["speakers"],
            sidecar["speaker_names"],
            sidecar["keys"],
            sidecar["meta"],
            arrays.get("pitch"),
        )


def build_feature_cache(
    utterances: list[Utterance],
    front_end: TextFrontEnd,
    mel_config: MelConfig = MelConfig(),
    *,
    speaker_names: list[str] | None = None,
    with_pitch: bool = False,
    progress: bool = True,
) -> tuple[FeatureCache, list[str]]:
    """Phonemize and featurize ``utterances`` (and log F0 if ``with_pitch``); returns the cache and a
    list of skipped items (with reasons).

    Items that cannot be used (unreadable audio, nothing speakable, fewer frames than phonemes) are
    skipped and reported, never silently dropped.
    """
    speaker_names = speaker_names or sorted({u.speaker for u in utterances})
    speaker_index = {name: i for i, name in enumerate(speaker_names)}
    mel_fn = MelSpectrogram(mel_config)
    skipped: list[str] = []
    phoneme_ids: list[list[int] | str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropped symbols are a data-check matter, not a training one
        for utt in utterances:
            # The same call as at inference, so training and synthesis see identical ids.
            try:
                phoneme_ids.append(front_end.encode([utt.text])[0])
            except ValueError as error:
                phoneme_ids.append(str(error))
    mels, phonemes, keys, speakers, pitches = [], [], [], [], []
    with Progress(disable=not progress) as bar:
        task = bar.add_task("features", total=len(utterances))
        for utt, ids in zip(utterances, phoneme_ids):
            bar.advance(task)
            if utt.speaker not in speaker_index:
                skipped.append(f"{utt.source}: speaker {utt.speaker!r} not in the speaker list")
                continue
            if isinstance(ids, str):
                skipped.append(f"{utt.source}: {ids}")
                continue
            try:
                audio = load_audio(utt.audio_path, mel_config.sample_rate)
            except AudioError as error:
                skipped.append(f"{utt.source}: {error}")
                continue
            with torch.no_grad():
                mel = mel_fn(torch.from_numpy(audio)).numpy()
            if len(mel) < len(ids):
                skipped.append(f"{utt.source}: {len(mel)} frames for {len(ids)} phonemes (audio too short)")
                continue
            if with_pitch:
                pitches.append(frame_log_f0(audio, len(mel), mel_config).astype(np.float16))
            mels.append(np.ascontiguousarray(mel, dtype=np.float16))
            phonemes.append(np.asarray(ids, dtype=np.int16))
            keys.append(utt.key)
            speakers.append(speaker_index[utt.speaker])
    if not keys:
        raise ValueError("no usable utterances: " + "; ".join(skipped[:5]))
    cache = FeatureCache(
        mels=np.concatenate(mels),
        mel_offsets=np.cumsum([0] + [len(m) for m in mels]).astype(np.int64),
        phonemes=np.concatenate(phonemes),
        text_offsets=np.cumsum([0] + [len(p) for p in phonemes]).astype(np.int64),
        speakers=np.asarray(speakers, dtype=np.int64),
        speaker_names=list(speaker_names),
        keys=keys,
        meta={"front_end": front_end.to_dict(), "mel": mel_config.to_dict()},
        pitch=np.concatenate(pitches) if with_pitch else None,
    )
    return cache, skipped
