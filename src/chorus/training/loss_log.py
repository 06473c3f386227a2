"""A training run's loss log: ``log.csv``-style rows appended as training goes, and their plot.

Every resumable loop keeps one. A run resumed from a checkpoint at step S first drops the rows
logged after S (written by a run that then died: that work is lost and about to be redone), so the
log always matches the checkpoint it continues from.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


class LossLog:
    """A CSV log with a ``step`` column first; ``fields`` are its columns, in order.

    Creating one (re)writes the file with the header and the old rows of steps ``<= resume_step``
    (none for a fresh run). Each :meth:`append` opens, writes and closes the file, so the rows are on
    disk when it returns.
    """

    def __init__(self, path: str | Path, fields: Sequence[str], resume_step: int = 0):
        if not fields or fields[0] != "step":
            raise ValueError(f"a loss log's first column is 'step', got {list(fields)}")
        self.path, self.fields = Path(path), list(fields)
        kept = [row for row in read_log(self.path) if int(row["step"]) <= resume_step] if self.path.is_file() else []
        with self.path.open("w", newline="") as handle:
            writer = self._writer(handle)
            writer.writeheader()
            writer.writerows(kept)

    def _writer(self, handle) -> csv.DictWriter:
        return csv.DictWriter(handle, fieldnames=self.fields, extrasaction="ignore", lineterminator="\n")

    def append(self, rows: Iterable[Mapping[str, object]]) -> None:
        """Append rows (column -> value, written as ``str(value)``: format numbers before)."""
        with self.path.open("a", newline="") as handle:
            self._writer(handle).writerows(rows)


def read_log(path: str | Path) -> list[dict[str, str]]:
    with Path(path).open(newline="") as handle:
        return list(csv.DictReader(handle))


def plot_losses(
    log_path: str | Path, png_path: str | Path, names: Sequence[str], *, title: str, log_scale: bool = False
) -> None:
    """Loss curves from a log to a PNG: one panel per column in ``names``, one curve per value of the
    log's ``split`` column (``train`` lines, ``val`` points), or one curve when it has none.
    ``log_scale``: a logarithmic loss axis. Draws on an Agg canvas: no display, no global pyplot state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_log(log_path)
    if not rows:
        return
    splits = list(dict.fromkeys(row["split"] for row in rows)) if "split" in rows[0] else [None]
    figure = Figure(figsize=(4.3 * len(names), 3.6))
    FigureCanvasAgg(figure)
    for index, name in enumerate(names):
        axes = figure.add_subplot(1, len(names), index + 1)
        for split in splits:
            points = [(int(row["step"]), float(row[name])) for row in rows if split is None or row["split"] == split]
            style = "o-" if split == "val" else "-"
            axes.plot(*zip(*points, strict=True), style, label=split, markersize=3)
        axes.set(
            title=name if "loss" in name else f"{name} loss", xlabel="step", yscale="log" if log_scale else "linear"
        )
        axes.grid(alpha=0.3)
        if splits != [None]:
            axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
