"""The step loop every adaptation recipe shares: train steps, a held-out evaluation every few steps,
a copy of the trained tensors at the best evaluation, and early stopping when the held-out loss stops
improving or the time budget runs out.

A few minutes of a voice overfit quickly: the held-out mel loss turns up well before a step cap a user
would pick, so the recipes keep the best evaluation's tensors rather than the last step's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from chorus.training.progress import step_progress

State = TypeVar("State")


class BestSnapshot(Generic[State]):
    """The lowest held-out value seen so far, the step it was seen at and a copy of what reached it
    (``take()``, called only on improvement); ``stale`` counts the evaluations since it last improved."""

    def __init__(self, value: float, state: State, step: int = 0):
        self.value, self.state, self.step = value, state, step
        self.stale = 0

    def offer(self, value: float, step: int, take: Callable[[], State]) -> bool:
        """Keep ``take()`` if ``value`` is strictly lower than the best; whether it was."""
        if value < self.value:
            self.value, self.state, self.step, self.stale = value, take(), step, 0
            return True
        self.stale += 1
        return False


# Why a loop ended, as a card and a command say it (a new user's probe: a run cut by --max-minutes read as done).
STOPPED_BY = {
    "steps": "its step cap",
    "patience": "early stopping (the held-out loss stopped improving)",
    "time": "its time budget (--max-minutes)",
    "interrupted": "an interrupt (Ctrl-C); the best evaluation so far is kept",
}


@dataclass
class LoopResult(Generic[State]):
    best: BestSnapshot[State]
    steps: int  # steps taken (early stopping may end before the cap)
    seconds: float  # training time, evaluations included
    history: list[dict] = field(default_factory=list)  # {"step", "val_mel"} and, after step 0, "train_mel"
    stopped: str = "steps"  # a key of STOPPED_BY

    def stop_note(self) -> str:
        """Why and where it ended: "stopped by its time budget (--max-minutes) at step 112; best at step 100"."""
        return stop_note(self.stopped, self.steps, self.best.step)


def stop_note(stopped: str, steps: int, best_step: int | None = None) -> str:
    """A run's end as its card says it: why (a key of :data:`STOPPED_BY`), at which step, and where the kept
    tensors come from when that is another step."""
    best = "" if best_step is None else f"; best at step {best_step}"
    return f"stopped by {STOPPED_BY[stopped]} at step {steps}{best}"


@dataclass(frozen=True)
class StepLoop:
    """``steps`` at most, evaluated every ``eval_every`` steps and at the last; stops after ``patience``
    evaluations without improvement (``None``: never), once ``max_seconds`` of training have passed, or, with
    ``keep_on_interrupt``, at an interrupt (Ctrl-C: the best evaluation so far is what the run keeps, not
    nothing). ``title`` heads the progress bar (none when ``progress`` is false)."""

    steps: int
    eval_every: int
    title: str
    patience: int | None = None
    max_seconds: float = math.inf
    progress: bool = True
    # Only for a command that says so and exits as interrupted (`chorus adapt`): elsewhere an interrupt stops the
    # whole program (a benchmark must not record a cut run as a result).
    keep_on_interrupt: bool = False

    def run(
        self,
        train_step: Callable[[int], float],
        evaluate: Callable[[int], float],
        take: Callable[[], State],
    ) -> LoopResult[State]:
        """Evaluate once before training (step 0), then call ``train_step(step)`` for steps 1, 2, ...;
        it returns that step's training loss. ``evaluate(step)`` returns the held-out loss; ``take()``
        copies what trains (called at step 0 and at each improvement)."""
        first = evaluate(0)
        best = BestSnapshot(first, take())
        history = [{"step": 0, "val_mel": first}]
        running: list[float] = []
        started = time.perf_counter()
        step, stopped = 0, "steps"
        with step_progress(self.title, self.progress) as bar:
            task = bar.add_task("steps", total=self.steps, status="")
            try:
                while step < self.steps:
                    step += 1
                    running.append(train_step(step))
                    if step % self.eval_every == 0 or step == self.steps:
                        value = evaluate(step)
                        history.append({"step": step, "train_mel": float(np.mean(running)), "val_mel": value})
                        running = []
                        best.offer(value, step, take)
                    last = running[-1] if running else history[-1]["train_mel"]
                    bar.update(task, completed=step, status=f"mel {last:.3f} best held-out {best.value:.3f}")
                    if step == self.steps:
                        break  # the cap, whatever else ran out at the same step
                    if self.patience is not None and best.stale >= self.patience:
                        stopped = "patience"
                        break
                    if time.perf_counter() - started > self.max_seconds:
                        stopped = "time"
                        break
            except KeyboardInterrupt:
                if not self.keep_on_interrupt:
                    raise
                stopped = "interrupted"  # the step under way is lost; the best evaluation before it stands
        return LoopResult(best, step, time.perf_counter() - started, history, stopped)
