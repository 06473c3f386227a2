"""Chorus: many voices on one text-to-speech model.

>>> import chorus
>>> tts = chorus.load_base()
>>> result = tts.synthesize("Hello there.", speaker=tts.speakers[0])
"""

__version__ = "0.1.0"


def load_base(*args, **kwargs):
    """Load the shipped base model and vocoder; see :func:`chorus.synthesis.load_base`."""
    from chorus.synthesis import load_base as _load_base

    return _load_base(*args, **kwargs)


# The library's main classes, imported on first use: `import chorus` stays fast (no torch) for the CLI.
_LAZY = {
    "Synthesizer": "chorus.synthesis",
    "SynthesisResult": "chorus.synthesis",
    "Timestamp": "chorus.text.timestamps",
}
__all__ = ["__version__", "load_base", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'chorus' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
