"""Atomic file writes: write to a temporary name in the same folder, then rename over the target.

A reader (or a process restarted after ``kill -9``) sees either the old file or the new one, never
half of one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(temp_path)`` and move the result to ``path``; the temporary file is removed on error.

    The temporary name is unique and created by ``write`` itself, so the file gets the usual umask
    permissions (``mkstemp`` would leave it owner-only after the rename).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp{path.suffix}"
    try:
        write(temp)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))
