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
