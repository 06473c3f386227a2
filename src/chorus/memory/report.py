"""Predicted and measured memory side by side: tables (Markdown, rich), a bar chart, one entry point.

:func:`memory_report` is what ``chorus memory`` calls: it predicts on the ``meta`` device (any size,
nothing allocated) and, when asked, measures one real step of the same configuration on a
synthetic batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from torch import nn

from chorus.memory.measure import (
    MeasuredMemory,
    measure_acoustic_step,
    measure_in_fresh_process,
)
from chorus.memory.predict import MemoryBreakdown, predict_memory
from chorus.models.acoustic import build_model, count_parameters
from chorus.models.config import AcousticConfig
from chorus.recipe import MemoryOptions

MIB = 2**20
# The memory options a report's heading lists: what the step's cost depends on beyond the model
# (``reversible`` is the model config's own).
REPORTED_OPTIONS = ("optimizer", "precision", "checkpointing", "frozen_dtype")
CATEGORY_NAMES = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
}
RECOMPUTE_NAME = "recompute (one block, during backward)"
PEAK_NOTE = (
    "Total: everything live at the step's peak by category, checkpointing's (or a reversible stack's) "
    "recompute included. The step-peak row sets the measured growth of the process peak (RSS on CPU, "
    "allocated memory on CUDA) over the step beside the total less the weights (resident before the "
    "step): the peak also holds backward's temporaries and allocator slack, and on CPU the RSS counts "
    "pages, so it is context for the categories, not their sum."
)


def comparison_rows(
    predicted: MemoryBreakdown, measured: MeasuredMemory | None = None
) -> list[tuple[str, int, int | None]]:
    """(row name, predicted bytes, measured bytes or None): the four categories, checkpointing's
    recompute when there is any, their total, and, when measured, the step's peak growth."""
    measured_values = measured.categories() if measured is not None else {}
    rows = [(CATEGORY_NAMES[name], getattr(predicted, name), measured_values.get(name)) for name in CATEGORY_NAMES]
    if predicted.recompute or measured_values.get("recompute"):
        rows.append(
            (RECOMPUTE_NAME, predicted.recompute, measured_values.get("recompute", 0) if measured is not None else None)
        )
    rows.append(("total", predicted.total, measured.total if measured is not None else None))
    if measured is not None and measured.peak_growth is not None:
        rows.append(
            (f"step peak ({measured.peak_kind} growth)", predicted.total - predicted.weights, measured.peak_growth)
        )
    return rows


def _difference(predicted: int, measured: int | None) -> str:
    """``predicted - measured`` in bytes ("0" where they agree to the byte) and in % of measured."""
    if measured is None:
        return ""
    if predicted == measured:
        return "0"
    percent = f" ({100 * (predicted - measured) / measured:+.1f}%)" if measured else ""
    return f"{predicted - measured:+,}{percent}"


def _bytes(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _mib(value: int) -> str:
    return f"{value / MIB:,.2f}"


def markdown_table(predicted: MemoryBreakdown, measured: MeasuredMemory | None = None) -> str:
    """A Markdown table: category, predicted and measured bytes, their difference, predicted MiB."""
    lines = [
        "| category | predicted (bytes) | measured (bytes) | predicted - measured (bytes) | predicted (MiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {_bytes(p)} | {_bytes(m)} | {_difference(p, m)} | {_mib(p)} |"
        for name, p, m in comparison_rows(predicted, measured)
    ]
    return "\n".join(lines) + "\n"


def rich_table(predicted: MemoryBreakdown, measured: MeasuredMemory | None = None, title: str | None = None) -> Table:
    """The same comparison as :func:`markdown_table`, for a terminal."""
    table = Table(title=title)
    table.add_column("category")
    for column in ("predicted (bytes)", "measured (bytes)", "predicted - measured", "predicted (MiB)"):
        table.add_column(column, justify="right")
    for name, p, m in comparison_rows(predicted, measured):
        table.add_row(name, _bytes(p), _bytes(m), _difference(p, m), _mib(p))
    return table


def plot_memory(rows: Sequence[tuple[str, MemoryBreakdown, MeasuredMemory | None]], png_path: str | Path) -> Path:
    """Bar chart, one panel per category (recompute included) and one for the total, of predicted
    (solid) and measured (hatched) MiB for each ``(label, predicted, measured or None)``: several
    methods or configurations side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    labels = [label for label, _, _ in rows]
    width = 0.38
    panels = {**CATEGORY_NAMES, "recompute": "recompute", "total": "total"}
    if not any(p.recompute for _, p, _ in rows):
        del panels["recompute"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8), squeeze=False)
    for axis, (key, title) in zip(axes[0], panels.items(), strict=True):
        positions = range(len(rows))
        axis.bar(
            [x - width / 2 for x in positions],
            [getattr(p, key) / MIB for _, p, _ in rows],
            width,
            label="predicted",
            color="tab:blue",
        )
        measured = [
            (x + width / 2, getattr(m, key) / MIB)
            for x, (_, _, m) in zip(positions, rows, strict=True)
            if m is not None
        ]
        if measured:
            axis.bar(*zip(*measured, strict=True), width, label="measured", color="tab:orange", hatch="//", alpha=0.8)
        axis.set_title(title)
        axis.set_ylabel("MiB")
        axis.set_xticks(list(positions), labels, rotation=30, ha="right")
        axis.grid(axis="y", alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=len(names), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


@dataclass
class MemoryReport:
    """One configuration's prediction, with its measurement when one was run."""

    label: str
    predicted: MemoryBreakdown
    measured: MeasuredMemory | None
    parameters: int  # all parameters of the model
    trainable_parameters: int  # those with requires_grad
    settings: dict  # batch, text_length, frames, optimizer, precision, checkpointing, frozen_dtype
    png: Path | None = None

    def markdown(self) -> str:
        """Heading with the settings, the comparison table, and the peak note when measured."""
        settings = ", ".join(f"{key} {value}" for key, value in self.settings.items())
        text = (
            f"### Memory of one training step: {self.label}\n\n{self.parameters:,} parameters, "
            f"{self.trainable_parameters:,} trained; {settings}.\n\n" + markdown_table(self.predicted, self.measured)
        )
        if self.measured is not None:
            text += f"\nMeasured on {self.measured.device}. {PEAK_NOTE}\n"
        return text

    def rich_table(self) -> Table:
        return rich_table(self.predicted, self.measured, title=f"Memory of one training step: {self.label}")


def memory_report(
    model_config: AcousticConfig,
    *,
    trainable: Callable[[nn.Module], None] | None = None,
    batch: int,
    text_length: int,
    frames: int,
    options: MemoryOptions | None = None,
    measure: bool = False,
    out_png: Path | None = None,
    device: str = "cpu",
    fresh_process: bool = False,
    label: str = "",
) -> MemoryReport:
    """Predict (and optionally measure) the memory of one training step of ``model_config``.

    The prediction builds the model on ``meta``, so any size costs nothing. With ``measure`` the
    model is built for real on ``device`` and one step runs on a synthetic batch of the given sizes;
    ``fresh_process`` runs it in a new process for a clean peak RSS (``trainable`` must then be a
    module-level function). ``trainable(model)`` sets which parameters train (None: all, i.e. full
    fine-tuning). ``options``: the training run's memory options (default :class:`MemoryOptions`).
    ``out_png`` gets the bar chart.
    """
    options = options or MemoryOptions()
    model = build_model(model_config, "meta")
    if trainable is not None:
        trainable(model)
    shape = {"batch": batch, "text_length": text_length, "frames": frames}
    predicted = predict_memory(model, **shape, options=options)
    measured = None
    if measure:
        measure_step = measure_in_fresh_process if fresh_process else measure_acoustic_step
        measured = measure_step(model_config, trainable=trainable, device=device, **shape, options=options)
    settings = shape | {name: getattr(options, name) for name in REPORTED_OPTIONS}
    label = label or ("full fine-tuning" if trainable is None else getattr(trainable, "__name__", "custom"))
    report = MemoryReport(
        label, predicted, measured, count_parameters(model), count_parameters(model, trainable_only=True), settings
    )
    if out_png is not None:
        report.png = plot_memory([(label, predicted, measured)], out_png)
    return report
