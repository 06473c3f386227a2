"""What every benchmark writes beside its figures, so a results file says what it measured.

- :func:`provenance`: the commit, whether ``src/`` equals it (and which files differ), threads per
  side, the Python, and which runner or code path was timed, read when the run starts.
- :class:`LoadSampler`: the machine's 1-minute load average sampled during the run (never written by
  hand), so a reader sees what else shared the CPU.
- :func:`spread` and :func:`paired_ratios`: repeated figures as n, median, quartiles and range; a ratio
  of two systems taken per interleaved pair, so its spread shows.
- :func:`percentile`, :func:`latency_ms` and :func:`mean_sd`: request latencies as n, p50, p99, mean and
  max in milliseconds; repeats as ``a, b, c (mean ± sample sd)``.
- :func:`closed_loop`: client threads that each send their next request when the last returned.
- :func:`tree_at`: a provenance record (or an older results file's ``git``) as ``commit [with changes]``.
- :func:`kept_on_failure`: a run that dies still leaves what it measured, with the error.
- :func:`write_results`: a finished run's JSON and Markdown report, the load sampled during it in both.
- :class:`RunLog`, :func:`run_records` and :func:`run_lines`: the runs behind a results file that several
  processes, or a run resumed after a crash, filled row by row: each run's record and the rows it measured.
- :func:`own_peak_rss_mb` and :class:`ChildPeakRss`: a process's own peak RSS (VmHWM), not ``ru_maxrss``,
  which a child started by exec inherits from its parent.

Benchmarks run as ``python bench/<name>.py``, so they import this module as ``run_record``.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from chorus.atomic import atomic_write_text


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


def machine(threads: int | str, path: str, **extra) -> dict:
    """What a server benchmark's ``config`` opens with: the cores, the load average at the start, the
    :func:`provenance` record, and the torch version where torch is loaded."""
    torch = sys.modules.get("torch")
    return {
        "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(),
        "provenance": provenance(threads, path, **extra),
        **({"torch": torch.__version__} if torch is not None else {}),
        "python": sys.version.split()[0],
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
    if record.get("note"):  # what the record itself cannot say (e.g. commits that landed during the run)
        parts.append(record["note"])
    return ", ".join(parts)


def finish(record: dict, after: dict, returncode: int, load: LoadSampler) -> dict:
    """``record`` (taken at the start) completed with the end of the run: its status, the load, and what
    changed under it (a commit or edits of ``src/`` during the run go into the record's note)."""
    record = {**record, "returncode": returncode, "load": load.summary(), "load_samples": load.samples}
    changes = []
    if after["commit"] != record["commit"]:
        changes.append(f"HEAD moved to `{after['commit'][:10]}` during the run")
    if after["src_modified"] != record["src_modified"]:
        changes.append("src/ changed during the run: " + ", ".join(after["src_modified"][:6] or ["back to clean"]))
    if returncode:
        changes.append(f"the command exited with status {returncode}")
    if changes:
        record["note"] = "; ".join(changes)
    return record


def utc_now() -> str:
    """Now, in UTC, to the second (ISO 8601), as run records write their start and end."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class RunLog:
    """One run of a benchmark whose results several runs fill row by row (processes side by side, a run
    resumed after a crash, a report pass that times what build passes made): its :func:`provenance` and
    the rows it measured, kept as ``<folder>/runs/<id>.json`` from its first row on and rewritten (whole,
    by rename: other processes read these files while they are written) at each :meth:`measured` and at
    its end, so a run that dies leaves its record with what it finished. A run that measured nothing and
    did not crash leaves no record. :func:`run_records` gathers a folder's runs for the results file and
    :func:`run_lines` writes them as Markdown.

    >>> with RunLog(folder, threads=1, path="bench/x.py --rows a") as log:  # doctest: +SKIP
    ...     log.measured("a")  # after row a's figures are written
    """

    def __init__(self, folder: Path, threads: int | str, path: str):
        started, order = utc_now(), time.time_ns()  # the second to read; the nanosecond to order runs by
        self.id = f"{started.replace(':', '').replace('-', '')[:15]}-{os.getpid()}-{order % 10**6:06d}"
        self.path = Path(folder) / "runs" / f"{self.id}.json"
        self.record = provenance(threads, path, started_utc=started, started_ns=order, measured=[])
        self.load = LoadSampler()

    def __enter__(self) -> RunLog:
        self.load.__enter__()
        return self

    def measured(self, *rows: str) -> None:
        """Name ``rows`` (as the results file names them) as this run's, and write the record so far."""
        self.record["measured"] += [row for row in rows if row not in self.record["measured"]]
        self._write()

    def __exit__(self, kind, error, trace) -> None:
        self.load.__exit__(kind, error, trace)
        after = provenance(self.record["threads"], self.record["path"])
        self.record = finish(self.record, after, int(error is not None), self.load)
        if error is not None:
            self.record["crashed"] = "".join(traceback.format_exception_only(kind, error)).strip()
        self.record["ended_utc"] = utc_now()
        if self.record["measured"] or error is not None:
            self._write()

    def _write(self) -> None:
        _write_json(self.path, {**self.record, "load": self.load.summary()})


def _write_json(path: Path, value: dict) -> None:
    """``value`` to ``path`` by rename (:func:`chorus.atomic.atomic_write_text`), so that a reader never
    sees half of it."""
    atomic_write_text(path, json.dumps(value, indent=1) + "\n")


def run_records(*folders: Path, rows: Iterable[str] | None = None) -> dict[str, dict]:
    """Every :class:`RunLog` record under ``folders`` (``<folder>/runs/*.json``), by run id, in the order
    the runs started; with ``rows``, only the runs that were the last to start of those that measured one
    of them (a row measured again by a later run is that run's: the older record no longer stands behind
    the results, which keep a row's latest measurement). A record that cannot be read is left out with a
    warning on stderr, never the report's end."""
    found = {}
    # A name starting with "." is a record being written (its temporary file), not a record.
    records = (p for folder in folders for p in sorted(Path(folder).glob("runs/*.json")) if p.name[0] != ".")
    for path in records:
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            print(f"run record {path} left out: {error}", file=sys.stderr)
    found = dict(sorted(found.items(), key=lambda item: item[1].get("started_ns", 0)))
    if rows is None:
        return found
    last = {row: run for run, record in found.items() for row in record.get("measured", [])}
    standing = {last[row] for row in rows if row in last}
    return {run: record for run, record in found.items() if run in standing}


def unrecorded(records: dict[str, dict], rows: Iterable[str]) -> list[str]:
    """The ``rows`` that no run of ``records`` names (measured before runs were recorded, or cached)."""
    named = {row for record in records.values() for row in record.get("measured", [])}
    return [row for row in rows if row not in named]


def gather_runs(into: Path, *folders: Path, rows: Iterable[str] | None = None) -> None:
    """Copy the :class:`RunLog` records of ``folders`` (with ``rows``, those :func:`run_records` keeps)
    into ``into``'s, so a results folder made from them names every run behind its rows."""
    for run, record in run_records(*folders, rows=rows).items():
        _write_json(Path(into) / "runs" / f"{run}.json", record)


def runs_section(records: dict[str, dict], rows: Sequence[str] = ()) -> str:
    """The "Runs" section a results file ends with: :func:`run_lines` under a heading, and which of the
    file's ``rows`` no run names."""
    missing = unrecorded(records, rows)
    lines = ["", "## Runs", "", "The runs that measured rows of this file (`runs/` beside it):", "",
             *run_lines(records)]  # fmt: skip
    if missing:
        lines += ["", f"{len(missing)} row(s) with no run record (measured before runs were recorded): "
                  + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")]  # fmt: skip
    return "\n".join([*lines, ""])


def run_lines(records: dict[str, dict], shown: int = 6) -> list[str]:
    """``records`` (:func:`run_records`) as Markdown bullets: each run's :func:`describe` sentence, its
    start and end, and the rows it measured (the first ``shown`` named)."""
    lines = []
    for run, record in records.items():
        rows = record.get("measured", [])
        named = ", ".join(rows[:shown]) + (f" and {len(rows) - shown} more" if len(rows) > shown else "")
        ended = record.get("ended_utc") or "still running or killed"
        status = f"; crashed: {record['crashed']}" if record.get("crashed") else ""
        lines.append(
            f"- run `{run}` ({record.get('started_utc')} to {ended}{status}): {describe(record)}; "
            f"measured {len(rows)} row(s){': ' + named if rows else ''}."
        )
    return lines


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
    return Spread(
        n=len(ordered),
        median=percentile(ordered, 50),
        q1=percentile(ordered, 25),
        q3=percentile(ordered, 75),
        low=ordered[0],
        high=ordered[-1],
        mean=statistics.fmean(ordered),
        sd=statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
    )


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float], zero: float | None = None) -> list[float]:
    """Each interleaved pair's ratio ``numerators[i] / denominators[i]``: a ratio of two systems measured
    in alternation is taken pair by pair, so load that drifts over the run moves both sides of a pair,
    and the spread of the ratios shows what is left. A denominator of 0 is an error, unless ``zero`` is
    given: that pair's ratio is then ``zero`` (``float("nan")`` for a report that shows the other pairs)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators against {len(denominators)} denominators: not pairs")
    if zero is None and any(d == 0 for d in denominators):
        raise ValueError("a denominator is 0")
    return [n / d if d else zero for n, d in zip(numerators, denominators, strict=True)]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear interpolation, numpy's default); NaN for none."""
    if not len(values):
        return float("nan")
    ordered = sorted(float(v) for v in values)
    position = q / 100 * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def latency_ms(seconds: Sequence[float]) -> dict:
    """Latencies given in seconds as ``{"n", "p50_ms", "p99_ms", "mean_ms", "max_ms"}``; ``{"n": 0}`` for
    none (a percentile is shown with the number of requests behind it)."""
    ms = [1000 * float(s) for s in seconds]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms),
        "max_ms": max(ms),
    }


def mean_sd(values: Sequence[float], digits: int = 2, listed: bool = False) -> str:
    """``mean ± sample sd`` of ``values``, after the values themselves with ``listed``
    (``a, b, c (mean ± sd)``); one value alone is written as it is, with no spread to show.

    >>> mean_sd([1.0, 2.0, 3.0], listed=True)
    '1.00, 2.00, 3.00 (2.00 ± 1.00)'
    """
    if not values:
        raise ValueError("no values to take the spread of")
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    summary = f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"
    if not listed:
        return summary
    return ", ".join(f"{v:.{digits}f}" for v in values) + f" ({summary})"


def tree_at(record: dict) -> str:
    """The code a result was measured with, in a few words: ``abc1234`` or ``abc1234 with uncommitted
    changes to src/`` from a :func:`provenance` record; an older results file's own ``git`` as written."""
    if "git" in record:
        return record["git"]
    commit = str(record.get("commit", ""))[:7] or "no commit"
    return commit if record.get("src_clean") else f"{commit} with uncommitted changes to src/"


@dataclass(frozen=True)
class Sent:
    """One request of a :func:`closed_loop`: which client sent it, when it returned (``time.perf_counter()``
    seconds), how long it took, and what ``send`` returned (or the exception it raised)."""

    client: int
    ended: float
    seconds: float
    outcome: object


@dataclass(frozen=True)
class Loop:
    """What a :func:`closed_loop` sent: every request, when the clients started and the seconds until the
    last stopped."""

    sent: list[Sent]
    started: float
    wall_s: float

    def within(self, start_s: float, seconds: float) -> list[Sent]:
        """The requests that returned between ``start_s`` and ``start_s + seconds`` after the start."""
        lo, hi = self.started + start_s, self.started + start_s + seconds
        return [s for s in self.sent if lo <= s.ended < hi]


def closed_loop(plans: Sequence[Iterable], send: Callable, seconds: float | None = None) -> Loop:
    """One thread per plan, all released at once (a barrier), each calling ``send(item)`` on its plan's
    items one after another (the next when the last returned). Without ``seconds`` every plan runs to its
    end; with it the clients stop after that long (a plan may then be endless), each after the request it
    is in. An exception from ``send`` is recorded as that request's outcome and the client goes on."""
    stop = threading.Event()
    lock = threading.Lock()
    sent: list[Sent] = []
    start = threading.Barrier(len(plans) + 1)

    def client(index: int, plan: Iterable) -> None:
        start.wait()
        for item in plan:
            if stop.is_set():
                return
            began = time.perf_counter()
            try:
                outcome = send(item)
            except Exception as error:  # noqa: BLE001 - the caller counts it
                outcome = error
            ended = time.perf_counter()
            with lock:
                sent.append(Sent(index, ended, ended - began, outcome))

    threads = [threading.Thread(target=client, args=(k, plan), daemon=True) for k, plan in enumerate(plans)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    if seconds is not None:
        stop.wait(seconds)
        stop.set()
    for thread in threads:
        thread.join()
    return Loop(sent, began, time.perf_counter() - began)


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


# ``ru_maxrss`` (getrusage, wait4) is not a child's own peak: at exec Linux keeps the old address space's
# high-water mark, and Python starts children with vfork, so the old address space is the parent's. A bench
# that has loaded its judges then reads every later child at no less than its own peak (bench/bases.py's
# 3-minute Piper adaptations read 2.7 GB; their own peak was 1.6 GB). VmHWM belongs to the address space
# that exec starts afresh.


def _vm_hwm_kb(status: Path) -> int:
    """VmHWM (kB) in a ``/proc/<pid>/status`` file."""
    line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM"))
    return int(line.split()[1])


def own_peak_rss_mb() -> float:
    """This process's own peak RSS in MB since it was exec'd (Linux: VmHWM)."""
    return _vm_hwm_kb(Path("/proc/self/status")) / 1024


class ChildPeakRss:
    """A child's own peak RSS, read from its VmHWM every ``interval`` seconds while it runs (a high-water
    mark, so a late read still holds an earlier peak; only a peak in the last ``interval`` before the
    child exits can be missed). Start it after ``Popen`` returned (the child has exec'd); ``mb`` after
    the ``with`` block."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.status, self.interval, self.kb = Path(f"/proc/{pid}/status"), interval, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            try:
                self.kb = max(self.kb, _vm_hwm_kb(self.status))
            except (OSError, StopIteration):  # gone, or a zombie: no address space left
                return
            if self.done.wait(self.interval):
                return

    def __enter__(self) -> ChildPeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    @property
    def mb(self) -> float:
        return self.kb / 1024


def _plain(value):
    """JSON for what ``json`` cannot write by itself: dataclasses, paths, numpy scalars."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def write_results(out: Path, stem: str, result: dict, load: LoadSampler, report: Callable[[dict], str]) -> None:
    """``out/<stem>.json`` and ``out/<stem>.md`` (``report(result)``, also printed) of a finished run, with the
    load ``load`` sampled during it in ``result["provenance"]``."""
    result["provenance"]["load"] = load.summary()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (out / f"{stem}.md").write_text(text)
    print(text)
