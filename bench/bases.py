"""The bases side by side (issue 38, item 6): each base's own voice, and voices adapted on each base.

**Base voices**, on the 20 benchmark sentences (no speaker here reads them), interleaved sentence by
sentence in a rotating order, one thread each:

* ``Chorus's PyTorch Piper``: ``load_base("piper-joe")``, the library's path (the engine);
* ``onnxruntime Piper``: Piper's own graph (``chorus.peers.piper.PiperVoice``, 1 intra-op thread);
* ``Chorus base``: ``load_base()``, the shipped base's default speaker and vocoder.

Judged by distillmos (MOS) and Whisper tiny.en (WER); real-time factor per sentence with its spread, and
PyTorch Piper over onnxruntime Piper per sentence pair. Both Piper systems use the voice's scales and
draw their own noise, so their audio differs sample by sample; the noiseless equality is a test
(``tests/models/test_piper_vits.py``). One draw of noise per sentence makes a WER that moves by points
from draw to draw, so ``--draws`` reads the sentences that many times (PyTorch Piper seeded 0, 1, ...;
onnxruntime draws its own) and the Piper rows pool every draw, with the WER of each draw beside.

**Adapted voices**: for each target (``--targets``, held-out datasets never trained on) and each of
``--minutes``, the first minutes of its clips (as ``bench/adaptation.py`` picks them) adapted on each base
by ``chorus adapt`` itself in a child process (its defaults; ``--base piper-joe`` for the Piper base),
timed and with its peak RSS read from the child's resource usage; then spoken through the library on the
target's last 20 clips' sentences and judged (MOS, WER, resemblyzer similarity to 10 other real clips).
Voices are kept under ``--work`` and reused when present (``--fresh`` makes them again).

    python bench/bases.py --part base --out bench/results/bases
    python bench/bases.py --part adapted --targets flite-slt,festival-ked --minutes 1,3 --out bench/results/bases
    python bench/bases.py --part report --out bench/results/bases

Writes ``base.json`` and ``adapted-<targets>.json`` (one per run of a part: targets may run in parallel
processes) and, from all of them, ``bases.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.peers.piper import load_joe
from chorus.synthesis import load_base

sys.path.insert(0, str(Path(__file__).parent))
from run_record import ChildPeakRss, LoadSampler, describe, kept_on_failure, paired_ratios, provenance, spread  # noqa: E402

BASES = {"piper-joe": "piper-joe", "chorus": None}  # --base value of each base (None: the shipped Chorus base)


def wer_per_draw(rows: list, draws: int) -> list[float]:
    """The corpus WER of each of ``draws`` readings, where ``rows`` (judged items with ``word_edits`` and
    ``reference_words``) hold the readings one after another."""
    if not rows or len(rows) % draws:
        raise ValueError(f"{len(rows)} judged items are not {draws} readings of the same sentences")
    size = len(rows) // draws
    parts = [rows[d * size : (d + 1) * size] for d in range(draws)]
    return [sum(r.word_edits for r in part) / sum(r.reference_words for r in part) for part in parts]


def judge(items: list[EvalItem], similarity: bool, draws: int = 1) -> dict:
    """MOS, corpus WER and (``similarity``) resemblyzer similarity of ``items``; where they are ``draws``
    readings of the same sentences one after another, each reading's WER too."""
    judges = Judges(speaker=SpeakerJudge() if similarity else None, reference=False)
    report = evaluate_pairs(items, judges=judges, progress=False)
    means = report.means()
    mos = [row.mos for row in report.rows if row.mos is not None]
    result = {
        "n": len(items),
        "wer": report.corpus_wer,
        "mos": means.get("mos"),
        "mos_sd": float(np.std(mos, ddof=1)) if len(mos) > 1 else None,
        "similarity": means.get("speaker_similarity"),
    }
    if draws > 1:
        result["wer_per_draw"] = wer_per_draw(report.rows, draws)
    return result


PIPERS = ("Chorus's PyTorch Piper", "onnxruntime Piper")  # the systems that draw noise


def reading_order(names: list[str], sentences: int, draws: int) -> list[tuple[int, int, str]]:
    """(draw, sentence index, system) in the order they are read: draw after draw, sentence after sentence,
    every system that reads in that draw (all in the first; the Piper systems after) in an order rotating
    sentence by sentence, so each system goes first as often as the others."""
    order = []
    for draw in range(draws):
        present = names if draw == 0 else [name for name in names if name in PIPERS]
        for index in range(sentences):
            turn = index % len(present)
            order += [(draw, index, name) for name in present[turn:] + present[:turn]]
    return order


def base_voices(sentences: list[str], draws: int = 1) -> dict:
    """Each system speaks each sentence in turn (the order rotating per sentence), ``draws`` times over for
    the Piper systems (the Chorus base draws no noise: it reads each sentence once); time and audio kept."""
    torch.set_num_threads(1)
    piper_torch, chorus = load_base("piper-joe"), load_base()
    piper_onnx = load_joe(threads=1)
    systems = {
        PIPERS[0]: lambda text: piper_torch.synthesize_batch([text])[0].audio,
        PIPERS[1]: lambda text: piper_onnx.synthesize(text)[0],
        "Chorus base": lambda text: chorus.synthesize_batch([text])[0].audio,
    }
    rates = {PIPERS[0]: piper_torch.sample_rate, "Chorus base": chorus.sample_rate}
    rates[PIPERS[1]] = piper_onnx.config.sample_rate
    for speak in systems.values():  # one warm-up each: first calls pay for lazy set-up
        speak("Warm up.")
    audio: dict[str, list] = {name: [] for name in systems}
    rtf: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for draw, index, name in reading_order(names, len(sentences), draws):
        piper_torch.engine.base.settings = replace(piper_torch.engine.base.settings, seed=draw)
        started = time.perf_counter()
        clip = np.asarray(systems[name](sentences[index]), dtype=np.float32)
        rtf[name].append((time.perf_counter() - started) / (len(clip) / rates[name]))
        audio[name].append(clip)
    rows = {}
    for name in names:
        texts = sentences * (len(audio[name]) // len(sentences))
        items = [
            EvalItem(f"{i:03d}", a, t, sample_rate=rates[name]) for i, (a, t) in enumerate(zip(audio[name], texts))
        ]
        # Each draw's WER alone beside the pooled one: how far one draw of noise moves it.
        rows[name] = {**judge(items, False, draws if name in PIPERS else 1), "rtf": vars(spread(rtf[name]))}
    ratios = paired_ratios(rtf[PIPERS[0]], rtf[PIPERS[1]])
    # The README's speed question: Chorus's base against Piper as Piper ships (onnxruntime), same sentences
    # (the first draw's: the Chorus base reads each sentence once).
    speedup = paired_ratios(rtf[PIPERS[1]][: len(sentences)], rtf["Chorus base"])
    return {
        "systems": rows,
        "draws": draws,
        "torch_over_onnx_rtf": vars(spread(ratios)),
        "chorus_speedup_over_onnx": vars(spread(speedup)),
    }


def heldout_split(folder: Path, sentences: int = 20, references: int = 10):
    """(judged utterances, reference clip paths, the pool training takes its first minutes from)."""
    utterances, _ = discover(folder)
    return (
        utterances[-sentences:],
        [u.audio_path for u in utterances[-sentences - references : -sentences]],
        utterances[: -sentences - references],
    )


def adapt_in_child(data: Path, voice: Path, base: str | None, threads: int, steps: int | None) -> dict:
    """``chorus adapt`` in a child process: wall and CPU seconds (wait4) and the child's own peak RSS (its
    VmHWM: wait4's ``ru_maxrss`` holds this process's peak, see :class:`run_record.ChildPeakRss`)."""
    command = [sys.executable, "-m", "chorus", "adapt", str(data), "--out", str(voice), "--threads", str(threads)]
    command += ["--overwrite"]  # the benchmark's own work folder: a voice there is one it made, to make again
    command += ["--base", base] if base else []
    command += ["--steps", str(steps)] if steps else []
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with ChildPeakRss(child.pid) as peak:
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}):\n{output[-2000:]}")
    return {
        "seconds": round(time.perf_counter() - started, 1),
        # CPU time beside wall time: on a shared machine the wall clock also counts the neighbours.
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(peak.mb, 1),
        "log": output[-600:],
    }


def adapted_voices(args: argparse.Namespace) -> list[dict]:
    rows = []
    for target in args.targets.split(","):
        evaluation, references, pool = heldout_split(args.heldout / target)
        texts = [u.text for u in evaluation]
        for minutes in (float(m) for m in args.minutes.split(",")):
            data = write_subset(first_minutes(pool, minutes), args.work / f"{target}-{minutes:g}min-data")
            for base_name, base in BASES.items():
                if base_name not in args.bases.split(","):
                    continue
                voice = args.work / f"{target}-{minutes:g}min-{base_name}"
                cell = args.work / f"{voice.name}.json"
                if cell.is_file() and not args.fresh:
                    adaptation = json.loads(cell.read_text())
                else:
                    adaptation = adapt_in_child(data, voice, base, args.threads, args.steps)
                    cell.write_text(json.dumps(adaptation))
                torch.set_num_threads(args.threads)
                tts = load_base(base)
                name = tts.load_voice(voice)
                spoken = tts.synthesize_batch(texts, voice=name)
                items = [
                    EvalItem(u.key, s.audio, u.text, speaker_references=references, sample_rate=s.sample_rate)
                    for u, s in zip(evaluation, spoken)
                ]
                card = json.loads((voice / "voice_card.json").read_text())
                generator_parameters = sum(p.numel() for p in tts.engine.model.parameters())
                rows.append(
                    {
                        "target": target,
                        "minutes": minutes,
                        "base": base_name,
                        **judge(items, similarity=True),
                        "train_minutes": round(adaptation["seconds"] / 60, 2),
                        "train_cpu_minutes": round(adaptation["cpu_seconds"] / 60, 2),
                        "peak_rss_mb": adaptation["peak_rss_mb"],
                        "voice_bytes": sum(f.stat().st_size for f in voice.iterdir() if f.suffix == ".safetensors"),
                        "voice_share": card["trainable_parameters"] / generator_parameters,
                        "steps": card["steps"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        rows.append({"target": target, "recordings": judge(  # the recordings' own figures, once per run
            [EvalItem(u.key, u.audio_path, u.text, speaker_references=references) for u in evaluation], similarity=True
        ), **derivation(args.heldout / target)})  # fmt: skip
    return rows


TARGET_MOS, TARGET_WER, TARGET_TRAIN_MINUTES, TARGET_SHARE = 3.3, 0.10, 15.0, 0.02


def adapted_verdicts(rows: list[dict], minutes: float = 3.0) -> list[str]:
    """Issue 38's targets for voices adapted on the Piper base from ``minutes`` of a target, one row per target
    adapted on both bases: MOS >= 3.3, similarity >= the Chorus base's voice of the same minutes, WER <= 10 %,
    training <= 15 minutes (a wall clock on the run's threads: the target says 2), a voice <= 2 % of the base.
    When a run judged a cell twice, the last row read counts."""
    cells = {(r["target"], r["base"]): r for r in rows if "recordings" not in r and r["minutes"] == minutes}
    targets = sorted({t for t, b in cells if b == "piper-joe" and (t, "chorus") in cells})
    if not targets:
        return []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = [
        f"Issue 38's targets for the Piper base's voices from {minutes:g} minutes, each against the Chorus base's "
        "voice of the same target and minutes. Training is wall minutes on the run's threads, within `chorus "
        "adapt`'s 10-minute budget, which stops a Piper run before its last steps on 1 thread (the steps column).",
        "",
        "| target | MOS >= 3.3 | similarity >= the Chorus base's | WER <= 10 % | training <= 15 min | voice <= 2 % |",
        "|---|---|---|---|---|---|",
    ]
    for target in targets:
        piper, chorus = cells[(target, "piper-joe")], cells[(target, "chorus")]
        lines.append(
            f"| {target} | {piper['mos']:.2f}: {verdict(piper['mos'] >= TARGET_MOS)} | "
            f"{piper['similarity']:.3f} vs {chorus['similarity']:.3f}: "
            f"{verdict(piper['similarity'] >= chorus['similarity'])} | "
            f"{100 * piper['wer']:.1f} %: {verdict(piper['wer'] <= TARGET_WER)} | "
            f"{piper['train_minutes']:.1f}: {verdict(piper['train_minutes'] <= TARGET_TRAIN_MINUTES)} | "
            f"{100 * piper['voice_share']:.2f} %: {verdict(piper['voice_share'] <= TARGET_SHARE)} |"
        )
    return lines + [""]


def derivation(folder: Path) -> dict:
    """How a target made by ``bench/unheard_voice.py`` was made (its ``derived.json``), or nothing."""
    record = folder / "derived.json"
    return {"derived": json.loads(record.read_text())} if record.is_file() else {}


def derivation_lines(rows: list[dict]) -> list[str]:
    """One line per target made from another voice: the chain, and how far resemblyzer hears it from its
    source and from its nearest other voice, beside the source against its own other clips."""
    lines, seen = [], set()
    for row in rows:
        if "derived" not in row or row["target"] in seen:  # every run of a target records it again
            continue
        seen.add(row["target"])
        made = row["derived"]
        scores = dict(made["resemblyzer_similarity"])
        source, yardstick = (
            scores.pop(made["source"]),
            scores.pop(f"{made['source']}, its own other clips (same speaker)"),
        )
        others = ""
        if scores:  # voices given with --compare
            nearest = max(scores, key=scores.get)
            others = f" and at most {scores[nearest]:.3f} against the {len(scores)} other voices compared ({nearest})"
        lines.append(
            f"- {row['target']}: no model here heard it. Made by `bench/unheard_voice.py` from {made['source']} "
            f"(held out of every training) through `{made['sox']}`; resemblyzer scores it {source:.3f} against "
            f"{made['source']} (whose own clips score {yardstick:.3f} against each other){others}."
        )
    return lines + [""] if lines else []


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(out: Path) -> str:
    lines = ["# The bases side by side", ""]
    base_file = out / "base.json"
    if base_file.is_file():
        base = json.loads(base_file.read_text())
        draws = base["result"].get("draws", 1)  # runs before --draws read each sentence once
        lines += [
            "## Base voices (20 benchmark sentences, interleaved)",
            "",
            f"`python bench/bases.py --part base --draws {draws} --out {out}`: {describe(base['provenance'])}. "
            f"Each Piper system read every sentence {draws} time(s) (PyTorch seeded 0-{draws - 1}, onnxruntime "
            "its own noise); its MOS and WER pool every reading, and the WER of each reading is beside.",
            "",
            "| system | MOS (sd) | WER | WER of each reading | real-time factor, median (IQR) |",
            "|---|---|---|---|---|",
        ]
        for name, row in base["result"]["systems"].items():
            rtf = row["rtf"]
            each = ", ".join(f"{100 * w:.1f}" for w in row.get("wer_per_draw", [])) or "-"
            lines.append(
                f"| {name} | {_fmt(row['mos'])} ({_fmt(row['mos_sd'])}) | {100 * row['wer']:.1f} % | {each} | "
                f"{rtf['median']:.3f} ({rtf['q1']:.3f}-{rtf['q3']:.3f}), n {rtf['n']} |"
            )
        ratio = base["result"]["torch_over_onnx_rtf"]
        systems = base["result"]["systems"]
        torch_row, onnx_row = systems["Chorus's PyTorch Piper"], systems["onnxruntime Piper"]
        mos_gap, wer_gap = torch_row["mos"] - onnx_row["mos"], 100 * (torch_row["wer"] - onnx_row["wer"])
        lines += [
            "",
            f"PyTorch Piper's time over onnxruntime's, per sentence: median {ratio['median']:.2f}x "
            f"(IQR {ratio['q1']:.2f}-{ratio['q3']:.2f}, range {ratio['low']:.2f}-{ratio['high']:.2f}).",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
            f"| MOS within 0.05 of onnxruntime Piper's | {mos_gap:+.2f} | {'met' if abs(mos_gap) <= 0.05 else 'not met'} |",
            f"| WER within 1 point | {wer_gap:+.1f} points | {'met' if abs(wer_gap) <= 1 else 'not met'} |",
            f"| real-time factor <= 1.5x onnxruntime's | {ratio['median']:.2f}x (median) | "
            f"{'met' if ratio['median'] <= 1.5 else 'not met'} |",
            "",
        ]
        readings = {name: row.get("wer_per_draw") for name, row in systems.items() if name in PIPERS}
        if all(readings.values()):  # runs with --draws: the gap beside how far one draw moves each system
            lines += [
                "WER of one reading, lowest to highest: "
                + "; ".join(f"{name} {100 * min(w):.1f}-{100 * max(w):.1f} %" for name, w in readings.items())
                + f" (the pooled gap: {wer_gap:+.1f} points).",
                "",
            ]
        speedup = base["result"].get("chorus_speedup_over_onnx")
        if speedup:  # runs before it was recorded lack it
            verdict = "met" if speedup["median"] >= 2 else "not met"
            lines += [
                f"Chorus base's speed over onnxruntime Piper's (Piper's real-time factor over Chorus's, per "
                f"sentence, same thread): median {speedup['median']:.2f}x (IQR {speedup['q1']:.2f}-{speedup['q3']:.2f}, "
                f"range {speedup['low']:.2f}-{speedup['high']:.2f}); target at least 2x: {verdict}.",
                "",
            ]
    adapted_files = sorted(out.glob("adapted-*.json"))
    if adapted_files:
        lines += [
            "## Adapted voices (each target's last 20 clips' sentences; similarity to 10 other real clips)",
            "",
            "Adapted by `chorus adapt` with its defaults in a child process, "
            + "; ".join(f"`{f.name}`: {describe(json.loads(f.read_text())['provenance'])}" for f in adapted_files)
            + ".",
            "",
            "| target | minutes | base | MOS (sd) | WER | similarity | steps | training min, wall (CPU) | peak RSS MB | "
            "voice KB (share) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        rows = [row for f in adapted_files for row in json.loads(f.read_text())["result"]]
        seen_recordings = set()
        for row in sorted(rows, key=lambda r: (r["target"], r.get("minutes", 0), r.get("base", ""))):
            if "recordings" in row:
                if row["target"] in seen_recordings:  # every run judges them again: the same clips
                    continue
                seen_recordings.add(row["target"])
                rec = row["recordings"]
                lines.append(
                    f"| {row['target']} | recordings | - | {_fmt(rec['mos'])} ({_fmt(rec['mos_sd'])}) | "
                    f"{100 * rec['wer']:.1f} % | {_fmt(rec['similarity'], 3)} | - | - | - | - |"
                )
                continue
            lines.append(
                f"| {row['target']} | {row['minutes']:g} | {row['base']} | {_fmt(row['mos'])} ({_fmt(row['mos_sd'])}) | "
                f"{100 * row['wer']:.1f} % | {_fmt(row['similarity'], 3)} | {row['steps']} | {row['train_minutes']:.1f} "
                f"({row['train_cpu_minutes']:.1f}) | "
                f"{row['peak_rss_mb']:.0f} | {row['voice_bytes'] / 1024:.0f} ({100 * row['voice_share']:.2f} %) |"
            )
        lines += [""] + derivation_lines(rows) + adapted_verdicts(rows)
    text = "\n".join(lines) + "\n"
    (out / "bases.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["base", "adapted", "report"], required=True)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--targets", default="flite-slt,festival-ked")
    parser.add_argument("--minutes", default="1,3")
    parser.add_argument("--bases", default=",".join(BASES), help="which bases' voices to make and judge")
    parser.add_argument("--steps", type=int, default=None, help="chorus adapt --steps (default: its own)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draws", type=int, default=3, help="readings of each sentence by each Piper system")
    parser.add_argument("--work", type=Path, default=Path("runs/bases"))
    parser.add_argument("--fresh", action="store_true", help="adapt again even where a voice exists")
    parser.add_argument("--out", type=Path, default=Path("bench/results/bases"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.part != "report":
        name = (
            f"adapted-{args.targets.replace(',', '+')}-{args.bases.replace(',', '+')}-{args.minutes.replace(',', '+')}"
        )
        path = args.out / ("base.json" if args.part == "base" else f"{name}.json")
        record = {"provenance": provenance(args.threads, "load_base(...).synthesize_batch; chorus adapt in a child")}
        with kept_on_failure(path, record), LoadSampler() as load:
            record["result"] = (
                base_voices(benchmark_sentences(), args.draws) if args.part == "base" else adapted_voices(args)
            )
        record["provenance"]["load"] = load.summary()
        path.write_text(json.dumps(record, indent=1, default=str))
    print(report(args.out))


if __name__ == "__main__":
    main()
