"""A voice folder from elsewhere (a download, a tenant's upload through `chorus store add`) is untrusted input:
each test is an attack a security probe made on the loaders, refused in the file's words before it costs
anything. Loading never runs code (no pickles: tested in test_adapters.py and the store's tests)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from chorus.adapters import add_adapter, find_targets
from chorus.adapters.lora import LoraConfig
from chorus.adapters.registry import config_from_dict, module_pattern
from chorus.adapters.residual import ResidualAdapterConfig
from chorus.adapters.voice import CHORUS_FILE, VoiceCard, VoiceError, apply_voice, read_voice, save_voice
from chorus.models.acoustic import build_model
from conftest import tiny_config

BASE_SHA = "ab" * 32


@pytest.fixture
def voice(tmp_path):
    """A LoRA + residual voice of the tiny model, saved; returns its folder."""
    model = build_model(tiny_config()).eval()
    configs = [LoraConfig(r=2), ResidualAdapterConfig(bottleneck=3)]
    add_adapter(model, "v", configs)
    return save_voice(tmp_path / "v", model, "v", configs, VoiceCard("v", ["lora", "residual"], BASE_SHA))


def fresh_model():
    return build_model(tiny_config()).eval()


def edit_section(folder, change) -> None:
    path = folder / CHORUS_FILE
    section = json.loads(path.read_text())
    change(section)
    path.write_text(json.dumps(section))


def test_a_pattern_that_backtracks_exponentially_in_pythons_re_matches_in_linear_time():
    """171 bytes of PEFT folder held a server's every request: Python's re took 1 s for a 24-character module
    name with this pattern, doubling with each character (the tiny model's names reach 30: hours). RE2 answers
    at once; here it matches nothing."""
    evil = "(?:[a-z0-9_.]|[a-z0-9_.])*!"
    with pytest.raises(ValueError, match="match no module"):
        find_targets(fresh_model(), LoraConfig(targets=evil))
    assert module_pattern(r"encoder\.layers\.\d+\.attn\.q_proj").fullmatch("encoder.layers.1.attn.q_proj")


def test_a_pattern_re2_cannot_read_is_refused_by_name():
    with pytest.raises(ValueError, match=r"targets '\(a\)\\\\1' is not a regular expression .* \(RE2 syntax\)"):
        LoraConfig(targets=r"(a)\1")  # a back-reference: Python's re reads it, RE2 does not
    with pytest.raises(ValueError, match="exclude '\\(' is not a regular expression"):
        LoraConfig(exclude="(")


@pytest.mark.parametrize(
    ("fields", "wrong"),
    [
        ({"r": "4"}, "r: '4'"),
        ({"r": True}, "r: True"),
        ({"r": 4.5}, "r: 4.5"),
        ({"alpha": float("nan")}, "alpha: nan (not a finite number)"),
        ({"targets": [1]}, "targets: [1]"),
        ({"layers": [-1]}, "negative block index"),
        ({"alpha": 10**400}, "alpha: 1000"),  # past a float's range: OverflowError had escaped
        ({"r": 2**62}, "r 4611686018427387904 over the largest size"),  # torch's size arithmetic overflowed
    ],
)
def test_config_values_of_the_wrong_type_are_refused_where_they_are_read(fields, wrong):
    with pytest.raises(ValueError, match=re.escape(wrong)):
        config_from_dict({"method": "lora", **fields})


def test_sizes_a_config_declares_are_checked_against_the_weights_before_they_are_allocated(voice):
    """A rank of 4,096 over rank-2 tensors was built (0.4 GB here) before the shapes were compared (a rank of 100,000
    took 3.9 GB)."""
    edit_section(voice, lambda section: section["methods"][0].update(r=4096))
    model = fresh_model()
    with pytest.raises(VoiceError, match=r"another shape than the voice's config makes: .*lora_A\.weight \(2, "):
        apply_voice(model, read_voice(voice), "v", BASE_SHA)
    assert not [name for name, _ in model.named_modules() if "lora" in name], "nothing was built"


def test_numpy_scalars_and_tuples_are_values_of_their_type():
    """A library user's np.int64 rank or tuple of targets is what they mean."""
    import numpy as np

    config = LoraConfig(r=np.int64(4), alpha=np.float32(8.0), targets=("q_proj",), layers=(0,))
    assert find_targets(fresh_model(), config)


def test_a_base_name_that_is_not_a_name_is_refused_when_read(voice):
    """It names the base the command line opens: a list there crashed `chorus synthesize --voice`."""
    edit_section(voice, lambda section: section.update(base_model=["x"]))
    with pytest.raises(VoiceError, match="is not a base's name"):
        read_voice(voice)


def test_weights_of_a_config_that_lacks_them_are_refused_before_building(voice):
    edit_section(voice, lambda section: section["methods"].pop(1))  # the residual adapter's tensors stay
    with pytest.raises(VoiceError, match="unexpected"):
        apply_voice(fresh_model(), read_voice(voice), "v", BASE_SHA)


def test_nan_or_infinite_weights_are_refused_when_read(voice):
    """They loaded, then every request for the voice was a 500 from deep in the duration rounding."""
    weights = voice / "adapter_model.safetensors"
    tensors = load_file(weights)
    first = next(iter(tensors))
    tensors[first] = torch.full_like(tensors[first], float("inf"))
    save_file(tensors, weights)
    edit_section(voice, lambda section: section.update(weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest()))
    with pytest.raises(VoiceError, match="NaN or infinity"):
        read_voice(voice)


def test_a_chorus_voice_that_records_no_base_is_not_loaded_on_one(voice):
    """An empty base hash skipped the base check: the voice spoke on any base."""
    edit_section(voice, lambda section: section.update(base_model_sha256=""))
    with pytest.raises(VoiceError, match="records no base model"):
        apply_voice(fresh_model(), read_voice(voice), "v", BASE_SHA)
    edit_section(voice, lambda section: section.update(base_model_sha256=7))
    with pytest.raises(VoiceError, match="is not a sha256"):
        read_voice(voice)


def test_a_version_that_is_not_a_number_is_a_format_error(voice):
    edit_section(voice, lambda section: section.update(version="2"))  # was a TypeError comparing str with int
    with pytest.raises(VoiceError, match="not a voice format this Chorus reads"):
        read_voice(voice)


def test_a_peft_config_without_its_rank_or_with_a_bad_one_is_a_voice_error(voice):
    (voice / CHORUS_FILE).unlink()  # a PEFT folder: adapter_config.json alone says what it is
    config_path = voice / "adapter_config.json"
    config = {"peft_type": "LORA", "target_modules": ["q_proj"], "lora_alpha": 4}
    config_path.write_text(json.dumps(config))
    with pytest.raises(VoiceError, match="a PEFT LoRA config without 'r'"):
        read_voice(voice)
    config_path.write_text(json.dumps({**config, "r": "x"}))
    with pytest.raises(VoiceError, match="invalid PEFT LoRA config"):
        read_voice(voice)
    config_path.write_text(json.dumps({**config, "r": 2, "layers_to_transform": 1}))  # PEFT's one block, alone
    with pytest.warns(UserWarning, match="without speaker_vector.safetensors"):
        assert read_voice(voice).configs[0].layers == [1]


@pytest.mark.parametrize(("field", "value"), [("notes", [1]), ("name", {"a": 1}), ("steps", "many")])
def test_a_voice_card_of_the_wrong_types_is_refused(voice, field, value):
    """A card whose notes were a list was stored; the server's card route then failed on it (a 500)."""
    card_path = voice / "voice_card.json"
    card_path.write_text(json.dumps({**json.loads(card_path.read_text()), field: value}))
    with pytest.raises(VoiceError, match=f"corrupted voice card \\({field}: "):
        read_voice(voice)
