"""Voices from short samples (issue 30): a refined voice adapted from 15 s and 30 s of audio against 1
and 3 minutes, and instant voices made from the sample alone, on the three held-out datasets
(piper-joe, flite-slt, festival-ked: no clip of them was in the base's or the speaker encoder's training).

Every sample is drawn per seed: the dataset's clips before the evaluation sentences and the similarity
references, in an order shuffled by the seed, taken while they fit in the length (within 10 %); the
same seed also seeds the adaptation (held-out split, batch order, initialization). The split of each
dataset is bench/adaptation.py's (the last 20 clips are its evaluation sentences, the 10 before them the
similarity references, the rest the pool samples come from); ``--sentences`` of the 20 are judged.

Part ``adapt``: each recipe (``RECIPES``: adapter methods and options) adapts the shipped base from the
sample with ``AdaptConfig``'s defaults and the server's onboarding settings (mel-loss start, early
stopping on held-out mel loss every 25 steps, patience 4, no wall-clock cap) and the server's minimum of
speech for a sample (``SAMPLE_MIN_MINUTES``, 10 s: counted as speech, a 15 s draw can hold less than 12 s).
One run at the largest step cap (``--caps``) gives every smaller cap too: a run
capped at N steps is the same run stopped at N (same batches, same seed), keeping the best held-out
loss among its evaluations up to N, so the adapter weights are snapshotted at every evaluation and each
cap's voice is the snapshot ``adapt`` would have kept. Its time is the wall time from the call to that
evaluation (data check and features included). The voice is judged beside its start speaker (the base
speaker it starts from, as it is on the base).

Part ``instant``: no training. The shipped speaker encoder embeds the sample (mean of its clips'
embeddings); the instant voice is (i) the nearest base speaker in the encoder's space, (ii) a blend of
the k nearest weighted by their cosine similarity (``"a(w1)+b(w2)"``), (iii) the speaker vector the
encoder->speaker map (:func:`chorus.speaker_recognition.start.speaker_map`) puts the embedding at.

Judges: Whisper tiny.en corpus WER, resemblyzer similarity to the 10 reference clips, through the base's
default vocoder (the one the server speaks with). One thread, shared 2-core CPU: times are upper bounds.

    python bench/short_samples.py --parts adapt,instant --voices flite-slt --seconds 15,30 --seeds 1 \\
        --recipes residual,speaker --caps 100,200,300 --sentences 10

Writes ``short_samples.md``, ``short_samples.json`` and ``short_samples.png`` under ``--out``; rows of
earlier runs into the same folder are kept (one row per voice/seconds/recipe/cap/seed and per
voice/seconds/method/seed) when they were made with the same settings. Each run that measures rows
leaves its record under ``--out``'s ``runs/`` (commit, ``src/`` clean or not, the sampled load, the command,
the rows it measured; ``run_record.RunLog``), and the report lists every run behind its rows; ``--merge``
brings the merged folders' records along.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from chorus.adapters import parse_methods
from chorus.audio.vocoders import load_vocoder
from chorus.data.features import build_feature_cache
from chorus.data.formats import Utterance, discover
from chorus.data.subsets import write_subset
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.bundle import load_bundle
from chorus.recipe import AdaptConfig
from chorus.serving.settings import ONBOARDING_STEPS, SAMPLE_MIN_MINUTES
from chorus.speaker_recognition.bundle import load_encoder, shipped_encoder_dir
from chorus.speaker_recognition.start import speaker_map
from chorus.synthesis import DEFAULT_BASE, DEFAULT_VOCODER, Synthesizer
from chorus.synthesis.voices import Blend, SpeakerSpec
from chorus.training.adapt import VOICE, adapt, closest_speakers
from run_record import RunLog, gather_runs, mean_sd, run_records, runs_section  # bench/, beside this script

# Recipes suited to short samples: (adapter methods, their options).
RECIPES: dict[str, tuple[str, dict]] = {
    "residual": ("residual", {}),  # the default recipe
    "speaker": ("speaker", {}),  # the speaker vector alone: 256 numbers, timing included
    "cln+speaker": ("cln+speaker", {}),
    "lora-r2": ("lora", {"lora": {"r": 2}}),
}
EVALUATION, REFERENCES = 20, 10  # bench/adaptation.py's split of each dataset
REFERENCE_RECIPE = ("residual", ONBOARDING_STEPS)  # the 1-minute voice the targets name: the server's recipe
INSTANT = ("nearest", "blend-2", "blend-3", "mapped", "mel-nearest")


def sample(pool: list[Utterance], seconds: float, seed: int) -> list[Utterance]:
    """Clips of ``pool`` in an order shuffled by ``seed``, taken while they fit in ``seconds`` (+10 %),
    until they reach ``seconds`` (-10 %)."""
    chosen, total = [], 0.0
    for index in np.random.default_rng(seed).permutation(len(pool)):
        duration = sf.info(str(pool[index].audio_path)).duration
        if total + duration <= seconds * 1.1:
            chosen.append(pool[index])
            total += duration
        if total >= seconds * 0.9:
            break
    return chosen


def seconds_of(clips: list[Utterance]) -> float:
    return sum(sf.info(str(u.audio_path)).duration for u in clips)


class Judge:
    """Speaks the evaluation sentences and judges them (WER, similarity); results of the same base speaker
    or blend are kept, as the base says them the same way every time."""

    def __init__(self, args, evaluation: list[Utterance], references: list[Path]):
        self.evaluation, self.references = evaluation, references
        self.judges = Judges(naturalness=None, reference=False, speaker=SpeakerJudge())
        self.vocoder = None
        self.args = args
        self._base: dict[str, dict] = {}

    def synthesizer(self, bundle) -> Synthesizer:
        if self.vocoder is None:
            name = self.args.vocoder or bundle.info.get("default_vocoder", "griffin-lim")
            self.vocoder = load_vocoder(DEFAULT_VOCODER if name == "neural" else name, mel_config=bundle.mel_config)
        return Synthesizer(bundle, self.vocoder)

    def score(self, tts: Synthesizer, speaker: SpeakerSpec = None, voice: str | None = None) -> dict:
        """Corpus WER and mean similarity of ``speaker`` (or the loaded ``voice``) on the evaluation sentences."""
        items = []
        for utterance in self.evaluation:
            spoken = tts.synthesize(utterance.text, speaker, voice=voice)
            items.append(
                EvalItem(
                    utterance.key,
                    spoken.audio,
                    utterance.text,
                    speaker_references=self.references,
                    sample_rate=spoken.sample_rate,
                )
            )
        report = evaluate_pairs(items, judges=self.judges, progress=False)
        return {"wer": report.corpus_wer, "similarity": report.means()["speaker_similarity"]}

    def base(self, tts: Synthesizer, speaker: SpeakerSpec) -> dict:
        key = speaker.key if isinstance(speaker, Blend) else str(speaker)
        if key not in self._base:
            self._base[key] = self.score(tts, speaker)
        return self._base[key]


def settings(args) -> dict:
    """What every row of one results folder shares."""
    defaults = AdaptConfig()
    return {
        "base": str(args.base) if args.base else "shipped",  # not its path: checkouts and worktrees differ
        "vocoder": args.vocoder or load_bundle(args.base or DEFAULT_BASE).info.get("default_vocoder", "griffin-lim"),
        "sentences": args.sentences,
        "references": REFERENCES,
        "threads": args.threads,
        "eval_every": defaults.eval_every,
        "patience": defaults.patience,
        "max_frames": defaults.max_frames,
        "validation_fraction": defaults.validation_fraction,
        "start": "mel loss",
    }


def adapt_rows(args, voice: str, seconds: float, clips: list[Utterance], recipe: str, seed: int, judge: Judge):
    """One adaptation at the largest cap; a row per cap (see the module's docstring)."""
    bundle = load_bundle(args.base or DEFAULT_BASE)  # fresh: the voice's adapter goes into this model
    caps = sorted(args.caps)
    methods, options = RECIPES[recipe]
    config = AdaptConfig(
        methods=parse_methods(methods, options),
        steps=caps[-1],
        threads=args.threads,
        max_minutes=math.inf,  # the step cap and early stopping alone end training
        min_minutes=SAMPLE_MIN_MINUTES,  # speech, not audio: what the server takes is taken here
        seed=seed,
    )
    data = write_subset(clips, args.work / "data" / f"{voice}-{seconds:g}s-seed{seed}")
    snapshots: dict[int, tuple[float, dict[str, torch.Tensor]]] = {}
    started = time.perf_counter()

    def keep(step: int, model) -> None:
        trained = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        snapshots[step] = (time.perf_counter() - started, trained)

    result = adapt(
        data,
        bundle,
        args.work / "voices" / f"{voice}-{seconds:g}s-{recipe}-seed{seed}",
        config,
        progress=False,
        on_evaluate=keep,
    )
    total_seconds = time.perf_counter() - started
    losses = {entry["step"]: entry["val_mel"] for entry in result.history}
    tts = judge.synthesizer(bundle)
    tts.voices["adapted"] = (result.model, VOICE)
    start_speaker = result.card.notes["speaker_vector_start"]
    start = judge.base(tts, start_speaker)
    parameters = dict(result.model.named_parameters())
    judged: dict[int, dict] = {}
    rows = []
    for cap in caps:
        reached = [step for step in losses if step <= cap]
        best = min(reached, key=lambda step: (losses[step], step))  # the first best, as ``adapt`` keeps it
        if best not in judged:
            with torch.no_grad():
                for name, value in snapshots[best][1].items():
                    parameters[name].copy_(value)
            judged[best] = judge.score(tts, voice="adapted")
        rows.append(
            {
                "voice": voice,
                "seconds": seconds,
                "data_seconds": round(seconds_of(clips), 2),
                "clips": len(clips),
                "recipe": recipe,
                "cap": cap,
                "seed": seed,
                "steps": max(reached),
                "best_step": best,
                "adapt_seconds": round(snapshots[max(reached)][0], 1),
                "run_seconds": round(total_seconds, 1),
                "trainable_parameters": result.card.trainable_parameters,
                "val_mel_start": losses[0],
                "val_mel_best": losses[best],
                **judged[best],
                "start_speaker": start_speaker,
                "start_wer": start["wer"],
                "start_similarity": start["similarity"],
            }
        )
    return rows


def instant_rows(args, voice: str, seconds: float, clips: list[Utterance], seed: int, judge: Judge, mapping, encoder):
    """The instant voices of one sample (no training), each judged; beside the encoder's, the base speaker
    whose conditioning fits the sample best by teacher-forced mel loss (where ``adapt`` starts)."""
    bundle = load_bundle(args.base or DEFAULT_BASE)
    tts = judge.synthesizer(bundle)
    started = time.perf_counter()
    embedding = encoder.embed([u.audio_path for u in clips]).mean(0)
    cosines = mapping.embeddings @ (embedding / np.linalg.norm(embedding))
    order = np.argsort(-cosines)
    embedded = time.perf_counter() - started
    voices: dict[str, SpeakerSpec] = {"nearest": bundle.speakers[order[0]]}
    for k in (2, 3):
        voices[f"blend-{k}"] = "+".join(f"{bundle.speakers[i]}({cosines[i]:.3f})" for i in order[:k])
    voices["mapped"] = Blend(f"mapped:{voice}-{seconds:g}s-seed{seed}", torch.from_numpy(mapping.vector(embedding)))
    started = time.perf_counter()
    cache, _ = build_feature_cache(
        clips,
        bundle.front_end,
        bundle.mel_config,
        speaker_names=[clips[0].speaker],
        progress=False,
        with_pitch=bundle.model.config.use_pitch,
    )
    indices = np.arange(len(cache))
    voices["mel-nearest"] = bundle.speakers[
        int(closest_speakers(bundle.model, cache, indices, np.zeros(len(cache)))[0])
    ]
    mel_seconds = time.perf_counter() - started
    rows = []
    for method, speaker in voices.items():
        rows.append(
            {
                "voice": voice,
                "seconds": seconds,
                "data_seconds": round(seconds_of(clips), 2),
                "method": method,
                "seed": seed,
                "speaker": speaker.key if isinstance(speaker, Blend) else speaker,
                "encoder_cosine_nearest": round(float(cosines[order[0]]), 4),
                "make_seconds": round(mel_seconds if method == "mel-nearest" else embedded, 2),
                **judge.base(tts, speaker),
            }
        )
    return rows


def spread(values: list[float], digits: int, scale: float = 1.0) -> str:
    """``mean ± sample sd`` of ``values`` times ``scale`` (the value alone for one)."""
    return mean_sd([v * scale for v in values], digits)


def group(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    grouped: dict[tuple, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["seed"]):
        grouped.setdefault(tuple(row[k] for k in keys), []).append(row)
    return grouped


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows)


def reference_voices(adapted: list[dict]) -> dict[str, list[dict]]:
    """Per dataset, the rows of the 1-minute voice the targets name (``REFERENCE_RECIPE`` at 60 s)."""
    recipe, cap = REFERENCE_RECIPE
    return {
        voice: rows
        for (voice, seconds, r, c), rows in group(adapted, "voice", "seconds", "recipe", "cap").items()
        if (seconds, r, c) == (60.0, recipe, cap)
    }


def choose_recipe(adapted: list[dict]) -> tuple[tuple[str, int] | None, list[str]]:
    """The short-sample recipe: among the (recipe, cap)s run at 30 s on every dataset, compared on the seeds
    they all ran, those whose mean WER stays within the start speaker's + 10 points on every dataset, the one
    with the highest mean similarity over the datasets; within 0.005 of it, the fewest steps."""
    thirty = group([r for r in adapted if r["seconds"] == 30.0], "recipe", "cap", "voice")
    voices = {r["voice"] for r in adapted}
    runs = {(r, c) for r, c, _ in thirty if all((r, c, v) in thirty for v in voices)}
    if not runs:
        return None, ["No recipe ran at 30 s on every dataset."]
    seeds = set.intersection(*({row["seed"] for row in thirty[(*run, v)]} for run in runs for v in voices))
    lines = [f"Compared at 30 s on seed(s) {', '.join(map(str, sorted(seeds)))}, the seeds every recipe ran:", ""]
    candidates = []
    for recipe, cap in sorted(runs):
        cells = [[row for row in thirty[(recipe, cap, v)] if row["seed"] in seeds] for v in sorted(voices)]
        similarity = statistics.mean(mean(rows, "similarity") for rows in cells)
        worst = max(100 * (mean(rows, "wer") - mean(rows, "start_wer")) for rows in cells)
        seconds = statistics.mean(mean(rows, "adapt_seconds") for rows in cells)
        ok = worst <= 10
        lines.append(
            f"- `{recipe}` cap {cap}: mean similarity {similarity:.3f}, worst WER over start speaker "
            f"{worst:+.1f} points, {seconds:.0f} s per adaptation{'' if ok else ' (WER allowance exceeded)'}"
        )
        if ok:
            candidates.append((similarity, cap, recipe))
    if not candidates:
        return None, lines
    top = max(c[0] for c in candidates)
    _, cap, recipe = min((c for c in candidates if c[0] >= top - 0.005), key=lambda c: (c[1], -c[0]))
    return (recipe, cap), lines


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def target_lines(adapted: list[dict], chosen: tuple[str, int] | None) -> list[str]:
    """The refined-voice targets of the chosen recipe against the 1-minute voice, per dataset, on the means."""
    references = reference_voices(adapted)
    if chosen is None or not references:
        return ["No recipe and 1-minute voice to judge the targets with (not run)."]
    lines = []
    cells = group(adapted, "voice", "seconds", "recipe", "cap")
    for voice, reference in sorted(references.items()):
        one_minute = mean(reference, "similarity")
        thirty = cells.get((voice, 30.0, *chosen))
        fifteen = cells.get((voice, 15.0, *chosen))
        parts = []
        # Ratios in four digits: three would round a miss just under a bar (0.95, 1.0) onto it.
        if thirty:
            ratio = mean(thirty, "similarity") / one_minute
            wer, start = 100 * mean(thirty, "wer"), 100 * mean(thirty, "start_wer")
            parts.append(f"30 s similarity {ratio:.4f}x the 1-minute voice's ({verdict(ratio >= 0.95)})")
            parts.append(f"30 s WER {wer:.1f} vs start speaker {start:.1f} + 10 ({verdict(wer <= start + 10)})")
        if fifteen:
            ratio = mean(fifteen, "similarity") / one_minute
            parts.append(f"moonshot, 15 s at the 1-minute similarity: {ratio:.4f}x ({verdict(ratio >= 1.0)})")
        lines.append(f"- {voice} (1-minute voice {one_minute:.3f}, {len(reference)} seed(s)): " + "; ".join(parts))
    return lines


def instant_lines(instant: list[dict]) -> tuple[list[str], str | None]:
    """The instant-voice target per (dataset, length) and method, on the means over seeds, and the best method
    (meets the target in the most cells, then the highest mean similarity)."""
    cells = group(instant, "voice", "seconds", "method")
    lines, score = [], {}
    for voice, seconds in sorted({(v, s) for v, s, _ in cells}):
        nearest = cells.get((voice, seconds, "nearest"))
        if not nearest:
            continue
        base_sim, base_wer = mean(nearest, "similarity"), 100 * mean(nearest, "wer")
        parts = []
        for method in INSTANT[1:]:
            rows = cells.get((voice, seconds, method))
            if not rows:
                continue
            sim, wer = mean(rows, "similarity"), 100 * mean(rows, "wer")
            ok = sim >= base_sim and wer <= base_wer + 2
            wins, total = score.get(method, (0, []))
            score[method] = (wins + ok, [*total, sim])
            parts.append(f"{method} {sim:.3f} / {wer:.1f} ({verdict(ok)})")
        lines.append(f"- {voice}, {seconds:g} s: nearest {base_sim:.3f} / WER {base_wer:.1f}; " + "; ".join(parts))
    best = max(score, key=lambda m: (score[m][0], statistics.mean(score[m][1]))) if score else None
    return lines, best


def row_name(voice: str, seconds: float, recipe: str, seed: int) -> str:
    """How a run's record names the rows it measured (one adaptation gives a row per cap; "instant" for
    the instant voices of one sample)."""
    return f"{voice} {seconds:g} s {recipe} seed {seed}"


def write_results(adapted: list[dict], instant: list[dict], out: Path, args) -> None:
    shared = settings(args)
    chosen, candidates = choose_recipe(adapted)
    instant_targets, best_instant = instant_lines(instant)
    lines = [
        "# Voices from short samples",
        "",
        f"Held-out datasets; {shared['sentences']} held-out sentences judged per voice (Whisper tiny.en corpus WER, "
        f"resemblyzer similarity to {REFERENCES} real clips), spoken through the `{shared['vocoder']}` vocoder. "
        f"Adaptation: mel-loss start, early stopping every {shared['eval_every']} steps (patience "
        f"{shared['patience']}), {shared['threads']} thread(s), a shared 2-core CPU (times are upper bounds). "
        "Mean ± sample sd over the seeds (each seed: another sample of clips and another training seed).",
        "",
        "## Refined voice",
        "",
        *candidates,
        "",
        (
            f"Chosen for samples under 1 minute: **`{chosen[0]}`, step cap {chosen[1]}** (rule: the highest mean "
            "similarity at 30 s over the datasets among recipes within the start speaker's WER + 10 points "
            "on every dataset; within 0.005 of it, the fewest steps)."
            if chosen
            else "None chosen."
        ),
        "",
        "Targets (refined voice from 30 s: similarity >= 0.95x the 1-minute voice's, WER <= its start "
        f"speaker's + 10 points; moonshot: 15 s at the 1-minute voice's similarity; the 1-minute voice is "
        f"`{REFERENCE_RECIPE[0]}` cap {REFERENCE_RECIPE[1]}, the server's recipe):",
        "",
        *target_lines(adapted, chosen),
        "",
        "| dataset | sample s (actual) | recipe | cap | seeds | similarity | WER % | start speaker similarity | "
        "start speaker WER % | steps reached (best) | adapt s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (voice, seconds, recipe, cap), rows in sorted(group(adapted, "voice", "seconds", "recipe", "cap").items()):
        lines.append(
            f"| {voice} | {seconds:g} ({statistics.mean(r['data_seconds'] for r in rows):.1f}) | {recipe} | {cap} | "
            f"{', '.join(str(r['seed']) for r in rows)} | {spread([r['similarity'] for r in rows], 3)} | "
            f"{spread([r['wer'] for r in rows], 1, 100)} | {spread([r['start_similarity'] for r in rows], 3)} | "
            f"{spread([r['start_wer'] for r in rows], 1, 100)} | "
            f"{', '.join('{steps} ({best_step})'.format(**r) for r in rows)} | "
            f"{spread([r['adapt_seconds'] for r in rows], 0)} |"
        )
    runaway = [r for r in adapted if r["wer"] > 1.0 and r["cap"] == min(x["cap"] for x in adapted)]
    if runaway:
        lines += [
            "",
            "Corpus WER above 100 % (look for a transcript where Whisper repeats itself; such a row's WER is the "
            "judge's, not the voice's): "
            + ", ".join(f"{r['voice']} {r['seconds']:g} s {r['recipe']} seed {r['seed']}" for r in runaway),
        ]
    lines += [
        "",
        "## Instant voice",
        "",
        "Target: similarity >= the nearest base speaker's at WER <= its + 2 points (similarity / WER %, means):",
        "",
        *instant_targets,
        "",
        f"Best instant-voice method: **{best_instant}** (meets the target in the most cells, then the highest "
        "mean similarity)."
        if best_instant
        else "No instant voices ran.",
        "",
        "| dataset | sample s (actual) | method | seeds | similarity | WER % | speakers (first seed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (voice, seconds, method), rows in sorted(
        group(instant, "voice", "seconds", "method").items(), key=lambda c: (c[0][0], c[0][1], INSTANT.index(c[0][2]))
    ):
        lines.append(
            f"| {voice} | {seconds:g} ({statistics.mean(r['data_seconds'] for r in rows):.1f}) | {method} | "
            f"{', '.join(str(r['seed']) for r in rows)} | {spread([r['similarity'] for r in rows], 3)} | "
            f"{spread([r['wer'] for r in rows], 1, 100)} | {rows[0]['speaker']} |"
        )
    names = {row_name(r["voice"], r["seconds"], r["recipe"], r["seed"]) for r in adapted}
    names |= {row_name(r["voice"], r["seconds"], "instant", r["seed"]) for r in instant}
    runs = run_records(out, rows=names)
    (out / "short_samples.md").write_text("\n".join(lines) + "\n" + runs_section(runs, sorted(names)))
    (out / "short_samples.json").write_text(
        json.dumps({"settings": shared, "adapted": adapted, "instant": instant, "runs": runs}, indent=1)
    )
    plot(adapted, instant, out / "short_samples.png")
    print("\n".join(lines), flush=True)


def plot(adapted: list[dict], instant: list[dict], path: Path) -> None:
    """Per dataset: similarity against sample length per recipe and cap (top), and each instant voice's
    similarity against its WER (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    voices = sorted({r["voice"] for r in adapted + instant})
    if not voices:
        return
    fig, axes = plt.subplots(2, len(voices), figsize=(4.4 * len(voices), 8), squeeze=False)
    lines = sorted({(r["recipe"], r["cap"]) for r in adapted})
    for column, voice in enumerate(voices):
        top, bottom = axes[0][column], axes[1][column]
        for k, (recipe, cap) in enumerate(lines):
            points = sorted(
                (seconds, mean(rows, "similarity"))
                for (v, seconds, r, c), rows in group(adapted, "voice", "seconds", "recipe", "cap").items()
                if (v, r, c) == (voice, recipe, cap)
            )
            if points:
                top.plot(*zip(*points, strict=True), "o-", color=plt.get_cmap("tab20")(k % 20), label=f"{recipe} {cap}")
        reference = reference_voices(adapted).get(voice)
        if reference:
            top.axhline(0.95 * mean(reference, "similarity"), color="gray", ls="--", lw=1, label="0.95x 1-min voice")
        top.set_xscale("log")
        ticks = sorted({r["seconds"] for r in adapted})
        top.set_xticks(ticks, [f"{t:g}" for t in ticks])
        top.minorticks_off()
        top.set_xlabel("sample seconds")
        top.set_title(voice)
        top.grid(alpha=0.3)
        for (v, seconds, method), rows in group(instant, "voice", "seconds", "method").items():
            if v == voice:
                marker = "o" if seconds < 20 else "s"
                bottom.scatter(
                    100 * mean(rows, "wer"),
                    mean(rows, "similarity"),
                    marker=marker,
                    color=plt.get_cmap("tab10")(INSTANT.index(method)),
                    label=f"{method} {seconds:g} s",
                )
        bottom.set_xlabel("WER %")
        bottom.grid(alpha=0.3)
        if bottom.collections:
            bottom.legend(fontsize=7)
    axes[0][0].set_ylabel("similarity, adapted voice")
    axes[1][0].set_ylabel("similarity, instant voice")
    handles = {h.get_label(): h for axis in axes[0] for h in axis.get_lines()}
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=min(len(handles), 6), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def measure(args, adapted: dict, instant: dict, log: RunLog) -> None:
    """The rows ``args`` asks for that ``adapted`` and ``instant`` (keyed as in the results) lack, each
    added, named in ``log`` and written out as it comes."""
    parts = args.parts.split(",")
    encoder = mapping = None
    if "instant" in parts:
        encoder = load_encoder(shipped_encoder_dir())
        mapping = speaker_map(load_bundle(args.base or DEFAULT_BASE), encoder)
    splits = {}
    for voice in args.voices.split(","):
        utterances, _ = discover(args.heldout / voice)
        references = [u.audio_path for u in utterances[-EVALUATION - REFERENCES : -EVALUATION]]
        judge = Judge(args, utterances[-EVALUATION:][: args.sentences], references)
        splits[voice] = (utterances[: -EVALUATION - REFERENCES], judge)
    # Seed-major: every dataset's first seed before any second one, so partial results cover every dataset.
    for seed in [int(s) for s in args.seeds.split(",")]:
        for voice, (pool, judge) in splits.items():
            if "instant" in parts:
                for seconds in [float(s) for s in args.instant_seconds.split(",")]:
                    if all((voice, seconds, method, seed) in instant for method in INSTANT):
                        continue  # already in the results folder
                    rows = instant_rows(
                        args, voice, seconds, sample(pool, seconds, seed), seed, judge, mapping, encoder
                    )
                    instant.update({(voice, seconds, r["method"], seed): r for r in rows})
                    log.measured(row_name(voice, seconds, "instant", seed))
                    print(", ".join(f"{voice} {seconds:g}s {r['method']}: {r['similarity']:.3f}" for r in rows))
                    write_results(list(adapted.values()), list(instant.values()), args.out, args)
            if "adapt" not in parts:
                continue
            for seconds in [float(s) for s in args.seconds.split(",")]:
                recipes = args.recipes if seconds < 60 else args.long_recipes
                for recipe in recipes.split(","):
                    if all((voice, seconds, recipe, cap, seed) in adapted for cap in args.caps):
                        continue  # already in the results folder
                    rows = adapt_rows(args, voice, seconds, sample(pool, seconds, seed), recipe, seed, judge)
                    adapted.update({(voice, seconds, recipe, r["cap"], seed): r for r in rows})
                    log.measured(row_name(voice, seconds, recipe, seed))
                    print(
                        ", ".join(
                            f"{voice} {seconds:g}s {recipe} cap {r['cap']} seed {seed}: similarity "
                            f"{r['similarity']:.3f}, WER {100 * r['wer']:.1f}%, {r['adapt_seconds']:.0f} s"
                            for r in rows
                        ),
                        flush=True,
                    )
                    write_results(list(adapted.values()), list(instant.values()), args.out, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None, help="base model folder (default: shipped)")
    parser.add_argument("--vocoder", default=None, help="vocoder of every judged clip (default: the base's)")
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument("--parts", default="adapt,instant", help="adapt, instant or both")
    parser.add_argument("--seconds", default="15,30,60,180", help="sample lengths for adaptation")
    parser.add_argument("--instant-seconds", default="15,30", help="sample lengths for instant voices")
    parser.add_argument("--recipes", default="residual,speaker,cln+speaker", help=f"of {', '.join(RECIPES)}")
    parser.add_argument(
        "--long-recipes",
        default=REFERENCE_RECIPE[0],
        help="recipes run at 60 s and more (the references need only the default)",
    )
    parser.add_argument("--caps", default="100,200,300", help="step caps; one run at the largest gives them all")
    parser.add_argument("--seeds", default="1,2,3", help="sample and training seeds, one row each")
    parser.add_argument("--sentences", type=int, default=10, help=f"of the {EVALUATION} evaluation sentences")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/short_samples"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/short_samples"))
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="results folders of other runs (e.g. parallel processes) to merge into --out; nothing is run",
    )
    args = parser.parse_args()
    args.caps = [int(c) for c in args.caps.split(",")]
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    adapted, instant = {}, {}
    for folder in [args.out, *args.merge]:
        results = folder / "short_samples.json"
        previous = (
            json.loads(results.read_text())
            if results.is_file()
            else {"settings": settings(args), "adapted": [], "instant": []}
        )
        if previous["settings"] != settings(args):
            parser.error(f"{results} was made with {previous['settings']}, not {settings(args)}: give another --out")
        adapted.update({(r["voice"], r["seconds"], r["recipe"], r["cap"], r["seed"]): r for r in previous["adapted"]})
        instant.update({(r["voice"], r["seconds"], r["method"], r["seed"]): r for r in previous["instant"]})
    if args.merge:
        gather_runs(args.out, *args.merge)
        write_results(list(adapted.values()), list(instant.values()), args.out, args)
        return
    try:
        with RunLog(args.out, args.threads, " ".join(sys.argv)) as log:
            measure(args, adapted, instant, log)
    finally:  # the report again with this run's end (or its crash) in its record
        write_results(list(adapted.values()), list(instant.values()), args.out, args)


if __name__ == "__main__":
    main()
