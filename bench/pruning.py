"""Benchmark: the five pruning techniques of "EPIC TTS Models" on the Chorus base, against the dense base.

Rows (each a model folder that `chorus prune` could have written; built with :func:`chorus.pruning.prune_base`):

* ``dense``: the shipped base, measured in the same run;
* ``ump`` and ``parp`` at ``--sparsities`` of the targeted weights, from the shipped base, fine-tuned
  ``--steps`` steps (their budget);
* ``structured`` at ``--structured-sparsities`` of the channels and heads, from the shipped base,
  fine-tuned ``--steps`` steps;
* ``snip`` and ``dynamic`` at ``--scratch-sparsities``, trained from scratch for ``--scratch-steps``
  steps, beside ``dense-scratch``: the dense model trained from scratch with the same loop, schedule,
  data and steps (the fair baseline of a from-scratch technique, which a 9,000-step base is not).

Every row says the same ``--sentences`` benchmark sentences (in no speaker's training text) in each of
the ``--voices`` (as ``bench/base.py``), through the model's default vocoder, and is judged by judges
nobody here trained: Whisper tiny.en (WER, CER), resemblyzer (similarity to real corpus clips of the
voice), distillmos (predicted MOS); against the voice's own engine reading the same sentences: MCD
(DTW), F0 RMSE and voiced/unvoiced error (WORLD harvest); speaking rate (words per second of speech).
Beside: non-zero parameters, bytes of ``model.safetensors``, training seconds, and the acoustic
model's CPU real-time factor (``model.infer`` only, no vocoder: what pruning changes), measured for
all rows side by side in one loop: ``--rtf-repeats`` rounds, each timing every row on every sentence
once, rows in a new order each round; the median round and the spread are reported.

    python bench/pruning.py --out bench/results/pruning

Model folders and the corpus' feature cache go to ``--work`` (default ``runs/pruning``); a row whose
folder (or judged scores) exists is reused, so a stopped run resumes, and ``--rows`` splits the rows
over processes (the RTF loop and the report run with ``--report``, over every judged row found). Writes
``pruning.md``, ``pruning.json`` and ``pruning.png`` (each metric against sparsity, a line per technique).
Each process leaves its record in ``--work``'s ``runs/`` (commit, ``src/`` clean or not, the sampled load,
the command, and each row's build, judging or held-out mel L1 it did; ``run_record.RunLog``); the report
copies the runs behind its rows to ``--out``'s ``runs/`` and lists them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from base import DEFAULT_VOICES, corpus_references  # bench/, beside this script
from chorus.corpus.build import record_sentences
from chorus.corpus.text import benchmark_sentences
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.bundle import load_bundle, save_bundle
from chorus.pruning import PruneConfig, prune_base
from chorus.pruning.loop import fresh_model, train
from chorus.pruning.run import load_training_data, sparsity_report
from chorus.pruning.targets import DEFAULT_EXCLUDE, DEFAULT_INCLUDE
from chorus.synthesis import DEFAULT_BASE, load_base
from chorus.training.pretrain import evaluate
from run_record import RunLog, gather_runs, run_records, runs_section  # bench/, beside this script

METRICS = [  # (key, column header, format, plotted)
    ("wer", "WER %", "{:.1f}", True),
    ("cer", "CER %", "{:.1f}", False),
    ("f0_rmse_hz", "F0 RMSE Hz", "{:.1f}", True),
    ("voicing_error", "V/UV err %", "{:.1f}", False),
    ("words_per_second", "words/s", "{:.2f}", False),
    ("mcd_db", "MCD dB", "{:.2f}", True),
    ("speaker_similarity", "similarity", "{:.3f}", True),
    ("mos", "MOS", "{:.2f}", True),
]
PERCENT = {"wer", "cer", "voicing_error"}
TIMED = "report: every row's acoustic RTF"  # what every --report pass measures again


@dataclasses.dataclass(frozen=True)
class Row:
    technique: str  # a registered technique, "dense" (the shipped base) or "dense-scratch"
    sparsity: float
    steps: int

    @property
    def name(self) -> str:
        return self.technique if self.technique in ("dense",) else f"{self.technique}-{self.sparsity:g}-{self.steps}"

    @property
    def from_scratch(self) -> bool:
        return self.technique in ("snip", "dynamic", "dense-scratch")

    @classmethod
    def from_name(cls, name: str) -> Row:
        if name == "dense":
            return cls("dense", 0.0, 0)
        technique, sparsity, steps = name.rsplit("-", 2)
        return cls(technique, float(sparsity), int(steps))


def planned_rows(args) -> list[Row]:
    rows = [Row("dense", 0.0, 0)]
    techniques = args.techniques.split(",")
    for technique in ("ump", "parp"):
        if technique in techniques:
            rows += [Row(technique, s, args.steps) for s in args.sparsities]
    if "structured" in techniques:
        rows += [Row("structured", s, args.steps) for s in args.structured_sparsities]
    if {"snip", "dynamic"} & set(techniques):
        rows.append(Row("dense-scratch", 0.0, args.scratch_steps))
        for technique in ("snip", "dynamic"):
            if technique in techniques:
                rows += [Row(technique, s, args.scratch_steps) for s in args.scratch_sparsities]
    return rows


def model_folder(row: Row, args) -> Path:
    """Where the row's model is: the shipped base for ``dense``, else its folder under ``--work``."""
    return DEFAULT_BASE if row.technique == "dense" else args.work / row.name


def build(row: Row, args) -> Path:
    """The row's model folder, made the first time."""
    folder = model_folder(row, args)
    if (folder / "config.json").is_file():
        return folder
    features = args.work / "features.safetensors"
    if row.technique == "dense-scratch":
        base = load_bundle(DEFAULT_BASE)
        data = load_training_data(base, args.corpus, features)
        # The from-scratch techniques' budget, exactly (PruneConfig makes it), without a mask.
        budget = PruneConfig("snip", 0.5, str(folder), str(args.corpus), steps=row.steps, seed=args.seed).budget()
        model = fresh_model(base, budget.seed)
        result = train(model, data, budget, title="dense from scratch")
        info = {"default_vocoder": base.info.get("default_vocoder", "griffin-lim")}  # nothing of the base's training
        info["pruning"] = {
            "method": "dense-scratch",
            "from_scratch": True,
            "target_sparsity": 0.0,
            **sparsity_report(base.model, model, DEFAULT_INCLUDE, DEFAULT_EXCLUDE),
            "steps": result.steps,
            "train_seconds": round(result.seconds, 3),
            "learning_rate": budget.learning_rate,
        }
        save_bundle(dataclasses.replace(base, model=model, info=info, weights_sha256=""), folder)
        return folder
    config = PruneConfig(
        row.technique,
        row.sparsity,
        str(folder),
        str(args.corpus),
        steps=row.steps,
        features=str(features),
        threads=args.threads,
        seed=args.seed,
    )
    return prune_base(config)


def judge(row: Row, folder: Path, args, judges: Judges, recordings, references) -> dict:
    """Mean scores of the row's model over every voice and sentence (cached in ``--work``)."""
    cached = args.work / "judged" / f"{row.name}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    tts = load_base(folder)
    items = []
    for voice in args.voices:
        for index, text in enumerate(args.sentence_list):
            result = tts.synthesize(text, voice)
            items.append(
                EvalItem(
                    f"{voice}/{index:03d}",
                    result.audio,
                    text,
                    reference=recordings[voice][index],
                    speaker_references=references[voice],
                    synthesis_seconds=result.seconds,
                    sample_rate=result.sample_rate,
                )
            )
    report = evaluate_pairs(items, judges)
    info = tts.bundle.info.get("pruning", {})
    scores = {
        **report.means(),
        "wer": report.corpus_wer,
        "cer": report.corpus_cer,
        "clips": len(items),
        "parameters": info.get("parameters", sum(p.numel() for p in tts.bundle.model.parameters())),
        "nonzero_parameters": info.get(
            "nonzero_parameters", sum(int(torch.count_nonzero(p)) for p in tts.bundle.model.parameters())
        ),
        "sparsity": info.get("sparsity", 0.0),
        "bytes": (folder / "model.safetensors").stat().st_size,
        "train_seconds": info.get("train_seconds", 0.0),
        "steps": info.get("steps", tts.bundle.info.get("steps", 0)),  # the dense base: its pretraining
    }
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(scores, indent=2))
    return scores


def held_out_mel_l1(name: str, folder: Path, data, args, log: RunLog) -> float:
    """The row's teacher-forced mel L1 on the corpus' held-out utterances (two per speaker), cached:
    what training optimizes, and still telling where every row's speech is unintelligible."""
    cached = args.work / "judged" / f"{name}.loss.json"
    if cached.is_file():
        return json.loads(cached.read_text())["mel"]
    model = load_bundle(folder).model
    losses = evaluate(model, data.cache, data.validation, torch.device("cpu"), args.max_frames)
    cached.write_text(json.dumps(losses))
    log.measured(f"{name} mel L1")
    return losses["mel"]


@torch.no_grad()
def acoustic_rtf(folders: dict[str, Path], sentences: list[str], voices: list[str], repeats: int, seed: int) -> dict:
    """Per row: the acoustic model's seconds per second of audio, each round timing every row on every
    sentence once (rows in a new order each round); the median round and the min/max rounds."""
    models = {}
    for name, folder in folders.items():
        bundle = load_bundle(folder)
        inputs = []
        for index, text in enumerate(sentences):
            ids = torch.tensor([bundle.front_end.encode([text])[0]])
            speaker = torch.tensor([bundle.speaker_index(voices[index % len(voices)])])
            inputs.append((ids, torch.tensor([ids.shape[1]]), speaker))
        models[name] = (bundle.model.eval(), inputs, bundle.mel_config.hop_length / bundle.mel_config.sample_rate)
    rounds: dict[str, list[float]] = {name: [] for name in models}
    order = list(models)
    rng = random.Random(seed)
    for repeat in range(repeats + 1):  # round 0 warms every model up and is not counted
        rng.shuffle(order)
        for name in order:
            model, inputs, frame_seconds = models[name]
            spent = audio = 0.0
            for ids, lengths, speaker in inputs:
                started = time.perf_counter()
                out = model.infer(ids, lengths, speaker)
                spent += time.perf_counter() - started
                audio += float(out.frame_mask.sum()) * frame_seconds
            if repeat:
                rounds[name].append(spent / audio)
    return {
        name: {"median": float(np.median(r)), "min": float(min(r)), "max": float(max(r)), "rounds": r}
        for name, r in rounds.items()
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [("held_out_mel_l1", "held-out mel L1", "", True)] + [m for m in METRICS if m[3]]
    shown += [("bytes", "MB on disk", "", True), ("rtf", "acoustic RTF", "", True)]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    dense = next(r for r in results if r["technique"] == "dense")
    for axis, (key, label, _, _) in zip(axes.flat, shown):
        groups = sorted({(r["technique"], r["steps"]) for r in results if not r["technique"].startswith("dense")})
        for technique, steps in groups:  # one line per technique and budget
            mine = [r for r in results if (r["technique"], r["steps"]) == (technique, steps)]
            mine.sort(key=lambda r: r["target_sparsity"])
            values = [_value(r, key) for r in mine]
            name = f"{technique} ({steps} steps)"
            axis.plot([100 * r["target_sparsity"] for r in mine], values, marker="o", label=name)
        axis.axhline(_value(dense, key), color="k", linestyle="--", linewidth=1, label="dense base")
        scratch = [r for r in results if r["technique"] == "dense-scratch"]
        if scratch:
            axis.axhline(_value(scratch[0], key), color="gray", linestyle=":", linewidth=1, label="dense from scratch")
        axis.set_xlabel("sparsity % (structured: of channels and heads)")
        axis.set_title(label)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _value(row: dict, key: str) -> float:
    if key == "bytes":
        return row["bytes"] / 1e6
    if key == "rtf":
        return row["rtf"]["median"]
    value = row[key]
    return 100 * value if key in PERCENT else value


def report(results: list[dict], args) -> str:
    dense = next(r for r in results if r["technique"] == "dense")
    header = ["row", "budget", "sparsity reached %", "held-out mel L1"] + [m[1] for m in METRICS]
    header += ["non-zero params", "MB on disk", "x dense bytes", "train s", "acoustic RTF (min-max)", "x dense speed"]
    lines = [
        "# Pruning the base",
        "",
        f"{len(args.voices)} voices ({', '.join(args.voices)}) x {len(args.sentence_list)} benchmark sentences, "
        f"the model's default vocoder; {args.threads} CPU thread(s); acoustic RTF over {args.rtf_repeats} rounds "
        "(median round; min-max). Budgets: after-training rows start from the shipped base "
        f"({dense['steps']:,} steps) and fine-tune the steps given; from-scratch rows train only the "
        "steps given, like dense-scratch.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in results:
        budget = (
            f"shipped base ({r['steps']:,} steps)"
            if r["technique"] == "dense"
            else f"{r['steps']} steps {'from scratch' if r['from_scratch'] else 'fine-tuning the base'}"
        )
        cells = [r["name"], budget, f"{100 * r['sparsity']:.1f}", f"{r['held_out_mel_l1']:.3f}"]
        for key, _, fmt, _ in METRICS:
            value = r.get(key)
            cells.append("n/a" if value is None else fmt.format(100 * value if key in PERCENT else value))
        rtf = r["rtf"]
        cells += [
            f"{r['nonzero_parameters']:,}",
            f"{r['bytes'] / 1e6:.2f}",
            f"{r['bytes'] / dense['bytes']:.2f}",
            f"{r['train_seconds']:.0f}",
            f"{rtf['median']:.4f} ({rtf['min']:.4f}-{rtf['max']:.4f})",
            f"{dense['rtf']['median'] / rtf['median']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--techniques", default="ump,parp,structured,snip,dynamic")
    parser.add_argument(
        "--sparsities", type=lambda s: [float(x) for x in s.split(",")], default=[0.2, 0.4, 0.6, 0.8, 0.9]
    )
    parser.add_argument(
        "--structured-sparsities", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.2, 0.3, 0.5]
    )
    parser.add_argument(
        "--scratch-sparsities", type=lambda s: [float(x) for x in s.split(",")], default=[0.2, 0.4, 0.6, 0.8, 0.9]
    )
    parser.add_argument("--steps", type=int, default=100, help="fine-tuning steps of the after-training rows")
    parser.add_argument("--scratch-steps", type=int, default=300, help="steps of the from-scratch rows")
    parser.add_argument("--rows", default=None, help="only these row names (comma-separated), for parallel builds")
    parser.add_argument("--report", action="store_true", help="also time every row found and write the report")
    parser.add_argument("--voices", type=lambda s: s.split(","), default=DEFAULT_VOICES.split(","))
    parser.add_argument("--sentences", type=int, default=10)
    parser.add_argument("--references", type=int, default=10, help="real clips per voice for similarity")
    parser.add_argument("--rtf-repeats", type=int, default=5)
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--work", type=Path, default=Path("runs/pruning"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-frames", type=int, default=4800, help="padded frames per batch of the loss")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=Path("bench/results/pruning"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    args.sentence_list = benchmark_sentences()[: args.sentences]
    rows = planned_rows(args)
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.name in wanted]

    recordings = {voice: record_sentences(voice, args.sentence_list) for voice in args.voices}
    references = {voice: corpus_references(args.corpus, voice, args.references) for voice in args.voices}
    judges = Judges(speaker=SpeakerJudge())
    with RunLog(args.work, args.threads, " ".join(sys.argv)) as log:
        for row in rows:
            built = (model_folder(row, args) / "config.json").is_file()
            folder = build(row, args)
            if not built:
                log.measured(f"{row.name} built")
            judged = (args.work / "judged" / f"{row.name}.json").is_file()
            score = judge(row, folder, args, judges, recordings, references)
            if not judged:
                log.measured(f"{row.name} judged")
            print(f"{row.name}: WER {100 * score['wer']:.1f}% MOS {score.get('mos')}", flush=True)
        if not args.report:
            return
        results = timed_rows(args, log)
        log.measured(TIMED)
    args.out.mkdir(parents=True, exist_ok=True)
    stages = {
        r["name"]: ("judged", "mel L1") if r["technique"] == "dense" else ("built", "judged", "mel L1") for r in results
    }
    behind = [f"{name} {stage}" for name, named in stages.items() for stage in named] + [TIMED]  # dense is not built
    gather_runs(args.out, args.work, rows=behind)
    (args.out / "pruning.md").write_text(
        report(results, args) + runs_section(run_records(args.out, rows=behind), behind)
    )
    (args.out / "pruning.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "pruning.png")
    print((args.out / "pruning.md").read_text())


def timed_rows(args, log: RunLog) -> list[dict]:
    """Every judged row in ``args.work``, in the report's order, with its acoustic RTF (all rows timed side
    by side here) and held-out mel L1."""
    order = {t: i for i, t in enumerate(("dense", "ump", "parp", "structured", "dense-scratch", "snip", "dynamic"))}
    judged = [
        p.name[: -len(".json")] for p in (args.work / "judged").glob("*.json") if not p.name.endswith(".loss.json")
    ]
    done = sorted(map(Row.from_name, judged), key=lambda r: (order[r.technique], r.steps, r.sparsity))
    folders = {r.name: model_folder(r, args) for r in done}
    rtf = acoustic_rtf(folders, args.sentence_list, args.voices, args.rtf_repeats, args.seed)
    data = load_training_data(load_bundle(DEFAULT_BASE), args.corpus, args.work / "features.safetensors")
    losses = {name: held_out_mel_l1(name, folder, data, args, log) for name, folder in folders.items()}
    results = []
    for r in done:
        values = json.loads((args.work / "judged" / f"{r.name}.json").read_text())
        results.append(
            {
                **values,
                "name": r.name,
                "technique": r.technique,
                "target_sparsity": r.sparsity,
                "from_scratch": r.from_scratch,
                "rtf": rtf[r.name],
                "held_out_mel_l1": losses[r.name],
            }
        )
    return results


if __name__ == "__main__":
    main()
