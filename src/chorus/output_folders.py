"""Whether a folder may be written whole, the old one swapped out (:func:`chorus.atomic.atomic_write_folder`):
what the swap would destroy is refused before any work, by the command line (``--out``) and the library
(``adapt(..., out)``) alike. The library's ``adapt`` had deleted the recordings it was given as ``out``, and a
folder of voices given for one voice's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from chorus.atomic import recover_interrupted_write

# What a desktop leaves in any folder it shows: no one's data, and no reason to refuse a folder.
DESKTOP_LEFTOVERS = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


@dataclasses.dataclass(frozen=True)
class OutputKind:
    """What is written as one folder: ``noun`` to name it, ``marks`` (a file that says a folder is one) and
    ``files`` (every file it writes: a folder holding anything else is more than one)."""

    noun: str
    marks: tuple[str, ...]
    files: tuple[str, ...]


def output_folder_problem(
    out: Path,
    data: Path,
    overwrite: bool,
    kind: OutputKind,
    option: str = "--out",
) -> str | None:
    """Why ``kind`` may not be written to ``out`` from the recordings in ``data``, or None; ``option`` names
    ``out`` as the caller offers it (the library's ``adapt`` says `` `out` ``).

    Refused: the recordings (``out`` is, holds or lies inside ``data``); the current folder; a folder holding
    anything but one of ``kind``, with ``overwrite`` or not (``voices`` for ``voices/NAME`` would lose them
    all); and one of ``kind`` unless ``overwrite``. A link is refused too (the swap would replace the link,
    not what it points to)."""
    out, data = Path(out), Path(data)
    try:
        recover_interrupted_write(out)  # a swap killed half-way: its old folder back first, then judged
        return _output_problem(out, data, overwrite, kind, option)
    except OSError as error:
        return f"{out}: {error}"


def _output_problem(out: Path, data: Path, overwrite: bool, kind: OutputKind, option: str) -> str | None:
    out_path, data_path = out.resolve(), data.resolve()
    if out_path == data_path or out_path in data_path.parents:
        return f"{out} holds the recordings ({data}), which replacing the folder would delete: give another {option}"
    if out_path.is_relative_to(data_path):
        return f"{out} is inside the recordings' folder ({data}), where it would be read as recordings: give another {option}"
    if out_path == Path.cwd().resolve() or out_path in Path.cwd().resolve().parents:
        return f"{out} is the current folder or holds it: give the name of a folder to write"
    if out.is_symlink():
        return f"{out} is a link: give the folder itself, or a new one"
    if out.exists() and not out.is_dir():
        return f"{out} is a file: give another {option} (a folder)"
    held = sorted(p.name for p in out.iterdir() if p.name not in DESKTOP_LEFTOVERS) if out.is_dir() else []
    if not held:
        return None
    if not any((out / mark).is_file() for mark in kind.marks):
        inner = [name for name in held if any((out / name / mark).is_file() for mark in kind.marks)]
        if inner:  # voices/ given for voices/NAME
            return (
                f"{out} holds {len(inner)} folder(s) of {kind.noun} ({', '.join(inner[:3])}): give {option} {out}/NAME"
            )
        return f"{out} holds files that are not {kind.noun} ({', '.join(held[:3])}), which replacing the folder would delete: give another {option}"
    # Only what the writer itself writes, as plain files: a folder or a link under one of its names is more.
    others = [
        name for name in held if name not in kind.files or (out / name).is_symlink() or not (out / name).is_file()
    ]
    if others:
        return (
            f"{out} holds {kind.noun} and more ({', '.join(others[:3])}), which replacing the folder would delete: move them out, "
            f"or give another {option}"
        )
    return (
        None if overwrite else f"{out} already holds {kind.noun}: give another {option}, or --overwrite to replace it"
    )
