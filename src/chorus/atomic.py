"""Atomic file writes: write to a temporary name in the same folder, then rename over the target.

A reader (or a process restarted after ``kill -9``) sees either the old file or the new one, never
half of one.
"""

from __future__ import annotations

import os
import shutil
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


def atomic_write_folder(folder: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(temp_folder)`` and swap the result in for ``folder`` with renames.

    The old folder is moved aside (``.NAME.old-PID``) for the instant between the two renames;
    :func:`recover_interrupted_write` puts it back if a process dies there.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    temp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        write(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        os.replace(folder, old)
    os.replace(temp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def recover_interrupted_write(folder: str | Path) -> None:
    """Finish a write that was killed between moving the old folder aside and moving the new one in:
    the old folder is the last complete one, so it is put back."""
    folder = Path(folder)
    if folder.exists():
        return
    leftovers = sorted(folder.parent.glob(f".{folder.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if leftovers:
        os.replace(leftovers[-1], folder)
