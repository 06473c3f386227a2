"""Bases by name: what ``--base`` takes, and which base a voice folder needs.

One list names the plug-ins (:data:`BASES`); this module imports none of them until a base is opened. Each
plug-in module declares ``claims(spec) -> bool`` (whether ``spec``, as ``--base`` gives it, names one of
its bases), ``open_base(spec, vocoder, device, config) -> Base`` and ``speakers(spec) -> (names, default)`` (opening no
more than naming them needs); the first that claims a spec opens it, so the
shipped Chorus base, which claims anything left (None: the shipped one, or a model folder), comes last.
Adding a kind of base is one module plus one line here.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from chorus.adapters.voice import read_voice
from chorus.models.device import checked_device
from chorus.synthesis.bases.base import Base

BASES = {
    "piper": "chorus.synthesis.bases.piper",  # a Piper voice: piper-joe, or a voice.onnx with its .onnx.json
    "chorus": "chorus.synthesis.bases.chorus",  # Chorus's acoustic model + vocoder: the default
}
CHORUS = "chorus"  # the name voices of a Chorus base record (their sha256 says which weights)


def open_base(
    spec: str | Path | None = None,
    vocoder: str | Path | None = None,
    device: str = "cpu",
    config: str | Path | None = None,
) -> Base:
    """The base ``spec`` names: None or ``"chorus"`` for the shipped Chorus base, a Chorus model folder,
    ``"piper-joe"`` (the installed Piper voice) or a Piper ``voice.onnx``. ``vocoder``: the Chorus base's
    (see :func:`chorus.synthesis.bases.chorus.open_base`); ``config``: a Piper voice's ``.onnx.json`` kept
    elsewhere than beside its ``.onnx`` (Piper's ``--config``; None: beside it)."""
    checked_device(device)
    text = None if spec is None else str(spec)
    return _plugin(text).open_base(text, vocoder, device, None if config is None else Path(config))


def base_speakers(spec: str | Path | None = None) -> tuple[list[str], str]:
    """The speakers of the base ``spec`` names (as :func:`open_base` reads it), in index order, and its default
    speaker: ``chorus speakers``."""
    text = None if spec is None else str(spec)
    return _plugin(text).speakers(text)


def _plugin(spec: str | None):
    """The plug-in module of the first base that claims ``spec``."""
    for module in BASES.values():
        plugin = importlib.import_module(module)
        if plugin.claims(spec):
            return plugin
    raise ValueError(f"no base claims {spec!r}")  # the Chorus base claims anything: only a broken list gets here


def base_of_voice(folder: str | Path) -> str | None:
    """What ``--base`` must be to speak the voice at ``folder``: None for a Chorus base's voice (the shipped
    base, or whichever model folder its sha256 names), else the name of the base it records
    (``"piper-joe"``, or a Piper voice file's name, which a caller finds as a path)."""
    recorded = read_voice(folder).base_model
    return None if recorded in (None, "", CHORUS) else recorded


__all__ = ["BASES", "CHORUS", "Base", "base_of_voice", "base_speakers", "open_base"]
