"""Benchmark: a voice-space voice (only its vector learns) against a per-voice LoRA as data shrinks.

The space is learned over the base corpus's voices (``--space-minutes`` of each) and, with
``--space-virtual N``, over N new virtual voices derived from them by sox
(:mod:`chorus.corpus.virtual`): voices the base has never heard, so that the space must learn adapter
directions and not only speaker vectors. Nothing is derived from the held-out voices. Then for each
held-out voice and amount of data (30 s, 1, 3, 10 minutes: the first clips of the voice), a voice is
made both ways, from the same clips: ``chorus voice-space fit`` (``dim`` numbers, once per start in
``--fit-init``: the nearest training voice's z, the clips' d-vector through the space's linear map,
or the center) and ``chorus adapt --method lora+speaker``. Both speak the voice's held-out
sentences and are judged against its real recordings (Whisper WER, resemblyzer similarity).

    python bench/voice_space.py --voices piper-joe --out bench/results/voice_space
    python bench/voice_space.py --kinds lora --minutes 3      # the LoRA rows alone (no space needed),
                                                              # e.g. in a second process
    python bench/voice_space.py --voices ""                   # the report again from voice_space.json

Writes ``voice_space.md``, ``voice_space.json`` and ``similarity_vs_minutes.png``. Each process leaves its
record under ``--out``'s ``runs/`` (commit, ``src/`` clean or not, the sampled load, the command, the rows it
measured; ``run_record.RunLog``), and the report lists the runs behind its rows.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

import torch

from base import judge_voice  # bench/, beside this script
from chorus.adapters import parse_methods
from chorus.adapters.hypernetwork import VoiceSpace
from chorus.atomic import atomic_write_text
from chorus.corpus.virtual import add_virtual_speakers
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import Judges
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.bundle import load_bundle
from chorus.recipe import AdaptConfig
from chorus.synthesis import DEFAULT_BASE
from chorus.training.adapt import adapt
from chorus.training.voice_space_training import VoiceSpaceConfig, fit_voice, train_voice_space
from run_record import RunLog, run_records, runs_section  # bench/, beside this script


def heldout_split(folder: Path, sentences: int, references: int) -> tuple[list, list[Path], list]:
    """A held-out voice's clips: (the last ``sentences`` to speak and judge, the ``references`` before
    them that similarity is measured against (paths), the rest: the pool training data is taken from)."""
    utterances, _ = discover(folder)
    return (
        utterances[-sentences:],
        [u.audio_path for u in utterances[-sentences - references : -sentences]],
        utterances[: -sentences - references],
    )


FIT_STEPS = inspect.signature(fit_voice).parameters["steps"].default
SPACE = "the voice space (learned in --work)"  # how a run record names the learning of the space


def space_kind(init: str, steps: int) -> str:
    return f"voice space, {init} start" + ("" if steps == FIT_STEPS else f", {steps} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voices", default="piper-joe,flite-slt,festival-ked")
    parser.add_argument("--minutes", default="0.5,1,3,10")
    parser.add_argument("--space-method", default="cln+speaker", help="the adapter the space generates")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--space-steps", type=int, default=200)
    parser.add_argument("--space-minutes", type=float, default=1.0, help="audio of each corpus voice in the space")
    parser.add_argument("--space-virtual", type=int, default=54, help="new virtual voices added to the space")
    parser.add_argument(
        "--fit-steps",
        type=int,
        default=FIT_STEPS,
        help="most steps of a space voice's fit (early stopping); rows of other budgets are apart",
    )
    parser.add_argument(
        "--fit-init",
        default="nearest,embedding",
        help="where a space voice's vector starts (nearest, embedding, mean): one row each",
    )
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE, help="base model the space and the voices use")
    parser.add_argument(
        "--kinds",
        default="space,lora",
        help="what to make: space (learn the space if needed, fit its voices), lora, or both",
    )
    parser.add_argument(
        "--redo-lora", action="store_true", help="adapt the LoRA voices again (with --kinds space,lora)"
    )
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--references", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--work", type=Path, default=Path("runs/voice_space"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/voice_space"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    kinds = set(args.kinds.split(","))
    space = None
    judges = Judges(speaker=SpeakerJudge(), reference=False)
    results_path = args.out / "voice_space.json"
    with RunLog(args.out, args.threads, " ".join(sys.argv)) as log:
        if "space" in kinds:
            space, space_voices, space_info = learned_space(args, log)
        for voice in filter(None, args.voices.split(",")):
            evaluation, references, pool = heldout_split(args.heldout / voice, args.sentences, args.references)
            for minutes in [float(m) for m in args.minutes.split(",")]:
                data = args.work / "data" / f"{voice}-{minutes:g}"
                write_subset(first_minutes(pool, minutes), data)
                made = []
                for init in args.fit_init.split(",") if space is not None else []:
                    fitted = fit_voice(
                        data,
                        load_bundle(args.base),
                        space,
                        args.work / "voices" / f"{voice}-{minutes:g}-space-{init}-{args.fit_steps}",
                        steps=args.fit_steps,
                        init=init,
                        threads=args.threads,
                        progress=False,
                    )
                    made.append((space_kind(init, args.fit_steps), fitted.voice_dir, fitted.card))
                # The per-voice LoRA does not depend on the space: a result from an earlier run is kept.
                if "lora" in kinds and (
                    args.redo_lora
                    or space is None
                    or not any(row_key(r) == (voice, minutes, "lora+speaker") for r in read_rows(results_path))
                ):
                    lora = adapt(
                        data,
                        load_bundle(args.base),
                        args.work / "voices" / f"{voice}-{minutes:g}-lora",
                        AdaptConfig(methods=parse_methods("lora+speaker"), threads=args.threads, min_minutes=0.4),
                        progress=False,
                    )
                    made.append(("lora+speaker", lora.voice_dir, lora.card))
                for kind, voice_dir, card in made:
                    scores = judge_voice(args.base, voice_dir, evaluation, references, judges)
                    save_row(
                        results_path,
                        {
                            "voice": voice,
                            "minutes": minutes,
                            "data_minutes": card.data_minutes,
                            "kind": kind,
                            "numbers": card.trainable_parameters,
                            "seconds": card.train_seconds,
                            "start_voice": card.notes.get("start_voice"),
                            **scores,
                        },
                    )
                    log.measured(row_name((voice, minutes, kind)))
                    print(f"{voice} {minutes:g} min {kind}: similarity {scores['similarity']:.3f}", flush=True)
    if space is not None:
        write(read_rows(results_path), args, space, space_voices, space_info)


def learned_space(args, log: RunLog) -> tuple[VoiceSpace, list[str], dict]:
    """The space under ``--work``, learned first if it is not there: (space, its voices, training info)."""
    space_dir = args.work / "space"
    if not (space_dir / "voice_space.json").is_file():
        root = args.work / "space_voices"
        for source in sorted(p for p in args.corpus.iterdir() if (p / "metadata.csv").is_file()):
            utterances, _ = discover(source)
            write_subset(first_minutes(utterances, args.space_minutes), root / source.name)
        add_virtual_speakers(root, args.space_virtual, minutes=args.space_minutes)
        started = time.perf_counter()
        _, history = train_voice_space(
            root,
            load_bundle(args.base),
            space_dir,
            VoiceSpaceConfig(method=args.space_method, dim=args.dim, steps=args.space_steps, threads=args.threads),
            progress=False,
        )
        (args.work / "space_training.json").write_text(
            json.dumps({"seconds": time.perf_counter() - started, "history": history})
        )
        log.measured(SPACE)
    space, _, space_voices = VoiceSpace.load(space_dir)
    return space, space_voices, json.loads((args.work / "space_training.json").read_text())


def row_key(row: dict) -> tuple:
    return row["voice"], row["minutes"], row["kind"]


def row_name(key: tuple) -> str:
    """How a run's record names a row (:func:`row_key`)."""
    voice, minutes, kind = key
    return f"{voice} {minutes:g} min {kind}"


def read_rows(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.is_file() else []


def save_row(path: Path, row: dict) -> None:
    """Put ``row`` into the results file, replacing its earlier result; the file is read again first,
    so that runs for other voices or kinds writing to it at the same time keep their rows."""
    rows = [r for r in read_rows(path) if row_key(r) != row_key(row)] + [row]
    atomic_write_text(path, json.dumps(rows, indent=1))


def write(rows: list[dict], args, space: VoiceSpace, space_voices: list[str], space_info: dict) -> None:
    rows = sorted(rows, key=lambda r: (r["voice"], r["minutes"], r["kind"]))
    kinds = list(dict.fromkeys(r["kind"] for r in rows if r["kind"] != "lora+speaker"))
    lines = [
        "# Voice space against per-voice LoRA",
        "",
        f"Base: {'the shipped base' if args.base == DEFAULT_BASE else f'`{args.base}`'} (weights sha256 "
        f"`{space.base_model_sha256[:12]}`). "
        f"Space: dim {space.dim}, generating {', '.join(c.method for c in space.configs)} adapters; learned over "
        f"{len(space_voices)} voices ({sum('~' in v for v in space_voices)} of them new virtual voices; "
        f"{args.space_minutes:g} min each) in "
        f"{space_info['seconds'] / 60:.1f} min. A space voice fits only its {space.dim} numbers "
        f"(at most {FIT_STEPS} steps with early stopping on held-out mel L1, unless the row says more), "
        "from one of these starts: *nearest*, the z of the training voice "
        "whose speaker d-vector is closest to the clips' (named in the last column); *embedding*, the clips' "
        "d-vector through the space's linear map; *mean*, the space's center. LoRA is `chorus adapt --method "
        "lora+speaker` with its defaults. Same clips, same held-out sentences, judged against the real "
        "recordings.",
        "",
        "| voice | minutes | kind | numbers learned | seconds | WER % | similarity | start voice |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['voice']} | {row['data_minutes']:.2f} | {row['kind']} | {row['numbers']:,} | "
            f"{row['seconds']:.0f} | {100 * (row['wer'] or 0):.1f} | {row['similarity']:.3f} | "
            f"{row.get('start_voice') or ''} |"
        )
    lines += [
        "",
        "Target: a voice-space voice from 1 minute reaches at least 0.9x the similarity of a per-voice "
        "LoRA trained on 3 minutes.",
    ]
    for voice in dict.fromkeys(r["voice"] for r in rows):
        lora_3 = next(
            (r for r in rows if r["voice"] == voice and r["minutes"] == 3 and r["kind"] == "lora+speaker"), None
        )
        for kind in kinds:
            space_1 = next((r for r in rows if r["voice"] == voice and r["minutes"] == 1 and r["kind"] == kind), None)
            if space_1 and lora_3:
                ratio = space_1["similarity"] / lora_3["similarity"]
                lines.append(
                    f"- {voice}, {kind}: {space_1['similarity']:.3f} / {lora_3['similarity']:.3f} = "
                    f"{ratio:.3f}x ({'met' if ratio >= 0.9 else 'not met'})"
                )
    names = [SPACE, *(row_name(row_key(r)) for r in rows)]
    (args.out / "voice_space.md").write_text(
        "\n".join(lines) + "\n" + runs_section(run_records(args.out, rows=names), names)
    )
    plot(rows, args.out / "similarity_vs_minutes.png")
    print("\n".join(lines))


def plot(rows: list[dict], path: Path) -> None:
    """One panel per voice: similarity against minutes of data for each kind, and the target (0.9x the
    3-minute LoRA) as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    voices = list(dict.fromkeys(r["voice"] for r in rows))
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    minutes = sorted({r["minutes"] for r in rows})
    fig, axes = plt.subplots(1, len(voices), figsize=(4 * len(voices), 3.6), sharey=True, squeeze=False)
    for axis, voice in zip(axes[0], voices):
        for index, kind in enumerate(kinds):
            points = sorted((r["minutes"], r["similarity"]) for r in rows if r["voice"] == voice and r["kind"] == kind)
            if points:
                axis.plot(*zip(*points), "s--" if kind == "lora+speaker" else "o-", color=f"C{index}", label=kind)
        lora_3 = next((r["similarity"] for r in rows if row_key(r) == (voice, 3, "lora+speaker")), None)
        if lora_3 is not None:
            axis.axhline(0.9 * lora_3, color="red", linestyle=":", label="target: 0.9x LoRA at 3 min")
        axis.set_xscale("log")
        axis.set_xticks(minutes, [f"{m:g}" for m in minutes])
        axis.minorticks_off()
        axis.set_title(voice)
        axis.set_xlabel("minutes of the new voice")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("similarity to real clips")
    # One legend for all panels, below them, so that it hides no point.
    handles = {label: handle for axis in axes[0] for handle, label in zip(*axis.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * ((len(handles) + 2) // 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
