"""Pruning: compact storage of sparse weights, each technique on the tiny base (sparsity reached, masks
kept or moved as the technique says, excluded layers untouched), structured shrinking that keeps the
function where it removes nothing alive, and a pruned base used like the shipped one."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn
from typer.testing import CliRunner

from chorus.cli import app
from chorus.models.acoustic import build_model
from chorus.models.bundle import CheckpointError, load_bundle, save_bundle
from chorus.models.sparse_storage import pack, unpack
from chorus.pruning import PruneConfig, prune_base
from chorus.pruning.dynamic import drop_and_regrow, random_masks
from chorus.pruning.masks import MaskSet, global_magnitude_masks
from chorus.pruning.registry import technique_names
from chorus.pruning.structured import channel_plan, shrink
from chorus.pruning.targets import DEFAULT_EXCLUDE, prunable_layers
from conftest import tiny_config

TECHNIQUES = ["ump", "parp", "snip", "dynamic", "structured"]


def features(tiny_base: Path) -> str:
    return str(tiny_base.parent / "features.safetensors")  # the tiny base's own feature cache


def pruned(tiny_base, two_voice_corpus, tmp_path, method, sparsity=0.5, steps=3, **options) -> Path:
    config = PruneConfig(
        method=method,
        sparsity=sparsity,
        out=str(tmp_path / method),
        data=str(two_voice_corpus),
        model=str(tiny_base),
        steps=steps,
        features=features(tiny_base),
        max_frames=2000,
        **options,
    )
    return prune_base(config, progress=False)


def test_every_technique_is_registered():
    assert sorted(technique_names()) == sorted(TECHNIQUES)


def test_sparse_weights_are_stored_compactly_and_load_back_exactly(tiny_base, tmp_path):
    bundle = load_bundle(tiny_base)
    dense_bytes = (tiny_base / "model.safetensors").stat().st_size
    with safe_open(str(tiny_base / "model.safetensors"), "pt") as weights:
        assert "packed" not in (weights.metadata() or {})  # a dense model is written as before
    for sparsity in (0.5, 0.9):
        model = copy.deepcopy(bundle.model)
        layers = prunable_layers(model)
        MaskSet.by_global_magnitude(layers, sparsity)
        folder = tmp_path / f"s{sparsity}"
        save_bundle(dataclasses.replace(bundle, model=model), folder)
        loaded = load_bundle(folder)
        for name, value in model.state_dict().items():
            assert torch.equal(loaded.model.state_dict()[name], value), name
        # Each pruned float32 weight: 4 bytes per kept value and a bit per entry, instead of 4 bytes each.
        weights = [layer.weight for layer in layers.values()]
        saved = sum(4 * w.numel() - 4 * int(torch.count_nonzero(w)) - (w.numel() + 7) // 8 for w in weights)
        size = (folder / "model.safetensors").stat().st_size
        assert abs(size - (dense_bytes - saved)) < 4096, (size, dense_bytes, saved)  # the header's JSON differs


def test_pack_round_trip_and_damage():
    state = {"w": torch.tensor([[0.0, 1.5, 0.0, -2.0]] * 40), "ids": torch.arange(100), "b": torch.ones(3)}
    tensors, metadata = pack(state)
    assert set(tensors) == {"w.__kept", "w.__mask", "ids", "b"} and json.loads(metadata["packed"]) == {"w": [40, 4]}
    assert all(torch.equal(unpack(tensors, metadata)[k], v) for k, v in state.items())
    del tensors["w.__mask"]
    with pytest.raises(ValueError, match="lacks"):
        unpack(tensors, metadata)


def test_a_damaged_packed_file_is_a_clear_error(tiny_base, tmp_path):
    bundle = load_bundle(tiny_base)
    MaskSet.by_global_magnitude(prunable_layers(bundle.model), 0.5)
    save_bundle(bundle, tmp_path / "pruned")
    from safetensors.torch import load_file, save_file

    path = tmp_path / "pruned" / "model.safetensors"
    with safe_open(str(path), "pt") as weights:
        metadata = weights.metadata()
    tensors = load_file(str(path))
    name = next(k for k in tensors if k.endswith(".__kept"))
    tensors[name] = tensors[name][:-1]
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(CheckpointError, match="mask keeps"):
        load_bundle(tmp_path / "pruned")


def test_default_targets_leave_embeddings_norms_and_the_output_dense(tiny_base):
    names = set(prunable_layers(load_bundle(tiny_base).model))
    assert "decoder.layers.0.ff.conv1" in names and "encoder.layers.0.attn.q_proj" in names
    assert "mel_proj" not in names and not any("norm" in n or "embedding" in n for n in names)
    decoder_only = prunable_layers(load_bundle(tiny_base).model, ["decoder.*"], ["*.attn.*"])
    assert set(decoder_only) == {"decoder.layers.0.ff.conv1", "decoder.layers.0.ff.conv2"}
    with pytest.raises(ValueError, match="no Linear or Conv1d layer matches"):
        prunable_layers(load_bundle(tiny_base).model, ["nothing*"])


@pytest.mark.parametrize("method", ["ump", "parp", "snip", "dynamic"])
def test_unstructured_techniques_reach_their_sparsity(method, tiny_base, two_voice_corpus, tmp_path):
    folder = pruned(tiny_base, two_voice_corpus, tmp_path, method, sparsity=0.6)
    base, result = load_bundle(tiny_base), load_bundle(folder)
    info = result.info["pruning"]
    assert info["method"] == method and info["steps"] == 3 and info["train_seconds"] > 0
    assert info["target_sparsity"] == 0.6 and info["base_sha256"] == base.weights_sha256
    assert info["sparsity"] == pytest.approx(0.6, abs=0.01)
    layers = prunable_layers(result.model)
    for name, layer in layers.items():
        zeros = 1 - float(torch.count_nonzero(layer.weight)) / layer.weight.numel()
        assert info["layers"][name] == pytest.approx(zeros, abs=1e-4)
        if method == "dynamic":  # every layer at the target, whatever moved
            assert zeros == pytest.approx(0.6, abs=max(0.01, 1 / layer.weight.numel())), name
    assert result.model.config == base.model.config  # same architecture: zeros, not smaller layers
    for dense in ("mel_proj.weight", "speaker_embedding.weight", "encoder.layers.0.norm1.weight"):  # not pruned
        value = result.model.state_dict()[dense]
        assert torch.count_nonzero(value) == value.numel(), dense
    if method in ("snip", "dynamic"):
        assert info["from_scratch"] and not torch.equal(result.model.mel_proj.weight, base.model.mel_proj.weight)
        assert torch.equal(result.model.mel_mean, base.model.mel_mean)  # the base's statistics
    if method == "dynamic":
        assert info["mask_updates"] >= 1 and info["connections_moved"] > 0


def test_ump_keeps_its_mask_through_fine_tuning(tiny_base, two_voice_corpus, tmp_path):
    base = load_bundle(tiny_base)
    masks = global_magnitude_masks(prunable_layers(copy.deepcopy(base.model)), 0.5)
    result = load_bundle(pruned(tiny_base, two_voice_corpus, tmp_path, "ump", steps=4))
    for name, layer in prunable_layers(result.model).items():
        assert torch.equal(layer.weight != 0, masks[name]), name  # exactly the one-shot mask
    moved = [
        not torch.equal(layer.weight, prunable_layers(base.model)[n].weight * masks[n])
        for n, layer in prunable_layers(result.model).items()
    ]
    assert any(moved)  # and the kept weights were fine-tuned


def test_parp_lets_pruned_weights_come_back(tiny_base, two_voice_corpus, tmp_path):
    """PARP's adjust step trains the weights its first prune zeroed too: the last prune keeps some of them."""
    base = load_bundle(tiny_base)
    first = global_magnitude_masks(prunable_layers(copy.deepcopy(base.model)), 0.5)  # PARP's own first prune
    # A large rate: in a few steps weights that start at zero grow past the smallest kept ones, as they
    # do over the technique's hundreds of steps at its own rate.
    result = load_bundle(pruned(tiny_base, two_voice_corpus, tmp_path, "parp", steps=4, learning_rate=0.05))
    layers = prunable_layers(result.model)
    came_back = sum(int((~first[name] & (layer.weight != 0)).sum()) for name, layer in layers.items())
    first_zeros = sum(int((~mask).sum()) for mask in first.values())
    info = result.info["pruning"]
    assert came_back > 0
    assert info["came_back"] == pytest.approx(came_back / first_zeros)  # what the model card reports
    assert info["sparsity"] == pytest.approx(0.5, abs=0.01)  # and the target is still met


def test_a_sparsity_that_would_remove_every_weight_is_refused():
    """torch rounds the share to a count: 0.9999999 of 80 weights is all 80 (it had pruned the whole base)."""
    layers = {"a": nn.Linear(8, 4, bias=False), "b": nn.Linear(4, 10, bias=False)}  # 32 + 40 weights
    with pytest.raises(ValueError, match=r"removes all 72 targeted weights: a sparsity under 0\.99305\d* keeps one"):
        global_magnitude_masks(copy.deepcopy(layers), 0.9999999)
    below = global_magnitude_masks(copy.deepcopy(layers), 71.49 / 72)  # just under the bound it states
    assert sum(int(mask.sum()) for mask in below.values()) == 1
    kept = global_magnitude_masks(copy.deepcopy(layers), 71 / 72)  # the most it takes: one weight stays
    assert sum(int(mask.sum()) for mask in kept.values()) == 1


def test_drop_and_regrow_moves_connections_and_keeps_each_layers_sparsity():
    torch.manual_seed(0)
    model = build_model(tiny_config())
    layers = prunable_layers(model)
    masks = MaskSet(layers, random_masks(layers, 0.7, seed=1))
    before = {n: m.clone() for n, m in masks.masks.items()}
    for layer in layers.values():
        layer.weight.grad = torch.randn_like(layer.weight)
    moved = drop_and_regrow(masks, 0.3)
    assert moved > 0
    for name, mask in masks.masks.items():
        assert int(mask.sum()) == int(before[name].sum())  # as many grown as dropped
        grown = mask & ~before[name]
        grad = layers[name].weight.grad.abs()
        if grown.any():  # the grown ones have the largest gradients among those that were inactive
            assert grad[grown].min() >= grad[~before[name] & ~grown].max() - 1e-6


def test_structured_shrinking_keeps_the_function_when_it_removes_dead_channels(tiny_base):
    base = load_bundle(tiny_base)
    model = copy.deepcopy(base.model)
    with torch.no_grad():  # kill channels and a head, so removing exactly them changes nothing
        block = model.decoder.layers[0]
        block.ff.conv1.weight[:12] = 0
        block.ff.conv1.bias[:12] = 0
        dim = block.attn.head_dim
        for proj in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
            proj.weight[dim:] = 0
            proj.bias[dim:] = 0
        block.attn.out_proj.weight[:, dim:] = 0
    plan = channel_plan(model, 0.25, ["decoder.layers.0.ff", "*.attn"], [])  # 12 of 48 channels, 1 of 4 heads
    assert plan["encoder.layers.0.attn"].tolist() == [0, 1]  # the heads are ranked over every block
    assert plan["decoder.layers.0.ff"].tolist() == list(range(12, 48))
    assert plan["decoder.layers.0.attn"].tolist() == [0]  # the dead head went
    smaller = shrink(model, plan)
    assert smaller.decoder.layers[0].ff.conv1.out_channels == 36 and smaller.decoder.layers[0].attn.n_heads == 1
    assert smaller.config.layer_sizes == {
        "decoder.layers.0.ff": 36,
        "encoder.layers.0.attn": 2,
        "decoder.layers.0.attn": 1,
    }
    phonemes = torch.tensor([base.front_end.encode(["The birch canoe slid."])[0]])
    speaker = torch.tensor([0])
    expected = model.eval().infer(phonemes, torch.tensor([phonemes.shape[1]]), speaker)
    got = smaller.infer(phonemes, torch.tensor([phonemes.shape[1]]), speaker)
    assert torch.allclose(got.mel, expected.mel, atol=1e-5)
    assert sum(p.numel() for p in smaller.parameters()) < sum(p.numel() for p in model.parameters())


def test_structured_pruning_makes_a_smaller_model_that_loads(tiny_base, two_voice_corpus, tmp_path):
    folder = pruned(tiny_base, two_voice_corpus, tmp_path, "structured", sparsity=0.5)
    base, result = load_bundle(tiny_base), load_bundle(folder)
    sizes = result.model.config.layer_sizes
    assert sizes["encoder.layers.0.ff"] == 24 and sizes["decoder.layers.0.ff"] == 24
    assert sizes["encoder.layers.0.attn"] == sizes["decoder.layers.0.attn"] == 1  # 2 of 4 heads, one a block
    assert sizes["duration_predictor.conv1"] == sizes["duration_predictor.conv2"] == 8
    assert result.model.decoder.layers[0].ff.conv1.weight.shape == (24, 32, 3)
    info = result.info["pruning"]
    assert info["parameters"] < 0.75 * info["dense_parameters"] and info["layer_sizes"] == sizes
    assert info["layers"]["decoder.layers.0.ff.conv1"] == pytest.approx(0.5)
    assert (folder / "model.safetensors").stat().st_size < 0.8 * (tiny_base / "model.safetensors").stat().st_size
    assert result.model.config.d_model == base.model.config.d_model


def test_bad_layer_sizes_are_refused():
    with pytest.raises(ValueError, match="layer_sizes"):
        tiny_config(layer_sizes={"decoder.layers.0.mlp": 3})
    with pytest.raises(ValueError, match="keeps 3 heads of 2"):
        tiny_config(layer_sizes={"decoder.layers.0.attn": 3})


def test_prune_config_refuses_bad_input(tiny_base, two_voice_corpus, tmp_path):
    with pytest.raises(ValueError, match="unknown pruning technique 'magic'; known: dynamic, parp"):
        PruneConfig(method="magic", sparsity=0.5, out="x", data="y")
    with pytest.raises(ValueError, match="between 0 and 1"):
        PruneConfig(method="ump", sparsity=50, out="x", data="y")
    # A corpus with other speakers than the base's.
    other = tmp_path / "other"
    (other / "solo").mkdir(parents=True)
    for item in (two_voice_corpus / "m3").iterdir():
        (other / "solo" / item.name).symlink_to(item)
    config = PruneConfig(method="ump", sparsity=0.5, out=str(tmp_path / "o"), data=str(other), model=str(tiny_base))
    with pytest.raises(ValueError, match="not the base model's"):
        prune_base(config, progress=False)
    assert not (tmp_path / "o.features.safetensors").exists()  # refused before its features were made


def test_an_exclude_given_leaves_the_default_exclusions_dense(tiny_base, two_voice_corpus, tmp_path):
    """A researcher's probe: --exclude 'decoder.*' had replaced the defaults, and mel_proj was half pruned."""
    out = tmp_path / "pruned"
    result = CliRunner().invoke(
        app,
        [
            "prune", "--method", "ump", "--sparsity", "0.5", "--model", str(tiny_base), "--data",
            str(two_voice_corpus), "--out", str(out), "--steps", "0", "--features", features(tiny_base),
            "--exclude", "decoder.*",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    pruning = json.loads((out / "config.json").read_text())["info"]["pruning"]
    assert pruning["exclude"] == [*DEFAULT_EXCLUDE, "decoder.*"]
    assert not any(name == "mel_proj" or name.startswith("decoder.") for name in pruning["layers"]), pruning["layers"]


@pytest.mark.parametrize("method", ["ump", "structured"])
def test_pruned_base_is_used_like_the_shipped_one(method, tiny_base, two_voice_corpus, new_voice_data, tmp_path):
    runner = CliRunner()
    out = tmp_path / "pruned"
    result = runner.invoke(
        app,
        [
            "prune", "--method", method, "--sparsity", "0.5", "--model", str(tiny_base), "--data",
            str(two_voice_corpus), "--out", str(out), "--steps", "2", "--features", features(tiny_base),
            "--max-frames", "2000",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"{method}: sparsity" in result.output and "MB on disk" in result.output
    # The folder is one model now: the same command again is refused before any work (it had replaced it).
    again = runner.invoke(app, ["prune", "--method", method, "--sparsity", "0.5", "--model", str(tiny_base),
                                "--data", str(two_voice_corpus), "--out", str(out), "--steps", "2"])  # fmt: skip
    said = " ".join(again.output.split())
    assert again.exit_code == 2 and f"--out {out} already holds a model: give another --out, or --overwrite" in said
    wav = tmp_path / "hello.wav"
    result = runner.invoke(app, ["synthesize", "--model", str(out), "--text", "The birch canoe.", "--out", str(wav)])
    assert result.exit_code == 0 and wav.stat().st_size > 1000, result.output
    voice = tmp_path / "voice"
    result = runner.invoke(
        app,
        [
            "adapt",
            str(new_voice_data),
            "--model",
            str(out),
            "--out",
            str(voice),
            "--steps",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    card = json.loads((voice / "voice_card.json").read_text())
    assert card["base_model_sha256"] == load_bundle(out).weights_sha256 != load_bundle(tiny_base).weights_sha256
    from chorus.serving.batcher import Batcher
    from chorus.serving.engine import Engine

    engine = Engine.load(out, "griffin-lim")  # what `chorus serve --model` loads
    engine.add_voice("new", voice)
    batcher = Batcher(engine)
    try:
        spoken = [batcher.submit("The birch canoe.", v) for v in ("new", engine.bundle.default_speaker)]
        assert all(len(f.result(60).audio) > 1000 for f in spoken)
    finally:
        batcher.close()


def test_prune_command_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "prune",
            "--method",
            "ump",
            "--sparsity",
            "0.5",
            "--out",
            str(tmp_path / "x"),
            "--data",
            str(tmp_path / "none"),
        ],
    )
    assert result.exit_code == 2 and "chorus corpus build" in result.output and "Traceback" not in result.output
    # A folder holding anything but a model is never swapped out for one, --overwrite or not.
    (tmp_path / "corpus").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    kept = CliRunner().invoke(app, ["prune", "--method", "ump", "--sparsity", "0.5", "--out", str(tmp_path / "notes"),
                                    "--data", str(tmp_path / "corpus"), "--overwrite"])  # fmt: skip
    said = " ".join(kept.output.split())
    assert kept.exit_code == 2 and "holds files that are not a model (todo.txt)" in said, said
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
