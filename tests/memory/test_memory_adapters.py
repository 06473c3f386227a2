"""Memory prediction of adapter training: every registered method's wrappers (their ``shadow_forward``)
against one measured step, per category."""

from __future__ import annotations

import pytest
import torch

from chorus.adapters import BASE, method_names, parse_methods, routed, set_active
from chorus.adapters.inject import adapter_tensors
from chorus.adapters.lora import LoraConfig, LoraLinear
from chorus.memory import ShadowPass, measure_acoustic_step, predict_memory
from chorus.memory.measure import measure_training_step
from chorus.models.acoustic import build_model
from chorus.recipe import AdaptConfig, MemoryOptions
from chorus.training.adapt import VOICE, prepare_for_training, trainable_for
from conftest import tiny_config

torch.set_num_threads(1)

SIZES = {"batch": 2, "text_length": 9, "frames": 31}


def adapted(method: str, **options):
    """``trainable`` callback that adds and activates voice ``method`` (picklable, for fresh processes)."""
    return trainable_for(AdaptConfig(methods=parse_methods(method, options)))


def _compare(trainable, config_extra: dict | None = None, **settings):
    """Predicted and measured memory of a step with the memory options ``settings``."""
    config, options = tiny_config(**(config_extra or {})), MemoryOptions(**settings)
    measured = measure_acoustic_step(config, trainable=trainable, warmup=False, **SIZES, options=options)
    model = build_model(config, "meta")
    trainable(model)
    return predict_memory(model, **SIZES, options=options), measured


def _assert_exact(predicted, measured) -> None:
    """The prediction claims every category to the byte, recompute included."""
    assert predicted.categories() == measured.categories()


# Every registered method (and full fine-tuning) with its defaults, then combinations and variants.
@pytest.mark.parametrize(
    "method,options",
    [
        *((name, {}) for name in method_names()),
        ("lora+speaker", {}),
        ("speaker", {"speaker": {"train_projection": True}}),
    ],
    ids=[*method_names(), "lora+speaker", "speaker-projection"],
)
def test_adapter_prediction_matches_measurement(method, options):
    predicted, measured = _compare(adapted(method, **options))
    _assert_exact(predicted, measured)
    if method != "full":
        assert 0 < measured.gradients < 0.05 * measured.weights


@pytest.mark.parametrize(
    "settings",
    [
        {"checkpointing": True},
        {"precision": "bf16"},
        {"optimizer": "adamw8bit"},
        {"optimizer": "adamw8bit", "checkpointing": True, "precision": "bf16"},
    ],
    ids=["checkpointing", "bf16", "adamw8bit", "all-three"],
)
@pytest.mark.parametrize("method", ["lora", "full"])
def test_adapter_prediction_with_memory_options(method, settings):
    if settings.get("optimizer") == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    _assert_exact(*_compare(adapted(method), **settings))


@pytest.mark.parametrize(
    "method,options,config_extra,settings",
    [
        # BiasDelta(LoraLinear(Linear)); bf16 deltas promote bf16 outputs back to float32.
        ("lora+bitfit", {}, {}, {"precision": "bf16"}),
        # ResidualAdapter(PrefixAttention(attention with LoraLinear projections)), ConditionalLayerNorm norms.
        ("residual+prefix+lora+cln", {}, {}, {"precision": "bf16", "checkpointing": True}),
        # LoraConv1d and LoraEmbedding.
        (
            "lora",
            {"lora": {"targets": ["q_proj", "conv1", "conv2", "symbol_embedding", "embed"]}},
            {"use_pitch": True},
            {"precision": "bf16"},
        ),
        # Residual adapters after a Conv1d (channel axis), a Linear and a LayerNorm.
        ("residual", {"residual": {"targets": ["ff", "conv1", "prior_proj", "norm2"]}}, {}, {}),
        # The math attention path with a prefix: keys and values need gradients where queries do not.
        ("prefix", {}, {"dropout": 0.1}, {}),
        # The plain layer norm of a bf16 input keeps bf16 statistics.
        ("cln", {}, {}, {"precision": "bf16"}),
    ],
    ids=[
        "bitfit-around-lora",
        "residual-prefix-lora-cln",
        "lora-conv-embedding",
        "residual-conv-linear-norm",
        "prefix-dropout",
        "cln-bf16",
    ],
)
def test_nested_and_targeted_adapters(method, options, config_extra, settings):
    _assert_exact(*_compare(adapted(method, **options), config_extra, **settings))


@pytest.mark.parametrize(
    "method,settings",
    [
        ("lora", {}),
        ("lora+speaker", {}),
        ("residual", {}),
        ("speaker", {}),
        ("prefix", {}),
        ("lora", {"checkpointing": True}),
        ("lora", {"optimizer": "adamw8bit", "checkpointing": True}),
        ("full", {}),
    ],
    ids=[
        "lora",
        "lora+speaker",
        "residual",
        "speaker",
        "prefix",
        "lora-checkpointing",
        "lora-adamw8bit-checkpointing",
        "full",
    ],
)
@pytest.mark.parametrize("frozen_dtype", ["bf16", "int8"])
def test_lighter_frozen_base(method, settings, frozen_dtype):
    # bf16: the frozen weights stored in bfloat16: no autocast copies of them, a bfloat16 residual stream,
    # alignment path and duration targets, frozen convolutions that save no input. int8: the frozen linear
    # and convolution weights in 8 bits besides. (Full fine-tuning freezes nothing: nothing changes.)
    if settings.get("optimizer") == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    predicted, measured = _compare(adapted(method), precision="bf16", frozen_dtype=frozen_dtype, **settings)
    _assert_exact(predicted, measured)
    model = _meta_model(adapted(method))
    fp32_base = predict_memory(model, **SIZES, options=MemoryOptions(precision="bf16", **settings))
    norms = {id(p) for module in model.modules() if isinstance(module, torch.nn.LayerNorm) for p in module.parameters()}
    voice = {id(p) for p in adapter_tensors(model)}
    frozen = [p for p in model.parameters() if not p.requires_grad and id(p) not in norms | voice]
    saved = 2 * sum(p.numel() for p in frozen)  # 2 of 4 bytes per frozen value of the base (norms stay fp32)
    if frozen_dtype == "int8":
        layers = [m for m in model.modules() if type(m) in (torch.nn.Linear, torch.nn.Conv1d)]
        weights = [m.weight for m in layers if not any(p.requires_grad for p in m.parameters())]
        saved += sum(w.numel() - 4 * w.shape[0] for w in weights)  # 1 more byte per value, a float32 scale a row
    assert fp32_base.weights - predicted.weights == saved
    assert predicted.activations < fp32_base.activations or method == "full"
    assert predicted.gradients == fp32_base.gradients and predicted.optimizer_states == fp32_base.optimizer_states


def _meta_model(trainable, config_extra: dict | None = None) -> torch.nn.Module:
    model = build_model(tiny_config(**(config_extra or {})), "meta")
    trainable(model)
    return model


@pytest.mark.parametrize("frozen_dtype", ["bf16", "int8"])
@pytest.mark.parametrize("method", ["cln", "bitfit"])
def test_lighter_frozen_base_with_float32_outputs_into_frozen_layer_norms(method, frozen_dtype):
    # cln's and bitfit's float32 outputs make the residual stream float32; the frozen layer norms keep
    # float32 weights for that reason (CPU layer norm refuses a float32 input with bfloat16 weights),
    # so the step runs and the prediction follows its dtypes.
    _assert_exact(*_compare(adapted(method), precision="bf16", frozen_dtype=frozen_dtype))


def test_unread_parameters_get_no_gradient():
    # Full fine-tuning (of every weight) behind an active speaker vector never reads the speaker table:
    # no gradient, no optimizer state, although it requires grad.
    every_weight = trainable_for(AdaptConfig(methods=parse_methods("full"), keep_text_side=False))
    predicted, measured = _compare(every_weight)
    model = build_model(tiny_config(), "meta")
    every_weight(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) * 4
    table = model.speaker_embedding.base_layer.weight.numel() * 4
    assert predicted.gradients == measured.gradients == trainable - table
    assert predicted.optimizer_states == measured.optimizer_states


def test_frozen_linear_saves_only_what_lora_needs():
    # LoRA around a frozen Linear with an input that needs a gradient: the base saves nothing (its
    # weight is a parameter), A saves x, B saves A(x).
    layer = LoraLinear(torch.nn.Linear(16, 24))
    layer.add(VOICE, LoraConfig(r=4))
    layer.active = VOICE
    layer.base_layer.requires_grad_(False)
    x = torch.randn(3, 5, 16, requires_grad=True)
    measured = measure_training_step(
        layer, {"x": x}, lambda out, _: out.sum(), torch.optim.AdamW(p for p in layer.parameters() if p.requires_grad)
    )
    pass_ = ShadowPass()
    pass_.leaf(layer, pass_.new(tuple(x.shape), x.dtype, requires_grad=True))
    assert pass_.saved_bytes == measured.activations == 3 * 5 * (16 + 4) * 4


def test_inactive_adapter_is_the_base_layer():
    config = tiny_config()
    model, plain = build_model(config, "meta"), build_model(config, "meta")
    prepare_for_training(model, AdaptConfig(methods=parse_methods("lora+speaker")))
    set_active(model, None)
    model.requires_grad_(True)
    with_adapter, base = predict_memory(model, **SIZES), predict_memory(plain, **SIZES)
    assert with_adapter.activations == base.activations
    assert with_adapter.gradients == base.gradients  # the adapter's tensors are not read
    with routed(model, [VOICE, BASE]), pytest.raises(ValueError, match="routing"):
        predict_memory(model, **SIZES)
