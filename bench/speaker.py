"""Chorus's speaker encoder: training memory per category (predicted and measured), step time, and
equal error rate on speakers it never trained on, for every trunk, reversible or not, and every optimizer;
resemblyzer on the same trials; and the zero-shot use of an embedding.

Variants are named ``{arch}{depth}[-rev]-{optimizer}``: ``resnet18-adam``, ``resnet18-rev-adam8bit``,
``df-resnet56-rev-sgd8bit`` ... Every variant trains on the same corpus (the corpus' speakers and the
virtual speakers its sox chains make), with the same steps, batch and seed.

    python bench/speaker.py --train resnet18-adam,resnet18-rev-adam8bit   # train (one process per core)
    python bench/speaker.py --report                                      # judge every trained variant

A training stopped before its last step goes on from its checkpoint when the same command runs again.

Memory: every trained variant, and plain/reversible x 32-bit/8-bit Adam over depths (ResNet-18/34/50,
DF-ResNet-56/110/179), at the training batch (32 crops of 200 frames, 252 speakers), predicted and
measured (one step in a fresh process per configuration: categories from saved-tensor hooks, and the
process's peak RSS growth over the step). The zero-shot and start rows come from
``bench/adaptation.py --speaker-encoder`` runs (see bench/README.md) when their results exist.

Trials: the corpus' held-out voices (flite-slt, festival-ked, piper-joe) and speakers derived only
from them by the same sox chains, ``--trial-clips`` clips each, every pair a trial (a derived speaker
is a different speaker from its source: the hardest trials). None of these clips is used in training.
Every EER is also given without piper-joe and its relatives: encoders trained on natural-sounding speakers
made from the Piper voice (v2, v3) heard that voice read other sentences, so only the other trials are of
voices they never heard.

``--encoders`` judges bundles beside the trained variants on the same trials (the shipped encoder, the
consent check's v3: ``--encoders src/chorus/assets/speaker_encoder,src/chorus/assets/speaker_encoder_v3``);
they have no memory or step-time rows (their recipe is on their model cards).

Each process leaves its record in ``--work``'s ``runs/`` (commit, ``src/`` clean or not, the sampled load,
the command, what it trained or measured; ``run_record.RunLog``); the report copies the runs behind its
rows to ``--out``'s ``runs/`` and lists them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.audio.mel import MelConfig
from chorus.corpus.virtual import with_virtual_speakers
from chorus.data.formats import discover
from chorus.evaluation.similarity import SpeakerJudge
from chorus.memory.measure import measure_in_fresh_process
from chorus.memory.speaker_encoder import (
    ENCODER_NAME,
    encoder_config_by_name,
    measure_speaker_step,
    predict_speaker_memory,
)
from chorus.speaker_recognition.bundle import load_encoder
from chorus.speaker_recognition.encoder import SpeakerEncoderConfig
from chorus.speaker_recognition.verification import verification_scores
from chorus.training.speaker_encoder import SpeakerTrainConfig, prepare_clips, train_speaker_encoder
from run_record import RunLog, gather_runs, run_records, runs_section  # bench/, beside this script

VARIANT = re.compile(r"^(resnet|df-resnet)(\d+)(-rev)?-(adam8bit|adam|sgd8bit|sgd)$")
JUDGED = "report: every trained variant's EER (and step time where timed), resemblyzer's EER"  # what --report measures
TRAINING = SpeakerTrainConfig(corpus="", out="")  # the recipe every variant shares, but for steps and seed
# A DF-ResNet-179 step takes about 10 s on one thread: its 600 steps outlast a working session, so each
# training also saves its checkpoint this often (besides every 100 steps) and is resumed from it.
CHECKPOINT_MINUTES = 10
DEFAULT_VARIANTS = (
    "resnet18-adam,resnet18-rev-adam8bit,resnet18-adam8bit,resnet18-rev-adam,resnet18-sgd,resnet18-sgd8bit,"
    "df-resnet56-adam,df-resnet56-rev-adam8bit"
)


def parse_variant(name: str) -> tuple[SpeakerEncoderConfig, str]:
    """``resnet18-rev-adam8bit`` -> (its encoder config, its optimizer)."""
    match = VARIANT.match(name)
    if match is None:
        raise ValueError(f"variant {name!r} is not '{{resnet|df-resnet}}{{depth}}[-rev]-{{optimizer}}'")
    arch, depth, rev, optimizer = match.groups()
    return SpeakerEncoderConfig(arch=arch, depth=int(depth), reversible=rev is not None), optimizer


def train_variants(names: list[str], args, log: RunLog) -> None:
    """Train every variant not trained yet, on features made once for all of them."""
    corpus = args.work / "corpus"
    if not corpus.is_dir():
        with_virtual_speakers(args.corpus, corpus, args.virtual_speakers)
    base = SpeakerTrainConfig(corpus=str(corpus), out="", steps=args.steps, seed=args.seed)
    clips = None
    for name in names:
        folder = args.work / "encoders" / name
        if (folder / "config.json").is_file():
            print(f"{name}: trained already", flush=True)
            continue
        encoder, optimizer = parse_variant(name)
        if clips is None:
            clips = prepare_clips(base, MelConfig(n_mels=encoder.n_mels))
        config = SpeakerTrainConfig(
            corpus=str(corpus),
            out=str(folder),
            encoder=encoder,
            optimizer=optimizer,
            steps=args.steps,
            seed=args.seed,
            threads=args.threads,
            checkpoint_minutes=CHECKPOINT_MINUTES,
        )
        # A training cut short (a session's end) goes on from its checkpoint, on the path it would have taken.
        resume = folder if (folder / "checkpoint").is_dir() else None
        print(f"{name}: {'resumed from its checkpoint' if resume else 'training'}", flush=True)
        train_speaker_encoder(config, clips=clips, resume=resume)
        log.measured(f"train {name}")


def trial_clips(args) -> list[tuple[str, Path]]:
    """(speaker, clip) of the trials: the held-out voices and speakers derived only from them."""
    folder = args.work / "trials"
    if not folder.is_dir():
        with_virtual_speakers(args.heldout, folder, args.trial_virtual_speakers)
    rng = np.random.default_rng(args.seed)
    clips = []
    for speaker in sorted(p for p in folder.iterdir() if (p / "metadata.csv").is_file()):
        paths = sorted(u.audio_path for u in discover(speaker)[0])
        chosen = rng.choice(len(paths), size=min(args.trial_clips, len(paths)), replace=False)
        clips += [(speaker.name, paths[i]) for i in sorted(chosen)]
    lines = [
        f"{int(a[0] == b[0])} {a[1].relative_to(folder)} {b[1].relative_to(folder)}"
        for a, b in itertools.combinations(clips, 2)
    ]
    (folder / "trials.txt").write_text("\n".join(lines) + "\n")  # VoxCeleb's format, for chorus speaker eval
    return clips


def verification_row(embeddings: np.ndarray, clips: list[tuple[str, Path]]) -> dict:
    """EER and minDCF (p_target 0.01) of every pair of ``clips`` from their unit embeddings ``[N, D]``, and the
    EER of the pairs with no clip of piper-joe or a speaker derived from it (``eer_without_joe``)."""
    pairs = list(itertools.combinations(range(len(clips)), 2))
    scores = [float(embeddings[i] @ embeddings[j]) for i, j in pairs]
    same = [clips[i][0] == clips[j][0] for i, j in pairs]
    result = verification_scores(scores, same)
    unheard = [k for k, (i, j) in enumerate(pairs) if not (is_joe(clips[i][0]) or is_joe(clips[j][0]))]
    without_joe = verification_scores([scores[k] for k in unheard], [same[k] for k in unheard])
    return {
        "eer": result.eer,
        "min_dcf": result.min_dcf,
        "trials": result.trials,
        "targets": result.targets,
        "eer_without_joe": without_joe.eer,
        "trials_without_joe": without_joe.trials,
    }


def is_joe(speaker: str) -> bool:
    """Whether a trial speaker is piper-joe or derived from it (``piper-joe~pitch-240``)."""
    return speaker.split("~")[0] == "piper-joe"


def resemblyzer_embeddings(clips: list[tuple[str, Path]]) -> np.ndarray:
    judge = SpeakerJudge()
    return np.stack([judge.embed(load_audio(path, SAMPLE_RATE), SAMPLE_RATE) for _, path in clips])


def memory_rows(names: list[tuple[str, str]], args, log: RunLog) -> list[dict]:
    """Predicted and measured memory of one training step per encoder name and optimizer."""
    cache = args.work / "memory.json"
    done = {(r["encoder"], r["optimizer"]): r for r in json.loads(cache.read_text())} if cache.is_file() else {}
    rows = []
    for name, optimizer in names:
        if (name, optimizer) in done:
            rows.append(done[(name, optimizer)])
            continue
        config = encoder_config_by_name(name)
        settings = {"speakers": args.memory_speakers, "batch": args.batch, "frames": args.frames}
        predicted = predict_speaker_memory(config, optimizer=optimizer, **settings)
        measured = measure_in_fresh_process(config, step=measure_speaker_step, optimizer=optimizer, **settings)
        rows.append(
            {
                "encoder": name,
                "optimizer": optimizer,
                "predicted": predicted.categories(),
                "measured": measured.categories(),
                "peak_rss_growth": measured.peak_growth,
            }
        )
        print(f"memory {name} {optimizer}: {sum(measured.categories().values()) / 2**20:.0f} MiB", flush=True)
        cache.write_text(json.dumps(rows + [r for k, r in done.items() if k not in names], indent=1))
        log.measured(f"memory {name} {optimizer}")
    return rows


def encoder_rows(args, clips) -> list[dict]:
    """One row per trained variant (``--work``'s ``encoders/``) and per ``--encoders`` bundle, named by its path."""
    rows = []
    trained = sorted(folder.parent for folder in (args.work / "encoders").glob("*/config.json"))
    for folder in trained + args.encoders:
        name = folder.name if folder in trained else str(folder)
        bundle = load_encoder(folder)
        info = bundle.info
        rows.append(
            {
                "variant": name,
                "parameters": sum(p.numel() for p in bundle.encoder.parameters()),
                "steps": info["steps"],
                "seconds_per_step": info["train_seconds"] / info["steps"],
                "final_loss": info["final_loss"],
                "calibration_eer": info["calibration"]["eer"],
                **verification_row(bundle.embed([path for _, path in clips]), clips),
            }
        )
        print(f"{name}: EER {100 * rows[-1]['eer']:.2f}%", flush=True)
    return rows


def step_times(names: list[str], args) -> dict[str, list[float]]:
    """Seconds of one training step (batch ``args.batch`` x ``args.frames``, ``args.memory_speakers`` classes)
    per variant, in this process on ``args.threads`` thread(s): ``args.time_rounds`` rounds, the variants
    interleaved within each (so a busy moment of the machine falls on all of them), one step a round after
    one untimed warm-up step each."""
    import time

    from chorus.speaker_recognition.encoder import SpeakerClassifier, SpeakerEncoder
    from chorus.training.speaker_encoder import speaker_optimizer

    torch.manual_seed(args.seed)
    steps = {}
    for name in names:
        encoder, optimizer_name = parse_variant(name)
        model = SpeakerClassifier(SpeakerEncoder(encoder), args.memory_speakers)
        lr = 1e-3 if optimizer_name.startswith("adam") else 0.05
        steps[name] = (model, speaker_optimizer(list(model.parameters()), optimizer_name, lr, 1e-4))
    mel = torch.randn(args.batch, args.frames, 80)
    labels = torch.randint(0, args.memory_speakers, (args.batch,))

    def one(name: str) -> float:
        model, optimizer = steps[name]
        started = time.perf_counter()
        loss = model(mel, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    for name in names:
        one(name)  # warm-up: first-call allocations, bitsandbytes' kernels
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.time_rounds):
        for name in names:
            times[name].append(one(name))
    return times


def mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def report(encoders: list[dict], resemblyzer: dict, memory: list[dict], starts: dict, args, clips) -> str:
    speakers = len({s for s, _ in clips})
    lines = [
        "# Chorus's speaker encoder",
        "",
        f"Trials: {encoders[0]['trials'] if encoders else resemblyzer['trials']:,} pairs of {len(clips)} clips "
        f"of {speakers} speakers never trained on ({args.heldout} and {args.trial_virtual_speakers} speakers derived "
        f"from them), {encoders[0]['targets'] if encoders else resemblyzer['targets']:,} same-speaker. "
        f"Training: {args.steps} steps of {TRAINING.batch_speakers} speakers x {TRAINING.per_speaker} crops of "
        f"{TRAINING.segment_frames} frames, seed {args.seed}, {args.threads} CPU thread(s).",
        "",
        "| variant | parameters | s/step (median, min-max) | final loss | calibration EER % | EER % | minDCF (0.01) "
        f"| EER % without piper-joe's {resemblyzer['trials'] - resemblyzer['trials_without_joe']:,} trials "
        "| EER x the same trunk's vanilla Adam |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    eers = {r["variant"]: r["eer"] for r in encoders}
    for r in encoders:
        variant = VARIANT.match(r["variant"])
        vanilla = eers.get(f"{variant.group(1)}{variant.group(2)}-adam") if variant else None
        ratio = f"{r['eer'] / vanilla:.2f}" if vanilla else ""
        timed = r.get("step_seconds") or [r["seconds_per_step"]]
        # A bundle trained elsewhere (another machine, batch and recipe) has no step time comparable with these.
        step = f"{np.median(timed):.2f} ({min(timed):.2f}-{max(timed):.2f})" if variant else "see its card"
        lines.append(
            f"| {r['variant']} | {r['parameters']:,} | {step} | "
            f"{r['final_loss']:.2f} | {100 * r['calibration_eer']:.2f} | {100 * r['eer']:.2f} | {r['min_dcf']:.3f} | "
            f"{100 * r['eer_without_joe']:.2f} | {ratio} |"
        )
    lines.append(
        f"| resemblyzer (GE2E, pretrained on thousands of real speakers) | | | | | {100 * resemblyzer['eer']:.2f} | "
        f"{resemblyzer['min_dcf']:.3f} | {100 * resemblyzer['eer_without_joe']:.2f} | |"
    )
    if encoders and "step_seconds" in encoders[0]:
        lines += [
            "",
            f"Step time: one step of {args.batch} crops of {args.frames} frames ({args.memory_speakers} classes) in one "
            f"process on {args.threads} thread(s), {args.time_rounds} rounds with the variants interleaved; the time is "
            "the whole step (forward, backward with the reversible stages' recomputation, optimizer). Calibration EER: "
            "the training speakers' held-out clips, which set each encoder's threshold; EER: the trials above.",
        ]
    if args.encoders:
        lines += [
            "",
            "Bundles judged as they are (" + ", ".join(str(f) for f in args.encoders) + "): their training (machine, "
            "batch, steps, final loss, calibration trials) is on their model cards, not comparable with the rows "
            "trained here. An encoder that heard relatives of the Piper voice (v2, v3) never heard piper-joe's held-out "
            "clips, but the column without piper-joe's trials is the one of voices wholly new to it.",
        ]
    lines += [
        "",
        f"## Training memory of one step ({args.batch} crops of {args.frames} frames, {args.memory_speakers} "
        "speakers), MiB: predicted / measured",
        "",
        "| encoder | optimizer | weights | gradients | optimizer states | activations | recompute | total "
        "| peak RSS growth | total x vanilla Adam |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals = {(r["encoder"], r["optimizer"]): sum(r["measured"].values()) for r in memory}
    for r in memory:
        plain = totals.get((r["encoder"].removesuffix("-rev"), "adam"))
        cells = [
            f"{mib(r['predicted'].get(k, 0))} / {mib(r['measured'].get(k, 0))}"
            for k in ("weights", "gradients", "optimizer_states", "activations", "recompute")
        ]
        total = totals[(r["encoder"], r["optimizer"])]
        lines.append(
            f"| {r['encoder']} | {r['optimizer']} | " + " | ".join(cells) + f" | {mib(sum(r['predicted'].values()))} / "
            f"{mib(total)} | {mib(r['peak_rss_growth'])} | {plain / total:.1f}x |"
        )
    if starts:
        lines += [
            "",
            "## Where a voice starts (bench/adaptation.py, 1 minute, resemblyzer similarity to real clips)",
            "",
            "| run | method | voice | steps | similarity | WER % | start speaker |",
            "|---|---|---|---|---|---|---|",
        ]
        for run, rows in starts.items():
            for row in rows:
                lines.append(
                    f"| {run} | {row['method']} | {row['voice']} | {row['steps']} | {row['similarity']:.3f} | "
                    f"{100 * (row['wer'] or 0):.1f} | {row['start_speaker']} |"
                )
    return "\n".join(lines) + "\n"


def plot(encoders: list[dict], resemblyzer: dict, memory: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in memory:
        arch, depth, rev = ENCODER_NAME.match(r["encoder"]).groups()
        label = f"{arch}{rev or ''} {r['optimizer']}"
        curves.setdefault(label, []).append((int(depth), sum(r["measured"].values()) / 2**20))
    for label, points in sorted(curves.items()):
        xs, ys = zip(*sorted(set(points)))
        style = ("--" if "8bit" in label else "-") + ("^" if "-rev" in label else "o")
        right.plot(xs, ys, style, color="tab:orange" if label.startswith("df") else "tab:blue", label=label)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("depth")
    right.set_ylabel("measured training memory of one step, MiB")
    right.set_title("Memory against depth (batch 32 x 200 frames)")
    right.legend(fontsize=7)
    names = [r["variant"] for r in encoders] + ["resemblyzer"]
    values = [100 * r["eer"] for r in encoders] + [100 * resemblyzer["eer"]]
    left.barh(names, values, color=["tab:blue"] * len(encoders) + ["tab:gray"])
    left.set_xlabel("EER % on held-out speakers (lower is better)")
    left.set_title("Verification")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", default=None, help=f"variants to train (comma-separated), e.g. {DEFAULT_VARIANTS}")
    parser.add_argument("--report", action="store_true", help="judge every trained variant and write the report")
    parser.add_argument(
        "--encoders",
        type=lambda text: [Path(p) for p in text.split(",") if p],
        default=[],
        help="speaker-encoder folders judged beside the trained variants (comma-separated)",
    )
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--virtual-speakers", type=int, default=216, help="virtual speakers added to the corpus")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--trial-virtual-speakers", type=int, default=9)
    parser.add_argument("--trial-clips", type=int, default=8, help="clips per trial speaker")
    parser.add_argument("--memory-speakers", type=int, default=252, help="classes of the AAM head")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--starts", type=Path, default=Path("bench/results/speaker_start"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--time-rounds", type=int, default=5, help="rounds of the step-time measurement (0: none)")
    parser.add_argument("--work", type=Path, default=Path("runs/speaker"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/speaker"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with RunLog(args.work, args.threads, " ".join(sys.argv)) as log:
        if args.train:
            train_variants(args.train.split(","), args, log)
        if not args.report:
            return
        clips = trial_clips(args)
        encoders = encoder_rows(args, clips)
        variants = [r["variant"] for r in encoders if VARIANT.match(r["variant"])]  # not the --encoders bundles
        if args.time_rounds:
            times = step_times(variants, args)
            for row in encoders:
                if row["variant"] in times:
                    row["step_seconds"] = [round(t, 4) for t in times[row["variant"]]]
        resemblyzer = verification_row(resemblyzer_embeddings(clips), clips)
        trained = [(m.group(1) + m.group(2) + (m.group(3) or ""), m.group(4)) for m in map(VARIANT.match, variants)]
        sweep = [
            (f"{arch}{depth}{rev}", optimizer)
            for arch, depths in (("resnet", (18, 34, 50)), ("df-resnet", (56, 110, 179)))
            for depth in depths
            for rev in ("", "-rev")
            for optimizer in ("adam", "adam8bit")
        ]
        memory = memory_rows(list(dict.fromkeys(sweep + trained)), args, log)
        log.measured(JUDGED)
    starts = {
        folder.name: json.loads((folder / "adaptation.json").read_text())
        for folder in sorted(args.starts.glob("*"))
        if (folder / "adaptation.json").is_file()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    behind = [
        *(f"train {r['variant']}" for r in encoders if VARIANT.match(r["variant"])),
        *(f"memory {r['encoder']} {r['optimizer']}" for r in memory),
    ]
    behind.append(JUDGED)
    gather_runs(args.out, args.work, rows=behind)
    results = {"encoders": encoders, "resemblyzer": resemblyzer, "memory": memory}
    (args.out / "speaker.json").write_text(json.dumps(results, indent=2))
    report_text = report(encoders, resemblyzer, memory, starts, args, clips)
    (args.out / "speaker.md").write_text(report_text + runs_section(run_records(args.out, rows=behind), behind))
    plot(encoders, resemblyzer, memory, args.out / "speaker.png")
    print((args.out / "speaker.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
