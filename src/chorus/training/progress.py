"""The progress bar of every training loop: a title, the bar, steps done of the total, a status field
the loop updates (the running loss), the time elapsed and an estimate of the time left (an upper
bound for loops that stop early)."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def step_progress(title: str, enabled: bool = True) -> Progress:
    """A rich ``Progress`` for a loop of steps; add its task with a ``status`` field
    (``bar.add_task("steps", total=n, status="")``). ``enabled=False`` shows nothing."""
    return Progress(
        TextColumn(f"[bold]{title}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
    )
