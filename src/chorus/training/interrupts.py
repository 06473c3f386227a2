"""Ctrl-C in a long training run (``chorus pretrain``, ``chorus train-vocoder``): the step under way ends, a
checkpoint is written, and the run ends with :class:`RunInterrupted` (a ``KeyboardInterrupt``), so the same
command goes on from that step. Before, the run died mid-step, said nothing, and a rerun went back to the
last periodic checkpoint: up to 499 steps, 14 minutes of the shipped base's pretraining. A second Ctrl-C
stops at once, as Python would."""

from __future__ import annotations

import signal
import threading
from pathlib import Path


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C after saving its checkpoint at ``step`` into ``checkpoint``."""

    def __init__(self, step: int, checkpoint: Path, going_on: str = "the same command goes on from there"):
        super().__init__(f"interrupted at step {step}: the checkpoint is saved in {checkpoint}; {going_on}")
        self.step, self.checkpoint = step, checkpoint


class InterruptRequest:
    """While entered, Ctrl-C (SIGINT) sets :attr:`requested` instead of raising, for the step loop to read
    between steps. Only the main thread can handle signals: elsewhere Ctrl-C keeps Python's way."""

    def __init__(self) -> None:
        self.requested = False
        self._installed = False
        self._previous: object = None

    def __enter__(self) -> InterruptRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:  # the second Ctrl-C: now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._installed:  # a handler set outside Python reads as None: the default then
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None else self._previous)
