"""Benchmark: how long an OpenAI-style custom voice takes on this CPU through ``chorus serve`` itself, from
``POST /v1/audio/voices`` to its instant voice (the encoder's blend), to its fitted instant voice (the base
speaker that fits the sample best by mel loss, set once the refinement job has the sample's words) and to its
refined (adapted) voice, for the three held-out voices.

Each voice's consent recording is the phrase read by the engine that made its dataset, and its sample 13-17 s
of its recordings (the first half of its dataset), made as ``bench/consent.py`` makes them (10-14 s until the
server counted a sample's speech as a voice-activity detector hears it, pauses left out). The server is a
real ``chorus serve`` process on the shipped base (its process job runner, its real judges, its default sample
recipe, ``--adapt-threads`` for the job); the clock starts once it is healthy and its start-up work (the
speaker map of the instant voices) is done. The voices are made one after another (a server refines one at
a time), each timed from its POST by polling ``GET /v1/audio/voices/{id}`` every 0.5 s.

    python bench/voice_from_sample.py --out bench/results/voice_from_sample

Writes ``voice_from_sample.md`` and ``voice_from_sample.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from chorus.audio.io import SAMPLE_RATE
from chorus.corpus.build import record_sentences
from chorus.corpus.speakers import get_speaker
from chorus.serving.settings import CONSENT_PHRASES
from consent import SHORT, SOURCES, sample_windows  # bench/, beside this script
from run_record import LoadSampler, describe, kept_on_failure, provenance
from servers import chorus_command, free_port, get, launch, multipart, post_json, request, stop, wait_idle


def wav_bytes(audio: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def recordings(heldout: Path, seed: int) -> dict[str, tuple[bytes, bytes]]:
    """Each held-out voice's (consent, sample) as WAV bytes."""
    rng = np.random.default_rng(seed)
    phrase = CONSENT_PHRASES["en"]
    made = {}
    for source in SOURCES:
        consent = record_sentences(get_speaker(source), [phrase])[0]
        # 13-17 s: a sample needs 10 s of speech as the voice-activity detector hears it, pauses not counted.
        sample = sample_windows(source, heldout, "figures", 1, rng, seconds=(13, 17))[0]
        made[SHORT[source]] = (wav_bytes(consent), wav_bytes(sample))
    return made


def posted(port: int, path: str, fields: dict[str, str], field: str, audio: bytes) -> tuple[int, dict]:
    body, kind = multipart(fields, [(field, f"{field}.wav", audio, "audio/wav")])
    status, data = request(port, "POST", path, body, content_type=kind, timeout=600)
    return status, json.loads(data)


def speaks(port: int, voice_id: str) -> bool:
    """Whether the voice answers a speech request."""
    body = json.dumps({"input": "Hello there.", "voice": {"id": voice_id}}).encode()
    return request(port, "POST", "/v1/audio/speech", body, content_type="application/json")[0] == 200


def make_voice(port: int, consent: bytes, sample: bytes, name: str, timeout: float) -> dict:
    """Consent, then the voice; polls its stage until adapted or failed. Times in seconds from each POST."""
    started = time.perf_counter()
    status, answer = posted(port, "/v1/audio/voice_consents", {"name": name, "language": "en"}, "recording", consent)
    row = {"voice": name, "consent_status": status, "consent_seconds": time.perf_counter() - started}
    if status != 200:
        return row | {"error": answer["error"]["message"]}
    started = time.perf_counter()
    status, answer = posted(port, "/v1/audio/voices", {"name": name, "consent": answer["id"]}, "audio_sample", sample)
    row |= {"voice_status": status, "instant_seconds": time.perf_counter() - started}
    if status != 200:
        return row | {"error": answer["error"]["message"]}
    voice_id, blend = answer["id"], answer["instant"]
    row["blend"] = blend
    row["instant_speaks"] = speaks(port, voice_id)
    while time.perf_counter() - started < timeout:
        state = json.loads(get(port, f"/v1/audio/voices/{voice_id}"))
        if "fitted_seconds" not in row and state["instant"] != blend:
            row |= {"fitted_seconds": time.perf_counter() - started, "fitted": state["instant"]}
        if state["stage"] == "adapted" or state["refinement"] == "failed":
            break
        time.sleep(0.5)
    row |= {
        "stage": state["stage"],
        "refinement": state["refinement"],
        "refinement_error": state.get("refinement_error"),
        "refined_seconds": time.perf_counter() - started,
    }
    if state["stage"] == "adapted":  # the refined voice speaks as itself
        row["refined_speaks"] = speaks(port, voice_id)
    return row


def report(result: dict) -> str:
    rows = result["rows"]
    lines = [
        "# A custom voice from one sample: time to instant and to refined, through `chorus serve`",
        "",
        f"`{result['command']}`: {describe(result['provenance'])}. Shipped base, default sample recipe, a real",
        f"`chorus serve` process ({result['threads']} thread(s) for speech, {result['adapt_threads']} for the job);",
        f"its start-up work (the speaker map) took {result['startup_seconds']:.1f} s before the clock started.",
        "",
        "| voice | consent (s) | POST -> instant (s) | instant speaks | blend | POST -> fitted instant (s) | fitted "
        "speaker | POST -> end of refinement (s) | stage | refinement |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['voice']} | {r.get('consent_seconds', 0):.1f} | {r.get('instant_seconds', float('nan')):.1f} | "
            f"{r.get('instant_speaks', '')} | {r.get('blend', '-')} | {r.get('fitted_seconds', float('nan')):.1f} | "
            f"{r.get('fitted', '-')} | {r.get('refined_seconds', float('nan')):.0f} | {r.get('stage', '-')} | "
            f"{r.get('refinement', '-')}{': ' + r['refinement_error'] if r.get('refinement_error') else ''}"
            f"{' ' + r['error'] if r.get('error') else ''} |"
        )
    refined = [r["refined_seconds"] for r in rows if r.get("stage") == "adapted"]
    instant = [r["instant_seconds"] for r in rows if "instant_seconds" in r]
    fitted = [r["fitted_seconds"] for r in rows if "fitted_seconds" in r]
    lines += [
        "",
        f"p50 POST -> instant voice: {statistics.median(instant):.1f} s (n = {len(instant)})" if instant else "",
        f"p50 POST -> fitted instant voice: {statistics.median(fitted):.1f} s (n = {len(fitted)})" if fitted else "",
        f"p50 POST -> refined voice: {statistics.median(refined):.0f} s (n = {len(refined)} refined of {len(rows)})"
        if refined
        else f"no voice was refined (of {len(rows)})",
    ]
    return "\n".join(lines) + "\n"


def serve_and_time(args, made: dict[str, tuple[bytes, bytes]], result: dict) -> None:
    """Start ``chorus serve`` on an empty store, wait for its start-up work, make each voice in turn."""
    with tempfile.TemporaryDirectory(prefix="chorus-voice-from-sample-") as work:
        port = free_port()
        command = [*chorus_command(), "serve", "--store", str(Path(work) / "store"), "--port", str(port),
                   "--adapt-threads", str(args.adapt_threads)]  # fmt: skip
        environment = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
        process = launch(command, port, Path(work) / "server.log", env=environment, cwd=Path(work))
        try:
            result["startup_seconds"] = wait_idle(process.pid)
            post_json(port, "/v1/audio/speech", {"input": "Warm up.", "voice": "alloy"})
            for name, (consent, sample) in made.items():
                result["rows"].append(make_voice(port, consent, sample, name, args.timeout))
                print(result["rows"][-1], flush=True)
        finally:
            result["server_stop"] = stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server's speech")
    parser.add_argument("--adapt-threads", type=int, default=1, help="threads of its refinement job")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a refinement")
    parser.add_argument("--out", type=Path, default=Path("bench/results/voice_from_sample"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "voice_from_sample.json"
    result = {
        "command": " ".join(["python bench/voice_from_sample.py", *sys.argv[1:]]),
        "provenance": provenance(args.threads, "chorus serve (its process job runner), over HTTP"),
        "threads": args.threads,
        "adapt_threads": args.adapt_threads,
        "rows": [],
    }
    made = recordings(args.heldout, args.seed)
    with kept_on_failure(path, result), LoadSampler() as load:
        serve_and_time(args, made, result)
        result["provenance"]["load"] = load.summary()
    path.write_text(json.dumps(result, indent=1))
    (args.out / "voice_from_sample.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
