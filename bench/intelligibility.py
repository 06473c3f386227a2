"""Where adapted voices lose their words, and which recipe keeps them.

For each held-out voice (never in pretraining), amount of data, recipe and seed, the shipped base adapts a
voice; every ``--curve-every`` steps the voice speaks the evaluation sentences (free-running) and Whisper
scores them, beside the held-out teacher-forced mel loss that early stopping watches. The voice kept is
then judged on the evaluation sentences in three timings, which separate the durations from the decoder:

* ``free``: as it speaks, with its own predicted durations;
* ``real timing``: the durations of the real recording of the sentence (the alignment the model searches
  in it: the teacher-forced pass of training, run free of the real mel everywhere else);
* ``base timing``: the durations the base predicts for the start speaker (the adapter off).

Per voice once: the recordings themselves, Griffin-Lim copy synthesis of their mels (the vocoder's ceiling)
and the start speaker on the base. Judges: Whisper tiny.en (corpus WER), resemblyzer similarity to other real
clips of the voice, distillmos predicted MOS. Also WER by sentence length, and the predicted durations'
error per phoneme class against the real recording's alignment.

    python bench/intelligibility.py --voices piper-joe,flite-slt,festival-ked --minutes 3 \\
        --recipes residual,residual-keep-text,full,full-keep-text --seeds 1234 \\
        --out bench/results/intelligibility

Each run is one JSON file under ``--out/runs`` (finished runs are skipped, so parallel processes on
different voices share one folder); ``intelligibility.md`` and ``wer_over_steps.png`` are rebuilt from all
of them. Every run: step cap ``--steps``, early stopping on held-out mel loss, no wall-clock cap.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import active_adapter, parse_methods
from chorus.audio.io import load_audio
from chorus.audio.mel import log_mel
from chorus.audio.vocoders import load_vocoder
from chorus.data.batching import collate
from chorus.data.features import build_feature_cache
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import EvalItem, EvalReport, Judges, evaluate_pairs
from chorus.models.bundle import load_bundle
from chorus.models.losses import step_inputs
from chorus.recipe import AdaptConfig
from chorus.synthesis import DEFAULT_BASE
from chorus.training.adapt import adapt

# Recipes compared: AdaptConfig fields over the defaults (steps, threads and seed come from the command).
RECIPES = {
    # Every field that a default could change is spelled out, so a run means the same thing later.
    "residual": {"method": "residual", "keep_text_side": False, "method_options": {"residual": {"bottleneck": 6}}},
    "residual-keep-text": {
        "method": "residual",
        "keep_text_side": True,
        "method_options": {"residual": {"bottleneck": 6}},
    },
    "residual-keep-text-b12": {
        "method": "residual",
        "keep_text_side": True,
        "method_options": {"residual": {"bottleneck": 12}},
    },
    "residual+speaker-keep-text": {
        "method": "residual+speaker",
        "keep_text_side": True,
        "method_options": {"residual": {"bottleneck": 6}},
    },
    "residual+cln-keep-text-b12": {
        "method": "residual+cln",
        "keep_text_side": True,
        "method_options": {"residual": {"bottleneck": 12}},
    },
    "residual-keep-text-b12-output": {
        "method": "residual",
        "keep_text_side": True,
        "method_options": {"residual": {"bottleneck": 12, "targets": ["attn", "ff", "mel_proj"]}},
    },
    "full": {"method": "full", "keep_text_side": False},
    "full-keep-text": {"method": "full", "keep_text_side": True},
}

# Phoneme classes of the espeak IPA symbols, for the duration error per class.
PHONEME_CLASSES = {
    "vowel": set("aeiouæɐɑɒɔəɘɚɛɜɝɞɪʊʌɨʉɯɤøœɵ"),
    "stop": set("pbtdkɡgʔ"),
    "fricative": set("fvθðszʃʒhçxɣχħʕ"),
    "nasal": set("mnŋɲɳ"),
    "approximant": set("lɹrwjɾɫʎɭʋ"),
    "pause/stress": set(" ,;:.!?ˈˌːˑ"),
}


def phoneme_class(symbol: str) -> str:
    return next((name for name, members in PHONEME_CLASSES.items() if symbol[:1] in members), "other")


class Speaker:
    """Speaks texts with a model as it stands (active adapter and speaker id as given) through Griffin-Lim."""

    def __init__(self, bundle):
        self.bundle = bundle
        self.vocoder = load_vocoder("griffin-lim", mel_config=bundle.mel_config)

    def phonemes(self, text: str) -> torch.Tensor:
        return torch.tensor([self.bundle.front_end.encode([text])[0]])

    @torch.no_grad()
    def durations(self, model, text: str, speaker_id: int) -> torch.Tensor:
        """Predicted frames per token ``[1, text]``."""
        phonemes = self.phonemes(text)
        out = model.infer(phonemes, torch.tensor([phonemes.shape[1]]), speaker_ids=torch.tensor([speaker_id]))
        return out.durations

    @torch.no_grad()
    def audio(self, model, text: str, speaker_id: int = 0, durations: torch.Tensor | None = None) -> np.ndarray:
        was_training = model.training
        model.eval()
        phonemes = self.phonemes(text)
        out = model.infer(
            phonemes, torch.tensor([phonemes.shape[1]]), speaker_ids=torch.tensor([speaker_id]), durations=durations
        )
        model.train(was_training)
        mel = model.denormalize_mel(out.mel)[0, : int(out.frame_mask[0].sum())]
        audio = self.vocoder(mel.unsqueeze(0))[0].float().numpy()
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        return audio * (0.99 / peak) if peak > 0.99 else audio


def judge(clips: dict[str, np.ndarray], texts: dict[str, str], references, judges: Judges, rate: int) -> EvalReport:
    items = [
        EvalItem(key, audio, texts[key], speaker_references=references, sample_rate=rate)
        for key, audio in clips.items()
    ]
    return evaluate_pairs(items, judges=judges, progress=False)


def summary(report: EvalReport) -> dict:
    """Corpus WER, mean similarity and MOS, and per-item word edits and lengths (for buckets)."""
    means = report.means()
    return {
        "wer": report.corpus_wer,
        "similarity": means.get("speaker_similarity"),
        "mos": means.get("mos"),
        "items": [
            {"id": r.id, "words": r.reference_words, "edits": r.word_edits, "transcript": r.transcript}
            for r in report.rows
        ],
    }


@torch.no_grad()
def real_timing(model, cache, keys: list[str], speaker_id: int) -> dict[str, torch.Tensor]:
    """Per key, the durations ``[1, text]`` the model's alignment search finds in the real recording."""
    was_training = model.training
    model.eval()
    found = {}
    for index, key in enumerate(cache.keys):
        if key not in keys:
            continue
        batch = collate(cache, np.array([index]))
        batch.speakers.fill_(speaker_id)
        found[key] = model(**step_inputs(model, batch)).durations
    model.train(was_training)
    return found


def duration_errors(model, speaker: Speaker, texts: dict[str, str], timing: dict[str, torch.Tensor], speaker_id: int):
    """Mean |log(1+predicted) - log(1+real)| per phoneme class, and predicted / real total frames."""
    per_class: dict[str, list[float]] = {}
    ratios = []
    symbols = speaker.bundle.front_end.symbols.symbols
    for key, real in timing.items():
        predicted = speaker.durations(model, texts[key], speaker_id)[0]
        ids = speaker.bundle.front_end.encode([texts[key]])[0]
        error = (torch.log1p(predicted) - torch.log1p(real[0])).abs().tolist()
        for symbol_id, value in zip(ids, error, strict=True):
            per_class.setdefault(phoneme_class(symbols[symbol_id]), []).append(value)
        ratios.append(float(predicted.sum() / real[0].sum()))
    return {name: float(np.mean(values)) for name, values in per_class.items()}, float(np.mean(ratios))


def voice_reference(args, voice: str, evaluation, references, judges: Judges, speaker: Speaker) -> dict:
    """The recordings, their Griffin-Lim copy synthesis, and (filled by the first run) the start speaker."""
    path = args.out / "runs" / f"{voice}-reference.json"
    if path.is_file():
        return json.loads(path.read_text())
    rate = speaker.bundle.mel_config.sample_rate
    texts = {u.key: u.text for u in evaluation}
    recordings = {u.key: load_audio(u.audio_path, rate) for u in evaluation}
    copies = {}
    for key, audio in recordings.items():
        mel = torch.from_numpy(log_mel(audio, speaker.bundle.mel_config))
        copies[key] = speaker.vocoder(mel.unsqueeze(0))[0].float().numpy()
    row = {
        "voice": voice,
        "recordings": summary(judge(recordings, texts, references, judges, rate)),
        "copy_synthesis": summary(judge(copies, texts, references, judges, rate)),
    }
    path.write_text(json.dumps(row, indent=1))
    return row


def run_one(args, voice: str, minutes: float, recipe: str, seed: int, evaluation, references, judges: Judges) -> dict:
    bundle = load_bundle(args.base or DEFAULT_BASE)
    speaker = Speaker(bundle)
    rate = bundle.mel_config.sample_rate
    texts = {u.key: u.text for u in evaluation}
    fields = dict(RECIPES[recipe])
    methods = parse_methods(fields.pop("method"), fields.pop("method_options", None))
    config = AdaptConfig(
        methods=methods, **fields, steps=args.steps, threads=args.threads, max_minutes=math.inf, seed=seed
    )
    curve = []

    def follow(step: int, model) -> None:
        if step % args.curve_every:
            return
        clips = {key: speaker.audio(model, text) for key, text in texts.items()}
        report = judge(clips, texts, references, Judges(whisper=judges.whisper, speaker=None, naturalness=None), rate)
        curve.append({"step": step, "wer": report.corpus_wer})

    data = args.work / f"{voice}-{minutes:g}min"
    out = args.work / "voices" / f"{voice}-{minutes:g}-{recipe}-seed{seed}"
    started = time.perf_counter()
    result = adapt(data, bundle, out, config, progress=False, on_evaluate=follow)
    adapt_seconds = time.perf_counter() - started
    model = result.model
    val_by_step = {h["step"]: h["val_mel"] for h in result.history}
    for point in curve:
        point["val_mel"] = val_by_step.get(point["step"])
    start_speaker = bundle.speakers.index(result.card.notes["speaker_vector_start"])

    cache, _ = build_feature_cache(
        evaluation, bundle.front_end, bundle.mel_config, speaker_names=[voice], progress=False
    )
    keys = [k for k in texts if k in cache.keys]  # an item the features refuse is left out of every timing
    timing = real_timing(model, cache, keys, 0)
    # The base: bundle.model, which adapt() leaves as it was (the voice trained on a copy, result.model).
    base = bundle.model
    with active_adapter(base, None):
        base_durations = {key: speaker.durations(base, texts[key], start_speaker) for key in keys}
        base_timing = real_timing(base, cache, keys, start_speaker)
        base_clips = {key: speaker.audio(base, texts[key], start_speaker) for key in keys}
        base_errors, base_rate = duration_errors(base, speaker, texts, base_timing, start_speaker)
    kept = {key: texts[key] for key in keys}
    timings = {
        "free": {key: speaker.audio(model, texts[key]) for key in keys},
        "real timing": {key: speaker.audio(model, texts[key], durations=timing[key]) for key in keys},
        "base timing": {key: speaker.audio(model, texts[key], durations=base_durations[key]) for key in keys},
    }
    judged = {name: summary(judge(clips, kept, references, judges, rate)) for name, clips in timings.items()}
    errors, rate_ratio = duration_errors(model, speaker, texts, timing, 0)
    return {
        "voice": voice,
        "minutes": minutes,
        "recipe": recipe,
        "seed": seed,
        "config": {k: v for k, v in RECIPES[recipe].items()},
        "step_cap": args.steps,
        "steps": result.card.steps,
        "best_step": result.card.metrics["best_step"],
        "trainable_parameters": result.card.trainable_parameters,
        "artifact_bytes": (result.voice_dir / "adapter_model.safetensors").stat().st_size,
        "adapt_seconds": adapt_seconds,
        "start_speaker": bundle.speakers[start_speaker],
        "curve": curve,
        "history": result.history,
        "timings": judged,
        "start_voice": summary(judge(base_clips, kept, references, judges, rate)),
        "duration_error": errors,
        "frames_ratio": rate_ratio,
        "start_voice_duration_error": base_errors,
        "start_voice_frames_ratio": base_rate,
    }


def fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def mean_spread(values: list[float], spec: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def bucket_wer(items: list[dict], low: int, high: int) -> float | None:
    chosen = [i for i in items if i["words"] is not None and low <= i["words"] < high]
    words = sum(i["words"] for i in chosen)
    return sum(i["edits"] for i in chosen) / words if words else None


def write_report(out: Path, args) -> None:
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    references = {r["voice"]: r for r in runs if "recordings" in r}
    rows = sorted(
        (r for r in runs if "recipe" in r),
        key=lambda r: (r["voice"], r["minutes"], list(RECIPES).index(r["recipe"]), r["seed"]),
    )
    lines = [
        "# Where adapted voices lose their words",
        "",
        f"Shipped base; held-out voices; {args.sentences} evaluation sentences per voice (the last clips of each "
        f"held-out voice, never trained on), {args.references} other real clips as similarity references. Judges: "
        "Whisper tiny.en (corpus WER), resemblyzer, distillmos (predicted MOS); Griffin-Lim vocoder throughout. "
        f"Every run: step cap {args.steps}, early stopping on held-out mel loss, 1 torch thread.",
        "",
        "## The voices themselves",
        "",
        "| voice | recordings WER % | recordings MOS | Griffin-Lim copy WER % | copy MOS |",
        "|---|---|---|---|---|",
    ]
    for voice, ref in sorted(references.items()):
        rec, copy = ref["recordings"], ref["copy_synthesis"]
        lines.append(
            f"| {voice} | {fmt(100 * rec['wer'], '.1f')} | {fmt(rec['mos'], '.2f')} | "
            f"{fmt(100 * copy['wer'], '.1f')} | {fmt(copy['mos'], '.2f')} |"
        )
    lines += [
        "",
        "## Per recipe (mean ± sample standard deviation over seeds)",
        "",
        "WER % in three timings (see the script's docstring), similarity and MOS of the free-running voice, and "
        "the start speaker on the base beside it.",
        "",
        "| voice | min | recipe | seeds | WER free | WER real timing | WER base timing | start voice WER | "
        "similarity | MOS | start voice MOS | steps (best) | params |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault((row["voice"], row["minutes"], row["recipe"]), []).append(row)
    for (voice, minutes, recipe), group in cells.items():

        def values(path: str, scale: float = 1.0, group=group):
            first, second = path.split(".")
            return [None if g[first][second] is None else g[first][second] * scale for g in group]

        def timing_wer(name: str, group=group):
            return [100 * g["timings"][name]["wer"] for g in group]

        steps = ", ".join(f"{g['steps']} ({g['best_step']})" for g in group)
        lines.append(
            f"| {voice} | {minutes:g} | {recipe} | {', '.join(str(g['seed']) for g in group)} | "
            f"{mean_spread(timing_wer('free'), '.1f')} | {mean_spread(timing_wer('real timing'), '.1f')} | "
            f"{mean_spread(timing_wer('base timing'), '.1f')} | {mean_spread(values('start_voice.wer', 100), '.1f')} | "
            f"{mean_spread([g['timings']['free']['similarity'] for g in group], '.3f')} | "
            f"{mean_spread([g['timings']['free']['mos'] for g in group], '.2f')} | "
            f"{mean_spread(values('start_voice.mos'), '.2f')} | "
            f"{steps} | {group[0]['trainable_parameters']:,} |"
        )
    lines += [
        "",
        "## WER by sentence length (free-running; corpus WER % over each bucket, all seeds pooled)",
        "",
        "| voice | min | recipe | < 10 words | 10-17 words | 18+ words | start voice < 10 / 10-17 / 18+ |",
        "|---|---|---|---|---|---|---|",
    ]
    for (voice, minutes, recipe), group in cells.items():
        items = [i for g in group for i in g["timings"]["free"]["items"]]
        start = [i for g in group for i in g["start_voice"]["items"]]
        buckets = [(0, 10), (10, 18), (18, 10_000)]
        mine = [fmt(None if (w := bucket_wer(items, *b)) is None else 100 * w, ".1f") for b in buckets]
        theirs = [fmt(None if (w := bucket_wer(start, *b)) is None else 100 * w, ".1f") for b in buckets]
        lines.append(f"| {voice} | {minutes:g} | {recipe} | {' | '.join(mine)} | {' / '.join(theirs)} |")
    classes = list(PHONEME_CLASSES) + ["other"]
    lines += [
        "",
        "## Timing: predicted against the real recording's alignment",
        "",
        "Mean |log(1 + predicted frames) - log(1 + aligned frames)| per phoneme class, and predicted / real total "
        "frames (speaking rate), for the adapted voice and for the start speaker on the base (seeds pooled).",
        "",
        "| voice | min | recipe | " + " | ".join(classes) + " | frames ratio | start voice frames ratio |",
        "|---|---|---|" + "---|" * len(classes) + "---|---|",
    ]
    for (voice, minutes, recipe), group in cells.items():
        per_class = [
            fmt(
                statistics.mean(v)
                if (v := [g["duration_error"][c] for g in group if c in g["duration_error"]])
                else None,
                ".3f",
            )
            for c in classes
        ]
        lines.append(
            f"| {voice} | {minutes:g} | {recipe} | {' | '.join(per_class)} | "
            f"{statistics.mean(g['frames_ratio'] for g in group):.3f} | "
            f"{statistics.mean(g['start_voice_frames_ratio'] for g in group):.3f} |"
        )
    lines += ["", "## WER over the steps (free-running) beside the held-out mel loss", ""]
    for (voice, minutes, recipe), group in cells.items():
        for g in group:
            points = ", ".join(f"{p['step']}: {100 * p['wer']:.1f}% / {fmt(p['val_mel'], '.3f')}" for p in g["curve"])
            lines.append(f"- {voice} {minutes:g} min {recipe} seed {g['seed']} (step: WER / val mel): {points}")
    (out / "intelligibility.md").write_text("\n".join(lines) + "\n")
    plot_curves(cells, out / "wer_over_steps.png")


def plot_curves(cells: dict[tuple, list[dict]], path: Path) -> None:
    """One panel per voice: WER over the steps per recipe (solid) and held-out mel L1 (dashed, right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    voices = sorted({key[0] for key in cells})
    if not voices:
        return
    recipes = list(dict.fromkeys(key[2] for key in cells))
    colors = {recipe: plt.get_cmap("tab10")(k % 10) for k, recipe in enumerate(recipes)}
    fig, axes = plt.subplots(1, len(voices), figsize=(5 * len(voices), 4.2), squeeze=False)
    for axis, voice in zip(axes[0], voices, strict=True):
        twin = axis.twinx()
        for (v, minutes, recipe), group in cells.items():
            if v != voice:
                continue
            for g in group:
                steps = [p["step"] for p in g["curve"]]
                label = f"{recipe} {minutes:g} min" if g is group[0] else None
                style = "o-" if minutes >= 3 else "s:"  # squares, dotted: less data
                axis.plot(steps, [100 * p["wer"] for p in g["curve"]], style, color=colors[recipe], label=label)
                twin.plot(steps, [p["val_mel"] for p in g["curve"]], "--", color=colors[recipe], alpha=0.5)
        axis.set_title(voice)
        axis.set_xlabel("adaptation step")
        axis.set_ylabel("WER % (solid)")
        twin.set_ylabel("held-out mel L1 (dashed)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None, help="base model folder (default: shipped)")
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument("--minutes", default="3")
    parser.add_argument("--recipes", default="residual,residual-keep-text,full,full-keep-text")
    parser.add_argument("--seeds", default="1234")
    parser.add_argument("--steps", type=int, default=AdaptConfig.steps)
    parser.add_argument("--sentences", type=int, default=20, help="evaluation sentences per voice")
    parser.add_argument("--references", type=int, default=10, help="real clips for speaker similarity")
    parser.add_argument("--curve-every", type=int, default=100, help="steps between WER points of the curve")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/intelligibility"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/intelligibility"))
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from the runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_report(args.out, args)
        return
    judges = Judges(reference=False)
    for voice in args.voices.split(","):
        utterances, _ = discover(args.heldout / voice)
        # The same split as bench/adaptation.py: the last clips are the evaluation set, the ones before
        # them the similarity references, the rest the training pool.
        evaluation = utterances[-args.sentences :]
        references = [u.audio_path for u in utterances[-args.sentences - args.references : -args.sentences]]
        pool = utterances[: -args.sentences - args.references]
        voice_reference(args, voice, evaluation, references, judges, Speaker(load_bundle(args.base or DEFAULT_BASE)))
        for minutes in [float(m) for m in args.minutes.split(",")]:
            write_subset(first_minutes(pool, minutes), args.work / f"{voice}-{minutes:g}min")
            for seed in [int(s) for s in args.seeds.split(",")]:
                for recipe in args.recipes.split(","):
                    path = args.out / "runs" / f"{voice}-{minutes:g}-{recipe}-seed{seed}.json"
                    if path.is_file():
                        continue
                    started = time.perf_counter()
                    row = run_one(args, voice, minutes, recipe, seed, evaluation, references, judges)
                    path.write_text(json.dumps(row, indent=1))
                    free = row["timings"]["free"]
                    print(
                        f"{voice} {minutes:g} min {recipe} seed {seed}: WER free {100 * free['wer']:.1f}% / real "
                        f"timing {100 * row['timings']['real timing']['wer']:.1f}% / base timing "
                        f"{100 * row['timings']['base timing']['wer']:.1f}% (start voice "
                        f"{100 * row['start_voice']['wer']:.1f}%), similarity {free['similarity']:.3f}, MOS "
                        f"{free['mos']:.2f}, {row['steps']} steps ({time.perf_counter() - started:.0f} s)",
                        flush=True,
                    )
                    write_report(args.out, args)
    write_report(args.out, args)


if __name__ == "__main__":
    main()
