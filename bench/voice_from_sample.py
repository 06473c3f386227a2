"""Benchmark: how long an OpenAI-style custom voice takes on this CPU, from ``POST /v1/audio/voices`` to its
instant voice (the encoder's blend), to its fitted instant voice (the base speaker that fits the sample best by
mel loss, set once the refinement job has the sample's words) and to its refined (adapted) voice, for the three
held-out voices.

Each voice's consent recording (the phrase read by the engine that made its dataset) and a 13-28 s sample
of its recordings come from ``bench/consent.py``'s run (``runs/consent/audio``: run that first). The
server is the app of ``chorus serve`` in this process on the shipped base, with its real judges (Whisper
tiny.en, the shipped speaker encoder) and its default sample recipe; the base's speaker map (the instant
voices' space) is made before the clock starts, as ``chorus serve`` makes it at start-up. The voices are
made one after another (a server refines one at a time), each timed from its POST.

    python bench/voice_from_sample.py --out bench/results/voice_from_sample

Writes ``voice_from_sample.md`` and ``voice_from_sample.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from fastapi.testclient import TestClient

from chorus.serving.api import create_app
from chorus.serving.engine import Engine
from chorus.serving.store import VoiceStore
from chorus.serving.voice_keys import stored_voice_folder

VOICES = ("joe", "slt", "ked")


def make_voice(client: TestClient, consent: Path, sample: Path, name: str, timeout: float) -> dict:
    """Consent, then the voice; polls its stage until adapted or failed. Times in seconds from each POST."""
    started = time.perf_counter()
    with open(consent, "rb") as recording:
        answer = client.post(
            "/v1/audio/voice_consents",
            data={"name": name, "language": "en"},
            files={"recording": (consent.name, recording, "audio/wav")},
        )
    row = {"voice": name, "consent_status": answer.status_code, "consent_seconds": time.perf_counter() - started}
    if answer.status_code != 200:
        return row | {"error": answer.json()["error"]["message"]}
    consent_id = answer.json()["id"]
    started = time.perf_counter()
    with open(sample, "rb") as audio:
        answer = client.post(
            "/v1/audio/voices",
            data={"name": name, "consent": consent_id},
            files={"audio_sample": (sample.name, audio, "audio/wav")},
        )
    row |= {"voice_status": answer.status_code, "instant_seconds": time.perf_counter() - started}
    if answer.status_code != 200:
        return row | {"error": answer.json()["error"]["message"]}
    voice_id, blend = answer.json()["id"], answer.json()["instant"]
    row["blend"] = blend
    speech = client.post("/v1/audio/speech", json={"input": "Hello there.", "voice": {"id": voice_id}})
    row["instant_speaks"] = speech.status_code == 200
    while time.perf_counter() - started < timeout:
        state = client.get(f"/v1/audio/voices/{voice_id}").json()
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
    return row


def report(rows: list[dict], command: str, threads: int, map_seconds: float) -> str:
    lines = [
        "# A custom voice from one sample: time to instant and to refined",
        "",
        f"`{command}`; shipped base, default sample recipe,",
        f"{threads} torch thread(s) for speech; the speaker map took {map_seconds:.1f} s before the clock started.",
        "On the shared 2-core CPU, with other benchmark runs beside it (timings are upper bounds).",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--audio", type=Path, default=Path("runs/consent/audio"), help="bench/consent.py's recordings")
    parser.add_argument("--sample", type=int, default=0, help="which of its sample windows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a refinement")
    parser.add_argument("--out", type=Path, default=Path("bench/results/voice_from_sample"))
    args = parser.parse_args()
    command = " ".join(["python bench/voice_from_sample.py", *sys.argv[1:]])
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as work:
        store = VoiceStore(str(Path(work) / "store"))
        engine = Engine.load(resolve=functools.partial(stored_voice_folder, store))
        app = create_app(store, engine)
        started = time.perf_counter()
        app.state.server.custom_voices.speaker_map()  # as chorus serve makes it at start-up
        map_seconds = time.perf_counter() - started
        with TestClient(app) as client:
            rows = []
            for voice in VOICES:
                consent = args.audio / f"consent_{voice}_right_as-read.wav"
                sample = args.audio / f"sample_{voice}_{args.sample}.wav"
                rows.append(make_voice(client, consent, sample, voice, args.timeout))
                print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "voice_from_sample.json").write_text(json.dumps({"map_seconds": map_seconds, "rows": rows}, indent=1))
    (args.out / "voice_from_sample.md").write_text(report(rows, command, args.threads, map_seconds))
    print(report(rows, command, args.threads, map_seconds))


if __name__ == "__main__":
    main()
