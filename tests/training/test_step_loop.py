"""The shared step loop: evaluations, the best snapshot, early stopping and the time budget."""

from __future__ import annotations

import math

import pytest

from chorus.training.step_loop import BestSnapshot, StepLoop


def run(losses: dict[int, float], **options):
    """A loop whose held-out loss at step s is ``losses[s]``; the 'trained state' is the step reached."""
    state = {"step": 0}

    def train_step(step: int) -> float:
        state["step"] = step
        return float(step)

    loop = StepLoop(title="test", progress=False, **options)
    return loop.run(train_step, lambda step: losses[step], lambda: state["step"])


def test_keeps_the_best_evaluation_and_stops_after_patience():
    losses = {0: 5.0, 2: 4.0, 4: 3.0, 6: 3.5, 8: 3.2, 10: 3.9, 12: 1.0}
    result = run(losses, steps=12, eval_every=2, patience=3)
    assert result.steps == 10 and result.stopped == "patience"  # three evaluations (6, 8, 10) without beating 4's
    assert (result.best.value, result.best.step, result.best.state) == (3.0, 4, 4)
    assert [h["step"] for h in result.history] == [0, 2, 4, 6, 8, 10]
    assert result.history[1] == {"step": 2, "train_mel": 1.5, "val_mel": 4.0}  # mean of steps 1 and 2


def test_without_patience_runs_every_step_and_evaluates_the_last():
    losses = {0: 5.0, 3: 4.0, 6: 6.0, 7: 6.5}
    result = run(losses, steps=7, eval_every=3)
    assert result.steps == 7 and result.stopped == "steps"
    assert [h["step"] for h in result.history] == [0, 3, 6, 7]
    assert result.best.state == 3


def test_no_improvement_keeps_the_start():
    result = run({0: 1.0, 1: 1.0, 2: 2.0}, steps=2, eval_every=1)
    assert (result.best.step, result.best.state, result.best.value) == (0, 0, 1.0)


def test_time_budget_ends_the_loop():
    result = run(dict.fromkeys(range(100), 1.0), steps=99, eval_every=1, max_seconds=-1.0)
    assert result.steps == 1 and result.stopped == "time"
    assert result.stop_note() == "stopped by its time budget (--max-minutes) at step 1; best at step 0"


def test_an_interrupt_keeps_the_best_evaluation_so_far():
    """A new user's probe: Ctrl-C at step 99 of `chorus adapt` threw every step away (no folder, no word). The
    loop ends there with its best evaluation, which the run then saves, and says why it ended."""
    state = {"step": 0}

    def train_step(step: int) -> float:
        if step == 5:
            raise KeyboardInterrupt
        state["step"] = step
        return 1.0

    losses = {0: 5.0, 2: 3.0, 4: 4.0}
    keeping = StepLoop(steps=10, eval_every=2, title="t", progress=False, keep_on_interrupt=True)
    result = keeping.run(train_step, losses.get, lambda: state["step"])
    assert (result.stopped, result.steps, result.best.step, result.best.state) == ("interrupted", 5, 2, 2)
    assert "an interrupt (Ctrl-C)" in result.stop_note()
    # Only where asked (`chorus adapt`): a review found a benchmark recording a cut run as a result.
    with pytest.raises(KeyboardInterrupt):
        StepLoop(steps=10, eval_every=2, title="t", progress=False).run(train_step, losses.get, lambda: 0)


def test_the_step_cap_is_why_a_run_that_reaches_it_ends():
    """A review: a run reaching its cap as its time ran out was said to have stopped by its time budget."""
    result = run(dict.fromkeys(range(4), 1.0), steps=1, eval_every=1, max_seconds=-1.0)
    assert (result.steps, result.stopped) == (1, "steps")


def test_best_snapshot_takes_only_on_improvement():
    taken = []
    best = BestSnapshot(math.inf, None)
    for step, value in enumerate([3.0, 2.0, 2.0, 2.5, 1.0]):
        best.offer(value, step, lambda step=step: taken.append(step) or step)
    assert taken == [0, 1, 4] and best.state == 4 and best.stale == 0
