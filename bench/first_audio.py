"""Time to first audio under load: how long a client waits, from sending a one-sentence speech request to
the first byte of audio, against a real ``chorus serve`` with 1, 4 and 16 clients at once.

The server is this tree's ``chorus serve`` (a subprocess on a free loopback port, the shipped base with its
default vocoder, ``OMP_NUM_THREADS=--threads``) on a fresh store, with one API key per client (each
client is its own tenant, as independent users would be; the batcher serves tenants round-robin). Before
timing, the server finishes its start-up work (its CPU time stops growing: the speaker map for instant
voices is made in the background) and answers a few untimed requests.

Each client is closed-loop: it sends ``POST /v1/audio/speech`` (``response_format: pcm``, a base speaker,
one short sentence from ``bench/serving.py``'s ``TEXTS``), reads the first byte, then the rest, and
sends the next at once. One sentence is one batcher request; the route awaits it before it sends any
byte, so the first byte comes when the whole sentence is made (longer texts stream sentence by sentence,
and their first byte is this one sentence's). Concurrency levels run in blocks of ``--per-block``
requests, in ``--repeats`` rounds, their order reversed every other round (1, 4, 16, then 16, 4, 1), so
each level is measured beside its neighbours under the same background load; each client's first request
in a block is not counted (the block's start is a burst, not the steady state).

Where the time goes: the server's ``/metrics`` (batcher busy seconds, batches, batch sizes) read around
every block give the mean batch size and the mean time of one batch (acoustic forward and vocoder) per
level; the rest of the time to first audio is queueing (waiting for the batch in progress) and HTTP.
After the server stops, one sentence alone through :class:`~chorus.serving.engine.Engine` in this process
(same base, vocoder, thread count) splits one batch of one into the front end and acoustic forward
(``vocode=False``) and the vocoder (the rest).

Target (issue 31): p50 <= 0.3 s at 4 concurrent clients on this CPU. Anchors: Pocket TTS ~0.2 s to the
first chunk on 2 CPU cores; Kokoro-FastAPI < 1 s on an Apple M3.

    python bench/first_audio.py --out bench/results/first_audio

Writes ``first_audio.md``, ``first_audio.json`` and ``first_audio.png`` (the distribution per level).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from chorus.serving.engine import Engine, SentenceRequest
from chorus.serving.tenants import OPERATOR_TENANT
from run_record import closed_loop, machine, percentile, tree_at  # bench/, beside this script
from servers import batcher_counters, get, stop, timed_request, wait_idle
from serving import TEXTS
from soak import StoreSpec, start_server

TARGET_S = 0.3  # p50 at 4 clients
TARGET_CLIENTS = 4


def speech_body(text: str, speaker: str) -> bytes:
    return json.dumps({"model": "tts-1", "input": text, "voice": speaker, "response_format": "pcm"}).encode()


def block(port: int, keys: list[str], operator_key: str, bodies: list[bytes], clients: int, requests: int) -> dict:
    """``clients`` closed-loop clients sending ``requests`` requests between them (plus one uncounted first
    request each); their timings and the batcher's work over the block."""
    lock = threading.Lock()
    counter = iter(range(1 << 30))

    def plan(c: int):
        """Client ``c``'s requests: the next number from the shared counter while any are left."""
        first = True
        while True:
            with lock:
                n = next(counter)
            if n >= requests + clients:
                return
            yield c, n, first
            first = False

    def send(item: tuple[int, int, bool]) -> dict:
        c, n, first = item
        return timed_request(port, keys[c], bodies[n % len(bodies)]) | {"client": c, "counted": not first}

    before = batcher_counters(port, operator_key)
    loop = closed_loop([plan(c) for c in range(clients)], send)
    after = batcher_counters(port, operator_key)
    work = {k: after[k] - before[k] for k in after}
    return {"clients": clients, "seconds": loop.wall_s, "rows": [s.outcome for s in loop.sent], "batcher": work}


def alone(args, speaker: str) -> dict:
    """One sentence alone through the engine in this process: front end and acoustic forward, and with the
    vocoder; ``--alone-repeats`` times per text, alternating the two."""
    torch.set_num_threads(args.threads)
    engine = Engine.load()
    for text in TEXTS[:2]:  # warm-up
        engine.synthesize([SentenceRequest(text, speaker)])
    acoustic, whole, audio = [], [], []
    for _ in range(args.alone_repeats):
        for text in TEXTS:
            began = time.perf_counter()
            engine.synthesize([SentenceRequest(text, speaker)], vocode=False)
            acoustic.append(time.perf_counter() - began)
            began = time.perf_counter()
            (result,) = engine.synthesize([SentenceRequest(text, speaker)])
            whole.append(time.perf_counter() - began)
            audio.append(result.duration)
    return {
        "vocoder": type(engine.base.vocoder).__name__,
        "n": len(whole),
        "acoustic_p50_s": float(np.median(acoustic)),
        "whole_p50_s": float(np.median(whole)),
        "vocoder_p50_s": float(np.median(np.subtract(whole, acoustic))),
        "audio_p50_s": float(np.median(audio)),
    }


def summarize(blocks: list[dict], levels: list[int]) -> list[dict]:
    summary = []
    for clients in levels:
        mine = [b for b in blocks if b["clients"] == clients]
        rows = [r for b in mine for r in b["rows"] if r["counted"]]
        ok = [r for r in rows if r["status"] == 200]
        first = [r["first_byte_s"] for r in ok]
        work = {k: sum(b["batcher"][k] for b in mine) for k in ("busy_s", "batches", "rows")}
        batch_s = work["busy_s"] / max(work["batches"], 1)
        summary.append(
            {
                "clients": clients,
                "requests": len(rows),
                "failed": len(rows) - len(ok),
                "first_byte_p50_s": percentile(first, 50),
                "first_byte_p99_s": percentile(first, 99),
                "first_byte_mean_s": float(np.mean(first)),
                "total_p50_s": percentile([r["total_s"] for r in ok], 50),
                "per_block_p50_s": [
                    percentile([r["first_byte_s"] for r in b["rows"] if r["counted"] and r["status"] == 200], 50)
                    for b in mine
                ],
                "requests_per_s": sum(len(b["rows"]) for b in mine) / sum(b["seconds"] for b in mine),
                "mean_batch": work["rows"] / max(work["batches"], 1),
                "batch_s": batch_s,
                # What is left of the mean wait once the request's own batch is taken away: waiting for the
                # batch in progress (and the one before it), the event loop and HTTP on loopback.
                "queue_and_http_s": float(np.mean(first)) - batch_s,
            }
        )
    return summary


def report(result: dict, out: Path) -> None:
    (out / "first_audio.json").write_text(json.dumps(result, indent=1))
    summary, config, single = result["levels"], result["config"], result["alone"]
    at_target = (
        next(s for s in summary if s["clients"] == TARGET_CLIENTS) if TARGET_CLIENTS in config["levels"] else None
    )
    met = at_target is not None and at_target["first_byte_p50_s"] <= TARGET_S
    lines = [
        "# Time to first audio under load",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"`{shlex.join(result['server_command'])}` (this tree at {tree_at(config.get('provenance', config))}; the shipped base, its default "
        f"vocoder: {single['vocoder']}) on a {config['cpus']}-core CPU shared with other work, "
        f"OMP_NUM_THREADS={config['threads']}, load average {config['load_average_start'][0]:.1f} at the start "
        f"and {config['load_average_end'][0]:.1f} at the end. Closed-loop clients, one tenant each, each sending "
        "`POST /v1/audio/speech` (`response_format: pcm`, base speaker "
        f"`{config['speaker']}`, one sentence of {min(map(len, TEXTS))}-{max(map(len, TEXTS))} characters, "
        f"~{single['audio_p50_s']:.1f} s of audio) and reading the answer before the next; levels "
        f"{', '.join(map(str, config['levels']))} clients in blocks of {config['per_block']} counted requests, "
        f"{config['repeats']} rounds, order reversed every other round. Time to first audio: from sending the "
        "request (fresh loopback connection) to the first byte of audio received.",
        "",
        "## Findings",
        "",
        (
            f"- At {TARGET_CLIENTS} clients: p50 **{at_target['first_byte_p50_s']:.3f} s**, p99 "
            f"{at_target['first_byte_p99_s']:.3f} s (target p50 <= {TARGET_S:g} s: **{'met' if met else 'NOT met'}**)."
            if at_target
            else f"- {TARGET_CLIENTS} clients not measured."
        ),
        *(
            f"- {s['clients']} client(s): p50 {s['first_byte_p50_s']:.3f} s, p99 {s['first_byte_p99_s']:.3f} s over "
            f"{s['requests']} requests ({s['failed']} failed); {s['requests_per_s']:.2f} requests/s; mean batch "
            f"{s['mean_batch']:.2f} sentences taking {s['batch_s']:.3f} s; the rest of the mean wait "
            f"({s['first_byte_mean_s']:.3f} s): {s['queue_and_http_s']:.3f} s of queueing behind the batch in "
            "progress and HTTP."
            for s in summary
        ),
        f"- One sentence alone through the engine in the bench process ({single['n']} runs, median): front end "
        f"and acoustic forward {single['acoustic_p50_s']:.3f} s, vocoder ({single['vocoder']}) "
        f"{single['vocoder_p50_s']:.3f} s, together {single['whole_p50_s']:.3f} s for {single['audio_p50_s']:.2f} s "
        "of audio.",
        "- What dominates the wait: "
        + "; ".join(
            f"at {s['clients']} client(s) the request's own batch {100 * s['batch_s'] / s['first_byte_mean_s']:.0f}%, "
            f"queueing and HTTP {100 * max(s['queue_and_http_s'], 0) / s['first_byte_mean_s']:.0f}%"
            for s in summary
        )
        + f". A batch costs about its sentences' time one by one (compute-bound on one thread); of one sentence "
        f"alone, front end and acoustic forward {100 * single['acoustic_p50_s'] / single['whole_p50_s']:.0f}%, "
        f"vocoder {100 * single['vocoder_p50_s'] / single['whole_p50_s']:.0f}%.",
        "- Anchors: Pocket TTS ~0.2 s to the first chunk on 2 CPU cores; Kokoro-FastAPI < 1 s on an Apple M3.",
        "",
        "## By level",
        "",
        "| clients | requests | failed | first audio p50 s | p99 s | p50 per block s | whole answer p50 s "
        "| requests/s | mean batch | batch s | queue + HTTP s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        blocks = ", ".join(f"{v:.3f}" for v in s["per_block_p50_s"])
        lines.append(
            f"| {s['clients']} | {s['requests']} | {s['failed']} | {s['first_byte_p50_s']:.3f} | "
            f"{s['first_byte_p99_s']:.3f} | {blocks} | {s['total_p50_s']:.3f} | {s['requests_per_s']:.2f} | "
            f"{s['mean_batch']:.2f} | {s['batch_s']:.3f} | {s['queue_and_http_s']:.3f} |"
        )
    lines += [
        "",
        "Batch figures come from the server's `/metrics` (`chorus_batcher_busy_seconds`, `chorus_batch_size`) "
        'read before and after each block, so they include the uncounted first requests. "queue + HTTP" is '
        "the mean time to first audio less the mean batch time.",
        "",
        "## Caveats",
        "",
        "- One shared 2-core CPU: absolute times carry whatever else ran on it (the load average above); the "
        "levels were interleaved so that they compare under the same load.",
        "- One short sentence per request: its first byte is its whole audio (the route answers a one-sentence "
        "text as one piece); a longer text's first byte is its first sentence's, the same wait.",
    ]
    (out / "first_audio.md").write_text("\n".join(lines) + "\n")
    plot(result, out / "first_audio.png")
    print("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, s in enumerate(result["levels"]):
        times = sorted(
            r["first_byte_s"]
            for b in result["blocks"]
            if b["clients"] == s["clients"]
            for r in b["rows"]
            if r["counted"] and r["status"] == 200
        )
        left.plot(times, np.linspace(0, 1, len(times)), color=f"C{k}", label=f"{s['clients']} client(s)")
    left.axvline(TARGET_S, color="k", ls="--", lw=1, label=f"target p50 at {TARGET_CLIENTS}: {TARGET_S:g} s")
    left.set_xscale("log")
    left.set_xlabel("time to first audio, s")
    left.set_ylabel("fraction of requests")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, which="both")
    levels = [s["clients"] for s in result["levels"]]
    x = np.arange(len(levels))
    batch = [s["batch_s"] for s in result["levels"]]
    queue = [max(s["queue_and_http_s"], 0.0) for s in result["levels"]]
    right.bar(x, batch, color="C0", label="own batch (forward + vocoder)")
    right.bar(x, queue, bottom=batch, color="C1", label="queue + HTTP")
    right.plot(x, [s["first_byte_p50_s"] for s in result["levels"]], "ko", label="p50")
    right.plot(x, [s["first_byte_p99_s"] for s in result["levels"]], "k^", mfc="white", label="p99")
    right.set_xticks(x, [str(c) for c in levels])
    right.set_xlabel("concurrent clients")
    right.set_ylabel("seconds (bars: mean time to first audio)")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,4,16", help="concurrent clients, comma-separated")
    parser.add_argument("--per-block", type=int, default=60, help="counted requests per level per round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the levels")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the server")
    parser.add_argument("--alone-repeats", type=int, default=3, help="passes over the texts, one sentence alone")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/first_audio"))
    parser.add_argument(
        "--report", action="store_true", help="write the report again from OUT/first_audio.json (nothing is run)"
    )
    args = parser.parse_args()
    if args.report:
        report(json.loads((args.out / "first_audio.json").read_text()), args.out)
        return
    levels = [int(v) for v in args.levels.split(",")]
    command = shlex.join(["python", "bench/first_audio.py", *sys.argv[1:]])
    scratch = args.work is None
    work = Path(tempfile.mkdtemp(prefix="chorus-first-audio-")) if scratch else args.work
    args.out.mkdir(parents=True, exist_ok=True)
    keys = [secrets.token_urlsafe(24) for _ in range(max(levels))]
    operator_key = secrets.token_urlsafe(24)
    keys_file = work / "keys.txt"
    work.mkdir(parents=True, exist_ok=True)
    keys_file.write_text("".join(f"{k} c{c}\n" for c, k in enumerate(keys)) + f"{operator_key} {OPERATOR_TENANT}\n")
    config = {
        **machine(args.threads, "chorus serve (this tree's CLI): POST /v1/audio/speech, first body byte"),
        "levels": levels,
        "per_block": args.per_block,
        "repeats": args.repeats,
        "threads": args.threads,
    }
    # start_server's options: the defaults of chorus serve but the thread count (no onboarding here).
    serve_args = argparse.Namespace(
        cache_mb=64.0, adapt_steps=3, adapt_threads=1, threads=args.threads, trace_memory=False
    )
    try:
        server = start_server(serve_args, StoreSpec(str(work / "store")), keys_file, None, work / "server")
        try:
            print(f"server up on port {server.port}; waiting for its start-up work ...", flush=True)
            config["idle_wait_s"] = round(wait_idle(server.process.pid), 1)
            listed = json.loads(get(server.port, "/v1/voices", keys[0]))["data"]
            speaker = next(v["id"] for v in listed if v["type"] == "base")
            config["speaker"] = speaker
            bodies = [speech_body(text, speaker) for text in TEXTS]
            block(server.port, keys, operator_key, bodies, 4, 8)  # warm-up, not kept
            blocks = []
            for r in range(args.repeats):
                for clients in levels if r % 2 == 0 else levels[::-1]:
                    blocks.append(block(server.port, keys, operator_key, bodies, clients, args.per_block))
                    b = blocks[-1]
                    first = [x["first_byte_s"] for x in b["rows"] if x["counted"] and x["status"] == 200]
                    print(
                        f"round {r + 1}, {clients} clients: first audio p50 {percentile(first, 50):.3f} s", flush=True
                    )
        finally:
            shutdown = stop(server.process)
        print("one sentence alone through the engine ...", flush=True)
        single = alone(args, speaker)
        config["load_average_end"] = os.getloadavg()
        result = {
            "command": command,
            "server_command": [Path(server.command[0]).name, *server.command[1:]],
            "config": config,
            "shutdown": shutdown,
            "levels": summarize(blocks, levels),
            "alone": single,
            "blocks": blocks,
        }
        report(result, args.out)
    finally:
        if scratch:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
