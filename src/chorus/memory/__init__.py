"""Memory of a training step, per category (weights, gradients, optimizer states, activations, and the
block that checkpointing or a reversible stack rebuilds during backward):
predicted analytically for any size (``predict``), measured on a real step (``measure``), and shown
side by side (``report``)."""

from chorus.memory.measure import (
    MeasuredMemory,
    measure_acoustic_step,
    measure_in_fresh_process,
    measure_training_step,
    synthetic_batch,
)
from chorus.memory.predict import (
    MemoryBreakdown,
    ShadowPass,
    ShadowTensor,
    predict_memory,
    predicted_optimizer_states,
    register_activation_rule,
)
from chorus.memory.report import (
    MemoryReport,
    markdown_table,
    memory_report,
    plot_memory,
    rich_table,
)

__all__ = [
    "MeasuredMemory",
    "MemoryBreakdown",
    "MemoryReport",
    "ShadowPass",
    "ShadowTensor",
    "markdown_table",
    "measure_acoustic_step",
    "measure_in_fresh_process",
    "measure_training_step",
    "memory_report",
    "plot_memory",
    "predict_memory",
    "predicted_optimizer_states",
    "register_activation_rule",
    "rich_table",
    "synthetic_batch",
]
