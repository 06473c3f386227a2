"""Training memory of every adaptation method: predicted analytically vs measured on a real step.

For the shipped base's size, each method (and the memory-saving options) is predicted on the
``meta`` device and measured in a fresh process on one real training step of a synthetic batch of
the same shape: weights, gradients, optimizer states, activations, and the block checkpointing
rebuilds during backward (recompute), all in bytes, with the step's measured peak growth beside
their total; bytes of optimizer state per trained value (8-bit states apply to every adapter
tensor); ratios against full fine-tuning at several batch sizes. Then the same prediction for a
506M-parameter configuration (prediction only: measuring it would need tens of GB).

    python bench/adaptation_memory.py --out bench/results/adaptation

Writes ``memory.md`` and ``memory_per_method.png`` under ``--out``.

``--base piper-joe`` (or another Piper base) does the same for one step of the Piper recipe
(:mod:`chorus.memory.piper`: the posterior recipe on the base's real generator, with its shipped
posterior encoder) at each placement, default first, and fully fine-tuned, on
``--batch`` clips (default the recipe's 4) of ``--frames`` latent frames (default 480, ~5.6 s: about
the longest clip of the bench's 1- and 3-minute subsets, which sets a batch's padded length):

    python bench/adaptation_memory.py --base piper-joe --out bench/results/adaptation

Writes ``memory-<base>.md`` and ``memory-<base>.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chorus.adapters import parse_methods
from chorus.memory.piper import piper_memory_report
from chorus.memory.presets import model_config_by_name
from chorus.memory.report import memory_report, plot_memory
from chorus.recipe import AdaptConfig, MemoryOptions
from chorus.training.adapt import trainable_for
from chorus.training.piper_adapt import PLACEMENTS, PiperAdaptConfig

# (label, method, optimizer, precision, checkpointing, frozen_dtype)
SETTINGS = [
    ("full, fp32 AdamW", "full", "adamw", "fp32", False, "fp32"),
    ("lora", "lora", "adamw", "fp32", False, "fp32"),
    ("lora+speaker", "lora+speaker", "adamw", "fp32", False, "fp32"),
    ("residual", "residual", "adamw", "fp32", False, "fp32"),
    ("prefix", "prefix", "adamw", "fp32", False, "fp32"),
    ("speaker", "speaker", "adamw", "fp32", False, "fp32"),
    ("cln", "cln", "adamw", "fp32", False, "fp32"),
    ("bitfit", "bitfit", "adamw", "fp32", False, "fp32"),
    ("lora, 8-bit + checkpointing", "lora", "adamw8bit", "fp32", True, "fp32"),
    ("lora, 8-bit + checkpointing + bf16", "lora", "adamw8bit", "bf16", True, "fp32"),
    ("lora, 8-bit + checkpointing + bf16 + bf16 base", "lora", "adamw8bit", "bf16", True, "bf16"),
    ("lora, 8-bit + checkpointing + bf16 + int8 base", "lora", "adamw8bit", "bf16", True, "int8"),
    ("full, 8-bit + checkpointing + bf16", "full", "adamw8bit", "bf16", True, "fp32"),
]
# Set against full fine-tuning at several batch sizes (measured) and at 506M parameters (predicted).
TARGET_SETTINGS = (
    "lora, 8-bit + checkpointing",
    "lora, 8-bit + checkpointing + bf16",
    "lora, 8-bit + checkpointing + bf16 + bf16 base",
    "lora, 8-bit + checkpointing + bf16 + int8 base",
)
CATEGORIES = ("weights", "gradients", "optimizer_states", "activations")


def options(label: str) -> dict:
    """``memory_report`` keywords of the setting ``label`` in :data:`SETTINGS`."""
    _, method, optimizer, precision, checkpointing, frozen_dtype = next(s for s in SETTINGS if s[0] == label)
    return dict(
        # Every layer the method targets, text side included: the recipe the recorded figures were measured
        # with, and full fine-tuning of every weight, the 16-bytes-per-parameter baseline.
        trainable=trainable_for(AdaptConfig(methods=parse_methods(method), keep_text_side=False)),
        options=MemoryOptions(
            optimizer=optimizer, precision=precision, checkpointing=checkpointing, frozen_dtype=frozen_dtype
        ),
    )


def mib(value: int) -> str:
    return f"{value / 2**20:.2f}"


def differences(report) -> str:
    """Where prediction and measurement differ, per category, in bytes; "exact" where none does."""
    predicted, measured = report.predicted.categories(), report.measured.categories()
    wrong = [
        f"{name} {predicted.get(name, 0) - measured.get(name, 0):+,}"
        for name in predicted | measured
        if predicted.get(name, 0) != measured.get(name, 0)
    ]
    return ", ".join(wrong) or "exact"


def state_bytes_per_value(optimizer_states: int, trainable_parameters: int) -> str:
    return f"{optimizer_states / trainable_parameters:.2f}"


# The Piper recipe's placements, the shipped default first, and full fine-tuning, the baseline.
PIPER_PLACEMENTS = ("flow+decoder", *(p for p in PLACEMENTS if p != "flow+decoder"), "full")


def piper_main(args: argparse.Namespace) -> None:
    """The Piper recipe's step on ``args.base``: predicted and measured per category, per placement."""
    shape = dict(
        batch=args.batch or PiperAdaptConfig().batch_size,
        text_length=args.text_length or 60,
        frames=args.frames or 480,
    )
    reports = []
    for placement in PIPER_PLACEMENTS:
        report = piper_memory_report(
            args.base,
            adapt=PiperAdaptConfig(placement=placement),
            measure=True,
            fresh_process=True,
            label=f"{args.base}, {placement}",
            **shape,
        )
        reports.append(report)
        print(f"{report.label}: {differences(report)}", flush=True)
    full = reports[-1].measured.total
    lines = [
        f"# Training memory of one step of the Piper recipe on {args.base}",
        "",
        f"`python bench/adaptation_memory.py --base {args.base} --out {args.out}`. One step of the posterior "
        f"recipe (`chorus.training.piper_adapt.posterior_step_terms`) on {args.base}'s generator and the "
        "posterior encoder the recipe loads (it trains too), CPU, one thread; "
        f"{shape['batch']} clips of {shape['frames']} latent frames and {shape['text_length']} phoneme ids each "
        "(random audio and ids: the bytes depend on the shapes, not the values), the recipe's window. Predicted "
        "on the meta device (`chorus.memory.piper`); measured on a real step in a fresh process "
        "(`chorus.memory.measure`). Cells are measured bytes; the prediction column lists every category where "
        "predicted and measured differ (`exact`: equal to the byte in all of them). Total: every category; "
        "peak RSS growth: how much the step raised the process's resident peak (backward's temporaries and "
        "allocator slack included): context beside total less weights.",
        "",
        "| setting | trained params | weights | gradients | optimizer states | activations | total | total MiB | "
        "of full fine-tuning's | prediction | peak RSS growth MiB (total less weights MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        measured = report.measured
        growth = measured.peak_growth
        lines.append(
            f"| {report.label} | {report.trainable_parameters:,} | {measured.weights:,} | {measured.gradients:,} | "
            f"{measured.optimizer_states:,} | {measured.activations:,} | {measured.total:,} | {mib(measured.total)} | "
            f"{measured.total / full:.2f} | {differences(report)} | "
            f"{mib(growth) if growth else 'n/a'} ({mib(measured.total - measured.weights)}) |"
        )
    lines += ["", "Each setting's comparison, predicted beside measured:", ""]
    for report in reports:
        lines += [report.markdown(), ""]
    (args.out / f"memory-{Path(args.base).stem}.md").write_text("\n".join(lines))
    plot_memory([(r.label, r.predicted, r.measured) for r in reports], args.out / f"memory-{Path(args.base).stem}.png")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=None, help="a Piper base (piper-joe, a voice.onnx): its recipe's step")
    parser.add_argument("--batch", type=int, default=None, help="default 8 (Piper: the recipe's 4)")
    parser.add_argument("--text-length", type=int, default=None, help="default 60")
    parser.add_argument("--frames", type=int, default=None, help="default 300 (Piper: 480 latent frames)")
    parser.add_argument("--target-batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--out", type=Path, default=Path("bench/results/adaptation"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.base is not None:
        piper_main(args)
        return
    args.batch, args.text_length, args.frames = args.batch or 8, args.text_length or 60, args.frames or 300
    shape = dict(batch=args.batch, text_length=args.text_length, frames=args.frames)

    reports = []
    for label, *_ in SETTINGS:
        report = memory_report(
            model_config_by_name("shipped"), **options(label), measure=True, fresh_process=True, label=label, **shape
        )
        reports.append(report)
        print(
            f"{label}: predicted {report.predicted.total:,} B, measured {report.measured.total:,} B "
            f"({differences(report)})",
            flush=True,
        )

    lines = [
        "# Training memory per adaptation method (shipped base size)",
        "",
        f"One training step, batch {args.batch} x {args.text_length} phonemes x {args.frames} frames, CPU, one "
        "thread. Predicted analytically on the meta device (`chorus.memory.predict`); measured on a real step "
        "in a fresh process (activations: tensors saved for backward, via saved-tensor hooks; recompute: "
        "the largest block that checkpointing reruns in backward, rerun under the same hooks; gradients and "
        "optimizer states: the tensors). Cells are measured bytes; the prediction column lists every "
        "category where predicted and measured differ (`exact`: equal to the byte in all of them). Total: "
        "every category, recompute included: what is live at the step's peak. Peak RSS growth: how much "
        "the step raised the process's resident peak (measured; also holds backward's temporaries and "
        "allocator slack, and counts pages): context beside total less weights.",
        "",
        "| setting | trained params | weights | gradients | optimizer states (bytes / trained value) | "
        "activations | recompute | total | total MiB | prediction | peak RSS growth MiB (total less "
        "weights MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        measured = report.measured
        growth = measured.peak_growth
        lines.append(
            f"| {report.label} | {report.trainable_parameters:,} | {measured.weights:,} | {measured.gradients:,} | "
            f"{measured.optimizer_states:,} ({state_bytes_per_value(measured.optimizer_states, report.trainable_parameters)}) | "
            f"{measured.activations:,} | {measured.recompute:,} | {measured.total:,} | {mib(measured.total)} | "
            f"{differences(report)} | {mib(growth) if growth else 'n/a'} ({mib(measured.total - measured.weights)}) |"
        )

    lines += [
        "",
        "## 8-bit optimizer states",
        "",
        "bitsandbytes keeps float32 moments for tensors under `min_8bit_size` values (4,096 by default: every "
        "LoRA tensor here); `build_optimizer` sets it to 1, so every trained tensor gets uint8 moments and a "
        "float32 scale per block of 256. Bytes of optimizer state per trained value, predicted / measured "
        "(fp32 AdamW: 8 + 4 bytes per tensor for its step):",
        "",
    ]
    lines += [
        "| setting | optimizer | trained params | predicted bytes | measured bytes | bytes per trained value |",
        "|---|---|---|---|---|---|",
    ]
    for report in reports:
        predicted, measured = report.predicted.optimizer_states, report.measured.optimizer_states
        lines.append(
            f"| {report.label} | {report.settings['optimizer']} | {report.trainable_parameters:,} | "
            f"{predicted:,} | {measured:,} | {state_bytes_per_value(predicted, report.trainable_parameters)} / "
            f"{state_bytes_per_value(measured, report.trainable_parameters)} |"
        )

    lines += [
        "",
        "## Adapter + 8-bit states + checkpointing against full fine-tuning (fp32 AdamW), same batch",
        "",
        "Measured totals (weights + gradients + optimizer states + activations + recompute), MiB, with the "
        "measured peak RSS growth of the step in brackets; ratios are of the totals:",
        "",
        "| batch (utterances x frames) | full, fp32 AdamW | "
        + " | ".join(f"{label} | ratio" for label in TARGET_SETTINGS)
        + " |",
        "|---|---|" + "---|---|" * len(TARGET_SETTINGS),
    ]
    for batch in args.target_batches:
        measured = []
        for label in ("full, fp32 AdamW", *TARGET_SETTINGS):
            report = memory_report(
                model_config_by_name("shipped"),
                **options(label),
                measure=True,
                fresh_process=True,
                batch=batch,
                text_length=args.text_length,
                frames=args.frames,
            )
            measured.append(report.measured)
        cells = [f"{mib(m.total)} ({mib(m.peak_growth) if m.peak_growth else 'n/a'})" for m in measured]
        lines.append(
            f"| {batch} x {args.frames} | {cells[0]} | "
            + " | ".join(
                f"{cell} | 1/{measured[0].total / m.total:.1f}" for cell, m in zip(cells[1:], measured[1:], strict=True)
            )
            + " |"
        )
    weights = {report.label: report.measured.weights for report in reports}
    lines += [
        "",
        f"Target: at most 1/8. The base's weights ({mib(weights['full, fp32 AdamW'])} MiB in fp32, "
        f"{mib(weights[TARGET_SETTINGS[-2]])} MiB with the frozen ones in bf16, "
        f"{mib(weights[TARGET_SETTINGS[-1]])} MiB with the frozen linear and convolution weights in 8 bits) are in "
        "every setting and "
        "bound the ratio at small batches; activations dominate as the batch grows, and with checkpointing "
        "the rebuilt block (recompute) is live on top of the block inputs during backward.",
    ]

    big = model_config_by_name("500m")
    lines += [
        "",
        "## 506M-parameter configuration (predicted only)",
        "",
        "| setting | weights | gradients | optimizer states | activations | recompute | total (GiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    big_values = {}
    for label in ("full, fp32 AdamW", "lora", *TARGET_SETTINGS):
        report = memory_report(big, **options(label), measure=False, label=label, **shape)
        big_values[label] = report.predicted
        lines.append(
            f"| {label} | "
            + " | ".join(f"{getattr(report.predicted, c) / 2**30:.2f}" for c in (*CATEGORIES, "recompute"))
            + f" | {report.predicted.total / 2**30:.2f} |"
        )
    totals = {label: predicted.total for label, predicted in big_values.items()}
    best = min(totals, key=totals.get)
    ratio = totals["full, fp32 AdamW"] / totals[best]
    lines += [
        "",
        f"At 506M parameters, the leanest setting here ({best}) needs 1/{ratio:.1f} of full fine-tuning's "
        f"memory; the weights, almost all of them the frozen base, are "
        f"{100 * big_values[best].weights / totals[best]:.0f}% of what remains.",
        "",
    ]
    (args.out / "memory.md").write_text("\n".join(lines))
    plot_memory([(r.label, r.predicted, r.measured) for r in reports], args.out / "memory_per_method.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
