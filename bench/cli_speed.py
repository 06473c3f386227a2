"""Issue 39's four figures for ``chorus synthesize``, measured on the shipped model at ``--threads`` (1):

1. ``chorus --version`` and ``chorus --help``: wall time of the real command (``--startup-repeats`` each,
   alternating), and whether torch was imported (one more run of each under ``python -X importtime``).
   Target: <= 0.5 s, torch not imported.
2. ``--out -`` streams: ``chorus synthesize --out - --format pcm --quiet`` with ``--first-words`` (600)
   words on standard input; the time from the model being loaded to the first byte on standard output.
   The CLI runs inside this script (``--as-cli``: the same ``chorus`` app, its voice loading wrapped to
   write a ``time.monotonic()`` mark on standard error once the model is loaded; the monotonic clock is
   the machine's, so the mark and this process's reading of the first byte compare). Target: <= 2 s.
3. Peak memory: the real ``chorus synthesize --out - --format pcm --quiet`` with ``--small-words`` (100)
   and ``--large-words`` (3,000) words on standard input, the two alternating, ``--memory-repeats`` pairs.
   Peak RSS of the whole CLI process is read from outside: ``ru_maxrss`` of ``os.wait4`` on the child
   (the kernel's high-water mark of its resident set); ``/proc/PID/status`` VmRSS is also sampled every
   0.1 s for the picture. Target: the large run's peak within 10 % of the small run's, per pair. Each pair
   also runs the large text with oneDNN's own primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024``, its
   default) in place of the bound ``chorus synthesize`` sets (``chorus.cli.ONEDNN_CACHE_CAPACITY``), so the
   report shows what the bound saves in memory and costs in time.
4. Library against server on ``--speed-words`` (500) words, the same thread count: the library is
   :meth:`Synthesizer.stream` in this process (loaded once, warmed up; every sentence's audio taken), the
   server a real ``chorus serve`` (``OMP_NUM_THREADS`` the same) answering ``POST /v1/audio/speech`` with
   ``response_format: pcm``, read to its last byte; the two alternate, ``--speed-repeats`` pairs, and the
   ratio is taken per pair. Target: library / server <= 1.3.

Each verdict is on the median of its runs (or of its per-pair ratios), with n and the range beside it.
Text is English prose, generated deterministically: the Harvard sentences the package ships, in order,
until the word count is reached (:func:`prose`).

    python bench/cli_speed.py --out bench/results/cli_speed

Writes ``cli_speed.md``, ``cli_speed.json`` and ``cli_speed.png`` (RSS over time, small against large).
A run that dies writes what it measured to ``cli_speed.json`` with the error (``kept_on_failure``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from run_record import LoadSampler, describe, kept_on_failure, paired_ratios, provenance  # bench/, beside this
from servers import chorus_command, free_port, get, launch, stop, timed_request, wait_idle

HARVARD = Path(__file__).resolve().parents[1] / "src" / "chorus" / "resources" / "text" / "harvard_sentences.txt"
LOADED_MARK = "chorus-cli-speed: model loaded at"
STARTUP_LIMIT_S = 0.5
FIRST_BYTE_LIMIT_S = 2.0
MEMORY_LIMIT = 1.10  # large peak / small peak
SPEED_LIMIT = 1.3  # library / server
ONEDNN_DEFAULT = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}  # oneDNN's own capacity, for comparison


# -- arithmetic (tested in tests/bench/test_cli_speed.py) ------------------------------------------------
def prose(words: int, sentences: list[str] | None = None) -> str:
    """At least ``words`` words of English prose: the Harvard sentences in order (from the start again if
    they run out), whole sentences only, so the same count always gives the same text."""
    lines = sentences if sentences is not None else [s.strip() for s in HARVARD.read_text().splitlines() if s.strip()]
    chosen, count = [], 0
    for sentence in itertools.cycle(lines):
        if count >= words:
            break
        chosen.append(sentence)
        count += len(sentence.split())
    return " ".join(chosen)


def verdict(value: float, limit: float) -> str:
    """``met`` when ``value`` is at most ``limit``, else ``NOT met`` (NaN, nothing measured: not met)."""
    return "met" if value <= limit else "NOT met"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(values: list[float], digits: int = 3) -> str:
    """``median (range low-high, n N)`` for a report line."""
    if not values:
        return "not measured"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (n 1)"
    return f"{median(values):.{digits}f} (range {min(values):.{digits}f}-{max(values):.{digits}f}, n {len(values)})"


def imports_torch(importtime_stderr: str) -> bool:
    """Whether ``python -X importtime`` output lists the ``torch`` package (``... | ... | torch``)."""
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in importtime_stderr.splitlines())


def targets(result: dict) -> list[dict]:
    """Each of issue 39's targets with its figure (a median) and verdict, from the measured runs."""
    startup = result.get("startup", {})
    rows = []
    for flag in ("--version", "--help"):
        seconds = startup.get(flag, {}).get("seconds", [])
        torch_loaded = startup.get(flag, {}).get("imports_torch", True)
        met = verdict(median(seconds), STARTUP_LIMIT_S) == "met" and not torch_loaded
        rows.append(
            {
                "target": f"`chorus {flag}` <= {STARTUP_LIMIT_S} s without torch",
                "figure": f"{summary(seconds)} s; torch imported: {'yes' if torch_loaded else 'no'}",
                "verdict": "met" if met else "NOT met",
            }
        )
    first = [r["first_byte_after_load_s"] for r in result.get("first_byte", []) if r.get("first_byte_after_load_s")]
    rows.append(
        {
            "target": f"`--out -`: first byte <= {FIRST_BYTE_LIMIT_S:g} s after the model is loaded",
            "figure": f"{summary(first)} s",
            "verdict": verdict(median(first), FIRST_BYTE_LIMIT_S),
        }
    )
    growth = memory_growth(result.get("memory", []))
    rows.append(
        {
            "target": f"peak RSS of large text within {100 * (MEMORY_LIMIT - 1):.0f} % of small text's",
            "figure": f"large / small {summary(growth)}",
            "verdict": verdict(median(growth), MEMORY_LIMIT),
        }
    )
    ratios = speed_ratios(result.get("speed", []))
    rows.append(
        {
            "target": f"library time within {SPEED_LIMIT:g}x of the server's",
            "figure": f"library / server {summary(ratios)}",
            "verdict": verdict(median(ratios), SPEED_LIMIT),
        }
    )
    return rows


def memory_growth(pairs: list[dict]) -> list[float]:
    """Per complete pair, the large run's peak RSS over the small run's."""
    done = [p for p in pairs if "small" in p and "large" in p]
    return paired_ratios([p["large"]["peak_rss"] for p in done], [p["small"]["peak_rss"] for p in done])


def cache_bound_effect(pairs: list[dict]) -> dict[str, list[float]]:
    """Per pair that has both, the large run with ``chorus synthesize``'s bound on oneDNN's cache over the
    same run with oneDNN's default: peak RSS, wall seconds and CPU seconds (user + system, from ``os.wait4``:
    what the work cost, less moved by whatever else shares the CPU)."""
    done = [p for p in pairs if "large" in p and "large_default_cache" in p]
    return {
        what: paired_ratios([p["large"][what] for p in done], [p["large_default_cache"][what] for p in done])
        for what in ("peak_rss", "total_s", "cpu_s")
    }


def speed_ratios(pairs: list[dict]) -> list[float]:
    """Per complete pair, the library's seconds over the server's."""
    done = [p for p in pairs if "library_s" in p and "server_s" in p]
    return paired_ratios([p["library_s"] for p in done], [p["server_s"] for p in done])


# -- the CLI as a child process ---------------------------------------------------------------------------
@dataclass
class CliRun:
    """One ``chorus synthesize`` run read from outside: seconds from its start to its first byte on
    standard output and to its exit, its CPU seconds, the load mark (seconds after start) where the run wrote one, bytes
    written, peak RSS (``ru_maxrss`` of ``os.wait4``) and the sampled RSS ``(seconds, bytes)``."""

    words: int
    exit_code: int = 0
    first_byte_s: float | None = None
    loaded_s: float | None = None
    total_s: float = 0.0
    cpu_s: float = 0.0
    bytes: int = 0
    peak_rss: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)

    @property
    def first_byte_after_load_s(self) -> float | None:
        if self.first_byte_s is None or self.loaded_s is None:
            return None
        return self.first_byte_s - self.loaded_s

    def record(self, samples: bool = False) -> dict:
        keys = ("words", "exit_code", "first_byte_s", "loaded_s", "total_s", "cpu_s", "bytes", "peak_rss")
        out = {k: getattr(self, k) for k in keys} | {"first_byte_after_load_s": self.first_byte_after_load_s}
        return out | ({"rss": self.rss} if samples else {})


def synthesize_command(marked: bool) -> list[str]:
    """``chorus synthesize`` streaming raw PCM to standard output; ``marked``: run inside this script,
    with the load mark (:func:`run_as_cli`)."""
    chorus = [sys.executable, str(Path(__file__).resolve()), "--as-cli"] if marked else chorus_command()
    return [*chorus, "synthesize", "--out", "-", "--format", "pcm", "--quiet"]


def run_cli(text: str, words: int, threads: int, marked: bool, extra_env: dict | None = None) -> CliRun:
    """Run ``chorus synthesize`` on ``text`` (its standard input), reading its output as it comes."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads)} | (extra_env or {})
    run = CliRun(words)
    with tempfile.TemporaryFile() as err:
        began = time.monotonic()
        child = subprocess.Popen(
            synthesize_command(marked), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env
        )
        threading.Thread(target=_feed, args=(child.stdin, text), daemon=True).start()
        done = threading.Event()
        sampler = threading.Thread(target=_sample_rss, args=(child.pid, began, run.rss, done), daemon=True)
        sampler.start()
        while chunk := child.stdout.read1(1 << 16):
            if run.first_byte_s is None:
                run.first_byte_s = time.monotonic() - began
            run.bytes += len(chunk)
        child.stdout.close()
        _, status, usage = os.wait4(child.pid, 0)
        run.total_s = time.monotonic() - began
        done.set()
        sampler.join()
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        run.exit_code, run.peak_rss = child.returncode, usage.ru_maxrss * 1024  # KiB on Linux
        run.cpu_s = usage.ru_utime + usage.ru_stime
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    for line in stderr.splitlines():
        if line.startswith(LOADED_MARK):
            run.loaded_s = float(line.split()[-1]) - began
    if run.exit_code != 0:
        raise RuntimeError(f"chorus synthesize exited {run.exit_code}: {stderr[-2000:]}")
    return run


def _feed(stdin, text: str) -> None:
    stdin.write(text.encode())
    stdin.close()


def _sample_rss(pid: int, began: float, into: list, done: threading.Event) -> None:
    """VmRSS of ``pid`` every 0.1 s until ``done`` (a process gone or reaped meanwhile ends the sampling)."""
    while not done.wait(0.1):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        rss = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), None)
        if rss is None:  # a zombie has no VmRSS
            return
        into.append((round(time.monotonic() - began, 2), rss))


def run_as_cli(argv: list[str]) -> None:
    """The ``chorus`` app on ``argv``, its ``synthesize`` writing :data:`LOADED_MARK` and ``time.monotonic()``
    to standard error when the model is loaded (``_voice`` returned). Patched through ``load_command``, so
    the command's module is imported the way the real CLI imports it."""
    import chorus.cli as cli

    original = cli.load_command

    def load_command(name: str):
        command = original(name)
        if name == "synthesize":
            module = sys.modules["chorus.cli.synthesize"]
            voice = module._voice

            def marked(options):
                chosen = voice(options)
                print(f"{LOADED_MARK} {time.monotonic():.6f}", file=sys.stderr, flush=True)
                return chosen

            module._voice = marked
        return command

    cli.load_command = load_command
    cli.app(args=argv, prog_name="chorus")


# -- the four measurements -------------------------------------------------------------------------------
def measure_startup(repeats: int) -> dict:
    """``chorus --version`` and ``chorus --help``, alternating, ``repeats`` each; then one of each under
    ``-X importtime`` to see whether torch was imported."""
    out = {flag: {"seconds": []} for flag in ("--version", "--help")}
    for _ in range(repeats):
        for flag in out:
            began = time.perf_counter()
            subprocess.run([*chorus_command(), flag], capture_output=True, check=True)
            out[flag]["seconds"].append(time.perf_counter() - began)
    for flag in out:
        traced = subprocess.run(
            [sys.executable, "-X", "importtime", *chorus_command(), flag], capture_output=True, text=True, check=True
        )
        out[flag]["imports_torch"] = imports_torch(traced.stderr)
    return out


def measure_first_byte(args, into: list) -> None:
    text = prose(args.first_words)
    for k in range(args.first_repeats):
        run = run_cli(text, args.first_words, args.threads, marked=True)
        into.append(run.record())
        print(f"first byte {k + 1}: {run.first_byte_after_load_s:.3f} s after the model loaded", flush=True)


def measure_memory(args, into: list) -> None:
    """Small, large and large with oneDNN's default cache, alternating: in this order in even pairs, the
    reverse in odd ones."""
    texts = {"small": prose(args.small_words), "large": prose(args.large_words)}
    words = {"small": args.small_words, "large": args.large_words}
    sides = ("small", "large", "large_default_cache")
    for k in range(args.memory_repeats):
        pair: dict = {}
        into.append(pair)
        for side in sides if k % 2 == 0 else sides[::-1]:
            size, env = (side, None) if side in texts else ("large", ONEDNN_DEFAULT)
            run = run_cli(texts[size], words[size], args.threads, marked=False, extra_env=env)
            pair[side] = run.record(samples=True)
        peaks = ", ".join(f"{side} {pair[side]['peak_rss'] / 2**20:.0f} MiB" for side in sides)
        print(f"memory pair {k + 1}: {peaks}", flush=True)


def measure_speed(args, work: Path, into: list, config: dict) -> None:
    """Library and server on the same text, alternating (the library first in even pairs)."""
    import torch

    from chorus.serving.tenants import OPERATOR_TENANT
    from chorus.synthesis import load_base

    torch.set_num_threads(args.threads)
    text = prose(args.speed_words)
    key = secrets.token_urlsafe(24)
    keys = work / "keys.txt"
    keys.write_text(f"{key} {OPERATOR_TENANT}\n")
    port = free_port()
    command = [*chorus_command(), "serve", "--store", str(work / "store"), "--port", str(port), "--keys", str(keys)]
    config["server_command"] = [Path(command[0]).name, *command[1:]]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    server = launch(command, port, work / "server.log", env=env, cwd=work)
    try:
        config["server_idle_wait_s"] = round(wait_idle(server.pid), 1)
        listed = json.loads(get(port, "/v1/voices", key))["data"]
        speaker = next(v["id"] for v in listed if v["type"] == "base")
        config["speaker"] = speaker
        body = json.dumps({"model": "tts-1", "input": text, "voice": speaker, "response_format": "pcm"}).encode()
        tts = load_base()

        def library() -> float:
            began = time.perf_counter()
            for _ in tts.stream(text, speaker=speaker):
                pass
            return time.perf_counter() - began

        def served() -> float:
            answer = timed_request(port, key, body)
            if answer["status"] != 200:
                raise RuntimeError(f"the server answered {answer}")
            return answer["total_s"]

        library(), served()  # warm-up, not kept
        for k in range(args.speed_repeats):
            pair: dict = {}
            into.append(pair)
            for side in ("library", "server") if k % 2 == 0 else ("server", "library"):
                pair[f"{side}_s"] = library() if side == "library" else served()
            print(f"speed pair {k + 1}: library {pair['library_s']:.2f} s, server {pair['server_s']:.2f} s", flush=True)
    finally:
        config["server_shutdown"] = stop(server)


# -- the report -------------------------------------------------------------------------------------------
def report(result: dict, out: Path) -> None:
    rows = targets(result)
    lines = [
        "# `chorus synthesize`: issue 39's figures",
        "",
        f"    {result['command']}",
        "",
        f"Measured with {describe(result['provenance'])}.",
        "",
        "| target | figure (median, range, n) | verdict |",
        "|---|---|---|",
        *(f"| {r['target']} | {r['figure']} | **{r['verdict']}** |" for r in rows),
        "",
    ]
    first = result.get("first_byte", [])
    if first:
        after_start = [r["first_byte_s"] for r in first]
        lines.append(
            f"- First byte ({result['config']['first_words']} words): {summary(after_start)} s after the CLI started; "
            f"the whole answer {summary([r['total_s'] for r in first], 2)} s."
        )
    memory = [p for p in result.get("memory", []) if "small" in p and "large" in p]
    if memory:
        small = [p["small"]["peak_rss"] / 2**20 for p in memory]
        large = [p["large"]["peak_rss"] / 2**20 for p in memory]
        lines.append(
            f"- Peak RSS (`ru_maxrss` of `os.wait4`), {result['config']['small_words']} words: {summary(small, 0)} MiB; "
            f"{result['config']['large_words']} words: {summary(large, 0)} MiB; large run's time "
            f"{summary([p['large']['total_s'] for p in memory], 1)} s."
        )
    effect = cache_bound_effect(memory)
    if effect["peak_rss"]:
        default = [p["large_default_cache"]["peak_rss"] / 2**20 for p in memory if "large_default_cache" in p]
        lines.append(
            f"- The bound on oneDNN's primitive cache (`chorus synthesize` sets `ONEDNN_PRIMITIVE_CACHE_CAPACITY`): "
            f"the large run with oneDNN's default (1024) peaked at {summary(default, 0)} MiB; bound / default, per "
            f"pair: peak RSS {summary(effect['peak_rss'])}, the run's CPU seconds {summary(effect['cpu_s'])}, its wall "
            f"seconds {summary(effect['total_s'])}."
        )
    speed = [p for p in result.get("speed", []) if "library_s" in p and "server_s" in p]
    if speed:
        lines.append(
            f"- {result['config']['speed_words']} words: library {summary([p['library_s'] for p in speed], 2)} s, "
            f"server {summary([p['server_s'] for p in speed], 2)} s (speaker {result['config'].get('speaker')}; "
            "both with oneDNN's default cache: the bound is `chorus synthesize`'s)."
        )
    if "crashed" in result:
        lines.append(f"- The run stopped early: {result['crashed']}")
    lines += [
        "",
        "Verdicts are on the median (of runs, or of per-pair ratios). One shared CPU: the load average above says "
        "what else ran; compared sides were interleaved so drift moves both.",
    ]
    (out / "cli_speed.md").write_text("\n".join(lines) + "\n")
    if memory:
        plot(memory, result["config"], out / "cli_speed.png")
    print("\n".join(lines))


def plot(pairs: list[dict], config: dict, path: Path) -> None:
    """Sampled RSS over each run's time, small runs against large ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4))
    sides = (
        ("small", "C0", f"{config['small_words']} words"),
        ("large", "C3", f"{config['large_words']} words"),
        ("large_default_cache", "0.5", f"{config['large_words']} words, oneDNN's default cache"),
    )
    for side, color, name in sides:
        for k, pair in enumerate(p for p in pairs if side in p):
            samples = pair[side].get("rss", [])
            label = name if k == 0 else None
            axis.plot([t for t, _ in samples], [b / 2**20 for _, b in samples], color=color, alpha=0.7, label=label)
    axis.set_xlabel("seconds since the CLI started")
    axis.set_ylabel("RSS, MiB (VmRSS every 0.1 s)")
    axis.grid(alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if sys.argv[1:2] == ["--as-cli"]:
        run_as_cli(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cli_speed"))
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every side")
    parser.add_argument("--startup-repeats", type=int, default=5)
    parser.add_argument("--first-repeats", type=int, default=3)
    parser.add_argument("--first-words", type=int, default=600)
    parser.add_argument("--memory-repeats", type=int, default=3, help="pairs of small and large runs")
    parser.add_argument("--small-words", type=int, default=100)
    parser.add_argument("--large-words", type=int, default=3000)
    parser.add_argument("--speed-repeats", type=int, default=5, help="pairs of library and server runs")
    parser.add_argument("--speed-words", type=int, default=500)
    parser.add_argument("--report", action="store_true", help="write the report again from OUT/cli_speed.json")
    args = parser.parse_args()
    if args.report:
        report(json.loads((args.out / "cli_speed.json").read_text()), args.out)
        return
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch loads, in this process too
    args.out.mkdir(parents=True, exist_ok=True)
    keep = ("first_words", "small_words", "large_words", "speed_words", "threads")
    result: dict = {
        "command": shlex.join(["python", "bench/cli_speed.py", *sys.argv[1:]]),
        "provenance": provenance(args.threads, "chorus synthesize --out - (CLI); Synthesizer.stream; chorus serve"),
        "config": {k: getattr(args, k) for k in keep} | {"cpus": os.cpu_count()},
        "first_byte": [],
        "memory": [],
        "speed": [],
    }
    work = Path(tempfile.mkdtemp(prefix="chorus-cli-speed-"))
    try:
        with kept_on_failure(args.out / "cli_speed.json", result), LoadSampler(every=15) as load:
            result["startup"] = measure_startup(args.startup_repeats)
            measure_first_byte(args, result["first_byte"])
            measure_memory(args, result["memory"])
            measure_speed(args, work, result["speed"], result["config"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["provenance"]["load"] = load.summary()
    (args.out / "cli_speed.json").write_text(json.dumps(result, indent=1))
    report(result, args.out)


if __name__ == "__main__":
    main()
