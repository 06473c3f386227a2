"""Frozen layers that cost less in training (chorus.training.frozen_layers): the same function and input
gradients as torch's layers on the weight they hold, nothing saved for backward, 8-bit weights within half a
step, swapped in only where nothing trains, and an adaptation on such a base."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from chorus.adapters import parse_methods
from chorus.adapters.voice import read_voice
from chorus.models.acoustic import build_model
from chorus.models.bundle import load_bundle
from chorus.recipe import AdaptConfig, MemoryOptions
from chorus.synthesis import load_base
from chorus.training.adapt import VOICE, adapt, prepare_for_training
from chorus.training.frozen_layers import FrozenConv1d, FrozenLayer, Int8Conv1d, Int8Linear, lighten_frozen_layers
from conftest import tiny_config


def conv() -> nn.Conv1d:
    return nn.Conv1d(8, 16, 3, padding=1, dilation=1)


LAYERS = [(conv, FrozenConv1d), (conv, Int8Conv1d), (lambda: nn.Linear(8, 16), Int8Linear)]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("make,lighter", LAYERS, ids=[lighter.__name__ for _, lighter in LAYERS])
def test_same_outputs_and_input_gradients_as_torch_layers_and_nothing_saved(make, lighter, autocast):
    torch.manual_seed(0)
    reference = make().requires_grad_(False)
    light = lighter(copy.deepcopy(reference))
    with torch.no_grad():  # torch's layer on the weight the light one holds (dequantized for int8)
        reference.weight.copy_(light.compute_weight(torch.float32))
    x = torch.randn(4, 8, 20) if isinstance(reference, nn.Conv1d) else torch.randn(4, 20, 8)
    results = []
    for layer in (reference, light):
        given = x.clone().requires_grad_(True)
        saved = []
        with (
            torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        ):
            y = layer(given)
        (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        results.append((y.detach(), given.grad, saved))
    (y_ref, grad_ref, saved_ref), (y, grad, saved) = results
    assert y.dtype == y_ref.dtype == (torch.bfloat16 if autocast else torch.float32)
    assert torch.equal(y, y_ref) and torch.equal(grad, grad_ref)  # the same kernels, bit for bit
    assert saved == [] and any(t.shape == x.shape for t in saved_ref) == isinstance(reference, nn.Conv1d)
    with torch.no_grad():
        assert torch.equal(light(x), reference(x))


@pytest.mark.parametrize("make,lighter", LAYERS[1:], ids=["Int8Conv1d", "Int8Linear"])
def test_int8_weights_are_within_half_a_step_of_the_originals(make, lighter):
    torch.manual_seed(1)
    layer = make()
    with torch.no_grad():
        layer.weight[0] = 0  # a channel of zeros keeps a usable scale
    light = lighter(copy.deepcopy(layer))
    assert light.weight_int8.dtype == torch.int8 and light.weight_scale.shape == (
        layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels,
    )
    error = (light.compute_weight(torch.float32) - layer.weight).abs().flatten(1).amax(1)
    assert torch.all(error <= light.weight_scale / 2 + 1e-7) and light.weight_scale[0] == 1
    assert torch.equal(light.compute_weight(torch.float32)[0], torch.zeros_like(layer.weight[0]))
    assert (
        light.compute_weight(torch.float32)
        .abs()
        .flatten(1)
        .amax(1)[1:]
        .allclose(layer.weight.abs().flatten(1).amax(1)[1:])
    )


def test_only_layers_whose_tensors_are_all_frozen_are_swapped():
    model = build_model(tiny_config())
    prepare_for_training(model, AdaptConfig(methods=parse_methods("lora"), keep_text_side=False))
    before = {name for name, m in model.named_modules() if type(m) in (nn.Linear, nn.Conv1d)}
    trained = {
        name
        for name, m in model.named_modules()
        if type(m) in (nn.Linear, nn.Conv1d) and any(p.requires_grad for p in m.parameters())
    }
    assert lighten_frozen_layers(copy.deepcopy(model), "fp32") == 0
    for frozen_dtype, kinds in [("bf16", (FrozenConv1d,)), ("int8", (Int8Conv1d, Int8Linear))]:
        light = copy.deepcopy(model)
        count = lighten_frozen_layers(light, frozen_dtype)
        swapped = {name for name, m in light.named_modules() if isinstance(m, FrozenLayer)}
        assert count == len(swapped) > 0 and all(isinstance(dict(light.named_modules())[n], kinds) for n in swapped)
        assert swapped <= before - trained  # adapters' base layers (lora's q_proj.base_layer ...) among them
        assert any(name.endswith("base_layer") for name in swapped) == (frozen_dtype == "int8")  # lora wraps linears
        assert {n for n, p in light.named_parameters() if p.requires_grad} == {
            n for n, p in model.named_parameters() if p.requires_grad
        }
    with pytest.raises(ValueError, match="frozen_dtype must be one of fp32, bf16, int8"):
        lighten_frozen_layers(model, "fp16")


@pytest.mark.parametrize("frozen_dtype", ["bf16", "int8"])
def test_adaptation_on_a_lighter_frozen_base_trains_a_copy_and_learns(
    tiny_base, new_voice_data, tmp_path, frozen_dtype
):
    bundle = load_bundle(tiny_base)
    weights = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    memory = MemoryOptions(precision="bf16", frozen_dtype=frozen_dtype, checkpointing=True)
    config = AdaptConfig(methods=parse_methods("lora"), steps=6, eval_every=3, threads=1, memory=memory)
    result = adapt(new_voice_data, bundle, tmp_path / "voice", config, progress=False, in_place=True)
    # The caller's base is left as it was (even asked to adapt in place), its layers too.
    assert all(torch.equal(bundle.model.state_dict()[k], v) for k, v in weights.items())
    assert not any(isinstance(m, FrozenLayer) for m in bundle.model.modules())
    metrics = result.card.metrics
    assert metrics["validation_mel_l1_best"] < metrics["validation_mel_l1_start"]
    # Judged, saved and returned on the base as stored, as it will be spoken (the lighter copy runs only under
    # autocast): the returned model is the base's copy with the trained voice, the saved voice speaks on the base.
    assert not any(isinstance(m, FrozenLayer) for m in result.model.modules())
    assert "encoder_similarity_to_clips" in metrics
    tts = load_base(tiny_base, "griffin-lim")
    assert tts.synthesize("A test.", voice=tts.load_voice(result.voice_dir)).audio.size > 0
    # Every tensor the voice holds, as trained, the speaker vector it keeps as it started too (a review: only the
    # trained ones had been copied to the stored base, and the vector fell back to the table's mean)
    fp32 = adapt(
        new_voice_data,
        load_bundle(tiny_base),
        tmp_path / "fp32",
        replace(config, memory=MemoryOptions()),
        progress=False,
    )
    saved, reference = read_voice(result.voice_dir).tensors, read_voice(fp32.voice_dir).tensors
    assert saved.keys() == reference.keys() and any("speaker_vector" in key for key in saved)
    for key in saved:
        if "speaker_vector" in key:  # the starting speaker's row, where the fp32 run put it
            assert torch.equal(saved[key], reference[key]), key
    trained = dict(result.model.named_parameters())
    for key, value in saved.items():  # decoder.layers.0.attn.q_proj.lora_A.weight -> ...lora_A.voice:weight
        layer, tensor = key.rsplit(".", 1)
        if ".lora_" in key:
            assert torch.equal(value, trained[f"{layer}.{VOICE}:{tensor}"]), key
    # ... and they are the trained ones: a fresh LoRA's B is zero
    assert any(".lora_B." in key and value.abs().sum() > 0 for key, value in saved.items())


@pytest.mark.parametrize("frozen_dtype", ["bf16", "int8"])
def test_full_fine_tuning_on_a_lighter_frozen_text_side_keeps_what_it_trained(
    tiny_base, new_voice_data, tmp_path, frozen_dtype
):
    # Full fine-tuning keeps the text side by default: it is the frozen part stored lighter while the rest trains.
    bundle = load_bundle(tiny_base)
    memory = MemoryOptions(precision="bf16", frozen_dtype=frozen_dtype)
    config = AdaptConfig(methods=parse_methods("full"), steps=4, eval_every=2, threads=1, memory=memory)
    result = adapt(new_voice_data, bundle, tmp_path / "voice", config, progress=False)
    voice = read_voice(result.voice_dir)
    base = bundle.model.state_dict()
    assert voice.full and not any(isinstance(m, FrozenLayer) for m in result.model.modules())
    decoder = [k for k in voice.tensors if k.startswith("decoder.")]
    assert decoder and any(not torch.equal(voice.tensors[k], base[k]) for k in decoder if k in base)  # trained
    text_side = [k for k in voice.tensors if k.startswith("encoder.") and k in base]
    assert text_side and all(torch.equal(voice.tensors[k], base[k]) for k in text_side)  # kept as the base has it
