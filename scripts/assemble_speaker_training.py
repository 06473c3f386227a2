"""The speaker encoder v2's training folder, runs/speaker_corpus/encoder_training (checkpoints/speaker-encoder-v2): links to the 36 train speakers, the 216 sox-virtual speakers
made from them (as the shipped encoder's corpus), and links to the 20 Piper encoder speakers."""

import sys
import time
from pathlib import Path

from chorus.corpus.virtual import with_virtual_speakers

root = Path("runs/speaker_corpus")
folder = root / "encoder_training"
started = time.monotonic()
with_virtual_speakers(root / "train", folder, 216)
for speaker in sorted(p for p in (root / "encoder").iterdir() if (p / "metadata.csv").is_file()):
    if not (folder / speaker.name).exists():
        (folder / speaker.name).symlink_to(speaker.resolve(), target_is_directory=True)
names = sorted(p.name for p in folder.iterdir() if (p / "metadata.csv").is_file())
assert not any(
    n in ("piper-joe", "flite-slt", "festival-ked") or n.startswith(("flite-slt", "festival-ked")) for n in names
)
print(f"{len(names)} speakers in {folder} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
