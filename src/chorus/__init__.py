"""Chorus: many voices on one text-to-speech model.

>>> import chorus
>>> tts = chorus.load_base()
>>> result = tts.synthesize("Hello there.", speaker=tts.speakers[0])
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and editors see; at run time they come from __getattr__
    from chorus.adapters.voice import BaseMismatch, VoiceError
    from chorus.synthesis import SynthesisResult, Synthesizer
    from chorus.text.timestamps import Timestamp

__version__ = "0.1.0"
__all__ = ["__version__", "load_base", "Synthesizer", "SynthesisResult", "Timestamp", "VoiceError", "BaseMismatch"]

# The library's main classes, imported on first use: `import chorus` stays fast (no torch) for the CLI.
_LAZY = {
    "Synthesizer": "chorus.synthesis",
    "SynthesisResult": "chorus.synthesis",
    "Timestamp": "chorus.text.timestamps",
    # What load_voice raises, to catch by name (a ValueError; BaseMismatch a VoiceError).
    "VoiceError": "chorus.adapters.voice",
    "BaseMismatch": "chorus.adapters.voice",
}


def load_base(*args, **kwargs):
    """Load the shipped base model and vocoder; see :func:`chorus.synthesis.load_base`."""
    from chorus.synthesis import load_base as _load_base

    return _load_base(*args, **kwargs)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'chorus' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
