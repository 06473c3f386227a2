"""New virtual voices made from existing voice folders with sox, for learning a voice space.

A voice space learned only over the voices a base already knows has nothing to learn beyond their
speaker vectors. Voices the base has never heard, made by moving the pitch alone or the pitch and
the formants together (``speed``, with ``tempo`` restoring the speaking rate, as a longer or shorter
vocal tract would), make it learn adapter directions a new voice can use (see
``bench/results/voice_space``).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

from chorus.corpus.voices import SOX_COMMAND
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_metadata

# F0 alone, or F0 and formants together at the same speaking rate.
VIRTUAL_CHAINS: tuple[tuple[str, ...], ...] = (
    ("speed", "0.86", "tempo", "1.163"), ("speed", "1.12", "tempo", "0.893"), ("pitch", "-220"), ("pitch", "240"),
    ("speed", "0.92", "pitch", "180", "tempo", "1.087"), ("speed", "1.07", "pitch", "-200", "tempo", "0.935"))


def virtual_voice_name(source: str, chain: tuple[str, ...]) -> str:
    """``flite-rms~speed-086-tempo-1163``: the source and its chain, without dots (adapter names have none)."""
    return f"{source}~{'-'.join(chain).replace('.', '')}"


def add_virtual_voices(root: str | Path, count: int, *, minutes: float = 1.0) -> list[Path]:
    """Add ``count`` new voice folders to ``root``, each the first ``minutes`` of one of its voices
    through one sox chain (voices and chains taken in turn). Returns the new folders.

    Raises ``FileNotFoundError`` if sox is missing and ``ValueError`` if ``root`` has no voice folders
    or fewer (voice, chain) pairs than ``count``.
    """
    if count <= 0:
        return []
    if shutil.which("sox") is None:
        raise FileNotFoundError("virtual voices need sox (apt-get install -y sox)")
    root = Path(root)
    sources = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file() and "~" not in p.name)
    if not sources:
        raise ValueError(f"{root}: no voice folders (sub-folders with a metadata.csv) to derive voices from")
    if count > len(sources) * len(VIRTUAL_CHAINS):
        raise ValueError(f"{root}: {len(sources)} voices and {len(VIRTUAL_CHAINS)} sox chains make at most "
                         f"{len(sources) * len(VIRTUAL_CHAINS)} virtual voices, {count} asked for")
    # Voices and chains in turn; after each lcm(voices, chains) the chains shift by one, so no
    # (voice, chain) pair comes twice before all have come once.
    cycle = math.lcm(len(sources), len(VIRTUAL_CHAINS))
    made = []
    for index in range(count):
        source = sources[index % len(sources)]
        chain = VIRTUAL_CHAINS[(index + index // cycle) % len(VIRTUAL_CHAINS)]
        target = root / virtual_voice_name(source.name, chain)
        (target / "wavs").mkdir(parents=True, exist_ok=True)
        utterances = first_minutes(discover(source)[0], minutes)
        for utterance in utterances:
            done = subprocess.run([*SOX_COMMAND, str(utterance.audio_path),
                                   str(target / "wavs" / utterance.audio_path.name), *chain],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"sox failed on {utterance.audio_path}: {done.stderr.strip()[-300:]}")
        write_metadata(utterances, target)
        made.append(target)
    return made


def with_virtual_voices(root: str | Path, folder: str | Path, count: int, *, minutes: float = 1.0) -> Path:
    """``folder`` holding links to every voice folder of ``root`` and ``count`` virtual voices made
    from them (:func:`add_virtual_voices`), so that ``root`` itself is left untouched."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for voice in sorted(p for p in Path(root).iterdir() if (p / "metadata.csv").is_file()):
        if not (folder / voice.name).exists():
            (folder / voice.name).symlink_to(voice.resolve(), target_is_directory=True)
    add_virtual_voices(folder, count, minutes=minutes)
    return folder
