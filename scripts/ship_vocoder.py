"""Ship a trained neural vocoder as Chorus's, with its card, and record the base's default way of speaking.

    python scripts/ship_vocoder.py checkpoints/vocoder-gan checkpoints/vocoder-gta checkpoints/vocoder-natural \
        --data "checkpoints/vocoder-natural=corpus_out/vocoder corpus_out/natural corpus_out/train/flite-rms ..." \
        --report bench/results/naturalness/naturalness.json --default-vocoder neural --postfilter 1.5:1.3 \
        --chosen-by "bench/default_voice.py's rule on its development sentences (...)"

The last run folder's weights (its ``checkpoint/``) become ``src/chorus/assets/vocoder/`` with a
``MODEL_CARD.md`` made from every stage's own record (config, steps, loss log), the data roots it was
given (``--data``; a stage without one trained on ``corpus_out/train corpus_out/vocoder``) and the
naturalness benchmark's figures; each stage's loss curves are copied beside it. The base's ``config.json``
gets the chosen ``default_vocoder`` and ``postfilter`` (its weights, and so its hash, are untouched) and its
card's line on them is rewritten, naming what chose them (``--chosen-by``).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from chorus.audio.postfilter import MelPostFilter
from chorus.audio.vocoders import load_vocoder
from chorus.audio.vocoders.base import CONFIG_FILE, WEIGHTS_FILE
from chorus.models.bundle import file_sha256
from chorus.synthesis import DEFAULT_BASE, DEFAULT_VOCODER
from chorus.training.checkpoint import load_training_state
from chorus.training.vocoder import CHECKPOINT

# The data roots of a stage that ``--data`` does not name: the first two stages' (``train-vocoder`` does not
# record its roots in the checkpoint).
DEFAULT_DATA = ("corpus_out/train", "corpus_out/vocoder")
# What each data root is, for the card.
DATA_ROOTS = {
    "corpus_out/train": "the base speakers flite-rms, flite-awb, festival-kal, flite-kal16, flite-kal16-speed135 and "
    "festival-kal-speed135 at a quarter of their corpus clips, by `chorus corpus build corpus_out --scale 0.25 "
    "--speakers ...`",
    "corpus_out/vocoder": "`chorus.corpus.speakers.VOCODER_SPEAKERS`: Piper joe reading 160 other sentences each, "
    "resampled by sox `speed` 0.9, 1.1, 1.25 and 1.4",
    "corpus_out/natural": "`chorus.corpus.speakers.NATURAL_SPEAKERS`: twelve more sox chains of Piper joe (pitch, "
    "formant, tempo) reading other sentences",
}
# What chose the default, unless --chosen-by says otherwise: the first two stages' benchmark and rule.
CHOSEN_BY = (
    "`bench/naturalness.py` (best predicted MOS at WER within 1 point of Griffin-Lim's; `bench/results/naturalness/`)"
)
# The data roots made by the Piper voice (which also made the held-out piper-joe dataset).
PIPER_ROOTS = ("corpus_out/vocoder", "corpus_out/natural")
# What the vocoder this one started from was (its card, before this script replaced it).
ORIGIN = (
    "12,000 steps from scratch on the 36 pretraining voices of the offline corpus (12.5 h, espeak-ng, flite and "
    "festival voices and their sox variants), L1 on log-mel + 3-resolution STFT loss, no discriminator "
    "(`chorus train-vocoder corpus_out/train --steps 12000`)"
)


def training_seconds(log: Path) -> tuple[int, float]:
    """(steps logged, seconds inside training) of a loss.csv whose ``seconds`` restart at each resume."""
    total, last, steps = 0.0, 0.0, 0
    with log.open() as handle:
        for row in csv.DictReader(handle):
            seconds = float(row["seconds"])
            if seconds < last:
                total += last
            last, steps = seconds, int(row["step"])
    return steps, total + last


def describe_data(roots: Sequence[str]) -> str:
    """The card's words for data roots: a known root by what it holds, ``corpus_out/train/flite-rms`` as "the
    base speaker flite-rms (`corpus_out/train/flite-rms`)", any other by its path."""
    parts = []
    for root in roots:
        parent, _, speaker = root.rpartition("/")
        if root in DATA_ROOTS:
            parts.append(f"`{root}` ({DATA_ROOTS[root]})")
        elif parent == "corpus_out/train":
            parts.append(f"the base speaker {speaker} (`{root}`)")
        else:
            parts.append(f"`{root}`")
    return "; ".join(parts)


def stage_data(parser: argparse.ArgumentParser, runs: Sequence[Path], given: Sequence[str]) -> dict[Path, list[str]]:
    """Each stage's data roots from ``--data RUN=ROOTS`` items; a stage not named gets ``DEFAULT_DATA``."""
    named = {}
    for item in given:
        run, separator, roots = item.partition("=")
        if not separator or not roots.split():
            parser.error(f"--data {item!r}: give RUN=ROOTS, the roots space-separated")
        named[Path(run)] = roots.split()
    unknown = set(named) - set(runs)
    if unknown:
        parser.error(f"--data names no stage given: {', '.join(sorted(map(str, unknown)))}")
    return {run: named.get(run, list(DEFAULT_DATA)) for run in runs}


def shared_source(roots: Sequence[str]) -> str:
    """The card's paragraph on what the held-out piper-joe dataset shares with the vocoder's data."""
    piper = [f"`{root}`" for root in PIPER_ROOTS if root in roots]
    if not piper:
        return "No data root was made by the Piper voice: the held-out datasets share nothing with it."
    return (
        f"**Shared source:** the held-out piper-joe dataset comes from the same Piper voice as {' and '.join(piper)}; "
        "none of its adaptation or evaluation sentences was read for the vocoder (tested), but its figures are "
        "those of a voice whose relatives the vocoder heard. flite-slt and festival-ked share nothing with it."
    )


def stage_lines(index: int, run: Path, roots: Sequence[str]) -> list[str]:
    state = load_training_state(run / CHECKPOINT)
    config = state.meta["config"]
    steps, seconds = training_seconds(run / "loss.csv")
    with (run / "loss.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    last = {k: float(v) for k, v in rows[-1].items() if k not in ("step", "lr", "seconds")}
    aligned_model = config.get("aligned_model")
    fed = (
        f"{100 * config['aligned_fraction']:.0f}% of each batch: the base's teacher-forced mels of "
        f"{config['aligned_clips_per_voice']} clips per base speaker in the data (ground-truth-aligned), judged "
        "against the clips; the rest: crops of the data with their own mels"
        if aligned_model
        else "crops of the data with their own mels"
    )
    return [
        f"{index}. `{run}` ({steps:,} steps, {seconds / 3600:.2f} h of training on 1 CPU thread of a shared 2-core "
        f"machine), from `{config['init_from']}`: discriminators {', '.join(config['discriminators']) or 'none'} "
        f"(periods {config['periods']}, channels {config['period_channels']}; spectrogram convs "
        f"{config['discriminator_channels']}), least-squares GAN weight {config['adversarial_weight']:g}, feature "
        f"matching {config['feature_matching_weight']:g}, beside mel L1 {config['mel_loss_weight']:g} and STFT "
        f"{config['stft_loss_weight']:g}; batch {config['batch_size']} crops of {config['min_segment_seconds']:g}-"
        f"{config['max_segment_seconds']:g} s; AdamW peak lr {config['learning_rate']:g}; {fed}. Data: "
        f"{describe_data(roots)}. Last logged "
        + ", ".join(f"{k} {v:.3f}" for k, v in last.items())
        + f". Curves: `loss-stage{index}.png`.",
    ]


def command(run: Path, roots: Sequence[str]) -> str:
    """The ``chorus train-vocoder`` call that makes (or resumes) ``run``, from its saved config."""
    config = load_training_state(run / CHECKPOINT).meta["config"]
    words = [
        "chorus train-vocoder " + " ".join(roots),
        f"--out {run} --init-from {config['init_from']} --adversarial --weights-only",
        f"--learning-rate {config['learning_rate']:g} --threads 1",
    ]
    if config.get("aligned_model"):
        words.append(f"--aligned-model {config['aligned_model']} --aligned-fraction {config['aligned_fraction']:g}")
    steps, _ = training_seconds(run / "loss.csv")
    return " ".join(words) + f" --steps {steps}"


def figures(report: dict) -> list[str]:
    summary = report["summary"]
    voices = list(dict.fromkeys(key.split("|")[0] for key in summary if not key.startswith("piper-joe|Piper")))
    systems = [s for s in dict.fromkeys(key.split("|")[1] for key in summary) if s.startswith(("copy", "recordings"))]
    lines = ["| voice | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for voice in voices:
        cells = []
        for system in systems:
            value = summary.get(f"{voice}|{system}")
            cells.append("" if value is None else f"{value['mos']:.2f} ({100 * value['wer']:.0f}%)")
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="training run folders, in the order they ran")
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="RUN=ROOTS",
        help="a stage's data roots, space-separated (repeatable; default: " + " ".join(DEFAULT_DATA) + ")",
    )
    parser.add_argument("--report", type=Path, required=True, help="bench/naturalness.py's naturalness.json")
    parser.add_argument(
        "--chosen-by",
        default=CHOSEN_BY,
        help="what chose the default vocoder and post-filter, for both cards (a benchmark and its results folders)",
    )
    parser.add_argument("--default-vocoder", choices=["griffin-lim", "neural"], required=True)
    parser.add_argument("--postfilter", default="1:1", help="the base's post-filter, GV:CONTRAST")
    args = parser.parse_args()
    data = stage_data(parser, args.runs, args.data)
    final = args.runs[-1] / CHECKPOINT
    vocoder = load_vocoder(final)
    postfilter = MelPostFilter(*(float(x) for x in args.postfilter.split(":")))
    report = json.loads(args.report.read_text())

    DEFAULT_VOCODER.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        shutil.copy(final / name, DEFAULT_VOCODER / name)
    (DEFAULT_VOCODER / "loss.png").unlink(missing_ok=True)
    for index, run in enumerate(args.runs, 1):
        shutil.copy(run / "loss.png", DEFAULT_VOCODER / f"loss-stage{index}.png")
    config = vocoder.config
    parameters = sum(p.numel() for p in vocoder.parameters())
    lines = [
        "# Chorus neural vocoder (Vocos-style, adversarially fine-tuned)",
        "",
        f"Log-mel (80 bins, 22,050 Hz, hop 256, n_fft 1024, fmax 8 kHz, natural log) -> waveform through a ConvNeXt "
        f"backbone and an inverse-STFT head (Vocos; Siuzdak 2023). {parameters / 1e6:.2f} M parameters (`dim "
        f"{config.dim}, intermediate {config.intermediate_dim}, {config.num_layers} layers, kernel "
        f"{config.kernel_size}`); `{WEIGHTS_FILE}` sha256 `{file_sha256(DEFAULT_VOCODER / WEIGHTS_FILE)}`.",
        "",
        "## How it was made",
        "",
        f"0. Its start: {ORIGIN}.",
        *[line for index, run in enumerate(args.runs, 1) for line in stage_lines(index, run, data[run])],
        "",
        shared_source([root for roots in data.values() for root in roots]),
        "",
        "Each stage resumes from its committed weights-only checkpoint (`checkpoints/vocoder-*/checkpoint`: "
        "generator and discriminators; Adam's moments start afresh, re-estimated within ~20 steps at beta2 0.9):",
        "",
        "```bash",
        *[command(run, data[run]) for run in args.runs],
        "```",
        "",
        "Stage 1's `--init-from src/chorus/assets/vocoder` was the vocoder of stage 0, which this one replaced there "
        "(`git show 865661c:src/chorus/assets/vocoder/vocoder.safetensors`).",
        "",
        "## Measured (`bench/naturalness.py`), copy synthesis: recordings -> log-mel -> vocoder",
        "",
        f"Mean distillmos MOS (Whisper WER) over 20 clips per cell (sample spreads in `{args.report.parent}/"
        "naturalness.md`); the labels are the run's (`neural`: this vocoder).",
        "",
        *figures(report),
        "",
        f"Free synthesis: `{args.report.parent}/naturalness.md`. The default and its post-filter were chosen by "
        f"{args.chosen_by}.",
        "",
    ]
    (DEFAULT_VOCODER / "MODEL_CARD.md").write_text("\n".join(lines))

    config_path = DEFAULT_BASE / "config.json"
    base = json.loads(config_path.read_text())
    base["info"]["default_vocoder"] = args.default_vocoder
    base["info"]["postfilter"] = postfilter.to_dict()
    config_path.write_text(json.dumps(base, indent=2) + "\n")
    card_path = DEFAULT_BASE / "MODEL_CARD.md"
    card = card_path.read_text()
    line = (
        f"* Default vocoder: {args.default_vocoder}, after the post-filter global variance "
        f"{postfilter.global_variance:g}, contrast {postfilter.contrast:g} (`chorus.audio.postfilter`), chosen by "
        f"{args.chosen_by}. The neural vocoder is `assets/vocoder/`, see its card."
    )
    card_path.write_text(re.sub(r"^\* Default vocoder:.*$", line, card, count=1, flags=re.MULTILINE))
    print(f"shipped {final} as {DEFAULT_VOCODER}; base defaults: {args.default_vocoder}, {postfilter}")


if __name__ == "__main__":
    main()
