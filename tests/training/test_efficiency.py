"""Memory-efficient training options: checkpointing, reversible blocks, bf16 autocast, 8-bit AdamW."""

from __future__ import annotations

import math

import pytest
import torch

from chorus.memory import predicted_optimizer_states
from chorus.models.acoustic import (
    AcousticModel,
    TransformerStack,
    build_model,
    lengths_to_mask,
)
from chorus.models.losses import compute_losses
from chorus.recipe import OPTIMIZERS, AdaptConfig, MemoryOptions
from chorus.training.efficiency import (
    apply_memory_options,
    autocast,
    build_optimizer,
    optimizer_state_bytes,
)
from conftest import grads, saved_bytes, tiny_batch, tiny_config, tiny_model


def total_loss(model: AcousticModel, batch: dict) -> torch.Tensor:
    out = model(**batch)
    return compute_losses(model, out, batch["mel"], batch["text_lengths"])["total"]


# -- activation checkpointing ------------------------------------------------------------------


def test_checkpointing_gives_the_same_loss_and_gradients_and_stores_less():
    model, batch = tiny_model(), tiny_batch()
    plain_bytes, plain_loss = saved_bytes(lambda: total_loss(model, batch))
    plain_loss.backward()
    plain_grads = grads(model)
    model.zero_grad(set_to_none=True)

    apply_memory_options(model, MemoryOptions(checkpointing=True))
    assert model.encoder.gradient_checkpointing and model.decoder.gradient_checkpointing
    checkpointed_bytes, loss = saved_bytes(lambda: total_loss(model, batch))
    loss.backward()

    torch.testing.assert_close(loss, plain_loss)
    assert grads(model).keys() == plain_grads.keys()
    for name, grad in grads(model).items():
        torch.testing.assert_close(grad, plain_grads[name], msg=name)
    assert checkpointed_bytes < 0.7 * plain_bytes


def test_checkpointing_is_off_without_grad_and_not_saved():
    model = tiny_model()
    apply_memory_options(model, MemoryOptions(checkpointing=True))
    batch = tiny_batch()
    with torch.no_grad():
        out = model.infer(batch["phonemes"], batch["text_lengths"], speaker_ids=batch["speaker_ids"])
    assert torch.isfinite(out.mel).all()
    assert set(model.state_dict()) == set(tiny_model().state_dict())


# -- reversible blocks -------------------------------------------------------------------------


def coupled_reference(stack: TransformerStack, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The reversible stack's function, written out for plain autograd (stores every activation)."""
    x = x + stack.positions(x.shape[1], x.device).to(x.dtype)
    x1 = x2 = x
    for block in stack.layers:
        x1 = x1 + block.attention_branch(x2, mask)
        x2 = x2 + block.feed_forward_branch(x1, mask)
    return stack.norm((x1 + x2) / 2) * mask.unsqueeze(-1).to(x.dtype)


# Adapters freeze the base and train a few tensors; "all" trains everything.
TRAINABLE = {
    "all": lambda name: True,
    "adapter-like": lambda name: name in ("layers.0.attn.q_proj.weight", "layers.2.ff.conv2.bias", "norm.weight"),
    "half": lambda name: "attn" in name,
}


@pytest.mark.parametrize("trainable", sorted(TRAINABLE))
@pytest.mark.parametrize("input_grad", [True, False])
def test_reversible_stack_gradients_are_exact(trainable, input_grad):
    torch.manual_seed(0)
    stack = TransformerStack(tiny_config(reversible=True), n_layers=3).double()
    for name, p in stack.named_parameters():
        p.requires_grad_(TRAINABLE[trainable](name))
    x = torch.randn(2, 9, 32, dtype=torch.float64, requires_grad=input_grad)
    mask = lengths_to_mask(torch.tensor([9, 6]), 9)
    weight = torch.randn(2, 9, 32, dtype=torch.float64)

    out = stack(x, mask)
    (out * weight).sum().backward()
    ours, ours_x = grads(stack), x.grad
    stack.zero_grad(set_to_none=True)
    x.grad = None
    reference = coupled_reference(stack, x, mask)
    (reference * weight).sum().backward()

    torch.testing.assert_close(out, reference)
    assert ours.keys() == grads(stack).keys() == {n for n, p in stack.named_parameters() if p.requires_grad}
    for name, grad in grads(stack).items():
        torch.testing.assert_close(ours[name], grad, msg=name)
    if input_grad:
        torch.testing.assert_close(ours_x, x.grad)
    else:
        assert ours_x is None


def test_reversible_stack_under_bf16_autocast_matches_plain_autograd():
    # Backward must rebuild F and G in bf16 as forward ran them; rebuilt in float32 (the autograd
    # engine does not carry autocast over) the parameter gradients come out wrong by ~100%.
    torch.manual_seed(0)
    stack = TransformerStack(tiny_config(reversible=True), n_layers=4)
    x = torch.randn(2, 16, 32, requires_grad=True)
    mask = lengths_to_mask(torch.tensor([16, 11]), 16)
    weight = torch.randn(2, 16, 32)
    with autocast("bf16", "cpu"):
        out = stack(x, mask)
    (out.float() * weight).sum().backward()
    ours, ours_x = grads(stack), x.grad
    stack.zero_grad(set_to_none=True)
    x.grad = None
    with autocast("bf16", "cpu"):
        reference = coupled_reference(stack, x, mask)
    (reference.float() * weight).sum().backward()
    for name, grad in grads(stack).items():
        assert (ours[name] - grad).abs().max() <= 1e-2 * grad.abs().max(), name
    assert (ours_x - x.grad).abs().max() <= 1e-2 * x.grad.abs().max()


def test_reversible_saved_bytes_do_not_grow_with_depth():
    x = torch.randn(2, 16, 32, requires_grad=True)
    mask = lengths_to_mask(torch.tensor([16, 11]), 16)

    def stack_bytes(reversible: bool, depth: int) -> int:
        torch.manual_seed(0)
        stack = TransformerStack(tiny_config(reversible=reversible), n_layers=depth)
        return saved_bytes(lambda: stack(x, mask))[0]

    reversible = [stack_bytes(True, depth) for depth in (1, 2, 4)]
    plain = [stack_bytes(False, depth) for depth in (1, 2, 4)]
    assert reversible[0] == reversible[1] == reversible[2]
    assert plain[0] < plain[1] < plain[2]
    assert reversible[2] < plain[2] / 3


def test_reversible_keeps_parameter_names_and_matches_without_grad():
    plain, model = tiny_model(), tiny_model(reversible=True)
    assert list(model.state_dict()) == list(plain.state_dict())
    assert "encoder.layers.0.attn.q_proj.weight" in model.state_dict()
    batch = tiny_batch()
    with torch.no_grad():
        without_grad = model(**batch).mel
    torch.testing.assert_close(model(**batch).mel, without_grad)


def test_reversible_model_trains():
    model, batch = tiny_model(reversible=True), tiny_batch()
    optimizer = build_optimizer(model.parameters(), "adamw", lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(6):
        loss = total_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(value) for value in losses)
    assert losses[-1] < losses[0] - 0.1


def test_reversible_refuses_dropout_and_an_unreversible_base():
    with pytest.raises(ValueError, match="dropout"):
        tiny_config(reversible=True, dropout=0.1)
    with pytest.raises(ValueError, match="reversible=True"):
        apply_memory_options(tiny_model(), MemoryOptions(reversible=True))
    with pytest.raises(ValueError, match="reversible"):
        apply_memory_options(tiny_model(reversible=True), MemoryOptions(checkpointing=True))
    apply_memory_options(tiny_model(reversible=True), MemoryOptions(reversible=True))


# -- bf16 autocast -----------------------------------------------------------------------------


@pytest.mark.parametrize("reversible", [False, True])
def test_bf16_training_step_is_finite(reversible):
    model, batch = tiny_model(reversible=reversible), tiny_batch()
    dtypes = []
    model.decoder.layers[0].attn.q_proj.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    with autocast("bf16", "cpu"):
        out = model(**batch)
        loss = compute_losses(model, out, batch["mel"], batch["text_lengths"])["total"]
    loss.backward()
    assert dtypes[0] == torch.bfloat16, "the blocks ran in bf16"
    assert math.isfinite(loss.item())
    assert out.durations.sum(-1).tolist() == batch["frame_lengths"].tolist()
    assert all(torch.isfinite(g).all() for g in grads(model).values())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        fp32_loss = total_loss(model, batch)
    assert abs(loss.item() - fp32_loss.item()) < 0.05 * abs(fp32_loss.item())


def test_fp32_autocast_is_a_no_op_and_unknown_precision_fails():
    with autocast("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="fp32, bf16"):
        autocast("fp16", "cpu")


# -- optimizers --------------------------------------------------------------------------------


def fit_weight(name: str, steps: int = 5) -> tuple[list[float], torch.optim.Optimizer, torch.nn.Parameter]:
    """A few optimizer steps regressing a 256x256 weight onto a target (65,536 values)."""
    torch.manual_seed(0)
    weight, target = torch.nn.Parameter(torch.randn(256, 256)), torch.randn(256, 256)
    optimizer = build_optimizer([weight], name, lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        loss = (weight - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, optimizer, weight


def test_adamw8bit_steps_on_cpu_with_a_quarter_of_the_state():
    pytest.importorskip("bitsandbytes")
    losses, optimizer, weight = fit_weight("adamw8bit")
    full_losses, full_optimizer, _ = fit_weight("adamw")
    assert weight.device.type == "cpu"
    assert losses[-1] < losses[0] - 0.05
    assert abs(losses[-1] - full_losses[-1]) < 0.01, "same update up to quantization"
    assert optimizer.state[weight]["state1"].dtype == torch.uint8
    # 2 x 65,536 uint8 moments + block scales and maps, against 2 x 65,536 float32 moments.
    assert optimizer_state_bytes(optimizer) < 0.3 * optimizer_state_bytes(full_optimizer)
    assert optimizer_state_bytes(full_optimizer) >= 2 * 256 * 256 * 4


def test_adamw8bit_quantizes_small_tensors_too():
    # bitsandbytes' default min_8bit_size (4096) would leave every adapter tensor in float32; ours is 1,
    # so a LoRA-sized matrix, a bias and a single value all get uint8 moments and block scales.
    bitsandbytes = pytest.importorskip("bitsandbytes")
    tensors = [
        torch.nn.Parameter(torch.randn(4, 256)),
        torch.nn.Parameter(torch.randn(6)),
        torch.nn.Parameter(torch.randn(1)),
    ]
    optimizer = build_optimizer(tensors, "adamw8bit", lr=1e-2, weight_decay=0.0)
    assert isinstance(optimizer, bitsandbytes.optim.AdamW8bit)
    sum(t.sum() for t in tensors).backward()
    optimizer.step()
    for tensor in tensors:
        assert optimizer.state[tensor]["state1"].dtype == optimizer.state[tensor]["state2"].dtype == torch.uint8
    # 2 bytes per value + two float32 scales per block of 256, + the two shared 256-entry quantile maps.
    blocks = 4 + 1 + 1  # 4 x 256 fills four blocks; 6 values and 1 value one (partial) block each
    assert optimizer_state_bytes(optimizer) == 2 * (1024 + 6 + 1) + 2 * 4 * blocks + 2 * 4 * 256
    assert optimizer_state_bytes(optimizer) == predicted_optimizer_states(tensors, "adamw8bit")


def test_torchao_optimizer_builds():
    # Its first step compiles (seconds); stepping it is measured outside the test suite.
    optim = pytest.importorskip("torchao.optim")
    weight = torch.nn.Parameter(torch.randn(64, 64))
    assert isinstance(build_optimizer([weight], "adamw8bit-torchao", lr=1e-3, weight_decay=0.0), optim.AdamW8bit)


def test_optimizer_groups_and_unknown_names():
    a, b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    optimizer = build_optimizer(
        [{"params": [a]}, {"params": [b], "weight_decay": 0.0}], "adamw", lr=1e-3, weight_decay=0.1
    )
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.98) and optimizer.param_groups[0]["eps"] == 1e-9
    assert optimizer_state_bytes(optimizer) == 0, "no state before the first step"
    with pytest.raises(ValueError, match="adamw, adamw8bit, adamw8bit-torchao"):
        build_optimizer([a], "sgd", lr=1e-3, weight_decay=0.0)


# -- options -----------------------------------------------------------------------------------


def test_memory_options_validate_and_explain_themselves():
    assert set(MemoryOptions.help()) == {"optimizer", "checkpointing", "reversible", "precision", "frozen_dtype"}
    assert all(text and "\n" not in text for text in MemoryOptions.help().values())
    assert set(OPTIMIZERS) == {"adamw", "adamw8bit", "adamw8bit-torchao"}
    for bad in (
        {"optimizer": "adam"},
        {"precision": "fp16"},
        {"checkpointing": True, "reversible": True},
        {"frozen_dtype": "fp16"},
        {"frozen_dtype": "bf16", "precision": "fp32"},
        {"frozen_dtype": "int8", "precision": "fp32"},
    ):
        with pytest.raises(ValueError, match="MemoryOptions"):
            MemoryOptions(**bad)


def test_bf16_frozen_base_keeps_layer_norms_and_the_voice_in_float32():
    from chorus.adapters import parse_methods
    from chorus.adapters.inject import adapter_tensors
    from chorus.training.adapt import prepare_for_training
    from chorus.training.efficiency import cast_frozen_parameters

    model = build_model(tiny_config())
    trained = prepare_for_training(model, AdaptConfig(methods=parse_methods("bitfit")))
    cast_frozen_parameters(model, torch.bfloat16)
    norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    # The voice's speaker vector, which this method does not train, is the voice's too: it stays as it started
    voice = {id(p) for p in adapter_tensors(model)}
    assert any(not p.requires_grad for p in adapter_tensors(model))
    for parameter in model.parameters():
        kept = parameter.requires_grad or id(parameter) in norms | voice
        expected = torch.float32 if kept else torch.bfloat16
        assert parameter.dtype == expected
    assert all(p.dtype == torch.float32 for p in trained)


def test_bitsandbytes_is_imported_without_its_hub_kernel_warning():
    """bitsandbytes' CPU backend logs that it could not fetch a kernel from the Hugging Face Hub ("Failed to load
    CPU gemm_4bit_forward from kernels-community ..."), which a user of `--optimizer adamw8bit` read as an
    error; Chorus fetches nothing at run time and needs no such kernel. In a fresh process, as a command runs."""
    import subprocess
    import sys

    code = (
        "import torch; from chorus.training.efficiency import build_optimizer; "
        "build_optimizer([torch.nn.Parameter(torch.zeros(8))], 'adamw8bit', lr=1e-3, weight_decay=0.0); print('built')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "built" in done.stdout, done.stderr
    assert "Failed to load CPU gemm_4bit_forward" not in done.stderr + done.stdout, done.stderr
