"""New virtual speakers made from existing speaker folders with sox, for learning a voice space.

A voice space learned only over the base's own speakers has nothing to learn beyond their speaker
vectors. Speakers the base has never heard, made by moving the pitch alone or the pitch and
the formants together (``speed``, with ``tempo`` restoring the speaking rate, as a longer or shorter
vocal tract would), make it learn adapter directions a new voice can use (see
``bench/results/voice_space``).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

from chorus.corpus.speakers import SOX_COMMAND
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_metadata

# F0 alone, or F0 and formants together at the same speaking rate.
VIRTUAL_CHAINS: tuple[tuple[str, ...], ...] = (
    ("speed", "0.86", "tempo", "1.163"),
    ("speed", "1.12", "tempo", "0.893"),
    ("pitch", "-220"),
    ("pitch", "240"),
    ("speed", "0.92", "pitch", "180", "tempo", "1.087"),
    ("speed", "1.07", "pitch", "-200", "tempo", "0.935"),
)


def virtual_speaker_name(source: str, chain: tuple[str, ...]) -> str:
    """``flite-rms~speed-086-tempo-1163``: the source and its chain, without dots (adapter names have none)."""
    return f"{source}~{'-'.join(chain).replace('.', '')}"


def add_virtual_speakers(root: str | Path, count: int, *, minutes: float = 1.0) -> list[Path]:
    """Add ``count`` new speaker folders to ``root``, each the first ``minutes`` of one of its speakers
    through one sox chain (speakers and chains taken in turn). Returns the new folders.

    Raises ``FileNotFoundError`` if sox is missing and ``ValueError`` if ``root`` has no speaker folders
    or fewer (speaker, chain) pairs than ``count``.
    """
    if count <= 0:
        return []
    if shutil.which("sox") is None:
        raise FileNotFoundError("virtual speakers need sox (apt-get install -y sox)")
    root = Path(root)
    sources = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file() and "~" not in p.name)
    if not sources:
        raise ValueError(f"{root}: no speaker folders (sub-folders with a metadata.csv) to derive speakers from")
    if count > len(sources) * len(VIRTUAL_CHAINS):
        raise ValueError(
            f"{root}: {len(sources)} speakers and {len(VIRTUAL_CHAINS)} sox chains make at most "
            f"{len(sources) * len(VIRTUAL_CHAINS)} virtual speakers, {count} asked for"
        )
    # Speakers and chains in turn; after each lcm(speakers, chains) the chains shift by one, so no
    # (speaker, chain) pair comes twice before all have come once.
    cycle = math.lcm(len(sources), len(VIRTUAL_CHAINS))
    made = []
    for index in range(count):
        source = sources[index % len(sources)]
        chain = VIRTUAL_CHAINS[(index + index // cycle) % len(VIRTUAL_CHAINS)]
        target = root / virtual_speaker_name(source.name, chain)
        (target / "wavs").mkdir(parents=True, exist_ok=True)
        utterances = first_minutes(discover(source)[0], minutes)
        for utterance in utterances:
            done = subprocess.run(
                [*SOX_COMMAND, str(utterance.audio_path), str(target / "wavs" / utterance.audio_path.name), *chain],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"sox failed on {utterance.audio_path}: {done.stderr.strip()[-300:]}")
        write_metadata(utterances, target)
        made.append(target)
    return made


def with_virtual_speakers(root: str | Path, folder: str | Path, count: int, *, minutes: float = 1.0) -> Path:
    """``folder`` holding links to every speaker folder of ``root`` and ``count`` virtual speakers made
    from them (:func:`add_virtual_speakers`), so that ``root`` itself is left untouched."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for speaker in sorted(p for p in Path(root).iterdir() if (p / "metadata.csv").is_file()):
        if not (folder / speaker.name).exists():
            (folder / speaker.name).symlink_to(speaker.resolve(), target_is_directory=True)
    add_virtual_speakers(folder, count, minutes=minutes)
    return folder
