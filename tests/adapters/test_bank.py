"""Voice banks (many voices in one batch): the batched bank path against the name-keyed per-sample
routing reference for every registered method alone and all combined, in inference and teacher-forced
training, across voice mixes (all distinct, uniform, skewed, identical, base only); LoRA banks against
PEFT's mixed-adapter batch across the same mixes, in both modes; gradients of a trainable bank; the
unpack round trip; refusals."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest
import torch
from torch import nn
from torch.func import functional_call

from chorus.adapters import (
    BASE,
    AdapterLayer,
    active_adapter,
    adapter_layers,
    adapter_state_dict,
    add_adapter,
    all_methods,
    get_method,
    merge_adapter,
    routed,
    set_active,
    unmerge_all,
)
from chorus.adapters.bank import banked, pack_bank
from chorus.adapters.bitfit import BitFitConfig
from chorus.adapters.conditional_norm import ConditionalNormConfig
from chorus.adapters.layer import innermost, own_tensors, row_scopes, wrappers_of
from chorus.adapters.lora import LoraConfig
from chorus.adapters.registry import ALL_LAYERS
from chorus.adapters.residual import ResidualAdapterConfig
from chorus.adapters.voice import VoiceCard, apply_voice, read_voice, save_voice
from chorus.models.acoustic import build_model
from chorus.models.config import AcousticConfig
from conftest import tiny_config

CONFIG = tiny_config(n_speakers=3)
NAMES = [f"v{k}" for k in range(6)]


def voice_configs(method: str, k: int):
    """Voice k of ``method`` is the method's example k (:attr:`Method.example`: sizes and targets differ
    between voices, so ranks, bottlenecks and prefix lengths are padded in the bank and voices that skip
    a layer have an absent slot there)."""
    if method != "all":
        return [get_method(method).example(k)]
    # Voice k lacks the registry's method k, so every layer sees present and absent voices.
    return [m.example(k) for index, m in enumerate(all_methods()) if index != k]


MIXES = {
    "distinct": ["v0", "v1", "v2", BASE, "v3", "v4", "v5", BASE],
    "uniform": ["v1", "v4", BASE, "v2", "v4", "v1", "v2", BASE],
    "skewed": ["v3", "v3", "v0", "v3", "v3", BASE, "v3", "v3"],
    "identical": ["v5"] * 8,
    "base": [BASE] * 8,
}


def model_with_voices(method: str, config: AcousticConfig = CONFIG):
    """The tiny model with six randomized voices (fresh adapters are mostly no-ops by design)."""
    torch.manual_seed(0)
    model = build_model(config).eval()
    for k, name in enumerate(NAMES):
        add_adapter(model, name, voice_configs(method, k))
        with torch.no_grad():
            for value in adapter_state_dict(model, name).values():
                value.copy_(torch.randn_like(value) * 0.05 + value)
    return model


def batch(size: int = 8):
    generator = torch.Generator().manual_seed(1)
    text_lengths = torch.randint(4, 10, (size,), generator=generator)
    phonemes = torch.randint(1, 40, (size, 9), generator=generator) * (torch.arange(9) < text_lengths[:, None])
    frame_lengths = torch.randint(15, 24, (size,), generator=generator)
    mel = torch.randn(size, 24, CONFIG.n_mels, generator=generator)
    speakers = torch.randint(0, CONFIG.n_speakers, (size,), generator=generator)
    return phonemes, text_lengths, mel, frame_lengths, speakers


def run(model, inputs, teacher_forced: bool):
    phonemes, text_lengths, mel, frame_lengths, speakers = inputs
    if teacher_forced:
        return model(phonemes, text_lengths, mel, frame_lengths, speaker_ids=speakers)
    return model.infer(phonemes, text_lengths, speaker_ids=speakers)


def assert_same_output(actual, expected):
    assert torch.equal(actual.durations, expected.durations)
    assert torch.equal(actual.frame_mask, expected.frame_mask)
    for key in ("mel", "log_duration", "prior_mean"):
        if getattr(expected, key) is not None:
            torch.testing.assert_close(getattr(actual, key), getattr(expected, key), rtol=1e-4, atol=1e-5)


def loss_of(output, target, rows=None):
    """A training-like loss ([batch] weights ``rows`` select samples) that reaches every adapted layer."""
    per_sample = (
        ((output.mel - target) ** 2).sum((1, 2))
        + ((output.prior_mean - target) ** 2).sum((1, 2))
        + (output.log_duration**2).sum(1)
    )
    return per_sample.sum() if rows is None else (per_sample * rows).sum()


def adapter_parameter(layer, name: str, key: str):
    """The name-keyed parameter behind an adapter_state key (``lora_A.weight``, ``prefix_key``)."""
    attribute, _, rest = key.partition(".")
    entry = getattr(layer, attribute)[name]
    return entry[rest] if rest else entry


def region(tensor):
    return tuple(slice(0, size) for size in tensor.shape)


@pytest.mark.parametrize("method", [*(m.name for m in all_methods()), "all"])
def test_bank_equals_routed_reference(method):
    model = model_with_voices(method)
    bank = pack_bank(model, NAMES)
    inputs = batch()
    for mix in MIXES.values():
        for teacher_forced in (False, True):
            with routed(model, mix):
                expected = run(model, inputs, teacher_forced)
            with banked(model, bank, mix):
                actual = run(model, inputs, teacher_forced)
            assert_same_output(actual, expected)
    with banked(model, bank, MIXES["base"]):
        based = run(model, inputs, False)
    assert_same_output(based, run(model, inputs, False))  # outside the block the base runs again


def compare_gradients(model, bank, inputs, mix) -> int:
    """Backpropagate one loss through the bank, then through the routed reference; every bank slot's
    gradient must equal its voice's adapter gradient (zero where it has none, and in padding). Returns
    how many non-zero gradients were compared."""
    with banked(model, bank, mix):
        loss_of(run(model, inputs, True), inputs[2]).backward()
    for _, layer in bank.layers:
        for name in NAMES:
            if name in layer.configs and layer.configs[name].trains():
                for parameter in layer.adapter_parameters(name):
                    parameter.requires_grad_(True)
    with routed(model, mix):
        loss_of(run(model, inputs, True), inputs[2]).backward()
    compared = 0
    for _, layer in bank.layers:
        for slot, name in enumerate(NAMES):
            for key in layer.adapter_state(name) if name in layer.configs else {}:
                grad = layer.bank[key].grad[slot]  # every banked layer is reached by the loss
                reference = adapter_parameter(layer, name, key).grad
                expected = torch.zeros_like(grad)
                if reference is not None:
                    expected[region(reference)] = reference
                torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5)
                compared += int(reference is not None and reference.abs().sum() > 0)
    return compared


def frozen_model_with_bank(method: str, config: AcousticConfig = CONFIG, dtype: torch.dtype = torch.float32):
    model = model_with_voices(method, config).to(dtype)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, pack_bank(model, NAMES, trainable=True)


def test_trainable_bank_gradients_match_reference_and_stay_per_voice():
    model, bank = frozen_model_with_bank("all")
    inputs = batch()
    mix = ["v0", "v2", BASE, "v3", "v4", "v5", "v0", "v4"]  # v1 has no sample; v4's speaker vector is fixed
    assert compare_gradients(model, bank, inputs, mix) > 50
    speaker = next(layer for path, layer in bank.layers if path == "speaker_embedding")
    learns = [name in mix and name in speaker.configs and speaker.configs[name].train_vector for name in NAMES]
    assert "v4" in speaker.configs and not speaker.configs["v4"].train_vector  # a fixed vector in the batch
    grad = speaker.bank["speaker_vector"].grad
    learns = torch.tensor(learns)
    assert grad[~learns].abs().sum() == 0  # absent from the batch or from the voice; fixed
    assert grad[learns].abs().min() > 0 and learns.sum() >= 3

    # Each slot learns from its own samples only: a loss on v3's rows reaches slot 3 alone.
    bank_parameters = list(bank.parameters())
    for parameter in bank_parameters:
        parameter.grad = None
    rows = torch.tensor([name == "v3" for name in mix], dtype=torch.float32)
    with banked(model, bank, mix):
        loss_of(run(model, inputs, True), inputs[2], rows).backward()
    grads = [p.grad for p in bank_parameters if p.grad is not None]
    assert all(torch.count_nonzero(torch.cat([g[:3], g[4:]]).flatten()) == 0 for g in grads)
    assert sum(g[3].abs().sum() for g in grads) > 0


@pytest.mark.parametrize("stack", ["checkpointing", "reversible"])
def test_bank_gradients_through_recomputing_stacks(stack):
    """Both stacks run layers again in backward (inside the banked block); the reversible one only
    differentiates block parameters, which the bank tensors are. It recovers block inputs by subtraction,
    so in float32 its gradients agree only to a rounding that varies with the CPU's kernels: it is
    compared in float64."""
    reversible = stack == "reversible"
    config = AcousticConfig(**{**CONFIG.to_dict(), "reversible": reversible})
    dtype = torch.float64 if reversible else torch.float32
    model, bank = frozen_model_with_bank("all", config, dtype)
    model.encoder.gradient_checkpointing = model.decoder.gradient_checkpointing = not reversible
    phonemes, text_lengths, mel, frame_lengths, speakers = batch()
    inputs = phonemes, text_lengths, mel.to(dtype), frame_lengths, speakers
    assert compare_gradients(model, bank, inputs, MIXES["uniform"]) > 50


def test_unpack_round_trip_after_training_and_export(tmp_path):
    model = model_with_voices("all")
    before = {name: {k: v.clone() for k, v in adapter_state_dict(model, name).items()} for name in NAMES}
    bank = pack_bank(model, NAMES, trainable=True)
    optimizer = torch.optim.Adam(bank.parameters(), lr=0.05)
    inputs = batch()
    mix = MIXES["distinct"]
    for _ in range(2):
        optimizer.zero_grad()
        with banked(model, bank, mix):
            loss_of(run(model, inputs, True), inputs[2]).backward()
        optimizer.step()
    bank.unpack()
    for name in NAMES:
        after = adapter_state_dict(model, name)
        assert any(not torch.equal(after[k], v) for k, v in before[name].items())
    for _, layer in bank.layers:
        for slot, name in enumerate(NAMES):
            for key, tensor in (layer.adapter_state(name) if name in layer.configs else {}).items():
                padded = layer.bank[key][slot].detach()
                assert torch.equal(tensor, padded[region(tensor)])
                padded = padded.clone()
                padded[region(tensor)] = 0
                assert torch.count_nonzero(padded) == 0  # padding had exactly zero gradient: still zero
    with torch.no_grad():
        with routed(model, mix):
            expected = run(model, inputs, True)
        with banked(model, bank, mix):
            actual = run(model, inputs, True)
    assert_same_output(actual, expected)

    # An unpacked voice is a standalone artifact again.
    configs = voice_configs("all", 5)
    save_voice(tmp_path / "v5", model, "v5", configs, VoiceCard("v5", [c.method for c in configs], "base"))
    torch.manual_seed(0)
    fresh = build_model(CONFIG).eval()
    apply_voice(fresh, read_voice(tmp_path / "v5"), "v5")
    row = mix.index("v5")
    phonemes, text_lengths, mel, frame_lengths, speakers = (t[row : row + 1] for t in inputs)
    with active_adapter(fresh, "v5"):
        alone = fresh(phonemes, text_lengths, mel, frame_lengths, speaker_ids=speakers)
    frames = int(frame_lengths)
    torch.testing.assert_close(alone.mel[0, :frames], actual.mel[row, :frames], rtol=1e-4, atol=1e-5)

    keys = set(model.state_dict())
    bank.remove()
    assert not any(".bank." in key for key in model.state_dict()) and any(".bank." in key for key in keys)
    with pytest.raises(ValueError, match="removed"), banked(model, bank, mix):
        pass


class ForeignModel(nn.Module):
    """Not a Chorus model, with a strided, dilated convolution (residual adapters on channel axis 1)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16, padding_idx=0)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.LayerNorm(16))
        self.conv = nn.Conv1d(16, 8, 3, stride=2, dilation=2, padding=3)

    def forward(self, ids):
        return self.conv(self.body(self.embed(ids)).transpose(1, 2))


def foreign_model_with_voices(configs_of) -> ForeignModel:
    """The foreign model with four randomized voices; voice ``k`` gets the adapters ``configs_of(k)``."""
    torch.manual_seed(0)
    model = ForeignModel()
    for k, name in enumerate(NAMES[:4]):
        add_adapter(model, name, configs_of(k))
        with torch.no_grad():
            for value in adapter_state_dict(model, name).values():
                value.copy_(torch.randn_like(value) * 0.1 + value)
    return model


def assert_foreign_bank_equals_reference(model: ForeignModel) -> None:
    """A mix of the four voices and the base: the bank's output equals the routed reference's, which
    differs from the base's (an adapter that did nothing would not pass)."""
    bank = pack_bank(model, NAMES[:4])
    ids = torch.randint(0, 20, (6, 11))
    mix = ["v0", "v1", BASE, "v3", "v2", "v1"]
    with routed(model, mix):
        expected = model(ids)
    assert not torch.equal(expected, model(ids))
    with banked(model, bank, mix):
        torch.testing.assert_close(model(ids), expected, rtol=1e-4, atol=1e-5)


def test_foreign_model_bank_equals_routed_reference():
    def configs_of(k: int) -> list:
        return [
            LoraConfig(targets=["embed", "body.0", "conv"], r=1 + k),
            ResidualAdapterConfig(targets=["body.0", "conv", "body.2"], bottleneck=2 + k),
            ConditionalNormConfig(targets=["body.2"]),
            BitFitConfig(),
        ][k % 2 :]

    assert_foreign_bank_equals_reference(foreign_model_with_voices(configs_of))


FOREIGN_METHODS = [
    method.name for method in all_methods() if any(method.supports(module) for module in ForeignModel().modules())
]


@pytest.mark.parametrize("method", FOREIGN_METHODS)
def test_each_method_banks_on_a_foreign_model(method):
    """Every method that fits a layer of a module tree Chorus did not build, on all such layers."""

    def configs_of(k: int) -> list:
        return [dataclasses.replace(get_method(method).example(k), targets=ALL_LAYERS, exclude=None, layers=None)]

    assert_foreign_bank_equals_reference(foreign_model_with_voices(configs_of))


def test_refusals():
    model = model_with_voices("lora")
    bank = pack_bank(model, NAMES[:3])
    inputs = batch()
    with pytest.raises(ValueError, match="already holds a bank"):
        pack_bank(model, NAMES[3:])
    with pytest.raises(KeyError, match="not in this bank"):
        bank.index(["v0", "v4"])
    with pytest.raises(ValueError, match="values must be in"):
        with banked(model, bank, torch.tensor([0, 1, 3])):
            pass
    with pytest.raises(ValueError, match="batch of 8"):
        with banked(model, bank, ["v0", "v1", BASE]):
            run(model, inputs, False)
    with pytest.raises(KeyError, match="no adapter"):
        pack_bank(build_model(CONFIG), ["v0"])
    with pytest.raises(ValueError, match="distinct"):
        pack_bank(model, ["v4", "v4"])
    merge_adapter(model, "v4")
    with pytest.raises(ValueError, match="unmerge"), banked(model, bank, ["v0"] * 8):
        pass


# -- PEFT's mixed-adapter batch (adapter_names=[...]) is a second, independent reference ---------------


def peft_run(peft_model, inputs, mix, teacher_forced: bool):
    """PEFT's mixed-adapter batch: sample i through adapter ``mix[i]`` (``BASE`` is PEFT's base sentinel
    too). ``PeftModel.forward`` takes ``adapter_names`` for the teacher-forced forward; inference
    (``infer``) runs inside the context that ``forward`` and ``generate`` enter for it, which adds the
    per-sample adapter names to every LoRA layer's forward."""
    phonemes, text_lengths, mel, frame_lengths, speakers = inputs
    if teacher_forced:
        return peft_model(phonemes, text_lengths, mel, frame_lengths, speaker_ids=speakers, adapter_names=mix)
    with peft_model._enable_peft_forward_hooks(adapter_names=mix):
        return peft_model.get_base_model().infer(phonemes, text_lengths, speaker_ids=speakers)


def test_lora_bank_equals_peft_mixed_batch(peft, tmp_path):
    """PEFT makes the six LoRA voices (the registry's LoRA examples: ranks 1-4, rsLoRA, attention,
    convolutions, embedding and projections), Chorus reads PEFT's folders and banks them: equal in
    every voice mix, teacher-forced and in inference."""
    lora = [get_method("lora").example(k) for k in range(len(NAMES))]
    specs = {
        name: dict(
            r=c.r, lora_alpha=c.alpha, target_modules=c.targets, use_rslora=c.use_rslora, init_lora_weights=False
        )  # random B, so every update is non-zero
        for name, c in zip(NAMES, lora, strict=True)
    }
    torch.manual_seed(0)
    peft_model = peft.get_peft_model(build_model(CONFIG).eval(), peft.LoraConfig(**specs["v0"]), adapter_name="v0")
    for name in NAMES[1:]:
        peft_model.add_adapter(name, peft.LoraConfig(**specs[name]))
    peft_model.eval()
    peft_model.save_pretrained(str(tmp_path))  # one folder per adapter
    torch.manual_seed(0)
    model = build_model(CONFIG).eval()
    for name in NAMES:
        apply_voice(model, read_voice(tmp_path / name), name)
    bank = pack_bank(model, NAMES)
    inputs = batch()
    for mix in MIXES.values():
        for teacher_forced in (True, False):
            with torch.no_grad():
                expected = peft_run(peft_model, inputs, mix, teacher_forced)
                with banked(model, bank, mix):
                    actual = run(model, inputs, teacher_forced)
                base = run(model, inputs, teacher_forced)
            assert_same_output(actual, expected)
            assert torch.equal(expected.mel, base.mel) == (mix == MIXES["base"])  # PEFT applied the voices


def outermost_wrappers(model) -> list[AdapterLayer]:
    wrappers = [module for module in model.modules() if isinstance(module, AdapterLayer)]
    inner = {id(wrapper.base_layer) for wrapper in wrappers}
    return [wrapper for wrapper in wrappers if id(wrapper) not in inner]


def one_row_inputs(model, wrappers) -> dict[int, tuple]:
    """Each wrapper's positional inputs in a one-row forward of the model (the base alone)."""
    seen: dict[int, tuple] = {}
    hooks = [w.register_forward_pre_hook(lambda w, args: seen.setdefault(id(w), args)) for w in wrappers]
    try:
        with torch.no_grad():
            run(model, batch(1), False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@contextmanager
def merged(model, name):
    merge_adapter(model, name)
    try:
        yield
    finally:
        unmerge_all(model)
        set_active(model, None)


@pytest.mark.parametrize("method", [*(m.name for m in all_methods()), "all"])
def test_row_tensors_fold_a_rows_adapters_as_its_forward_applies_them(method):
    """``row_tensors`` (the Piper decoder's fused products read it): the innermost layer run with the folded
    tensors gives the wrapper's own output, for an active adapter, a routing or bank of one row, and a merged
    one; None where the method's effect is no change of those tensors (or a bank fold it lacks)."""
    model = model_with_voices(method)
    bank = pack_bank(model, NAMES)
    wrappers = outermost_wrappers(model)
    inputs = one_row_inputs(model, wrappers)
    states = {
        "active": lambda: active_adapter(model, "v1"),
        "routed": lambda: routed(model, ["v1"]),
        "merged": lambda: merged(model, "v1"),
    }
    folded = dict.fromkeys([*states, "bank"], 0)
    mergeable = all(layer.mergeable for _, layer in adapter_layers(model) if "v1" in layer.configs)
    for state, enter in [*states.items(), ("bank", lambda: banked(model, bank, ["v1"]))]:
        if state == "merged" and not mergeable:
            continue
        with enter(), torch.no_grad():
            for wrapper in wrappers:
                args = inputs[id(wrapper)]
                found = wrapper.row_tensors(1)
                applies = any("v1" in layer.configs for layer in wrappers_of(wrapper))
                if found is None:  # only where some wrapper holding v1 cannot fold it in this state
                    holders = [w for w in wrappers_of(wrapper) if "v1" in w.configs]
                    assert any(
                        not w.mergeable
                        or (state == "bank" and type(w).bank_merged_tensors is AdapterLayer.bank_merged_tensors)
                        for w in holders
                    )
                    continue
                layer, tensors = found
                torch.testing.assert_close(functional_call(layer, tensors, args), wrapper(*args), rtol=1e-5, atol=1e-6)
                folded[state] += applies
    if method in ("lora", "bitfit", "all"):
        assert folded["bank"] > 0  # LoRA and BitFit fold bank slots
    if mergeable:
        assert folded["active"] > 0 and folded["routed"] > 0


def test_row_tensors_refuse_rows_that_differ_and_row_scopes_narrow_a_bank_to_one_row():
    model = model_with_voices("lora")
    bank = pack_bank(model, NAMES)
    wrapper = next(w for w in outermost_wrappers(model) if "v0" in w.configs and "v2" in w.configs)
    with routed(model, ["v2", "v2"]):
        assert wrapper.row_tensors(2) is not None  # one voice for both rows
    with routed(model, ["v0", "v2"]):
        assert wrapper.row_tensors(2) is None
    mix = ["v2", BASE, "v0"]
    with banked(model, bank, mix):
        assert wrapper.row_tensors(3) is None
        scope = row_scopes(model)
        for row, name in enumerate(mix):
            with scope(row):
                assert wrapper.bank_index.tolist() == bank.index([name]).tolist()
                layer, tensors = wrapper.row_tensors(1)
                expected = wrapper.base_layer.weight if name == BASE else merged_weight(wrapper, name)
                torch.testing.assert_close(tensors["weight"], expected)
        assert wrapper.bank_index.tolist() == bank.index(mix).tolist()  # put back
        with pytest.raises(IndexError, match="row 3 of a batch of 3"), scope(3):
            pass
        with pytest.raises(KeyError), scope(2):
            raise KeyError("inside the scope")
        assert wrapper.bank_index.tolist() == bank.index(mix).tolist()  # put back after both


def merged_weight(wrapper, name):
    return wrapper.merged_base_tensors(name, own_tensors(innermost(wrapper)))["weight"]
