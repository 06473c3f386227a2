"""``chorus`` with the server's Python allocations traced, for ``bench/soak.py --trace-memory``.

Runs the ``chorus`` command line (``python bench/traced_serve.py serve ...``) under :mod:`tracemalloc`
(``CHORUS_TRACE_FRAMES`` frames per allocation, default 8). Each SIGUSR1 writes a snapshot,
``snapshot-N.pickle`` in the folder ``CHORUS_SNAPSHOTS``, after a garbage collection: two snapshots taken
minutes apart say whether Python objects grow (a leak, with the lines that allocate it) or whether the
resident memory grows beside them (native memory: torch, glibc's arenas). Onboarding jobs' processes are
forked from a fork server, a fresh interpreter: they are not traced.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from pathlib import Path


def main() -> None:
    folder = Path(os.environ["CHORUS_SNAPSHOTS"])
    folder.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(int(os.environ.get("CHORUS_TRACE_FRAMES", "8")))
    taken = [0]

    def snapshot(signum, frame) -> None:
        taken[0] += 1
        gc.collect()
        path = folder / f"snapshot-{taken[0]}.pickle"
        tracemalloc.take_snapshot().dump(str(path.with_suffix(".partial")))
        path.with_suffix(".partial").rename(path)  # whole, or not there

    signal.signal(signal.SIGUSR1, snapshot)
    from chorus.cli import app

    sys.argv = ["chorus", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
