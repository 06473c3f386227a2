"""What every benchmark writes beside its figures, so a results file says what it measured.

- :func:`provenance`: the commit, whether ``src/`` equals it (and which files differ), threads per
  side, the Python, and which runner or code path was timed, read when the run starts.
- :class:`LoadSampler`: the machine's 1-minute load average sampled during the run (never written by
  hand), so a reader sees what else shared the CPU.
- :func:`spread` and :func:`paired_ratios`: repeated figures as n, median, quartiles and range; a ratio
  of two systems taken per interleaved pair, so its spread shows.
- :func:`kept_on_failure`: a run that dies still leaves what it measured, with the error.

Benchmarks run as ``python bench/<name>.py``, so they import this module as ``run_record``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()


def provenance(threads: int | str, path: str, **extra) -> dict:
    """What is measured: the commit, the files of ``src/`` that differ from it, ``threads`` (per side, as
    the benchmark sets them), and ``path``, the runner or code path timed (``"chorus serve (process job
    runner)"``). Read it when the run starts: a later commit must not be credited with an older run."""
    status = subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True, check=False)
    # Each line is "XY path": two status columns and a space, so the output is not stripped (" M src/a.py").
    modified = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    return {
        "commit": _git("rev-parse", "HEAD"),
        "src_clean": not modified,
        "src_modified": modified,
        "threads": threads,
        "python": sys.version.split()[0],
        "path": path,
        **extra,
    }


class LoadSampler:
    """The 1-minute load average every ``every`` seconds while the run lasts (a daemon thread).

    >>> with LoadSampler(every=30) as load:
    ...     pass  # the run
    >>> load.summary()  # a sample when it starts and one when it stops, at the least
    '... (1-minute, n = 2)'
    """

    def __init__(self, every: float = 30.0):
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self.samples.append(os.getloadavg()[0])
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> str:
        if not self.samples:
            return "not sampled"
        return f"{min(self.samples):.1f}-{max(self.samples):.1f} (1-minute, n = {len(self.samples)})"


def describe(record: dict) -> str:
    """A provenance record (:func:`provenance`, with ``load`` added) as one Markdown sentence."""
    commit = str(record.get("commit", ""))[:10] or "no commit"
    if record.get("src_clean"):
        source = "src/ clean"
    else:
        source = "src/ with uncommitted changes to " + ", ".join(record.get("src_modified", [])[:6])
    parts = [f"commit `{commit}` ({source})", f"{record.get('threads')} thread(s)"]
    if "load" in record:
        parts.append(f"load average during the run {record['load']}")
    parts.append(f"timed: {record.get('path')}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Spread:
    """Repeated measurements: their number, median, quartiles and range (and mean ± sample sd)."""

    n: int
    median: float
    q1: float
    q3: float
    low: float
    high: float
    mean: float
    sd: float

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.median:.3g} (n 1, no spread)"
        return f"{self.median:.3g} (IQR {self.q1:.3g}-{self.q3:.3g}, range {self.low:.3g}-{self.high:.3g}, n {self.n})"


def spread(values: Sequence[float]) -> Spread:
    """The :class:`Spread` of ``values`` (quartiles by linear interpolation, as numpy's default).

    >>> str(spread([1.0, 2.0, 3.0, 4.0]))
    '2.5 (IQR 1.75-3.25, range 1-4, n 4)'
    """
    if not values:
        raise ValueError("no values to take the spread of")
    ordered = sorted(float(v) for v in values)

    def quantile(q: float) -> float:
        position = q * (len(ordered) - 1)
        below = int(position)
        above = min(below + 1, len(ordered) - 1)
        return ordered[below] + (ordered[above] - ordered[below]) * (position - below)

    return Spread(
        n=len(ordered),
        median=quantile(0.5),
        q1=quantile(0.25),
        q3=quantile(0.75),
        low=ordered[0],
        high=ordered[-1],
        mean=statistics.fmean(ordered),
        sd=statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
    )


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Each interleaved pair's ratio ``numerators[i] / denominators[i]``: a ratio of two systems measured
    in alternation is taken pair by pair, so load that drifts over the run moves both sides of a pair,
    and the spread of the ratios shows what is left."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators against {len(denominators)} denominators: not pairs")
    if any(d == 0 for d in denominators):
        raise ValueError("a denominator is 0")
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


@contextmanager
def kept_on_failure(path: Path, result: dict) -> Iterator[dict]:
    """Run the block; if it raises, write ``result`` as it stands (what was measured so far) to ``path``
    with the error under ``"crashed"``, then let the error through. The block fills ``result`` in place."""
    try:
        yield result
    except BaseException as error:
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = {**result, "crashed": "".join(traceback.format_exception_only(type(error), error)).strip()}
        path.write_text(json.dumps(kept, indent=1, default=_plain))
        print(f"the run stopped ({kept['crashed']}); what it measured is in {path}", file=sys.stderr)
        raise


def _plain(value):
    """JSON for what ``json`` cannot write by itself: dataclasses, paths, numpy scalars."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")
