"""Training memory of Chorus's speaker encoder per category, predicted and measured: the accounting
of :mod:`chorus.memory.predict` and :mod:`chorus.memory.measure` (weights, gradients, optimizer
states, activations and what reversible stages rebuild in backward) for one step of
:class:`~chorus.speaker_recognition.encoder.SpeakerClassifier` (encoder + AAM head + loss) on log-mels
``[batch, frames, n_mels]``, float32.

The shadow pass follows :class:`~chorus.speaker_recognition.encoder.SpeakerEncoder.forward` and the AAM
loss op by op, with the rules of torch 2.13 on CPU (a convolution saves its input, group norm its input
and a mean and reciprocal std per sample and group, relu and tanh their results ...), checked against
measurement by ``tests/memory/test_memory_speaker_encoder.py``. A reversible stage keeps only its joined output;
``recompute`` is its largest branch rebuilt in backward, beyond the branch's input.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from chorus.memory.measure import MeasuredMemory, measure_in_fresh_process, measure_training_step
from chorus.memory.predict import (
    MemoryBreakdown,
    ShadowPass,
    ShadowTensor,
    breakdown,
    nbytes,
    register_activation_rule,
)
from chorus.memory.report import MemoryReport, plot_memory
from chorus.speaker_recognition.encoder import (
    AdditiveAngularMargin,
    AttentiveStatisticsPooling,
    BasicBranch,
    DepthFirstBranch,
    ResidualBlock,
    SpeakerClassifier,
    SpeakerEncoder,
    SpeakerEncoderConfig,
    Stage,
)
from chorus.training.speaker_encoder import SPEAKER_OPTIMIZERS, speaker_optimizer

ENCODER_NAME = re.compile(r"^(resnet|df-resnet)(\d+)(-rev)?$")
QUANTIZATION_BLOCK = 256  # bitsandbytes: one float32 absmax per block of 256 values


def encoder_config_by_name(name: str) -> SpeakerEncoderConfig:
    """``resnet18``, ``resnet34-rev``, ``df-resnet179-rev`` ... -> its config (default widths)."""
    match = ENCODER_NAME.match(name)
    if match is None:
        raise ValueError(f"speaker encoder {name!r} is not '{{resnet|df-resnet}}{{depth}}[-rev]', e.g. resnet18-rev")
    arch, depth, rev = match.groups()
    return SpeakerEncoderConfig(arch=arch, depth=int(depth), reversible=rev is not None)


# -- activation rules ------------------------------------------------------------------------------


@register_activation_rule(nn.Conv2d)
def _conv2d(pass_: ShadowPass, conv: nn.Conv2d, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, in, F, T]`` -> ``[batch, out, F', T']``; convolution_backward saves the input
    (and the weight, a parameter) whenever the node exists."""
    requires_grad = x.requires_grad or conv.weight.requires_grad
    if requires_grad:
        pass_.save(x)
    size = [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, p, d, k, s in zip(x.shape[2:], conv.padding, conv.dilation, conv.kernel_size, conv.stride)
    ]
    return pass_.new((x.shape[0], conv.out_channels, *size), x.dtype, requires_grad)


@register_activation_rule(nn.GroupNorm)
def _group_norm(pass_: ShadowPass, norm: nn.GroupNorm, x: ShadowTensor) -> ShadowTensor:
    """native_group_norm saves its input and a float32 mean and rstd ``[batch, groups]``."""
    requires_grad = x.requires_grad or norm.weight.requires_grad
    if requires_grad:
        stats = (x.shape[0], norm.num_groups)
        pass_.save(x, pass_.new(stats, torch.float32), pass_.new(stats, torch.float32))
    return pass_.new(x.shape, x.dtype, requires_grad)


@register_activation_rule(nn.BatchNorm1d)
def _batch_norm(pass_: ShadowPass, norm: nn.BatchNorm1d, x: ShadowTensor) -> ShadowTensor:
    """native_batch_norm in training saves its input and a float32 mean and inverse std per channel."""
    if x.requires_grad:
        stats = (x.shape[1],)
        pass_.save(x, pass_.new(stats, torch.float32), pass_.new(stats, torch.float32))
    return pass_.new(x.shape, x.dtype, x.requires_grad)


@register_activation_rule(nn.ReLU)
def _relu(pass_: ShadowPass, _module: nn.ReLU, x: ShadowTensor) -> ShadowTensor:
    return pass_.relu(x)


@register_activation_rule(nn.Tanh)
def _tanh(pass_: ShadowPass, _module: nn.Tanh, x: ShadowTensor) -> ShadowTensor:
    return pass_.relu(x)  # like relu, tanh saves its result


@register_activation_rule(nn.Sequential)
def _sequential(pass_: ShadowPass, sequence: nn.Sequential, x: ShadowTensor) -> ShadowTensor:
    for module in sequence:
        x = pass_.leaf(module, x)
    return x


@register_activation_rule(BasicBranch)
def _basic_branch(pass_: ShadowPass, branch: BasicBranch, x: ShadowTensor) -> ShadowTensor:
    x = pass_.relu(pass_.leaf(branch.norm1, pass_.leaf(branch.conv1, x)))
    return pass_.leaf(branch.norm2, pass_.leaf(branch.conv2, x))


@register_activation_rule(DepthFirstBranch)
def _depth_first_branch(pass_: ShadowPass, branch: DepthFirstBranch, x: ShadowTensor) -> ShadowTensor:
    x = pass_.relu(pass_.leaf(branch.norm1, pass_.leaf(branch.expand, x)))
    x = pass_.relu(pass_.leaf(branch.norm2, pass_.leaf(branch.depthwise, x)))
    return pass_.leaf(branch.norm3, pass_.leaf(branch.project, x))


@register_activation_rule(ResidualBlock)
def _residual_block(pass_: ShadowPass, block: ResidualBlock, x: ShadowTensor) -> ShadowTensor:
    return pass_.relu(pass_.elementwise(x, pass_.leaf(block.branch, x)))


def _rebuilt(pass_: ShadowPass, branch: nn.Module, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """One branch as backward rebuilds it on a fresh input of ``shape``: raises ``pass_.recompute``
    to what it saves beyond that input."""
    inner = pass_.inner()
    inputs = inner.new(shape, dtype, True)
    inner.leaf(branch, inputs)
    pass_.recompute = max(pass_.recompute, inner.saved_bytes - inputs.storage.nbytes)


@register_activation_rule(Stage)
def _stage(pass_: ShadowPass, stage: Stage, x: ShadowTensor) -> ShadowTensor:
    x = pass_.leaf(stage.transition, x)
    if not stage.reversible:
        for block in stage.blocks:
            x = pass_.leaf(block, x)
        return x
    # The coupling runs without grad inside its autograd function and saves its joined output.
    half = (x.shape[0], x.shape[1] // 2, *x.shape[2:])
    for block in stage.blocks:
        _rebuilt(pass_, block.branch_f, half, x.dtype)
        _rebuilt(pass_, block.branch_g, half, x.dtype)
    requires_grad = x.requires_grad or any(p.requires_grad for p in stage.blocks.parameters())
    out = pass_.new(x.shape, x.dtype, requires_grad)
    if requires_grad and len(stage.blocks):
        pass_.save(out)
    return out if len(stage.blocks) else x


@register_activation_rule(AttentiveStatisticsPooling)
def _pooling(pass_: ShadowPass, pooling: AttentiveStatisticsPooling, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, channels, frames]`` -> ``[batch, 2 * channels]``."""
    batch, channels, _ = x.shape
    weights = pass_.relu(pass_.leaf(pooling.attention, x))  # softmax saves its result, like relu
    mean = pass_.new((batch, channels), x.dtype, True)  # (weights * x).sum(-1)
    pass_.mul(weights, x)
    squared = pass_.mul(x, x)  # x.pow(2) saves x, once
    pass_.mul(weights, squared)
    pass_.save(mean)  # mean.pow(2)
    variance = pass_.new((batch, channels), x.dtype, True)
    pass_.save(variance)  # clamp(min) saves its input
    std = pass_.relu(variance)  # sqrt saves its result
    return pass_.cat(mean, std)


def _normalize(pass_: ShadowPass, x: ShadowTensor) -> ShadowTensor:
    """``F.normalize(x, dim=-1)``: the norm saves its input and result, the division both operands."""
    rows = (*x.shape[:-1], 1)
    norm = pass_.new(rows, x.dtype, x.requires_grad)
    denominator = pass_.new(rows, x.dtype, x.requires_grad)  # clamp_min saves its input, the norm
    if x.requires_grad:
        pass_.save(x, norm, denominator)
    return pass_.new(x.shape, x.dtype, x.requires_grad)


@register_activation_rule(SpeakerEncoder)
def _encoder(pass_: ShadowPass, encoder: SpeakerEncoder, mel: ShadowTensor) -> ShadowTensor:
    """mel ``[batch, frames, n_mels]`` -> unit embeddings ``[batch, embedding_dim]``."""
    batch, frames, n_mels = mel.shape
    centered = pass_.elementwise(mel, pass_.new((batch, 1, n_mels), mel.dtype))
    x = pass_.leaf(encoder.stem, centered.view(batch, 1, n_mels, frames))
    for stage in encoder.stages:
        x = pass_.leaf(stage, x)
    x = x.view(x.shape[0], x.shape[1] * x.shape[2], x.shape[3])
    embedded = pass_.leaf(encoder.embedding, pass_.leaf(encoder.pooling, x))
    return _normalize(pass_, pass_.leaf(encoder.center, embedded))


def _aam_loss(pass_: ShadowPass, head: AdditiveAngularMargin, embeddings: ShadowTensor) -> None:
    """The AAM logits and cross-entropy of ``embeddings`` ``[batch, dim]``."""
    batch = embeddings.shape[0]
    classes = head.weight.shape[0]
    weight = pass_.parameter(head.weight)
    rows = (classes, 1)
    norm, denominator = pass_.new(rows, weight.dtype, True), pass_.new(rows, weight.dtype, True)
    pass_.save(norm, denominator)  # the weight, a parameter, adds nothing
    normalized = pass_.new(tuple(head.weight.shape), weight.dtype, True)
    pass_.save(embeddings, normalized)  # the matmul saves both factors
    cosine, clamped = pass_.new((batch, classes), weight.dtype, True), pass_.new((batch, classes), weight.dtype, True)
    labels = pass_.new((batch,), torch.int64)
    pass_.save(cosine, clamped, labels)  # clamp saves its input, gather its input and both the index
    gathered = pass_.new((batch, 1), weight.dtype, True)
    pass_.save(gathered, pass_.new((batch, 1), weight.dtype))  # acos, then cos of (acos + margin)
    pass_.save(pass_.new((batch, classes), weight.dtype))  # log_softmax saves its result
    pass_.save(pass_.new((), weight.dtype))  # nll_loss: the total weight


# -- weights, gradients, optimizer states ------------------------------------------------------------


def speaker_optimizer_states(parameters: list[torch.Tensor], optimizer: str) -> int:
    """Bytes of optimizer state after the first step (see :func:`~chorus.training.speaker_encoder.speaker_optimizer`).

    adam: two moments like the parameter and a float32 step; sgd: one momentum buffer; adam8bit and
    sgd8bit (bitsandbytes, every tensor in 8 bits): uint8 states and a float32 absmax per block of 256
    values per state, and the quantile maps (256 float32 each) shared by all tensors.
    """
    if optimizer not in SPEAKER_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r} (known: {', '.join(SPEAKER_OPTIMIZERS)})")
    states = 2 if optimizer.startswith("adam") else 1
    if optimizer == "adam":
        return sum(2 * nbytes(p) + 4 for p in parameters)
    if optimizer == "sgd":
        return sum(nbytes(p) for p in parameters)
    per_tensor = sum(states * (p.numel() + 4 * math.ceil(p.numel() / QUANTIZATION_BLOCK)) for p in parameters)
    return per_tensor + (states * 4 * 256 if parameters else 0)


def predict_speaker_memory(
    config: SpeakerEncoderConfig, *, speakers: int, batch: int, frames: int, optimizer: str = "adam"
) -> MemoryBreakdown:
    """Predict one training step of ``config`` with an AAM head over ``speakers`` on ``batch`` crops of
    ``frames`` mel frames, without running it (the model is built on ``meta``: any depth is free)."""
    with torch.device("meta"):
        model = SpeakerClassifier(SpeakerEncoder(config), speakers)
    pass_ = ShadowPass()
    embeddings = pass_.leaf(model.encoder, pass_.new((batch, frames, config.n_mels), torch.float32))
    _aam_loss(pass_, model.head, embeddings)
    parameters = list(model.parameters())  # all of them train
    return breakdown(model, parameters, speaker_optimizer_states(parameters, optimizer), pass_)


def measure_speaker_step(
    config: SpeakerEncoderConfig,
    *,
    speakers: int,
    batch: int,
    frames: int,
    optimizer: str = "adam",
    device: str = "cpu",
    seed: int = 0,
    warmup: bool = True,
) -> MeasuredMemory:
    """Build the encoder and head for real and measure one step on random log-mels and labels.

    ``warmup`` first runs a toy step with the same optimizer, so that one-time costs (bitsandbytes'
    import, thread pools) stay out of the measured peak."""
    if warmup:
        toy = SpeakerEncoderConfig(arch="resnet", depth=10, reversible=config.reversible, n_mels=config.n_mels)
        measure_speaker_step(toy, speakers=2, batch=2, frames=16, optimizer=optimizer, device=device, warmup=False)
    torch.manual_seed(seed)
    model = SpeakerClassifier(SpeakerEncoder(config), speakers).to(device).train()
    generator = torch.Generator().manual_seed(seed)
    inputs = {
        "mel": torch.randn(batch, frames, config.n_mels, generator=generator).to(device),
        "labels": torch.randint(0, speakers, (batch,), generator=generator).to(device),
    }
    return measure_training_step(
        model,
        inputs,
        lambda loss, _inputs: loss,
        speaker_optimizer(list(model.parameters()), optimizer, lr=1e-3, weight_decay=0.0),
    )


def speaker_memory_report(
    config: SpeakerEncoderConfig,
    *,
    speakers: int = 256,
    batch: int = 32,
    frames: int = 200,
    optimizer: str = "adam",
    measure: bool = False,
    fresh_process: bool = False,
    out_png=None,
    label: str = "",
) -> MemoryReport:
    """Predict (and with ``measure`` also measure) one training step of the speaker encoder."""
    settings = {"speakers": speakers, "batch": batch, "frames": frames, "optimizer": optimizer}
    predicted = predict_speaker_memory(config, **settings)
    measured = None
    if measure:
        if fresh_process:
            measured = measure_in_fresh_process(config, step=measure_speaker_step, **settings)
        else:
            measured = measure_speaker_step(config, **settings)
    with torch.device("meta"):
        model = SpeakerClassifier(SpeakerEncoder(config), speakers)
    parameters = sum(p.numel() for p in model.parameters())
    label = label or f"{config.arch}{config.depth}{'-rev' if config.reversible else ''} ({optimizer})"
    report = MemoryReport(label, predicted, measured, parameters, parameters, settings)
    if out_png is not None:
        report.png = plot_memory([(label, predicted, measured)], out_png)
    return report
