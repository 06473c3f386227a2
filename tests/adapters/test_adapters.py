"""Adapter framework: every registered method (the toy of ``tests/toy_method.py`` too) on the Chorus
model and on a foreign module; the matrix the design asks for (disabled equals base, merged equals
unmerged, only adapters train, save/load round-trips, per-sample routing equals separate runs), the
registry, PEFT interoperability and refusals."""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import tracemalloc

import pytest
import torch
from torch import nn

from chorus.adapters import (
    BASE,
    active_adapter,
    adapter_names,
    adapter_state_dict,
    add_adapter,
    all_methods,
    base_state_dict,
    find_targets,
    get_method,
    mark_trainable,
    merge_adapter,
    method_names,
    remove_adapter,
    routed,
    set_active,
    unmerge_all,
)
from chorus.adapters.bitfit import BitFitConfig
from chorus.adapters.lora import LoraConfig
from chorus.adapters.registry import ALL_LAYERS, FULL_FINE_TUNING
from chorus.adapters.residual import ResidualAdapterConfig
from chorus.adapters.voice import (
    VoiceCard,
    VoiceError,
    apply_voice,
    read_voice,
    save_voice,
)
from chorus.models.acoustic import build_model
from chorus.models.config import AcousticConfig
from conftest import tiny_config

CONFIG = tiny_config(n_speakers=3)
# Every registered method alone (its representative example), and all of them in one voice.
CASES = [method.name for method in all_methods()] + ["all"]
MERGEABLE = [method.name for method in all_methods() if method.mergeable]


def configs_of(case: str):
    if case == "all":
        return [method.example(0) for method in all_methods()]
    return [get_method(method).example(0) for method in case.split("+")]


def model_and_inputs(seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(CONFIG).eval()
    phonemes = torch.randint(1, 40, (3, 9))
    lengths = torch.tensor([9, 6, 7])
    speakers = torch.tensor([0, 1, 2])
    return model, (phonemes, lengths, speakers)


def infer(model, inputs):
    phonemes, lengths, speakers = inputs
    return model.infer(phonemes, lengths, speaker_ids=speakers).mel


def randomize(model, name):
    """Give adapter tensors non-trivial values (fresh ones are mostly no-ops by design)."""
    with torch.no_grad():
        for value in adapter_state_dict(model, name).values():
            value.copy_(torch.randn_like(value) * 0.05 + value)


@pytest.mark.parametrize("method", CASES)
def test_disabled_adapter_leaves_base_bit_identical(method):
    model, inputs = model_and_inputs()
    before = infer(model, inputs)
    base_weights = {k: v.clone() for k, v in model.state_dict().items()}
    add_adapter(model, "v1", configs_of(method))
    randomize(model, "v1")
    with active_adapter(model, "v1"):
        adapted = infer(model, inputs)
    assert not torch.equal(adapted, before)
    assert torch.equal(infer(model, inputs), before)
    current = base_state_dict(model)
    assert all(torch.equal(current[k], v) for k, v in base_weights.items())


# lora+toy: the toy's gain wraps LoRA on the same layers (q_proj, v_proj, mel_proj), a nest that does not
# commute: merged in the wrong order it gives W * s + dW where the forward gives (W + dW) * s.
@pytest.mark.parametrize("method", [*MERGEABLE, "lora+toy"])
def test_merged_equals_unmerged_and_unmerge_restores_exactly(method):
    model, inputs = model_and_inputs()
    before = infer(model, inputs)
    add_adapter(model, "v1", configs_of(method))
    randomize(model, "v1")
    with active_adapter(model, "v1"):
        unmerged = infer(model, inputs)
    merge_adapter(model, "v1")
    torch.testing.assert_close(infer(model, inputs), unmerged, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="merged"):
        set_active(model, None)
        infer(model, inputs)
    unmerge_all(model)
    set_active(model, None)
    assert torch.equal(infer(model, inputs), before)


def test_merging_a_nonlinear_adapter_is_refused():
    model, _ = model_and_inputs()
    add_adapter(model, "v1", [ResidualAdapterConfig(bottleneck=4)])
    with pytest.raises(ValueError, match="cannot be merged"):
        merge_adapter(model, "v1")


@pytest.mark.parametrize("method", CASES)
def test_only_adapter_parameters_train(method):
    model, (phonemes, lengths, speakers) = model_and_inputs()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    add_adapter(model, "v1", configs_of(method))
    trainable = mark_trainable(model, "v1")
    assert trainable and all(p.requires_grad for p in trainable)
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in trainable}
    set_active(model, "v1")
    model.train()
    mel = torch.randn(3, 30, CONFIG.n_mels)
    out = model(phonemes, lengths, mel, torch.tensor([30, 20, 25]), speaker_ids=speakers)
    ((out.mel - mel) ** 2).mean().backward()
    optimizer = torch.optim.SGD(trainable, lr=0.1)
    optimizer.step()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)
    after = base_state_dict(model)
    assert after.keys() == base.keys()
    assert all(torch.equal(after[k], v) for k, v in base.items())


@pytest.mark.parametrize("method", CASES)
def test_voice_folder_round_trip(method, tmp_path):
    model, inputs = model_and_inputs()
    configs = configs_of(method)
    add_adapter(model, "v1", configs)
    randomize(model, "v1")
    with active_adapter(model, "v1"):
        expected = infer(model, inputs)
    card = VoiceCard(name="v1", methods=[c.method for c in configs], base_model_sha256="abc")
    save_voice(tmp_path / "v1", model, "v1", configs, card)
    fresh, _ = model_and_inputs()
    voice = read_voice(tmp_path / "v1")
    apply_voice(fresh, voice, "loaded", base_model_sha256="abc")
    with active_adapter(fresh, "loaded"):
        assert torch.equal(infer(fresh, inputs), expected)


def test_reading_a_voice_again_and_again_keeps_no_memory(tmp_path):
    """A server reads voices on demand for as long as it runs: a read must leave nothing behind
    (safetensors' own file reader keeps ~55 bytes per tensor name per open)."""
    model, _ = model_and_inputs()
    configs = configs_of("all")
    add_adapter(model, "v1", configs)
    save_voice(
        tmp_path / "v1", model, "v1", configs, VoiceCard("v1", [c.method for c in configs], base_model_sha256="")
    )
    tensors = len(read_voice(tmp_path / "v1").tensors)
    for _ in range(20):  # warm-up: caches of the first reads
        read_voice(tmp_path / "v1")
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(300):
            read_voice(tmp_path / "v1")
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 300 * tensors * 8, (kept, tensors)  # the leak kept 300 x tensors x ~55 bytes


def test_routing_per_sample_equals_separate_runs():
    """The slow reference path: each row with its own voice equals running that voice alone."""
    model, (phonemes, lengths, speakers) = model_and_inputs()
    for name in ("a", "b"):
        add_adapter(model, name, configs_of("all"))
        randomize(model, name)
    mixes = [["a", "b", BASE], ["a", "a", "a"], [BASE, BASE, "b"], ["b", "a", "b"]]
    for mix in mixes:
        with routed(model, mix):
            together = model.infer(phonemes, lengths, speaker_ids=speakers)
        for row, name in enumerate(mix):
            with active_adapter(model, None if name == BASE else name):
                alone = model.infer(
                    phonemes[row : row + 1, : lengths[row]], lengths[row : row + 1], speaker_ids=speakers[row : row + 1]
                )
            frames = int(alone.frame_mask.sum())
            assert int(together.frame_mask[row].sum()) == frames
            torch.testing.assert_close(together.mel[row, :frames], alone.mel[0, :frames], rtol=1e-4, atol=1e-5)


def test_many_voices_coexist_and_remove_cleanly():
    model, inputs = model_and_inputs()
    before = infer(model, inputs)
    add_adapter(model, "a", [LoraConfig(r=2)])
    add_adapter(model, "b", [LoraConfig(r=3), BitFitConfig()])
    assert adapter_names(model) == {"a", "b"}
    with pytest.raises(ValueError, match="already has"):
        add_adapter(model, "a", [LoraConfig()])
    remove_adapter(model, "a")
    remove_adapter(model, "b")
    assert adapter_names(model) == set()
    assert not any("base_layer" in k for k in model.state_dict())
    assert torch.equal(infer(model, inputs), before)


def test_resident_voices_add_parameters_not_modules():
    # The serving engine keeps many voices resident. A LoRA or residual voice adds a few parameters to
    # each layer it adapts, not a sub-layer per tensor group as PEFT does: an nn.Module is about 2.3
    # KiB of Python heap, so with them (1.8 KiB per adapter tensor here) resident memory grew by more
    # than the voices' tensors on the shipped base.
    model, inputs = model_and_inputs()

    def configs():
        return [LoraConfig(r=4, targets=["q_proj", "v_proj", "conv1"]), ResidualAdapterConfig(bottleneck=4)]

    add_adapter(model, "first", configs())  # wraps the layers
    modules = len(list(model.modules()))
    voices = 10
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(voices):
            add_adapter(model, f"v{index}", configs())
        gc.collect()
        heap_per_voice = (tracemalloc.get_traced_memory()[0] - before) / voices
    finally:
        tracemalloc.stop()
    assert len(list(model.modules())) == modules
    tensors_per_voice = len(adapter_state_dict(model, "v0"))
    assert heap_per_voice < 1024 * tensors_per_voice  # about 270 B per tensor (a parameter and its key)
    parameters = len(list(model.parameters()))
    remove_adapter(model, "v3")
    assert len(list(model.parameters())) == parameters - tensors_per_voice and "v3" not in adapter_names(model)
    with active_adapter(model, "v4"):
        infer(model, inputs)


def test_target_selection_forms():
    model, _ = model_and_inputs()
    assert find_targets(model, LoraConfig(targets=["q_proj"])) == [
        "encoder.layers.0.attn.q_proj",
        "encoder.layers.1.attn.q_proj",
        "decoder.layers.0.attn.q_proj",
        "decoder.layers.1.attn.q_proj",
    ]
    assert find_targets(model, LoraConfig(targets=r"decoder\.layers\.\d+\.attn\.(q|v)_proj")) == [
        "decoder.layers.0.attn.q_proj",
        "decoder.layers.0.attn.v_proj",
        "decoder.layers.1.attn.q_proj",
        "decoder.layers.1.attn.v_proj",
    ]
    assert find_targets(model, LoraConfig(targets=["q_proj"], exclude=r"encoder\..*", layers=[1])) == [
        "decoder.layers.1.attn.q_proj"
    ]


def test_bad_targets_are_refused_before_anything_changes():
    model, _ = model_and_inputs()
    with pytest.raises(ValueError, match="match no module"):
        add_adapter(model, "v1", [BitFitConfig(), LoraConfig(targets=["no_such_layer"])])
    assert adapter_names(model) == set()
    with pytest.raises(TypeError, match="supports: Linear, Conv1d, Embedding"):
        add_adapter(model, "v1", [LoraConfig(targets=["encoder.layers.0.norm1"])])
    with pytest.raises(TypeError, match=r"bitfit cannot adapt '0' \(Linear\): it has no bias"):
        add_adapter(nn.Sequential(nn.Linear(4, 4, bias=False)), "v1", [BitFitConfig(targets=["0"])])
    with pytest.raises(ValueError, match="unknown adapter method 'dora'"):
        get_method("dora")


# -- the registry: a method is one module plus one line ------------------------------------------------


def test_a_new_method_is_one_module_and_one_line():
    """The toy method (tests/toy_method.py), registered by its import in tests/conftest.py as the shipped
    methods are by chorus/adapters/methods.py, is a method like the others: every test parametrized over
    the registry here and in test_bank.py / test_memory_adapters.py covers it."""
    assert "toy" in method_names() and method_names()[-1] == FULL_FINE_TUNING
    assert {"toy"} <= set(CASES) & set(MERGEABLE) & set(FOREIGN_METHODS)


def test_the_registry_imports_no_method():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("chorus")
    shipped = [m.config_class.__module__ for m in all_methods() if m.config_class.__module__.startswith("chorus.")]
    assert len(shipped) == len(all_methods()) - 1  # all but the toy
    for module in shipped:
        assert not graph.chain_exists(importer="chorus.adapters.registry", imported=module), module
        assert graph.direct_import_exists(importer="chorus.adapters.methods", imported=module), module


@pytest.mark.parametrize("method", [method.name for method in all_methods()])
def test_every_config_field_has_help(method):
    # The command line makes an option of every field, with this text as its help.
    for config_field in dataclasses.fields(get_method(method).config_class):
        assert config_field.metadata.get("help"), f"{method}: field {config_field.name!r} has no help text"


class ForeignModel(nn.Module):
    """Not a Chorus model: the framework must work on any module tree."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.LayerNorm(16))
        self.conv = nn.Conv1d(16, 8, 3, padding=1)

    def forward(self, ids):
        return self.conv(self.body(self.embed(ids)).transpose(1, 2))


FOREIGN_METHODS = [
    method.name for method in all_methods() if any(method.supports(module) for module in ForeignModel().modules())
]


@pytest.mark.parametrize("method", FOREIGN_METHODS)
def test_foreign_model(method):
    torch.manual_seed(0)
    model = ForeignModel()
    ids = torch.randint(0, 20, (2, 5))
    before = model(ids)
    configs = [dataclasses.replace(get_method(method).example(0), targets=ALL_LAYERS, exclude=None, layers=None)]
    add_adapter(model, "x", configs)
    randomize(model, "x")
    trainable = mark_trainable(model, "x")
    with active_adapter(model, "x"):
        after = model(ids)
        after.sum().backward()
    assert not torch.equal(after, before)
    assert torch.equal(model(ids), before)
    assert all(p.grad is not None for p in trainable)


def test_voice_refusals(tmp_path):
    model, _ = model_and_inputs()
    configs = [LoraConfig(r=2)]
    add_adapter(model, "v1", configs)
    save_voice(tmp_path / "v1", model, "v1", configs, VoiceCard("v1", ["lora"], base_model_sha256="base-a"))
    fresh, _ = model_and_inputs()
    with pytest.raises(VoiceError, match="was made on base"):
        apply_voice(fresh, read_voice(tmp_path / "v1"), "v1", base_model_sha256="base-b")
    weights = tmp_path / "v1" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(VoiceError, match="checksum"):
        read_voice(tmp_path / "v1")
    (tmp_path / "v1" / "adapter_config.json").write_text("{not json")
    with pytest.raises(VoiceError, match="corrupted JSON"):
        read_voice(tmp_path / "v1")
    (tmp_path / "v1" / "adapter_config.json").write_text("[1, 2]")  # JSON, but not an object (was AttributeError)
    with pytest.raises(VoiceError, match="corrupted JSON"):
        read_voice(tmp_path / "v1")
    with pytest.raises(VoiceError, match="missing"):
        read_voice(tmp_path / "nothing")
    other = build_model(AcousticConfig(**{**CONFIG.to_dict(), "d_model": 16}))
    add_adapter(model, "v2", configs)
    save_voice(tmp_path / "v2", model, "v2", configs, VoiceCard("v2", ["lora"], base_model_sha256=""))
    with pytest.raises(VoiceError, match="does not fit"):
        apply_voice(other, read_voice(tmp_path / "v2"), "v2")
    assert adapter_names(other) == set()
    section_path = tmp_path / "v2" / "chorus_voice.json"
    section = json.loads(section_path.read_text())
    section_path.write_text(json.dumps({**section, "methods": [1]}))  # a method entry that is not an object
    with pytest.raises(VoiceError, match="invalid method config"):
        read_voice(tmp_path / "v2")


# -- PEFT interoperability: the same LoRA file is read by both (the peft fixture skips without peft) ----


def test_peft_loads_a_chorus_lora(peft, tmp_path, recwarn):
    model, inputs = model_and_inputs()
    configs = [LoraConfig(r=4, alpha=8, targets=["q_proj", "v_proj", "conv1", "symbol_embedding"])]
    add_adapter(model, "v1", configs)
    randomize(model, "v1")
    with active_adapter(model, "v1"):
        expected = infer(model, inputs)
    save_voice(tmp_path / "v1", model, "v1", configs, VoiceCard("v1", ["lora"], base_model_sha256=""))
    fresh, _ = model_and_inputs()
    recwarn.clear()
    peft_model = peft.PeftModel.from_pretrained(fresh, str(tmp_path / "v1"))
    assert [str(w.message) for w in recwarn if "chorus" in str(w.message).lower()] == []  # nothing unexpected
    torch.testing.assert_close(peft_model.base_model.model.infer(*inputs[:2], speaker_ids=inputs[2]).mel, expected)
    # ... and back: the folder PEFT saves loads in Chorus to the same output.
    peft_model.save_pretrained(str(tmp_path / "back"))
    again, _ = model_and_inputs()
    apply_voice(again, read_voice(tmp_path / "back"), "b")
    with active_adapter(again, "b"):
        torch.testing.assert_close(infer(again, inputs), expected)


def test_peft_loads_a_lora_voice_as_chorus_adapt_makes_it(peft, tmp_path, recwarn):
    """`chorus adapt --method lora`: a LoRA (off the text side) and the untrained speaker vector every voice
    carries. The card says peft, and PEFT loads it: the LoRA from the adapter, the vector from its own
    file, which with it speaks the voice as Chorus does."""
    from huggingface_hub import ModelCard
    from safetensors.torch import load_file

    from chorus.adapters import parse_methods
    from chorus.recipe import AdaptConfig

    model, inputs = model_and_inputs()
    configs = AdaptConfig(methods=parse_methods("lora")).method_configs()
    assert [(c.method, c.trains()) for c in configs] == [("lora", True), ("speaker", False)]
    add_adapter(model, "v", configs)
    randomize(model, "v")
    with active_adapter(model, "v"):
        expected = infer(model, inputs)
    folder = save_voice(tmp_path / "v", model, "v", configs, VoiceCard("v", ["lora"], base_model_sha256="ab" * 32))
    hub = ModelCard((folder / "README.md").read_text()).data
    assert hub.library_name == "peft" and hub.base_model is None and hub.chorus_base_model_sha256 == "ab" * 32
    assert hub.license == "other" and hub.license_name and (folder / hub.license_link).is_file()
    fresh, _ = model_and_inputs()
    recwarn.clear()
    peft_model = peft.PeftModel.from_pretrained(fresh, str(folder))
    assert [str(w.message) for w in recwarn if "key" in str(w.message).lower()] == []  # no tensor left out
    (vector,) = load_file(folder / "speaker_vector.safetensors").values()
    phonemes, lengths, speakers = inputs
    vectors = vector.expand(len(speakers), -1)
    torch.testing.assert_close(
        peft_model.base_model.model.infer(phonemes, lengths, speaker_vectors=vectors).mel, expected
    )
    again, _ = model_and_inputs()
    apply_voice(again, read_voice(folder), "v")  # Chorus reads the folder whole
    with active_adapter(again, "v"):
        torch.testing.assert_close(infer(again, inputs), expected)
    # Saved again by PEFT, which leaves the vector behind: the voice spoke from the default speaker without a word.
    peft_model.save_pretrained(str(tmp_path / "back"))
    with pytest.warns(UserWarning, match="without speaker_vector.safetensors: it speaks from the speaker asked for"):
        read_voice(tmp_path / "back")
    shutil.copy(folder / "speaker_vector.safetensors", tmp_path / "back")  # copied back: the voice whole again
    back, _ = model_and_inputs()
    apply_voice(back, read_voice(tmp_path / "back"), "b")
    with active_adapter(back, "b"):
        torch.testing.assert_close(infer(back, inputs), expected)
    (folder / "speaker_vector.safetensors").write_bytes(b"changed")
    with pytest.raises(VoiceError, match="speaker_vector.safetensors: checksum mismatch"):
        read_voice(folder)


@pytest.mark.parametrize(
    "methods",
    [["residual"], ["lora", "speaker"], ["bitfit"]],
    ids=lambda m: "+".join(m),
)
def test_voices_that_are_not_peft_methods_say_so_to_peft(peft, tmp_path, methods):
    from chorus.adapters.speaker import SpeakerConfig

    model, inputs = model_and_inputs()
    by_name = {
        "residual": ResidualAdapterConfig(),
        "lora": LoraConfig(r=2),
        "speaker": SpeakerConfig(),
        "bitfit": BitFitConfig(),
    }
    configs = [by_name[m] for m in methods]
    add_adapter(model, "v", configs)
    randomize(model, "v")
    with active_adapter(model, "v"):
        expected = infer(model, inputs)
    save_voice(tmp_path / "v", model, "v", configs, VoiceCard("v", methods, base_model_sha256=""))
    fresh, _ = model_and_inputs()
    with pytest.raises(KeyError, match="a Chorus voice format, not a PEFT adapter"):
        peft.PeftModel.from_pretrained(fresh, str(tmp_path / "v"))
    apply_voice(fresh, read_voice(tmp_path / "v"), "v")  # Chorus reads it whole
    with active_adapter(fresh, "v"):
        torch.testing.assert_close(infer(fresh, inputs), expected)


def test_voices_of_the_earlier_layout_still_load_and_cards_carry_hub_metadata(tmp_path):
    from huggingface_hub import ModelCard

    model, inputs = model_and_inputs()
    configs = [ResidualAdapterConfig()]
    add_adapter(model, "v", configs)
    randomize(model, "v")
    with active_adapter(model, "v"):
        expected = infer(model, inputs)
    card = VoiceCard("v", ["residual"], base_model_sha256="ab" * 32, data_minutes=3.25, speech_minutes=2.875)
    card.metrics["encoder_similarity_to_clips"] = -0.2128
    folder = save_voice(tmp_path / "v", model, "v", configs, card)
    hub = ModelCard((folder / "README.md").read_text()).data
    assert hub.library_name == "chorus-tts" and hub.chorus_base_model_sha256 == "ab" * 32
    assert "- data: 3.25 min of audio, 2.88 of speech;" in (folder / "README.md").read_text()
    # A bare number a reader could not place says what it is on (-0.21 had stood alone).
    assert (
        "- encoder_similarity_to_clips: -0.2128 (cosine, -1 to 1, by Chorus's speaker encoder"
        in (folder / "README.md").read_text()
    )
    assert (
        hub.data_minutes == 3.25
        and hub.speech_minutes == 2.875
        and hub.license_link == "LICENSE.md"
        and "residual" in hub.tags
    )
    # The earlier layout: the Chorus section inside adapter_config.json, no chorus_voice.json.
    section = json.loads((folder / "chorus_voice.json").read_text())
    (folder / "chorus_voice.json").unlink()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": None, "chorus": section}))
    fresh, _ = model_and_inputs()
    apply_voice(fresh, read_voice(folder), "v")
    with active_adapter(fresh, "v"):
        torch.testing.assert_close(infer(fresh, inputs), expected)


def test_chorus_loads_a_peft_lora(peft, tmp_path):
    model, inputs = model_and_inputs()
    peft_config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["k_proj", "out_proj", "conv2"], init_lora_weights=False
    )  # random B, so the update is not zero
    peft_model = peft.get_peft_model(model, peft_config)
    expected = peft_model.base_model.model.infer(*inputs[:2], speaker_ids=inputs[2]).mel
    peft_model.save_pretrained(str(tmp_path / "peft"))
    assert "chorus" not in json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    fresh, _ = model_and_inputs()
    before = infer(fresh, inputs)
    with pytest.warns(UserWarning, match="without speaker_vector.safetensors"):  # PEFT trained it with none
        voice = read_voice(tmp_path / "peft")
    apply_voice(fresh, voice, "p")
    assert not torch.equal(expected, before)
    with active_adapter(fresh, "p"):
        torch.testing.assert_close(infer(fresh, inputs), expected)
