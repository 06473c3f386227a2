"""Warnings about a caller's text that point at the caller's line, not at the Chorus module that noticed.

``stacklevel`` counts frames, and a text passes through several of Chorus's (the synthesizer, the layout,
the front end) before one of them finds a character it cannot say; a fixed level points inside the package.
:func:`warn_caller` counts the frames up to the first outside it (Python 3.12's ``skip_file_prefixes``
does this; Chorus supports 3.11)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parents[1])  # .../chorus


def warn_caller(message: str, category: type[Warning]) -> None:
    """Warn ``message`` as ``category``, attributed to the first frame outside the chorus package."""
    frame, level = sys._getframe(1), 2  # stacklevel 2: the frame that called this function
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
