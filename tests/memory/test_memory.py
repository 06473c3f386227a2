"""Memory accounting: the analytic prediction against one measured training step, per category."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console

from chorus.memory import (
    MemoryBreakdown,
    measure_acoustic_step,
    measure_in_fresh_process,
    memory_report,
    plot_memory,
    predict_memory,
)
from chorus.memory.measure import _reset_peak_rss, _rss
from chorus.models.acoustic import build_model, count_parameters
from chorus.models.config import AcousticConfig
from chorus.recipe import MemoryOptions
from conftest import tiny_config


def freeze_base(model: torch.nn.Module) -> None:
    """A frozen base: only the speaker projection and the biases train."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith("speaker_proj") or name.endswith("bias"))


def _predict(config: AcousticConfig, trainable, options: MemoryOptions | None = None, **sizes) -> MemoryBreakdown:
    model = build_model(config, "meta")
    if trainable is not None:
        trainable(model)
    return predict_memory(model, **sizes, options=options)


def _assert_exact(predicted, measured) -> None:
    """The prediction claims every category to the byte, recompute included."""
    assert predicted.categories() == measured.categories()


@pytest.mark.parametrize("trainable", [None, freeze_base], ids=["full", "frozen-base"])
@pytest.mark.parametrize("batch,text_length,frames", [(2, 7, 23), (3, 15, 60), (1, 30, 90)])
def test_prediction_matches_measurement(trainable, batch, text_length, frames):
    config = tiny_config()
    settings = {"batch": batch, "text_length": text_length, "frames": frames}
    measured = measure_acoustic_step(config, trainable=trainable, warmup=False, **settings)
    predicted = _predict(config, trainable, **settings)
    _assert_exact(predicted, measured)
    if trainable is freeze_base:
        assert 0 < measured.gradients < 0.05 * measured.weights


@pytest.mark.parametrize(
    "config_extra,settings",
    [
        ({}, {"precision": "bf16"}),
        ({}, {"checkpointing": True}),
        ({}, {"optimizer": "adamw8bit"}),
        ({"dropout": 0.1}, {"precision": "bf16"}),
        ({"use_pitch": True, "use_energy": True}, {}),
        ({"reversible": True}, {}),
    ],
    ids=["bf16", "checkpointing", "adamw8bit", "dropout-bf16", "pitch-energy", "reversible"],
)
@pytest.mark.parametrize("trainable", [None, freeze_base], ids=["full", "frozen-base"])
def test_prediction_matches_measurement_with_options(config_extra, settings, trainable):
    if settings.get("optimizer") == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    config = tiny_config(**config_extra)
    sizes = {"batch": 2, "text_length": 9, "frames": 31}
    options = MemoryOptions(**settings)
    measured = measure_acoustic_step(config, trainable=trainable, warmup=False, **sizes, options=options)
    _assert_exact(_predict(config, trainable, options, **sizes), measured)


def test_checkpointed_blocks_are_seen_through_their_saved_inputs():
    # Non-reentrant checkpointing installs its own saved-tensor hooks inside each block; the block
    # inputs it keeps are still packed by the measuring hooks, and nothing inside the blocks is.
    config = tiny_config()
    sizes = {"batch": 2, "text_length": 9, "frames": 31}
    plain = measure_acoustic_step(config, warmup=False, **sizes)
    checkpointing = MemoryOptions(checkpointing=True)
    checkpointed = measure_acoustic_step(config, options=checkpointing, warmup=False, **sizes)
    predicted = _predict(config, None, checkpointing, **sizes)
    assert checkpointed.activations < plain.activations
    _assert_exact(predicted, checkpointed)
    # Backward's rebuild of one block is measured too (rerun under the measuring hooks), to the byte.
    assert checkpointed.recompute == predicted.recompute > 0 and plain.recompute == 0
    assert checkpointed.total == predicted.total
    # Per stack, checkpointing adds each block's input [batch, time, d_model] and the shared bool mask.
    without_blocks = _predict(tiny_config(encoder_layers=0, decoder_layers=0), None, **sizes)
    inputs = 2 * (2 * 9 * 32 * 4) + 2 * 9 + 2 * (2 * 31 * 32 * 4) + 2 * 31
    assert checkpointed.activations == without_blocks.activations + inputs


def test_500m_parameter_prediction_on_meta_allocates_nothing():
    config = AcousticConfig(
        d_model=1024,
        n_heads=16,
        encoder_layers=8,
        decoder_layers=9,
        ff_hidden=4096,
        predictor_hidden=1024,
        speaker_dim=256,
    )
    model = build_model(config, "meta")
    parameters = count_parameters(model)
    assert 480e6 < parameters < 520e6
    assert all(p.is_meta for p in model.parameters())
    # No timing here (times belong to the benchmarks): what shows the prediction never runs the model
    # for real is that the process's resident peak stays far below the weights' size.
    resettable = _reset_peak_rss()
    options = MemoryOptions(optimizer="adamw8bit", precision="bf16", checkpointing=True)
    predicted = predict_memory(model, batch=16, text_length=100, frames=400, options=options)
    assert predicted.gradients == 4 * parameters
    assert predicted.activations > 2**28 and predicted.recompute > 0
    if resettable:
        peak, current = _rss()
        assert peak - current < 256 * 2**20  # the weights alone would be ~1.9 GiB


def test_report_table_and_plot(tmp_path):
    config = tiny_config()
    report = memory_report(
        config,
        trainable=freeze_base,
        batch=2,
        text_length=7,
        frames=23,
        measure=True,
        options=MemoryOptions(checkpointing=True),
        out_png=tmp_path / "memory.png",
    )
    markdown = report.markdown()
    for row in (
        "| weights |",
        "| gradients |",
        "| optimizer states |",
        "| activations |",
        "| total |",
        "| recompute",
        "| step peak (RSS growth) |",
    ):
        assert row in markdown
    assert "freeze_base" in markdown and report.trainable_parameters < report.parameters
    # Bytes, not rounded MiB; the total holds the recompute, and prediction and measurement agree to the byte.
    assert report.predicted.recompute > 0 and report.predicted.total == report.measured.total
    total = report.predicted.total
    assert f"| total | {total:,} | {total:,} | 0 |" in markdown
    assert report.png.stat().st_size > 10_000
    console = Console(record=True, width=120)
    console.print(report.rich_table())
    assert "optimizer states" in console.export_text()

    predicted_only = memory_report(config, batch=2, text_length=7, frames=23)
    assert predicted_only.measured is None and "| activations |" in predicted_only.markdown()
    png = plot_memory(
        [("full", predicted_only.predicted, None), ("frozen base", report.predicted, report.measured)],
        tmp_path / "methods.png",
    )
    assert png.stat().st_size > 10_000


def test_fresh_process_measures_the_same_step():
    config = tiny_config()
    settings = {"batch": 2, "text_length": 7, "frames": 23}
    fresh = measure_in_fresh_process(config, **settings)
    assert fresh.categories() == measure_acoustic_step(config, warmup=False, **settings).categories()
    assert fresh.peak_kind == "RSS" and fresh.peak_growth > 0


def test_prediction_refuses_what_it_cannot_count():
    model = build_model(tiny_config(), "meta")
    with pytest.raises(ValueError, match="at least text_length"):
        predict_memory(model, batch=1, text_length=10, frames=5)
    model.speaker_proj = torch.nn.Identity()
    with pytest.raises(TypeError, match="register_activation_rule"):
        predict_memory(model, batch=1, text_length=5, frames=10)
