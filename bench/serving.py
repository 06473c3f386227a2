"""Benchmark: the multi-tenant voice server (one resident base, an adapter cache, the dynamic batcher)
against its two baselines, in one run on the same requests, machine and seed.

On the shipped base (``load_base()``, Griffin-Lim) with N synthetic ``lora+speaker`` voices: adapter
tensors set to small random values and saved as voice folders. They sound like nothing in particular;
quality is not measured here, only speed and memory (an adapter's size and compute do not depend on
its values).

1. Throughput (requests/s, audio seconds/s) and p50/p99 latency against the number of distinct voices
   in flight. ``--concurrency`` client threads each send ``--requests-per-thread`` short sentences in
   a closed loop (the next after the last returned); request i speaks ``TEXTS[i % len]`` in voice
   ``i % N``, so every N serves the same texts and a wave of C concurrent requests holds min(C, N)
   distinct voices. The server is the :class:`Batcher` (batches of distinct voices run through the
   voice bank) or a baseline behind one FIFO worker: ``swap_one_at_a_time`` (one adapter activated
   per request, PEFT's ``set_adapter``) and, at ``--per-voice-models`` voices, ``ModelPerVoice`` (a
   full model copy per voice). Each is measured with the Griffin-Lim vocoder and with the acoustic
   model only (the engine's vocoder replaced by one that returns no audio, for every method alike),
   since Griffin-Lim dominates CPU time: the acoustic-only ratio is the headline (it is where the
   adapters' cost shows), the vocoded one is reported beside it. All voices are resident before
   timing (no cold loads), and every (method, N, vocoder) combination first runs one untimed round
   (one request per client), so each path measured (active adapter, voice bank, swapping, model
   copies, with and without the vocoder) is warm. Runs repeat ``--repeats`` times; within a repeat
   and vocoder mode the batcher runs at N = 1 and at N = ``--concurrency`` back to back (the target
   pair, so its ratio compares neighbours on the shared CPU), each beside its swap run (swap N=1,
   batcher N=1, batcher N=C, swap N=C), then every other N (batcher, swap, model copies); odd repeats
   run that sequence backwards. Every ratio is given per repeat (per pair) too, with its spread, and
   every percentile with the number of requests behind it.
   Target: 32 concurrent requests over 32 distinct voices reach >= 0.85x the throughput of 32 of one.
2. Cold-load latency of a voice: engine cache miss -> voice ready (folder checksum, safetensors
   read, adapter added to the model), resolving the voice to a plain folder or through
   ``VoiceStore.get_voice`` (commit marker + sha256 of every file in the store's local folder); with
   the voice's files in the OS page cache, and with them dropped from it first
   (``posix_fadvise(DONTNEED)``); the fraction of their pages resident just before each load is
   measured (``mincore``) and reported.
3. Resident memory of the real server process (``chorus serve`` on a free loopback port, its RSS
   read from ``/proc/PID/status``): started on an empty store, then with 10, 100, 1,000 voices
   registered in its ``VoiceStore`` (and listed through ``GET /v1/voices``), then with k of them in
   use (one speech request each), against the ``resident_bytes`` its ``/healthz`` reports. In a bench
   process beside it: the Python objects per resident voice (tracemalloc) and the RSS of
   ``ModelPerVoice``.

    python bench/serving.py --threads 1 --out bench/results/serving

On a Piper base (``--base piper-joe`` or a Piper ``voice.onnx``; issue 38's target: 32 distinct voices
>= 0.9x the throughput of one), the voices are the ``--placement``'s adapters (``chorus adapt``'s Piper
placements, default ``flow+decoder``) with random values, naming the base as adapted voices do; part 1 runs
with the batcher and the swap baseline in the one mode there is (whole synthesis: the generator makes the
audio, there is no vocoder to take away), and part 2 unless ``--cold-loads 0``. Part 3 and the model-per-voice
baseline are Chorus-base measurements and are not run there; the report says so.

    python bench/serving.py --base piper-joe --threads 1 --voices 1,32 --out runs/serving_piper

Writes ``serving.md``, ``serving.json`` and ``serving.png`` (throughput and p99 vs distinct voices).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import parse_methods
from chorus.adapters.inject import adapter_state_dict, add_adapter, remove_adapter
from chorus.adapters.voice import VoiceCard, read_voice, save_voice
from chorus.recipe import AdaptConfig
from chorus.serving.batcher import Batcher
from chorus.serving.engine import Engine, SentenceRequest
from chorus.serving.settings import ServerSettings
from chorus.serving.store import VoiceStore
from chorus.serving.tenants import DEFAULT_TENANT
from chorus.synthesis import load_base
from chorus.synthesis.bases import open_base
from chorus.synthesis.bases.piper import claims as names_piper
from chorus.training.piper_adapt import PLACEMENTS
from run_record import LoadSampler, describe, latency_ms, mean_sd, paired_ratios, percentile, provenance
from run_record import closed_loop as run_clients  # bench/, beside this script
from servers import chorus_command, free_port, get, launch, post_json, process_rss, self_rss, stop, wait_idle
from serving_baselines import ModelPerVoice, swap_one_at_a_time

TEXTS = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
]
TENANT = "bench"
TARGET = 0.85
PIPER_TARGET = 0.9  # issue 38: 32 distinct voices on the Piper base >= 0.9x the throughput of one
MB = 1 << 20


# -- voices ------------------------------------------------------------------------------------
def on_piper(args) -> bool:
    """Whether ``--base`` names a Piper base (``piper-joe`` or a ``.onnx``); results written before
    ``--base`` existed were on the Chorus base."""
    return names_piper(getattr(args, "base", None))


def make_voices(synthesizer, count: int, root: Path, method: str, scale: float, seed: int) -> dict[str, Path]:
    """``count`` voice folders ``v000``... for the base: the method's adapters with random values."""
    model, configs = synthesizer.bundle.model, AdaptConfig(methods=parse_methods(method)).method_configs()
    return random_voices(model, configs, count, root, scale, seed, base_model_sha256=synthesizer.bundle.weights_sha256)


def make_piper_voices(base, count: int, root: Path, placement: str, scale: float, seed: int) -> dict[str, Path]:
    """``count`` voice folders for the Piper ``base``: the placement's adapters (as ``chorus adapt`` on a
    Piper base makes them, :data:`PLACEMENTS`) with random values, naming the base as its voices do."""
    configs = PLACEMENTS[placement]()
    return random_voices(
        base.model, configs, count, root, scale, seed, base_model_sha256=base.sha256, base_model=base.name
    )


def random_voices(model, configs: list, count: int, root: Path, scale: float, seed: int, **base) -> dict[str, Path]:
    """``count`` voices ``v000``... of ``configs`` on ``model``, each tensor its initial value plus Gaussian
    noise of std ``scale``; ``base``: the base the voice cards name (``VoiceCard`` fields)."""
    torch.manual_seed(seed)
    folders = {}
    for k in range(count):
        voice_id = f"v{k:03d}"
        add_adapter(model, "bench", configs)
        with torch.no_grad():
            for value in adapter_state_dict(model, "bench").values():
                value.add_(torch.randn_like(value) * scale)
        card = VoiceCard(
            name=voice_id,
            methods=[c.method for c in configs],
            notes={"synthetic": "random adapter"},
            **base,
        )
        folders[voice_id] = save_voice(root / voice_id, model, "bench", configs, card)
        remove_adapter(model, "bench")
    return folders


# -- measuring helpers -------------------------------------------------------------------------
def settle() -> int:
    """RSS after a garbage collection and returning freed heap pages to the OS (glibc)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return self_rss()


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _libc():
    return ctypes.CDLL("libc.so.6", use_errno=True)


def resident_fraction(paths: list[Path]) -> float:
    """Fraction of the pages of ``paths`` in the OS page cache now (Linux ``mincore`` on a read-only
    mapping; mapping does not read the file). NaN where it cannot be asked."""
    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if address in (None, ctypes.c_void_p(-1).value):
                return float("nan")
            pages = (size + page - 1) // page
            vector = (ctypes.c_ubyte * pages)()
            ok = libc.mincore(address, size, vector) == 0
            libc.munmap(address, size)
            if not ok:
                return float("nan")
            resident += sum(v & 1 for v in vector)
            total += pages
        finally:
            os.close(fd)
    return resident / total if total else float("nan")


def drop_from_page_cache(paths: list[Path]) -> None:
    """Ask the kernel to drop the cached pages of ``paths`` (``posix_fadvise(DONTNEED)``), written back
    first (``fsync``): dirty pages of recently written files would otherwise stay."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


class NoVocoder:
    """Stands in for the engine's vocoder to time the acoustic model alone: no audio per mel."""

    def __call__(self, mels: torch.Tensor) -> torch.Tensor:
        return torch.zeros(mels.shape[0], 0)


@contextmanager
def vocoder_mode(engine: Engine, vocode: bool):
    """The engine as it is (``vocode``), or with its vocoder replaced by :class:`NoVocoder` (a Chorus base's)."""
    if vocode:
        yield
        return
    real = engine.base.vocoder
    engine.base.vocoder = NoVocoder()
    try:
        yield
    finally:
        engine.base.vocoder = real


def vocoder_modes(args) -> tuple[bool, ...]:
    """The modes timed, in order: acoustic only, then vocoded; a Piper base has whole synthesis only (its
    generator makes the audio: there is no vocoder to take away)."""
    return (True,) if on_piper(args) else (False, True)


def mode_name(vocode: bool, args) -> str:
    if on_piper(args):
        return "whole synthesis"
    return "vocoded" if vocode else "acoustic"


def seconds_per_frame(engine: Engine) -> float:
    """Audio seconds of one mel frame of the Chorus base (an acoustic-only result has no audio)."""
    if engine.base.kind == "chorus":
        return engine.bundle.mel_config.hop_length / engine.sample_rate
    return engine.base.seconds_per_frame


def audio_seconds(result, frame_seconds: float) -> float:
    """A result's audio length: its mel's frames (the Chorus base) or its samples (a base without mels)."""
    if result.mel is not None:
        return result.mel.shape[0] * frame_seconds
    return len(result.audio) / result.sample_rate


def workload(voice_ids: list[str], n_voices: int, concurrency: int, per_thread: int) -> list[list[SentenceRequest]]:
    """Requests per client thread: thread t's j-th request is request i = j * C + t of the run."""

    def request(i: int) -> SentenceRequest:
        return SentenceRequest(TEXTS[i % len(TEXTS)], voice_ids[i % n_voices])

    return [[request(j * concurrency + t) for j in range(per_thread)] for t in range(concurrency)]


def closed_loop(serve, per_thread: list[list[SentenceRequest]], frame_seconds: float) -> dict:
    """Each thread sends its requests one after another through ``serve(request) -> SentenceResult``."""
    loop = run_clients(per_thread, serve)
    done = [s for s in loop.sent if not isinstance(s.outcome, Exception)]
    errors = [repr(s.outcome) for s in loop.sent if isinstance(s.outcome, Exception)]
    latencies = [s.seconds for s in done]
    audio = [audio_seconds(s.outcome, frame_seconds) for s in done]
    wall = loop.wall_s
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_examples": errors[:3],
        "wall_s": wall,
        "latencies_s": latencies,
        "audio_s": float(np.sum(audio)),
        "req_per_s": len(latencies) / wall,
        "audio_s_per_s": float(np.sum(audio)) / wall,
    }


def one_at_a_time(handler):
    """A server that runs ``handler`` on one request at a time, first come first served."""
    pool = ThreadPoolExecutor(max_workers=1)

    def serve(request: SentenceRequest):
        return pool.submit(handler, request).result()

    return serve, pool


def swap_handler(engine: Engine):
    def handle(request: SentenceRequest):
        result = swap_one_at_a_time(engine, [request])[0]
        if isinstance(result, Exception):
            raise result
        return result

    return handle


# -- 1 and 4: throughput, latency; the baselines ---------------------------------------------
def methods_at(n_voices: int, args) -> list[str]:
    """The servers measured at ``n_voices`` distinct voices."""
    methods = ["batcher"]
    if n_voices in args.swap_voices:
        methods.append("swap")
    if n_voices == args.per_voice_models:
        methods.append("model-per-voice")
    return methods


def run_once(
    engine: Engine,
    per_voice: ModelPerVoice,
    method: str,
    plan: list[list[SentenceRequest]],
    vocode: bool,
    args,
    frame_seconds: float,
) -> dict:
    """One closed-loop run of ``plan`` against ``method``, with or without the vocoder."""
    before = engine.stats()
    batcher_stats = None
    with vocoder_mode(engine, vocode):
        if method == "batcher":
            with batcher_for(engine, args) as batcher:
                run = closed_loop(lambda r: batcher.synthesize(r.text, r.voice, r.speed), plan, frame_seconds)
            batcher_stats = batcher.stats
        else:
            handler = swap_handler(engine) if method == "swap" else per_voice.synthesize
            serve, pool = one_at_a_time(handler)
            run = closed_loop(serve, plan, frame_seconds)
            pool.shutdown()
    run.update(method=method, vocode=vocode, cache_misses=engine.stats().misses - before.misses)
    if batcher_stats is not None:
        run.update(
            mean_batch=batcher_stats.mean_batch_size,
            paths=dict(batcher_stats.paths),
            batch_sizes={str(k): v for k, v in sorted(batcher_stats.batch_sizes.items())},
        )
    return run


def batcher_for(engine: Engine, args) -> Batcher:
    """``--batcher shipped``: the batcher ``chorus serve`` makes, with its settings' bounds (rows, wait, time
    per batch, padding); ``unbounded``: rows and wait from the flags, no bound on a batch's time or padding."""
    if args.batcher == "shipped":
        return Batcher.of_server(engine, ServerSettings())
    return Batcher(engine, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)


def target_pair(args) -> list[int]:
    """The N run back to back in every repeat: 1 and ``--concurrency`` (those of them measured)."""
    return [n for n in dict.fromkeys([1, args.concurrency]) if n in args.voices]


def repeat_sequence(args) -> list[tuple[int, str]]:
    """(N, method) runs of one repeat and vocoder mode, in order: swap N=1, batcher N=1, batcher N=C,
    swap N=C (the two batcher runs of the target pair back to back, each beside its swap run), the
    model copies after them, then every other N (batcher, swap, model copies)."""
    pair = target_pair(args)
    sequence = [(n, m) for n in pair[:1] for m in methods_at(n, args)[::-1]]
    sequence += [(n, m) for n in pair[1:] for m in methods_at(n, args)]
    return sequence + [(n, m) for n in args.voices if n not in pair for m in methods_at(n, args)]


def throughput(engine: Engine, voice_ids: list[str], folders: dict[str, Path], args) -> list[dict]:
    frame_seconds = seconds_per_frame(engine)
    per_voice = (  # the model copies read the Chorus base's bundle: no such baseline on a Piper base
        None if on_piper(args) else ModelPerVoice(engine, {v: folders[v] for v in voice_ids[: args.per_voice_models]})
    )
    # Warm-up: every (N, vocoder, method) once, one request per client, untimed, so that no measured
    # run pays a path's first call (the bank's gather shapes, the swap, the model copies, the vocoder).
    for n_voices in args.voices:
        plan = workload(voice_ids, n_voices, args.concurrency, 1)
        for vocode in vocoder_modes(args)[::-1]:
            for method in methods_at(n_voices, args):
                run_once(engine, per_voice, method, plan, vocode, args, frame_seconds)
    print("warm-up done", flush=True)
    runs = []
    for repeat in range(args.repeats):
        sequence = repeat_sequence(args)
        for vocode in vocoder_modes(args):
            for n_voices, method in sequence if repeat % 2 == 0 else sequence[::-1]:
                plan = workload(voice_ids, n_voices, args.concurrency, args.requests_per_thread)
                run = run_once(engine, per_voice, method, plan, vocode, args, frame_seconds)
                run.update(voices=n_voices, repeat=repeat, order=len(runs))
                runs.append(run)
                print(
                    f"repeat {repeat} N={n_voices:<4d} {mode_name(vocode, args):<8s} {method:<16s} "
                    f"{run['req_per_s']:6.2f} req/s  p50 {1000 * percentile(run['latencies_s'], 50):6.0f} ms  "
                    f"p99 {1000 * percentile(run['latencies_s'], 99):6.0f} ms  errors {run['errors']}"
                    + (f"  mean batch {run['mean_batch']:.1f}" if method == "batcher" else ""),
                    flush=True,
                )
    return runs


def summarize(runs: list[dict]) -> list[dict]:
    """Per (method, vocode, N): pooled throughput (all requests / all wall time), latency percentiles
    over every request (``requests`` of them), and the per-repeat throughputs (in repeat order)."""
    keys = sorted({(r["method"], r["vocode"], r["voices"]) for r in runs}, key=lambda k: (k[0], not k[1], k[2]))
    rows = []
    for method, vocode, n_voices in keys:
        group = sorted(
            (r for r in runs if (r["method"], r["vocode"], r["voices"]) == (method, vocode, n_voices)),
            key=lambda r: r["repeat"],
        )
        latencies = [s for r in group for s in r["latencies_s"]]
        wall = sum(r["wall_s"] for r in group)
        requests = sum(r["requests"] for r in group)
        row = {
            "method": method,
            "vocode": vocode,
            "voices": n_voices,
            "requests": requests,
            "errors": sum(r["errors"] for r in group),
            "req_per_s": requests / wall,
            "audio_s_per_s": sum(r["audio_s"] for r in group) / wall,
            "audio_s_per_request": sum(r["audio_s"] for r in group) / max(requests, 1),
            "p50_ms": 1000 * percentile(latencies, 50),
            "p99_ms": 1000 * percentile(latencies, 99),
            "per_repeat_req_per_s": [r["req_per_s"] for r in group],
            "cache_misses": sum(r["cache_misses"] for r in group),
        }
        if method == "batcher":
            row["mean_batch"] = float(np.mean([r["mean_batch"] for r in group]))
            row["batches"] = sum(sum(r["batch_sizes"].values()) for r in group)
            paths: dict[str, int] = {}
            for r in group:
                for path, count in r["paths"].items():
                    paths[path] = paths.get(path, 0) + count
            row["paths"] = paths
        rows.append(row)
    return rows


def per_repeat(numerator: dict, denominator: dict) -> list[float]:
    """Throughput ratios of two rows repeat by repeat (both ran in each repeat; back to back for the
    target pair and for the batcher beside its swap run, see :func:`repeat_sequence`)."""
    return paired_ratios(numerator["per_repeat_req_per_s"], denominator["per_repeat_req_per_s"], zero=float("nan"))


def spread(values: list[float]) -> str:
    """``a, b, c (mean ± sample standard deviation)`` of per-repeat ratios (one alone: as it is)."""
    return mean_sd(values, 2, listed=True)


def find(rows: list[dict], method: str, vocode: bool, n_voices: int) -> dict | None:
    return next((r for r in rows if (r["method"], r["vocode"], r["voices"]) == (method, vocode, n_voices)), None)


def targets(rows: list[dict], args) -> dict:
    """Throughput of ``--concurrency`` requests over that many distinct voices against one voice: the
    acoustic model alone first (the headline: Griffin-Lim's time, the same for every voice, dilutes
    the vocoded ratio toward 1), pooled over the repeats and per pair (the two runs back to back)."""
    out = {}
    distinct, target = args.concurrency, PIPER_TARGET if on_piper(args) else TARGET
    for vocode in (False, True):
        many, one = find(rows, "batcher", vocode, distinct), find(rows, "batcher", vocode, 1)
        if many is None or one is None:
            continue
        paired = per_repeat(many, one)
        ratio = many["req_per_s"] / one["req_per_s"] if one["req_per_s"] else float("nan")
        adjacent = target_pair(args) == [1, distinct]
        out[mode_name(vocode, args)] = {
            "distinct_voices": distinct,
            "ratio": ratio,
            "per_repeat_ratios": paired,
            "min_ratio": min(paired),
            "target": target,
            "met": ratio >= target,
            "pairs_back_to_back": adjacent,
            "headline": not vocode or on_piper(args),
            "requests_per_run": args.concurrency * args.requests_per_thread,
            "batches": many["batches"],
        }
    return out


# -- 2: cold loads -----------------------------------------------------------------------------
def cold_loads(engine: Engine, store: VoiceStore, voice_ids: list[str], folders: dict[str, Path], args) -> dict:
    """Engine cache misses with a zero-byte budget (every voice leaves the model when its block ends),
    with the voice's files in the page cache and dropped from it before each load; each entry holds
    the mean fraction of the files' pages resident just before the loads (``page_cache_resident``)."""
    budget, resolve = engine.cache_bytes, engine.resolve
    engine.resize(0)
    samples = [voice_ids[k % len(voice_ids)] for k in range(args.cold_loads)]
    stored = {v: store.get_voice(TENANT, v) for v in set(samples)}
    files = {v: files_of(folders[v]) + files_of(stored[v]) for v in stored}
    out = {}

    def timed(name: str, step, drop: bool) -> None:
        seconds, resident = [], []
        for voice_id in samples:
            if drop:
                drop_from_page_cache(files[voice_id])
            resident.append(resident_fraction(files[voice_id]))
            began = time.perf_counter()
            step(voice_id)
            seconds.append(time.perf_counter() - began)
        out[f"{name}, {'dropped from' if drop else 'in'} page cache"] = latency_ms(seconds) | {
            "page_cache_resident": float(np.mean(resident))
        }

    def engine_miss(voice_id: str) -> None:
        with engine.using([voice_id]) as (_, errors):
            if errors:
                raise errors[voice_id]

    try:
        for drop in (False, True):
            for name, resolver in [  # the engine resolves an AdaptedVoice (its key names the voice here)
                ("engine miss, plain folder", lambda voice: folders[voice.key]),
                ("engine miss, VoiceStore.get_voice", lambda voice: store.get_voice(TENANT, voice.key)),
            ]:
                engine.resolve = resolver
                timed(name, engine_miss, drop)
            timed("VoiceStore.get_voice alone", lambda v: store.get_voice(TENANT, v), drop)
            timed("read_voice alone (checksum + safetensors)", lambda v: read_voice(folders[v]), drop)
    finally:
        engine.resolve = resolve
        engine.resize(budget)
    return out


# -- 3: memory of the real server process -----------------------------------------------------
def server_memory(args, folders: dict[str, Path]) -> dict:
    """RSS of ``chorus serve`` (this tree's, single-tenant, on loopback): on an empty store, after
    registering voices into its store (and listing them through the API, so the server reads their
    rows), then with k voices in use (one short speech request each), beside ``/healthz``'s
    ``resident_bytes``. The server is a separate process: no gc or malloc_trim before readings."""
    root = args.work / "server-store"
    shutil.rmtree(root, ignore_errors=True)
    store = VoiceStore(str(root))
    port = free_port()
    command = [*chorus_command(), "serve", "--store", str(root), "--port", str(port), "--cache-mb", "1024"]
    environment = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    server = launch(command, port, args.work / "server.log", env=environment)
    try:
        # Healthy is not settled: the server makes its speaker map in the background at start-up, which
        # would otherwise land in the first voices' growth.
        wait_idle(server.pid)
        # One request in the default base voice first: the first call's one-time costs (the batcher's
        # worker, the vocoder's buffers) are then in the starting RSS, not in the first voice's growth.
        base_voices = json.loads(get(port, "/v1/voices"))["data"]
        default = next(v["id"] for v in base_voices if v.get("default"))
        post_json(port, "/v1/audio/speech", {"input": "Hello.", "voice": default, "response_format": "wav"})
        started = process_rss(server.pid)
        registration = register_voices(args, store, root, folders, port, server.pid, started, len(base_voices))
        in_use = use_voices(args, port, server.pid, registration[-1]["registered"] if registration else 0)
        return {
            "command": shlex.join(["chorus", *command[1:]]),
            "pid_rss_source": "/proc/PID/status VmRSS",
            "started_rss_bytes": started,
            "registration": registration,
            "in_use": in_use,
        }
    finally:
        stop(server, timeout=60)


def register_voices(
    args, store: VoiceStore, root: Path, folders: dict[str, Path], port: int, pid: int, started: int, base: int
) -> list[dict]:
    """Voices put into the server's store up to each of ``--registered``, listed through the API (``base``
    base voices besides them) and the server's RSS read after each step."""
    voice_ids = sorted(folders)
    registration, registered = [], 0
    for target in args.registered:
        began = time.perf_counter()
        while registered < target:
            store.put_voice(DEFAULT_TENANT, f"r{registered:04d}", folders[voice_ids[registered % len(voice_ids)]])
            registered += 1
        seconds = time.perf_counter() - began
        listed = len(json.loads(get(port, "/v1/voices"))["data"]) - base
        rss = process_rss(pid)
        registration.append(
            {
                "registered": target,
                "listed": listed,
                "rss_bytes": rss,
                "rss_delta_bytes": rss - started,
                "store_disk_bytes": tree_bytes(root),
                "register_seconds": seconds,
            }
        )
    return registration


def use_voices(args, port: int, pid: int, registered: int) -> list[dict]:
    """The first k registered voices spoken once each, for each k of ``--in-use``: the server's RSS growth
    from before the first, beside ``/healthz``'s ``resident_bytes``."""
    after_registering = process_rss(pid)
    in_use, loaded = [], 0
    for count in args.in_use:
        while loaded < min(count, registered):
            body = {"input": "Hello.", "voice": f"r{loaded:04d}", "response_format": "wav"}
            post_json(port, "/v1/audio/speech", body)
            loaded += 1
        health = json.loads(get(port, "/healthz"))
        rss = process_rss(pid)
        in_use.append(
            {
                "in_use": loaded,
                "resident_bytes": health["resident_bytes"],
                "resident_voices": health["resident_voices"],
                "rss_bytes": rss,
                "rss_delta_bytes": rss - after_registering,
            }
        )
    return in_use


# -- 3b: what the server's RSS is made of, and the model-per-voice baseline (fresh bench process) ---------
def memory_child(args) -> None:
    torch.set_num_threads(args.threads)
    folders = {p.name: p for p in sorted((args.work / "voices").iterdir())}
    voice_ids = sorted(folders)
    synthesizer = load_base(None, "griffin-lim")
    engine = Engine(synthesizer.base, resolve=lambda voice: folders[voice.key], cache_bytes=1 << 40)
    model_bytes = sum(t.numel() * t.element_size() for t in [*engine.model.parameters(), *engine.model.buffers()])
    ids = voice_ids[: max(args.in_use)]
    with engine.using(ids) as (_, errors):
        if errors:
            raise next(iter(errors.values()))
    stats = engine.stats()
    per_voice_adapter = stats.resident_bytes / max(stats.resident_voices, 1)
    # Where RSS beyond the tensors goes: Python objects per resident voice (module wrappers, dicts),
    # counted by tracemalloc on loading the same voices again (tensor storage is not Python's heap).
    engine.resize(0)
    engine.resize(1 << 40)
    gc.collect()
    tracemalloc.start()
    with engine.using(ids):
        pass
    gc.collect()
    python_heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    python_per_voice = python_heap / max(engine.stats().resident_voices, 1)
    engine.resize(0)  # the cache empties: the per-voice-model baseline is measured from a bare engine
    bare = settle()
    per_voice = ModelPerVoice(engine, {v: folders[v] for v in voice_ids[: args.per_voice_models]})
    rss = settle()
    models = {
        "voices": len(per_voice.models),
        "resident_bytes": per_voice.resident_bytes,
        "rss_delta_bytes": rss - bare,
        "base_model_bytes": model_bytes,
    }
    print(
        "RESULT "
        + json.dumps(
            {
                "base_model_bytes": model_bytes,
                "adapter_bytes_per_voice": per_voice_adapter,
                "python_heap_bytes_per_voice": python_per_voice,
                "model_per_voice": models,
            }
        ),
        flush=True,
    )


def memory(args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child-memory",
        "--work",
        str(args.work),
        "--threads",
        str(args.threads),
        "--in-use",
        ",".join(map(str, args.in_use)),
        "--per-voice-models",
        str(args.per_voice_models),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in finished.stdout.splitlines() if line.startswith("RESULT ")]
    if finished.returncode != 0 or not lines:
        raise RuntimeError(f"memory child failed:\n{finished.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


# -- report ------------------------------------------------------------------------------------
def report(result: dict, args) -> None:
    """``serving.md`` (printed too), ``serving.json`` and ``serving.png`` in ``args.out``."""
    lines = piper_report_lines(result, args) if on_piper(args) else chorus_report_lines(result, args)
    (args.out / "serving.md").write_text("\n".join(lines) + "\n")
    (args.out / "serving.json").write_text(json.dumps(result, indent=1))
    plot(result["summary"], args, args.out / "serving.png")
    print("\n".join(lines))


def chorus_report_lines(result: dict, args) -> list[str]:
    """The report of a run on the Chorus base: throughput in both vocoder modes, cold loads, memory."""
    return [
        *header_lines(result, args),
        *findings(result, args),
        *target_lines(result["targets"]),
        *throughput_lines(result["summary"], args, vocode=False),
        *throughput_lines(result["summary"], args, vocode=True),
        *model_per_voice_lines(result, args),
        *cold_load_lines(result["cold_load"], args),
        *server_memory_lines(result["server_memory"], result["memory"]),
        *caveat_lines(result["summary"]),
    ]


def header_lines(result: dict, args) -> list[str]:
    """The title, the command and how the run was made."""
    cfg = result["config"]
    lines = [
        "# Multi-tenant voice server: batched adapters against swapping and a model per voice",
        "",
        "```",
        result["command"],
        "```",
        "",
        (
            f"Shipped base, Griffin-Lim vocoder, {cfg['threads']} torch thread(s) on a {cfg['cpus']}-core CPU "
            f"(load average {cfg['load_average'][0]:.1f} at the start, "
            f"{cfg.get('load_average_end', [float('nan')])[0]:.1f} after the throughput runs"
            + (f"; sampled during them {cfg['load_during_throughput']}" if "load_during_throughput" in cfg else "")
            + "). Voices are synthetic "
            f"`{args.method}` adapters with random values (scale {args.adapter_scale:g}), "
            f"{result['adapter_bytes_per_voice'] / 1024:.0f} KiB of tensors each: they measure speed and memory, "
            "not quality. "
            f"{args.concurrency} client threads in a closed loop, {args.requests_per_thread} requests each per run "
            f"({args.concurrency * args.requests_per_thread} requests, about {args.requests_per_thread} batches of "
            f"{args.max_batch}), {args.repeats} repeats; in each repeat and vocoder mode the batcher ran at N = 1 "
            f"and N = {args.concurrency} back to back, each beside its swap run (swap N=1, batcher N=1, batcher "
            f"N={args.concurrency}, swap N={args.concurrency}), then the other N (batcher, swap, model copies), "
            "odd repeats in reverse order, so the target ratio and batcher / swap compare neighbours and the "
            "other N's ratio to N = 1 compares runs of the same repeat, not adjacent; "
            f"{batcher_words(args)}. Every voice was resident "
            "before timing (cache misses during runs are listed), and every (method, N, vocoder) combination ran "
            "one untimed warm-up round first. Baselines serve one request at a time, first come first "
            "served, to the same clients. Absolute numbers drift on a shared CPU; the ratios are the result, "
            "each given per repeat with its mean ± sample standard deviation. Latency percentiles are over "
            "all requests of all repeats; n is how many."
        ),
        "",
    ]
    if "provenance" in cfg:  # results written before the provenance record was kept have none
        lines[-2] += f" Measured at {describe(cfg['provenance'])}."
    return lines


ROLES = {  # modes other than the Chorus base's two
    "whole synthesis": (
        "headline: the Piper generator from phoneme ids to audio, adapters in its flow and decoder; "
        "there is no separate vocoder to take away, so this is the only mode"
    ),
}


def target_lines(targets: dict) -> list[str]:
    """The target ratio, each vocoder mode, met or not."""
    lines = ["## Target: many distinct voices in one batch", ""]
    for mode, t in targets.items():
        verdict = "**met**" if t["met"] else "**not met**"
        pairing = "per pair (back to back)" if t["pairs_back_to_back"] else "per repeat"
        role = ROLES.get(
            mode,
            "headline: the acoustic model alone, where the adapters' cost shows"
            if t["headline"]
            else "with Griffin-Lim, whose time (the same for every voice) dominates and dilutes the ratio toward 1",
        )
        lines.append(
            f"- {mode} ({role}): {t['distinct_voices']} concurrent requests over {t['distinct_voices']} "
            f"distinct voices reach **{t['ratio']:.2f}x** the throughput of {t['distinct_voices']} requests "
            f"of one voice (target >= {t['target']}x: {verdict}); {pairing} {spread(t['per_repeat_ratios'])}, "
            f"lowest {t['min_ratio']:.2f}; {t['batches']} batches over all repeats"
        )
    lines.append("")
    return lines


def throughput_lines(rows: list[dict], args, vocode: bool, title: str | None = None) -> list[str]:
    """The table of throughput and latency against distinct voices, with or without the vocoder."""
    title = title or ("acoustic model only (no vocoder)" if not vocode else "with Griffin-Lim vocoding")
    lines = [
        f"## Throughput and latency against distinct voices in flight, {title}",
        "",
        (
            "| voices N | batcher req/s | audio s/s | p50 / p99 ms (n) | mean batch | paths | swap req/s | "
            "swap p50 / p99 ms (n) | batcher / swap, per repeat | vs N=1, per repeat |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    one = find(rows, "batcher", vocode, 1)
    for n_voices in args.voices:
        b, s = find(rows, "batcher", vocode, n_voices), find(rows, "swap", vocode, n_voices)
        if b is None:
            continue
        paths = ", ".join(f"{k} {v}" for k, v in sorted(b["paths"].items()))
        swap_cols = (
            (
                f"{s['req_per_s']:.2f} | {s['p50_ms']:.0f} / {s['p99_ms']:.0f} ({s['requests']}) | "
                f"{b['req_per_s'] / s['req_per_s']:.2f}x: {spread(per_repeat(b, s))}"
            )
            if s
            else "- | - | -"
        )
        versus_one = (
            f"{b['req_per_s'] / one['req_per_s']:.2f}x: {spread(per_repeat(b, one))}" if one and n_voices != 1 else "1"
        )
        lines.append(
            f"| {n_voices} | {b['req_per_s']:.2f} | {b['audio_s_per_s']:.2f} | {b['p50_ms']:.0f} / "
            f"{b['p99_ms']:.0f} ({b['requests']}) | {b['mean_batch']:.1f} | {paths} | {swap_cols} | "
            f"{versus_one} |"
        )
    lines.append("")
    return lines


def model_per_voice_lines(result: dict, args) -> list[str]:
    """The model-per-voice baseline beside the batcher and swapping; its memory."""
    rows = result["summary"]
    lines = [
        f"## One full model per voice ({args.per_voice_models} voices)",
        "",
        "| server | mode | req/s | p50 / p99 ms (n) | throughput vs batcher, per repeat |",
        "|---|---|---|---|---|",
    ]
    for vocode in (False, True):
        b = find(rows, "batcher", vocode, args.per_voice_models)
        for method in ("batcher", "swap", "model-per-voice"):
            r = find(rows, method, vocode, args.per_voice_models)
            if r and b:
                lines.append(
                    f"| {method} | {'vocoded' if vocode else 'acoustic'} | {r['req_per_s']:.2f} | "
                    f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ({r['requests']}) | "
                    f"{r['req_per_s'] / b['req_per_s']:.2f}x: {spread(per_repeat(r, b))} |"
                )
    mem, server = result["memory"], result["server_memory"]
    mpv = mem["model_per_voice"]
    engine_row = next((r for r in server["in_use"] if r["in_use"] >= mpv["voices"]), None)
    lines += [
        "",
        f"Memory for {mpv['voices']} voices: a model per voice holds {mpv['resident_bytes'] / MB:.1f} MB of "
        f"tensors (the base is {mpv['base_model_bytes'] / MB:.1f} MB; the RSS of a bench process grew "
        f"{mpv['rss_delta_bytes'] / MB:.1f} MB building them) against "
        f"{mpv['voices'] * mem['adapter_bytes_per_voice'] / MB:.2f} MB of adapter tensors in the shared engine"
        + (
            f" (the real server's RSS grew {engine_row['rss_delta_bytes'] / MB:.1f} MB with "
            f"{engine_row['in_use']} voices in use)"
            if engine_row
            else ""
        )
        + ".",
        "",
    ]
    return lines


def cold_load_lines(cold_load: dict, args) -> list[str]:
    """The cold loads of a voice, in and out of the page cache."""
    lines = [
        "## Cold load of a voice",
        "",
        (
            f"{args.cold_loads} loads each, cycling over distinct voices; engine budget 0 bytes so every request is "
            "a miss (voice ready = inside `Engine.using`). Each step runs with the voice's files in the OS page "
            "cache (written moments before) and with them dropped from it before every load "
            '(`posix_fadvise(DONTNEED)`); "resident" is the mean fraction of their pages in the page cache just '
            "before the loads (`mincore`): at 0 the load read them from disk."
        ),
        "",
        "| step | page cache | resident | p50 ms | p99 ms (n) | mean ms | max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in cold_load.items():
        step, _, cache = name.rpartition(", ")
        lines.append(
            f"| {step} | {cache} | {t['page_cache_resident']:.2f} | {t['p50_ms']:.1f} | "
            f"{t['p99_ms']:.1f} ({t['n']}) | {t['mean_ms']:.1f} | {t['max_ms']:.1f} |"
        )
    return lines


def server_memory_lines(server: dict, mem: dict) -> list[str]:
    """The real server's RSS against voices registered and in use."""
    lines = [
        "",
        "## Resident memory of the server process against voices registered and in use",
        "",
        (
            f"The real server, `{server['command']}`, single-tenant on loopback; RSS from "
            f"{server['pid_rss_source']} of its process (no gc or malloc_trim: allocator slack included), after "
            f"one warm-up request in a base voice: {server['started_rss_bytes'] / MB:.1f} MB. Voices registered "
            "into its store (SQLite row + committed folder each), then listed through `GET /v1/voices`. "
            "Registering loads no voice."
        ),
        "",
        "| voices registered | listed by the server | RSS MB | RSS growth MB | store on disk MB | register s |",
        "|---|---|---|---|---|---|",
    ]
    for row in server["registration"]:
        lines.append(
            f"| {row['registered']:,} | {row['listed']:,} | {row['rss_bytes'] / MB:.1f} | "
            f"{row['rss_delta_bytes'] / MB:+.1f} | {row['store_disk_bytes'] / MB:.1f} | "
            f"{row['register_seconds']:.1f} |"
        )
    lines += [
        "",
        (
            f"Then k of the {server['registration'][-1]['registered']:,} registered voices in use (one speech "
            "request each, so the server loads it through its store into its engine cache); growth from the "
            "RSS after registering, beside the `resident_bytes` its `/healthz` reports:"
        ),
        "",
        "| voices in use | resident voices | resident_bytes MB | RSS growth MB | RSS growth / resident_bytes |",
        "|---|---|---|---|---|",
    ]
    for row in server["in_use"]:
        ratio = row["rss_delta_bytes"] / row["resident_bytes"] if row["resident_bytes"] else float("nan")
        lines.append(
            f"| {row['in_use']} | {row['resident_voices']} | {row['resident_bytes'] / MB:.2f} | "
            f"{row['rss_delta_bytes'] / MB:+.2f} | {ratio:.2f} |"
        )
    lines += [
        "",
        (
            f"Per resident voice: {mem['adapter_bytes_per_voice'] / 1024:.0f} KiB of adapter tensors (what "
            f"`resident_bytes` counts) plus {mem['python_heap_bytes_per_voice'] / 1024:.0f} KiB of Python "
            "objects (parameters, the adapter's configs and dicts; tracemalloc in a bench process loading the "
            "same voices again), which `resident_bytes` does not count."
        ),
    ]
    return lines


def caveat_lines(rows: list[dict]) -> list[str]:
    """What the figures do not show."""
    lines = [
        "",
        "## Caveats",
        "",
        "- Synthetic adapters with random values: speed and memory only; durations still follow the base "
        "(audio seconds per request, batcher vocoded: "
        + ", ".join(
            f"N={r['voices']}: {r['audio_s_per_request']:.2f}" for r in rows if r["method"] == "batcher" and r["vocode"]
        )
        + ").",
        (
            "- One shared, loaded CPU; Python client threads and the batcher worker share the GIL. RSS includes "
            "allocator slack."
        ),
        (
            "- Vocoding runs in the batcher's worker after each forward, so with Griffin-Lim it is most of "
            "every batch's time and hides the adapter cost; the acoustic-only rows show the forward alone."
        ),
        (
            "- Dropped from the page cache means read from this machine's disk (or its overlay); an object store "
            "adds its transfer time."
        ),
    ]
    if any(r["errors"] for r in rows):
        lines.append(
            "- Some requests failed: "
            + ", ".join(f"{r['method']} N={r['voices']}: {r['errors']}" for r in rows if r["errors"])
        )
    return lines


def mode_words(vocode: bool, args) -> str:
    return mode_name(vocode, args) if on_piper(args) else "vocoded" if vocode else "acoustic only"


def throughput_findings(result: dict, args) -> list[str]:
    """Each target ratio, met or not, then the batcher against swapping, per vocoder mode."""
    rows, lines = result["summary"], []
    for mode, t in result["targets"].items():
        lines.append(
            f"- Throughput, {mode}{' (headline)' if t['headline'] else ''}: {t['distinct_voices']} distinct "
            f"voices / 1 voice = {t['ratio']:.2f}x (target >= {t['target']}x: {'met' if t['met'] else 'NOT met'}; "
            f"{'per pair (back to back)' if t['pairs_back_to_back'] else 'per repeat'} "
            f"{spread(t['per_repeat_ratios'])})."
        )
    for vocode in (False, True):
        ratios = [
            (b["voices"], b["req_per_s"] / s["req_per_s"], per_repeat(b, s))
            for b in rows
            if b["method"] == "batcher" and b["vocode"] == vocode
            for s in [find(rows, "swap", vocode, b["voices"])]
            if s
        ]
        if ratios:
            lines.append(
                f"- Batcher against swapping one adapter at a time, {mode_words(vocode, args)}: "
                + "; ".join(f"N={n}: {r:.2f}x (per repeat {spread(p)})" for n, r, p in ratios)
                + " the throughput."
            )
    return lines


def findings(result: dict, args) -> list[str]:
    """The headline: each target and comparison in one line, met or not; the acoustic-only ratio first."""
    mem, server = result["memory"], result["server_memory"]
    lines = ["## Findings", "", *throughput_findings(result, args)]
    mpv = mem["model_per_voice"]
    lines.append(
        f"- One model per voice ({mpv['voices']} voices): {mpv['rss_delta_bytes'] / MB:.0f} MB of RSS against "
        f"{mpv['voices'] * mem['adapter_bytes_per_voice'] / MB:.1f} MB of adapter tensors in the shared "
        "engine; its throughput is no better than swapping (one request at a time either way)."
    )
    last = server["registration"][-1]
    lines.append(
        f"- The server process: registering {last['registered']:,} voices grew its RSS by "
        f"{last['rss_delta_bytes'] / MB:.1f} MB: memory follows the voices in use, not the voices registered."
    )
    if server["in_use"]:
        top = server["in_use"][-1]
        lines.append(
            f"- The server process with {top['in_use']} voices in use: RSS grew {top['rss_delta_bytes'] / MB:.1f} "
            f"MB for {top['resident_bytes'] / MB:.1f} MB of `resident_bytes` "
            f"({top['rss_delta_bytes'] / top['resident_bytes']:.1f}x): beyond the tensors, "
            f"{mem['python_heap_bytes_per_voice'] / 1024:.0f} KiB of Python objects per voice, PyTorch's "
            f"bookkeeping of {result['adapter_tensors_per_voice']} small tensors per voice, allocator slack "
            "and the requests' own buffers."
        )
    for name, t in result["cold_load"].items():
        if name.startswith("engine miss"):
            lines.append(
                f"- Cold load ({name}; {100 * t['page_cache_resident']:.0f}% of the files' pages cached): "
                f"p50 {t['p50_ms']:.1f} ms, p99 {t['p99_ms']:.1f} ms (n = {t['n']})."
            )
    return lines + [""]


# -- report on a Piper base ---------------------------------------------------------------------
def piper_report_lines(result: dict, args) -> list[str]:
    """The report of a run on a Piper base: whole synthesis only (no vocoder to take away), the swap
    baseline beside the batcher, cold loads where run; no memory parts (see :func:`piper_caveat_lines`)."""
    rows = result["summary"]
    lines = [
        *piper_header_lines(result, args),
        "## Findings",
        "",
        *throughput_findings(result, args),
        "",
        *target_lines(result["targets"]),
        *throughput_lines(rows, args, vocode=True, title="whole synthesis (the Piper generator makes the audio)"),
    ]
    if result["cold_load"]:
        lines += cold_load_lines(result["cold_load"], args)
    return lines + piper_caveat_lines(rows, args)


def piper_header_lines(result: dict, args) -> list[str]:
    """The title, the command and how a run on a Piper base was made."""
    cfg, base = result["config"], result["base"]
    sequence = f"swap N=1, batcher N=1, batcher N={args.concurrency}, swap N={args.concurrency}"
    return [
        "# Multi-tenant voice server on the Piper base: mixed-voice batches against one voice and swapping",
        "",
        "```",
        result["command"],
        "```",
        "",
        (
            f"Piper base `{base['name']}` (its `.onnx` sha256 {base['sha256'][:12]}...): a PyTorch VITS generator, "
            "phoneme ids to audio in one forward, so there is no separate vocoder and only whole synthesis is "
            "timed (the Chorus base's acoustic-only mode does not exist here). "
            f"{cfg['threads']} torch thread(s) on a {cfg['cpus']}-core CPU (load average "
            f"{cfg['load_average'][0]:.1f} at the start, {cfg['load_average_end'][0]:.1f} after the throughput "
            f"runs; sampled during them {cfg['load_during_throughput']}). Voices are synthetic "
            f"`{args.placement}` adapters (the Piper adaptation placement `chorus adapt` uses: "
            f"{base['methods']}) with random values (scale {args.adapter_scale:g}), "
            f"{result['adapter_bytes_per_voice'] / 1024:.0f} KiB of tensors each: they measure speed, not "
            f"quality. {args.concurrency} client threads in a closed loop, {args.requests_per_thread} requests "
            f"each per run ({args.concurrency * args.requests_per_thread} requests), {args.repeats} repeats; in "
            f"each repeat the batcher ran at N = 1 and N = {args.concurrency} back to back, each beside its swap "
            f"run where measured ({sequence}), then the other N, odd repeats in reverse order; "
            f"{batcher_words(args)}. Every voice was resident before timing (cache misses during runs are "
            "listed), and every (method, N) combination ran one untimed warm-up round first. The swap baseline "
            "serves one request at a time, first come first served, to the same clients. Absolute numbers "
            "drift on a shared CPU; the ratios are the result, each given per repeat with its mean ± sample "
            "standard deviation. Latency percentiles are over all requests of all repeats; n is how many. "
            f"Measured at {describe(cfg['provenance'])}."
        ),
        "",
    ]


def batch_size_caveat(rows: list[dict], args) -> list[str]:
    """How large the batches were, and why: on a CPU the shipped batcher stops a batch at ``max_batch_ms`` of
    estimated time, less than one Piper row takes, so once its estimate is learned a batch holds one row."""
    batcher = [r for r in rows if r["method"] == "batcher"]
    sizes = "; ".join(
        f"N={r['voices']}: mean {r['mean_batch']:.1f}, paths {', '.join(f'{k} {v}' for k, v in sorted(r['paths'].items()))}"
        for r in batcher
    )
    line = f"- Batches: {sizes}."
    swap = find(rows, "swap", True, 1)
    if getattr(args, "batcher", "unbounded") == "shipped" and swap:
        line += (
            f" The shipped batcher stops a batch once its estimated time (learned from the batches run) would pass "
            f"max_batch_ms {ServerSettings().max_batch_ms:g} on a CPU; one Piper request alone took about "
            f"{1000 / swap['req_per_s']:.0f} ms here (swap, N = 1), so after each run's first batches a batch "
            "holds one row: the ratio then compares one-row forwards, the adapter switched between them, not "
            "mixed-voice batches (`--batcher unbounded --max-batch C` times those)."
        )
    return [line]


def piper_caveat_lines(rows: list[dict], args) -> list[str]:
    """What a run on a Piper base does not show, and the parts of the Chorus base's report it skips."""
    audio = ", ".join(f"N={r['voices']}: {r['audio_s_per_request']:.2f}" for r in rows if r["method"] == "batcher")
    return [
        "",
        "## Caveats and parts not run",
        "",
        "- Synthetic adapters with random values: speed only; the audio seconds per request show whether they "
        f"changed the work (batcher: {audio}).",
        "- One shared, loaded CPU; Python client threads and the batcher worker share the GIL.",
        *batch_size_caveat(rows, args),
        "- Not run on a Piper base: the acoustic-only mode (the generator makes the audio; no vocoder to "
        "take away), the one-model-per-voice baseline (its copies are built through the Chorus base's model "
        "bundle), and the memory parts (the server process's RSS against voices registered and in use, and "
        "the bench process's heap per voice: both start the shipped Chorus base)"
        + ("" if args.cold_loads else ", nor cold loads (`--cold-loads 0`)")
        + ".",
    ]


def plot(rows: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"batcher": "o-", "swap": "s--", "model-per-voice": "D"}
    for method, style in styles.items():
        for vocode in (True, False):
            points = sorted((r["voices"], r) for r in rows if r["method"] == method and r["vocode"] == vocode)
            if not points:
                continue
            label = f"{method}, {mode_words(vocode, args)}"
            ns = [n for n, _ in points]
            color = "C0" if method == "batcher" else "C1" if method == "swap" else "C2"
            face = color if vocode else "white"
            left.plot(ns, [r["req_per_s"] for _, r in points], style, color=color, mfc=face, label=label)
            right.plot(ns, [r["p99_ms"] / 1000 for _, r in points], style, color=color, mfc=face, label=label)
    for axis, ylabel in ((left, "requests / s"), (right, "p99 latency, s")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(args.voices, [str(n) for n in args.voices])
        axis.set_yscale("log")
        axis.set_xlabel(f"distinct voices in flight ({args.concurrency} concurrent requests)")
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ints(text: str) -> list[int]:
    return [int(k) for k in text.split(",")]


def rereport(out: Path) -> None:
    """The report of a finished run again, from its ``serving.json``, with the run's own options."""
    result = json.loads((out / "serving.json").read_text())
    report(result, argparse.Namespace(**result["config"] | {"out": out}))


def batcher_words(args) -> str:
    if getattr(args, "batcher", "unbounded") == "shipped":
        shipped = ServerSettings()
        return (
            f"the batcher as `chorus serve` ships it (max_batch {shipped.max_batch}, max_wait {shipped.max_wait_ms:g} ms, "
            f"max_batch_ms {shipped.max_batch_ms:g}, batch_pad_ratio {shipped.batch_pad_ratio:g}, merge 'auto')"
        )
    return f"batcher max_batch {args.max_batch}, max_wait {args.max_wait_ms:g} ms, merge 'auto'"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voices", type=ints, default=[1, 8, 32, 128], help="distinct voices in flight")
    parser.add_argument("--concurrency", type=int, default=32, help="client threads (requests in flight)")
    parser.add_argument(
        "--requests-per-thread",
        type=int,
        default=8,
        help="per run (with max_batch = concurrency: about this many batches per run)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-batch", type=int, default=None, help="batcher rows per forward (default: concurrency)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument(
        "--batcher",
        choices=("shipped", "unbounded"),
        default="shipped",
        help="shipped: chorus serve's batcher and bounds; unbounded: --max-batch/--max-wait-ms only (the older runs)",
    )
    parser.add_argument(
        "--swap-voices", type=ints, default=None, help="N at which the swap baseline runs (default all)"
    )
    parser.add_argument("--per-voice-models", type=int, default=8, help="voices of the model-per-voice baseline")
    parser.add_argument("--cold-loads", type=int, default=50)
    parser.add_argument("--registered", type=ints, default=[10, 100, 1000])
    parser.add_argument("--in-use", type=ints, default=[8, 32, 128], help="voices cached after registering")
    parser.add_argument(
        "--base",
        default=None,
        help="the base served: the shipped Chorus base (default), piper-joe or a Piper voice .onnx (whole synthesis "
        "only; no model-per-voice baseline or memory parts there)",
    )
    parser.add_argument("--method", default="lora+speaker", help="the voices' adapters on the Chorus base")
    parser.add_argument(
        "--placement", default="flow+decoder", choices=sorted(PLACEMENTS), help="the voices' adapters on a Piper base"
    )
    parser.add_argument("--adapter-scale", type=float, default=0.02, help="std of the random adapter values")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/serving"))
    parser.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--report", action="store_true", help="write the report again from OUT/serving.json (nothing is measured)"
    )
    return parser.parse_args()


def resolve_defaults(args) -> None:
    """The batcher's sizes as the shipped server's (``--batcher shipped``), swap at every N by default; no
    model-per-voice baseline on a Piper base."""
    shipped = ServerSettings()
    args.max_batch = args.max_batch or (shipped.max_batch if args.batcher == "shipped" else args.concurrency)
    args.max_wait_ms = shipped.max_wait_ms if args.batcher == "shipped" else args.max_wait_ms
    args.swap_voices = args.voices if args.swap_voices is None else args.swap_voices
    if on_piper(args):
        args.per_voice_models = 0


def timed_runs(engine: Engine, voice_ids: list[str], folders: dict[str, Path], args, config: dict) -> dict:
    """The throughput runs (every voice resident first), the load through them, their summary and targets."""
    with engine.using(voice_ids):  # every voice resident before timing
        pass
    with LoadSampler() as load:  # the load through the timed runs, not only at their ends
        runs = throughput(engine, voice_ids, folders, args)
    config["load_average_end"] = os.getloadavg()
    config["load_during_throughput"] = load.summary()
    rows = summarize(runs)
    return {
        "summary": rows,
        "targets": targets(rows, args),
        "runs": [
            {k: v for k, v in r.items() if k != "latencies_s"}
            | {"p50_ms": 1000 * percentile(r["latencies_s"], 50), "p99_ms": 1000 * percentile(r["latencies_s"], 99)}
            for r in runs
        ],
    }


def voice_tensor_record(folders: dict[str, Path]) -> dict:
    tensors = read_voice(folders[sorted(folders)[0]]).tensors
    return {
        "adapter_bytes_per_voice": sum(t.numel() * t.element_size() for t in tensors.values()),
        "adapter_tensors_per_voice": len(tensors),
    }


def measure_chorus(args, config: dict) -> dict:
    """Every part on the shipped Chorus base: memory, server memory, cold loads, throughput."""
    synthesizer = load_base(None, "griffin-lim")
    count = max(max(args.voices), args.per_voice_models, min(args.cold_loads, 128))
    folders = make_voices(synthesizer, count, args.work / "voices", args.method, args.adapter_scale, args.seed)
    voice_ids = sorted(folders)
    tensors = voice_tensor_record(folders)

    print("memory (fresh bench process) ...", flush=True)
    memory_result = memory(args)
    print("memory of the server process ...", flush=True)
    server_result = server_memory(args, folders)

    store = VoiceStore(str(args.work / "store"))
    for voice_id in voice_ids:
        store.put_voice(TENANT, voice_id, folders[voice_id])
    engine = Engine(synthesizer.base, resolve=lambda voice: folders[voice.key], cache_bytes=1 << 30)
    print("cold loads ...", flush=True)
    cold = cold_loads(engine, store, voice_ids, folders, args)
    timed = timed_runs(engine, voice_ids, folders, args, config)
    return {
        "config": config,
        **tensors,
        "summary": timed["summary"],
        "targets": timed["targets"],
        "cold_load": cold,
        "memory": memory_result,
        "server_memory": server_result,
        "runs": timed["runs"],
    }


def measure_piper(args, config: dict) -> dict:
    """Throughput (whole synthesis) and cold loads (unless ``--cold-loads 0``) on a Piper base."""
    base = open_base(args.base)
    count = max(max(args.voices), min(args.cold_loads, 128))
    folders = make_piper_voices(base, count, args.work / "voices", args.placement, args.adapter_scale, args.seed)
    voice_ids = sorted(folders)
    engine = Engine(base, resolve=lambda voice: folders[voice.key], cache_bytes=1 << 30)
    cold = {}
    if args.cold_loads:
        store = VoiceStore(str(args.work / "store"))
        for voice_id in voice_ids:
            store.put_voice(TENANT, voice_id, folders[voice_id])
        print("cold loads ...", flush=True)
        cold = cold_loads(engine, store, voice_ids, folders, args)
    methods = ", ".join(c.method + (f" r={c.r}" if hasattr(c, "r") else "") for c in PLACEMENTS[args.placement]())
    record = {"name": base.name, "sha256": base.sha256, "kind": base.kind, "methods": methods}
    timed = timed_runs(engine, voice_ids, folders, args, config)
    return {"config": config, "base": record, **voice_tensor_record(folders), **timed, "cold_load": cold}


def main() -> None:
    args = parse_args()
    if args.report:
        rereport(args.out)
        return
    torch.set_num_threads(args.threads)
    if args.child_memory:
        memory_child(args)
        return
    resolve_defaults(args)
    command = shlex.join(["python", "bench/serving.py", *sys.argv[1:]])
    scratch = args.work is None
    args.work = Path(tempfile.mkdtemp(prefix="chorus-serving-")) if scratch else args.work
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        config = {
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "load_average": os.getloadavg(),
            "provenance": provenance(args.threads, timed_path(args)),
            "torch": torch.__version__,
            "python": platform.python_version(),
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
        measured = measure_piper(args, config) if on_piper(args) else measure_chorus(args, config)
        report({"command": command, **measured}, args)
    finally:
        if scratch:
            shutil.rmtree(args.work, ignore_errors=True)


def timed_path(args) -> str:
    """What the provenance record names as the path timed."""
    if on_piper(args):
        return f"Batcher / swap on the Piper base {args.base} in this process"
    return "Batcher / swap / ModelPerVoice in this process; chorus serve"


if __name__ == "__main__":
    main()
