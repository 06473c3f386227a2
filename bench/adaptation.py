"""Benchmark of voice adaptation: every method against full fine-tuning, on voices the base never heard.

For each held-out voice (piper-joe, flite-slt, festival-ked: no clip of them, nor any voice derived
from them, was in pretraining) and each amount of data (1, 3, 10 minutes), every method adapts the
shipped base; then it speaks sentences held out from its training clips and is judged against the
real recordings of those sentences: Whisper tiny.en WER, resemblyzer similarity to real clips of the
voice, distillmos predicted MOS, MCD (DTW), F0 RMSE. Beside each voice: the same sentences from its start
speaker on the base (the speaker whose vector it starts from) and from its own recordings. Also trainable
parameters, artifact size, time per step and in total, and forgetting: how the base voices change
(adapters: checked bit-identical; full fine-tuning: teacher-forced mel L1 on base-voice clips before and
after).

Adapter methods run with ``AdaptConfig``'s defaults (its text-side setting included); ``full`` is the
baseline every target names, full fine-tuning of every weight (``keep_text_side=False``).

    python bench/adaptation.py --voices flite-slt --minutes 3 --seeds 1234,1,2 --threads 1 \\
        --methods residual,full --out bench/results/adaptation

Training is capped by steps (``--steps``) and early stopping on held-out mel loss, never by wall clock:
on a shared CPU a clock cap would make a cell depend on the load beside it. Each row is one seed (held-out
split, batch order, initialization); cells run with several seeds get a mean and a spread, and the target
is decided on the means, with the per-seed ratios beside them.

Writes ``adaptation.md``, ``adaptation.json`` and ``similarity_vs_minutes.png`` under ``--out``;
results of earlier runs in the same folder are kept and merged (one row per voice/minutes/method/seed),
but only when they were made with the same settings (``recipe``): one table, one recipe. Each run that
measures rows leaves its record under ``--out``'s ``runs/`` (commit, ``src/`` clean or not, the sampled load,
the command, the rows it measured; ``run_record.RunLog``), listed in the report; ``--merge`` brings the
merged folders' records along.
Memory per method is measured by ``bench/adaptation_memory.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from base import speak_and_judge  # bench/, beside this script
from chorus.adapters import parse_methods
from chorus.adapters.voice import read_voice
from chorus.audio.vocoders import load_vocoder
from chorus.data.features import build_feature_cache
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.bundle import load_bundle
from chorus.peers.piper import load_joe
from chorus.recipe import DEFAULT_METHOD, AdaptConfig, MemoryOptions
from chorus.synthesis import DEFAULT_BASE, Synthesizer, load_base
from chorus.training.adapt import adapt, mel_loss
from run_record import RunLog, gather_runs, run_records, runs_section  # bench/, beside this script

METHODS = "speaker,lora,lora+speaker,residual,prefix,cln,bitfit,lora+cln+speaker,full"
FORGETTING_VOICES = ("flite-rms", "flite-awb", "festival-kal", "flite-kal16")


def base_voice_loss(model, bundle, corpus: Path, clips_per_voice: int = 4) -> float:
    """Teacher-forced mel L1 of ``model`` on a few real clips of base voices (forgetting probe)."""
    utterances = []
    for voice in FORGETTING_VOICES:
        found, _ = discover(corpus / voice)
        utterances += found[:clips_per_voice]
    cache, _ = build_feature_cache(
        utterances, bundle.front_end, bundle.mel_config, speaker_names=bundle.speakers, progress=False
    )
    losses = []
    for index in range(len(cache)):
        losses.append(mel_loss(model, cache, np.array([index]), 10_000, speaker_id=int(cache.speakers[index])))
    return float(np.mean(losses))


_START_VOICES: dict[tuple, dict] = {}


def start_voice(args, speaker: str, eval_utterances, references, judges) -> dict:
    """WER, similarity and MOS of the base speaker ``speaker`` on the evaluation sentences (once per process)."""
    key = (speaker, tuple(u.key for u in eval_utterances))
    if key not in _START_VOICES:
        tts = load_base(args.base, args.vocoder)
        items = [
            EvalItem(
                u.key,
                (spoken := tts.synthesize(u.text, speaker)).audio,
                u.text,
                speaker_references=references,
                sample_rate=spoken.sample_rate,
            )
            for u in eval_utterances
        ]
        report = evaluate_pairs(
            items,
            judges=Judges(
                whisper=judges.whisper, speaker=judges.speaker, naturalness=judges.naturalness, reference=False
            ),
            progress=False,
        )
        means = report.means()
        _START_VOICES[key] = {
            "wer": report.corpus_wer,
            "similarity": means.get("speaker_similarity"),
            "mos": means.get("mos"),
        }
    return _START_VOICES[key]


def recordings(voice: str, eval_utterances, judges) -> dict:
    """WER and MOS of the voice's own recordings of the evaluation sentences, and of Piper joe (the peer)
    reading the same sentences."""
    plain = Judges(whisper=judges.whisper, speaker=None, naturalness=judges.naturalness, reference=False)
    items = [EvalItem(u.key, u.audio_path, u.text) for u in eval_utterances]
    report = evaluate_pairs(items, judges=plain, progress=False)
    joe = load_joe(threads=1)
    spoken = [joe.synthesize(u.text) for u in eval_utterances]
    piper = evaluate_pairs(
        [EvalItem(u.key, audio, u.text, sample_rate=rate) for u, (audio, rate) in zip(eval_utterances, spoken)],
        judges=plain,
        progress=False,
    )
    return {
        "voice": voice,
        "wer": report.corpus_wer,
        "mos": report.means().get("mos"),
        "piper_wer": piper.corpus_wer,
        "piper_mos": piper.means().get("mos"),
    }


def memory_options(spec: str) -> MemoryOptions:
    """``--memory``'s ``precision=bf16,frozen_dtype=int8,checkpointing=true,optimizer=adamw8bit`` (fields of
    ``MemoryOptions``; empty: its defaults)."""
    items = [item.partition("=") for item in spec.split(",") if item]
    if any(not sep for _, sep, _ in items):
        raise SystemExit(f"--memory: give FIELD=VALUE items, comma-separated, got {spec!r}")
    given = {key: value for key, _, value in items}
    unknown = set(given) - {f.name for f in dataclasses.fields(MemoryOptions)}
    if unknown:
        raise SystemExit(f"--memory: no MemoryOptions field {', '.join(sorted(unknown))}")
    for flag in {"checkpointing", "reversible"} & set(given):
        if given[flag].lower() not in ("true", "false"):
            raise SystemExit(f"--memory: {flag} is true or false, got {given[flag]!r}")
        given[flag] = given[flag].lower() == "true"
    try:
        return MemoryOptions(**given)
    except ValueError as error:
        raise SystemExit(f"--memory: {error}") from None


def recipe(args) -> dict:
    """Settings every row of one results folder shares (method settings are per row, under ``settings``)."""
    defaults = AdaptConfig()
    # Memory options only where they differ from the defaults: the rows made before the option keep their recipe.
    memory = {
        k: v for k, v in dataclasses.asdict(memory_options(args.memory)).items() if v != getattr(MemoryOptions(), k)
    }
    return ({"memory": memory} if memory else {}) | {
        "base": str(args.base or DEFAULT_BASE),
        "step_cap": args.steps,
        "wall_clock_cap": None,
        "eval_every": defaults.eval_every,
        "patience": defaults.patience,
        "max_frames": defaults.max_frames,
        "validation_fraction": defaults.validation_fraction,
        "sentences": args.sentences,
        "references": args.references,
        "threads": args.threads,
        "start": f"speaker encoder {args.speaker_encoder}" if args.speaker_encoder else "mel loss",
        "vocoder": args.vocoder or load_bundle(args.base or DEFAULT_BASE).info.get("default_vocoder", "griffin-lim"),
    }


def run_one(
    args, voice: str, minutes: float, method: str, seed: int, eval_utterances, references, judges, work: Path
) -> dict:
    bundle = load_bundle(args.base or DEFAULT_BASE)
    probe_text = "The quick brown fox jumps over the lazy dog."
    base_before = Synthesizer(bundle, load_vocoder("griffin-lim", mel_config=bundle.mel_config)).mel(
        [probe_text], FORGETTING_VOICES[0]
    )[0]
    base_loss_before = base_voice_loss(bundle.model, bundle, args.corpus)
    # No wall-clock cap (math.inf): the step cap and early stopping alone end training.
    config = AdaptConfig(
        methods=parse_methods(method),
        steps=args.steps,
        threads=args.threads,
        max_minutes=math.inf,
        seed=seed,
        speaker_encoder=str(args.speaker_encoder) if args.speaker_encoder else None,
        memory=memory_options(args.memory),
    )
    if method == "full":
        config.keep_text_side = False  # the baseline: every weight
    data = work / f"{voice}-{minutes:g}min"
    result = adapt(data, bundle, work / "voices" / f"{voice}-{minutes:g}-{method}-seed{seed}", config, progress=False)
    card = result.card

    tts = load_base(args.base, args.vocoder)
    name = tts.load_voice(result.voice_dir)
    report = speak_and_judge(tts, name, eval_utterances, references, judges, against_recordings=True)
    means = report.means()
    start_speaker = card.notes["speaker_vector_start"]
    start = start_voice(args, start_speaker, eval_utterances, references, judges)

    if read_voice(result.voice_dir).full:
        forgetting = base_voice_loss(result.model, bundle, args.corpus) / base_loss_before - 1
        base_identical = None
    else:
        fresh = load_base(args.base, "griffin-lim")
        fresh.load_voice(result.voice_dir)
        base_identical = bool(torch.equal(fresh.mel([probe_text], FORGETTING_VOICES[0])[0], base_before))
        forgetting = 0.0 if base_identical else float("nan")
    artifact_bytes = (result.voice_dir / "adapter_model.safetensors").stat().st_size
    settings = (
        "; ".join(
            " ".join(
                [config.method]
                + [
                    f"{k}={v}"
                    for k, v in config.to_dict().items()
                    if k not in ("method", "exclude", "layers") and v is not None
                ]
            )
            for config in read_voice(result.voice_dir).configs
        )
        + f"; keep_text_side={config.keep_text_side}"
    )
    base_bytes = (Path(args.base or DEFAULT_BASE) / "model.safetensors").stat().st_size
    return {
        "voice": voice,
        "minutes": minutes,
        "data_minutes": card.data_minutes,
        "method": method,
        "seed": seed,
        "settings": settings,
        "recipe": recipe(args),
        "best_step": card.metrics["best_step"],
        "trainable_parameters": card.trainable_parameters,
        "artifact_bytes": artifact_bytes,
        "artifact_fraction": artifact_bytes / base_bytes,
        "steps": card.steps,
        "train_seconds": card.train_seconds,
        "seconds_per_step": card.train_seconds / max(card.steps, 1),
        "val_mel_start": card.metrics["validation_mel_l1_start"],
        "val_mel_best": card.metrics["validation_mel_l1_best"],
        "keep_text_side": config.keep_text_side,
        "wer": report.corpus_wer,
        "similarity": means.get("speaker_similarity"),
        "mos": means.get("mos"),
        "start_speaker": start_speaker,
        "start_wer": start["wer"],
        "start_similarity": start["similarity"],
        "start_mos": start["mos"],
        "mcd_db": means.get("mcd_db"),
        "f0_rmse_hz": means.get("f0_rmse_hz"),
        "base_voices_bit_identical": base_identical,
        "step_cap": args.steps,
        "forgetting_mel_l1_increase": forgetting,
        "threads": args.threads,
    }


def cells(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by (voice, minutes, method), each group sorted by seed."""
    grouped: dict[tuple, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["seed"]):
        grouped.setdefault((row["voice"], row["minutes"], row["method"]), []).append(row)
    return grouped


def mean_spread(values: list[float], digits: int = 3) -> str:
    """``mean ± sample standard deviation`` (the mean alone for one value)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def optional_spread(values: list[float | None], digits: int, scale: float = 1.0) -> str:
    """:func:`mean_spread` of the values present ("-" when none: rows made before the column existed)."""
    present = [v * scale for v in values if v is not None]
    return mean_spread(present, digits) if present else "-"


def similarity_ratio(rows: list[dict], row: dict) -> float | None:
    """``row``'s similarity over full fine-tuning's for the same voice, minutes and seed (None without one)."""
    full = next(
        (
            r
            for r in rows
            if (r["voice"], r["minutes"], r["method"], r["seed"]) == (row["voice"], row["minutes"], "full", row["seed"])
        ),
        None,
    )
    return row["similarity"] / full["similarity"] if full and full["similarity"] and row["similarity"] else None


def target_lines(rows: list[dict]) -> list[str]:
    """The issue's target per voice: the best adapter (artifact at most 1% of the base, best by mean similarity
    over the seeds it shares with full fine-tuning) against full fine-tuning at 3 minutes, on the means and per
    seed; and which cells of the voices x minutes x methods grid ran, with how many seeds."""
    lines = [
        "Target: the best adapter method reaches at least 0.95x full fine-tuning's speaker similarity at 3 "
        "minutes, with an artifact at most 1% of the base checkpoint. Decided on the mean similarity over "
        "the seeds both cells ran (ratio of the means); the per-seed ratios show its spread.",
        "",
    ]
    grouped = cells(rows)
    for voice in sorted({r["voice"] for r in rows}):
        full = {r["seed"]: r["similarity"] for r in grouped.get((voice, 3.0, "full"), [])}
        candidates = []
        for (cell_voice, minutes, method), group in grouped.items():
            if (cell_voice, minutes) != (voice, 3.0) or method == "full" or group[0]["artifact_fraction"] > 0.01:
                continue
            seeds = sorted(set(full) & {r["seed"] for r in group})
            if seeds:
                mine = {r["seed"]: r["similarity"] for r in group}
                candidates.append((statistics.mean(mine[s] for s in seeds), method, seeds, mine, group[0]))
        if not candidates:
            continue
        mean, method, seeds, mine, row = max(candidates)
        ratio = mean / statistics.mean(full[s] for s in seeds)
        per_seed = ", ".join(f"{mine[s] / full[s]:.3f} (seed {s})" for s in seeds)
        lines.append(
            f"- {voice}: {method} {mean:.3f} / full {statistics.mean(full[s] for s in seeds):.3f} = "
            f"**{ratio:.3f}x** over {len(seeds)} seed{'s' * (len(seeds) > 1)} ({per_seed}; "
            f"{100 * row['artifact_fraction']:.2f}% of the base; {'met' if ratio >= 0.95 else 'not met'})"
        )
    lines += ["", "Cells run (method: minutes per voice, seeds in brackets):", ""]
    for method in dict.fromkeys(METHODS.split(",") + [r["method"] for r in rows]):
        ran = {
            voice: [
                (minutes, len(group)) for (v, minutes, m), group in sorted(grouped.items()) if (v, m) == (voice, method)
            ]
            for voice in sorted({r["voice"] for r in rows})
        }
        if any(ran.values()):
            lines.append(
                f"- `{method}`: "
                + "; ".join(
                    f"{voice} {', '.join(f'{m:g} [{n}]' for m, n in cells_run) or '-'}"
                    for voice, cells_run in ran.items()
                )
            )
    return lines


def _mean(rows: list[dict], key: str, scale: float = 1.0) -> float | None:
    values = [r[key] * scale for r in rows if r.get(key) is not None]
    return statistics.mean(values) if values else None


def word_target_lines(rows: list[dict], voices: dict[str, dict]) -> list[str]:
    """The intelligibility targets of the default method (``DEFAULT_METHOD``) per voice, on the means
    over its seeds: WER against its start speaker on the base (3 min: +5 points, 1 min: +10) and against full
    fine-tuning, similarity against full fine-tuning, predicted MOS against the start speaker, the moonshot
    (within 3 points of the voice's own recordings), and base voices bit-identical."""
    method = DEFAULT_METHOD
    grouped = cells(rows)
    lines = [
        f"Intelligibility targets of the default method (`{method}`), on the means over its seeds (WER in points):",
        "",
    ]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    for voice in sorted({r["voice"] for r in rows}):
        own = voices.get(voice, {})
        for minutes, allowance in ((3.0, 5.0), (1.0, 10.0)):
            mine = grouped.get((voice, minutes, method))
            if not mine or mine[0].get("start_wer") is None:
                continue
            wer, start = _mean(mine, "wer", 100), _mean(mine, "start_wer", 100)
            parts = [f"WER {wer:.1f} vs start voice {start:.1f} + {allowance:g} ({verdict(wer <= start + allowance)})"]
            full = grouped.get((voice, minutes, "full"))
            if full:
                seeds = {r["seed"] for r in full} & {r["seed"] for r in mine}
                full_wer = _mean([r for r in full if r["seed"] in seeds], "wer", 100)
                ratio = _mean([r for r in mine if r["seed"] in seeds], "similarity") / _mean(
                    [r for r in full if r["seed"] in seeds], "similarity"
                )
                parts.append(f"vs full fine-tuning {full_wer:.1f} ({verdict(wer <= full_wer)})")
                parts.append(f"similarity {ratio:.3f}x full ({verdict(ratio >= 0.95)})")
            if mine[0].get("mos") is not None:
                mos, start_mos = _mean(mine, "mos"), _mean(mine, "start_mos")
                peer = f", Piper joe {own['piper_mos']:.2f}" if own.get("piper_mos") is not None else ""
                parts.append(f"MOS {mos:.2f} vs start voice {start_mos:.2f} ({verdict(mos >= start_mos)}){peer}")
            if own.get("wer") is not None:
                parts.append(
                    f"moonshot: own recordings {100 * own['wer']:.1f} + 3 ({verdict(wer <= 100 * own['wer'] + 3)})"
                )
            fraction = max(r["artifact_fraction"] for r in mine)
            parts.append(f"artifact {100 * fraction:.2f}% of the base ({verdict(fraction <= 0.01)})")
            lines.append(f"- {voice}, {minutes:g} min, {len(mine)} seed(s): " + "; ".join(parts))
    identical = [r["base_voices_bit_identical"] for r in rows if r["base_voices_bit_identical"] is not None]
    lines += [
        "",
        f"Base voices bit-identical after every adapter run: {'yes' if all(identical) else 'NO'} ({len(identical)} runs).",
    ]
    return lines


def row_name(voice: str, minutes: float | None = None, method: str = "", seed: int = 0) -> str:
    """How a run's record names the rows it measured: a voice's adapted row, or (no minutes) the judging of
    its own recordings."""
    return f"{voice} recordings" if minutes is None else f"{voice} {minutes:g} min {method} seed {seed}"


def write_results(rows: list[dict], out: Path, args, voices: dict[str, dict] | None = None) -> None:
    order = METHODS.split(",")
    rows = sorted(
        rows,
        key=lambda r: (r["voice"], r["minutes"], order.index(r["method"]) if r["method"] in order else 99, r["seed"]),
    )
    shared = recipe(args)
    lines = [
        "# Adaptation benchmark",
        "",
        f"Base: {args.base or 'shipped base'}; held-out voices; evaluation on {args.sentences} held-out "
        f"sentences per voice against the real recordings of the same sentences ({args.references} other real "
        "clips are the similarity references); judges: Whisper tiny.en, resemblyzer, distillmos, MCD (DTW), F0 RMSE "
        f"(WORLD harvest). Every row: step cap {shared['step_cap']}, no wall-clock cap, early stopping on "
        f"held-out mel loss (evaluated every {shared['eval_every']} steps, patience {shared['patience']}), "
        f"{shared['threads']} torch thread(s)"
        + (f"; memory options {shared['memory']} (the rest MemoryOptions' defaults)" if "memory" in shared else "")
        + ". Rows ran on a shared 2-core CPU, niced, beside other work: "
        "times are upper bounds; steps and similarities do not depend on the load.",
        "",
        *word_target_lines(rows, voices or {}),
        "",
        *target_lines(rows),
        "",
        "Per cell (mean ± sample standard deviation over the seeds run; one value for one seed):",
        "",
        "| voice | min | method | seeds | similarity | sim / full FT | WER % | start voice WER % | MOS | "
        "start voice MOS | MCD dB | steps reached |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (voice, minutes, method), group in cells(rows).items():
        ratios = [ratio for ratio in (similarity_ratio(rows, r) for r in group) if ratio is not None]
        lines.append(
            f"| {voice} | {minutes:g} | {method} | {', '.join(str(r['seed']) for r in group)} | "
            f"{mean_spread([r['similarity'] for r in group])} | "
            f"{mean_spread(ratios) if ratios and method != 'full' else 'n/a'} | "
            f"{mean_spread([100 * (r['wer'] or 0) for r in group], 1)} | "
            f"{optional_spread([r.get('start_wer') for r in group], 1, 100)} | "
            f"{optional_spread([r.get('mos') for r in group], 2)} | "
            f"{optional_spread([r.get('start_mos') for r in group], 2)} | "
            f"{mean_spread([r['mcd_db'] for r in group], 2)} | {', '.join(str(r['steps']) for r in group)} |"
        )
    if voices:
        lines += ["", "The voices' own recordings of the evaluation sentences, and Piper joe reading them:", ""]
        lines += [
            f"- {voice}: WER {100 * v['wer']:.1f}%, predicted MOS {v['mos']:.2f}"
            + (
                f"; Piper joe: WER {100 * v['piper_wer']:.1f}%, MOS {v['piper_mos']:.2f}"
                if v.get("piper_mos") is not None
                else ""
            )
            for voice, v in sorted(voices.items())
        ]
    lines += [
        "",
        "Per seed (steps reached of the cap, and the step whose weights were kept):",
        "",
        "| voice | min | method | seed | trainable params | artifact KB (% of base) | steps reached / cap | "
        "best step | s/step | adapt s | WER % | start speaker (WER %) | similarity | sim / full FT | MOS | MCD dB | "
        "F0 RMSE Hz | base voices |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = similarity_ratio(rows, row)
        ratio = "n/a" if ratio is None else f"{ratio:.3f}"
        if row["base_voices_bit_identical"] is None:
            base = f"mel L1 +{100 * row['forgetting_mel_l1_increase']:.1f}%"
        else:
            base = "bit-identical" if row["base_voices_bit_identical"] else "CHANGED"
        start = "-" if row.get("start_wer") is None else f"{row['start_speaker']} ({100 * row['start_wer']:.1f})"
        lines.append(
            f"| {row['voice']} | {row['data_minutes']:.1f} | {row['method']} | {row['seed']} | "
            f"{row['trainable_parameters']:,} | {row['artifact_bytes'] / 1024:.1f} ({100 * row['artifact_fraction']:.2f}%)"
            f" | {row['steps']} / {row['step_cap']} | {row['best_step']} | {row['seconds_per_step']:.2f} | "
            f"{row['train_seconds']:.0f} | {100 * (row['wer'] or 0):.1f} | {start} | {row['similarity']:.3f} | "
            f"{ratio} | {optional_spread([row.get('mos')], 2)} | {row['mcd_db']:.2f} | {row['f0_rmse_hz']:.1f} | {base} |"
        )
    lines += ["", "Settings of each method as run (the same for every seed):", ""]
    for method, settings in dict.fromkeys((r["method"], r["settings"]) for r in rows):
        lines.append(f"- `{method}`: {settings}")
    names = [row_name(r["voice"], r["minutes"], r["method"], r["seed"]) for r in rows]
    names += [row_name(voice) for voice in voices or {}]
    (out / "adaptation.md").write_text("\n".join(lines) + "\n" + runs_section(run_records(out, rows=names), names))
    (out / "adaptation.json").write_text(json.dumps(rows, indent=1))
    plot_similarity_vs_minutes(rows, out / "similarity_vs_minutes.png")
    print("\n".join(lines))


def plot_similarity_vs_minutes(rows: list[dict], path: Path) -> None:
    """One panel per voice (voices were run for different cells, so a mean over voices would mix
    them): mean similarity over the seeds run against minutes of data, a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    voices = sorted({r["voice"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = {method: plt.get_cmap("tab10")(k % 10) for k, method in enumerate(methods)}
    fig, axes = plt.subplots(1, len(voices), figsize=(4.2 * len(voices), 4.2), sharey=True, squeeze=False)
    for axis, voice in zip(axes[0], voices, strict=True):
        for method in methods:
            points = sorted(
                (minutes, statistics.mean(r["similarity"] for r in group))
                for (v, minutes, m), group in cells(rows).items()
                if (v, m) == (voice, method) and all(r["similarity"] is not None for r in group)
            )
            if points:
                axis.plot(*zip(*points, strict=True), "o-", color=colors[method], label=method)
        axis.set_xscale("log")
        axis.set_xticks([1, 3, 10], ["1", "3", "10"])
        axis.set_xlabel("minutes of adaptation data")
        axis.set_title(voice)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("speaker similarity to real clips")
    handles = {h.get_label(): h for axis in axes[0] for h in axis.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 6), fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(args, rows: dict, voices: dict[str, dict], log: RunLog) -> None:
    """The rows ``args`` asks for that ``rows`` (keyed voice, minutes, method, seed) lacks, and the
    recordings' own row of each voice ``voices`` lacks, each added, named in ``log`` and written out."""
    voices_file = args.out / "recordings.json"
    speaker = SpeakerJudge()
    judges = Judges(speaker=speaker)
    for voice in args.voices.split(","):
        utterances, _ = discover(args.heldout / voice)
        # The last clips are the evaluation set: never trained on, and their recordings are the references.
        evaluation = utterances[-args.sentences :]
        pool = utterances[: -args.sentences - args.references]
        references = [u.audio_path for u in utterances[-args.sentences - args.references : -args.sentences]]
        if voice not in voices:
            voices[voice] = recordings(voice, evaluation, judges)
            log.measured(row_name(voice))
            voices_file.write_text(json.dumps(voices, indent=1))
        for minutes in [float(m) for m in args.minutes.split(",")]:
            subset = first_minutes(pool, minutes)
            write_subset(subset, args.work / f"{voice}-{minutes:g}min")
            got = sum(sf.info(str(u.audio_path)).duration for u in subset) / 60
            if got < minutes * 0.95:
                print(f"{voice}: only {got:.1f} min available for the {minutes:g}-minute setting")
            for seed in [int(s) for s in args.seeds.split(",")]:
                for method in args.methods.split(","):
                    started = time.perf_counter()
                    row = run_one(args, voice, minutes, method, seed, evaluation, references, judges, args.work)
                    rows[(voice, minutes, method, seed)] = row
                    log.measured(row_name(voice, minutes, method, seed))
                    print(
                        f"{voice} {minutes:g} min {method} seed {seed}: similarity {row['similarity']:.3f}, WER "
                        f"{100 * (row['wer'] or 0):.1f}%, {row['steps']} steps, {row['train_seconds']:.0f} s "
                        f"adapting ({time.perf_counter() - started:.0f} s with judging)",
                        flush=True,
                    )
                    write_results(list(rows.values()), args.out, args, voices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None, help="base model folder (default: shipped)")
    parser.add_argument(
        "--vocoder", default=None, help="vocoder of every judged clip (default: the base's default vocoder)"
    )
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"), help="base voices (forgetting)")
    parser.add_argument("--voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument("--minutes", default="1,3,10")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--steps", type=int, default=AdaptConfig.steps, help="step cap of every run")
    parser.add_argument("--sentences", type=int, default=20, help="held-out sentences judged per voice")
    parser.add_argument("--references", type=int, default=10, help="real clips for speaker similarity")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--memory",
        default="",
        help="memory options of every run, MemoryOptions fields: precision=bf16,frozen_dtype=int8,checkpointing=true",
    )
    parser.add_argument(
        "--speaker-encoder",
        type=Path,
        default=None,
        help="start every voice from this encoder's map (chorus adapt --speaker-encoder); --steps 0: zero-shot",
    )
    parser.add_argument(
        "--seeds",
        default=str(AdaptConfig.seed),
        help="comma-separated seeds (held-out split, batch order, initialization), one row each",
    )
    parser.add_argument("--work", type=Path, default=Path("runs/adaptation"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/adaptation"))
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="results folders of other runs (e.g. parallel processes) to merge into --out; nothing is run",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    previous, voices = [], {}
    for folder in [args.out, *args.merge]:
        if (folder / "adaptation.json").is_file():
            previous += json.loads((folder / "adaptation.json").read_text())
        if (folder / "recordings.json").is_file():
            voices.update(json.loads((folder / "recordings.json").read_text()))
    other = [r for r in previous if r.get("recipe") != recipe(args)]
    if other:
        parser.error(
            f"{len(other)} rows were made with other settings than {recipe(args)}: "
            "give another --out (one table, one recipe)"
        )
    rows = {(r["voice"], r["minutes"], r["method"], r["seed"]): r for r in previous}
    if args.merge:
        gather_runs(args.out, *args.merge)
        (args.out / "recordings.json").write_text(json.dumps(voices, indent=1))
        write_results(list(rows.values()), args.out, args, voices)
        return
    try:
        with RunLog(args.out, args.threads, " ".join(sys.argv)) as log:
            measure(args, rows, voices, log)
    finally:  # the report again with this run's end (or its crash) in its record
        write_results(list(rows.values()), args.out, args, voices)


if __name__ == "__main__":
    main()
