"""Training memory of one step of Piper voice adaptation per category, predicted and measured: the
accounting of :mod:`chorus.memory.predict` and :mod:`chorus.memory.measure` (weights, gradients,
optimizer states, activations) for one step of the ``posterior`` recipe
(:func:`~chorus.training.piper_adapt.posterior_step_terms`) on a
:class:`~chorus.models.piper_vits.PiperGenerator` with a voice attached at any placement of
:data:`~chorus.training.piper_adapt.PLACEMENTS`, or fully fine-tuned, float32 on CPU.

The step: the posterior encoder reads ``batch`` clips of ``frames`` latent frames (``frames * hop``
samples) into their latents; the flow carries them to the prior's space, where the KL to the text
encoder's Gaussians (``text_length`` phoneme ids) along the monotonic alignment judges them; the
decoder renders one window of ``segment_frames + 2 * context_frames`` frames per clip, judged by
the log-mel L1 and the multi-resolution STFT loss.

The shadow pass follows the step op by op with the rules of torch 2.13 on CPU (a convolution saves
its input whenever its node exists, leaky ReLU its input, tanh, sigmoid, exp and softmax their
results, abs its input, complex or real, the FFT its windowed frames, gather its input and index, a
division by a tensor that tensor ...), checked against measurement by
``tests/memory/test_memory_piper.py``. A multiplication or division by a Python number saves no
tensor autograd's hooks see; the alignment search runs without gradients and saves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

import torch
from torch import nn

from chorus.memory.measure import MeasuredMemory, measure_in_fresh_process, measure_training_step
from chorus.memory.predict import MemoryBreakdown, ShadowPass, ShadowTensor, breakdown, nbytes, register_activation_rule
from chorus.memory.report import MemoryReport, plot_memory
from chorus.models.piper_posterior import CONFIG, PosteriorConfig, PosteriorEncoder
from chorus.models.piper_vits import (
    CouplingLayer,
    Decoder,
    FeedForward,
    Flip,
    PiperGenerator,
    PiperVitsConfig,
    RelativeAttention,
    ResBlock,
    TextEncoder,
    WaveNet,
)
from chorus.models.piper_vits import LayerNorm as ChannelLayerNorm
from chorus.training.piper_adapt import (
    SHIPPED_POSTERIOR,
    STFT_RESOLUTIONS,
    Clip,
    PiperAdaptConfig,
    SegmentLoss,
    attach_voice,
    load_posterior,
    posterior_optimizer,
    posterior_step_terms,
)

# -- activation rules ------------------------------------------------------------------------------


@register_activation_rule(nn.ConvTranspose1d)
def _conv_transpose1d(pass_: ShadowPass, conv: nn.ConvTranspose1d, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, in, length]`` -> ``[batch, out, (length - 1) * stride - 2 * padding + dilation * (kernel
    - 1) + output_padding + 1]``; convolution_backward saves the input (and the weight) whenever the node
    exists."""
    requires_grad = x.requires_grad or conv.weight.requires_grad or (conv.bias is not None and conv.bias.requires_grad)
    if requires_grad:
        pass_.save(x)
    (stride,), (padding,), (dilation,), (extra,) = conv.stride, conv.padding, conv.dilation, conv.output_padding
    length = (x.shape[-1] - 1) * stride - 2 * padding + dilation * (conv.kernel_size[0] - 1) + extra + 1
    return pass_.new((x.shape[0], conv.out_channels, length), x.dtype, requires_grad)


def _saves_input(pass_: ShadowPass, x: ShadowTensor) -> ShadowTensor:
    """An elementwise op that saves its input (leaky ReLU, log, clamp, pow): a new tensor of x's shape."""
    if x.requires_grad:
        pass_.save(x)
    return pass_.new(x.shape, x.dtype, x.requires_grad)


def _masked(pass_: ShadowPass, x: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    """``x * mask`` with a mask that needs no gradient: the mask is saved."""
    return pass_.mul(x, mask)


def _wavenet(pass_: ShadowPass, wavenet: WaveNet, x: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    """x ``[batch, channels, frames]``, mask ``[batch, 1, frames]`` -> the masked skip sum, same shape.
    Per layer the gate's halves are views; tanh and sigmoid save their results, their product saves
    both (already saved) and is the input the res-skip convolution saves."""
    output = pass_.new(x.shape, x.dtype)  # zeros_like(x)
    last = len(wavenet.in_layers) - 1
    for i, (in_layer, res_skip) in enumerate(zip(wavenet.in_layers, wavenet.res_skip_layers)):
        gate = pass_.leaf(in_layer, x)  # [batch, 2 * channels, frames]: each half a view of x's shape
        activated = pass_.mul(pass_.relu(gate.view(*x.shape)), pass_.relu(gate.view(*x.shape)))  # tanh, sigmoid
        acts = pass_.leaf(res_skip, activated)
        if i < last:
            x = _masked(pass_, pass_.elementwise(x, acts.view(*x.shape)), mask)
        output = pass_.elementwise(output, acts.view(*x.shape))
    return _masked(pass_, output, mask)


def _posterior(
    pass_: ShadowPass, posterior: PosteriorEncoder, batch: int, frames: int
) -> tuple[ShadowTensor, ShadowTensor, ShadowTensor]:
    """The posterior encoder on ``batch`` clips of ``frames`` frames -> (z, logs ``[batch, inter,
    frames]``, the float frame mask ``[batch, 1, frames]``). The spectrogram needs no gradient; the
    draw ``m + noise * exp(logs)`` saves the exp's result and the noise."""
    config = posterior.config
    spectrogram = pass_.new((batch, config.bins, frames), torch.float32)  # log(|STFT|)
    mask = pass_.new((batch, 1, frames), torch.float32)
    hidden = _wavenet(pass_, posterior.enc, _masked(pass_, pass_.leaf(posterior.pre, spectrogram), mask), mask)
    stats = _masked(pass_, pass_.leaf(posterior.proj, hidden), mask)  # m, logs: views of its halves
    inter = (batch, config.inter_channels, frames)
    m, logs = stats.view(*inter), stats.view(*inter)
    spread = pass_.relu(logs)  # exp saves its result
    z = _masked(pass_, pass_.elementwise(m, pass_.mul(pass_.new(inter, torch.float32), spread)), mask)
    return z, logs, mask


def _coupling_encode(pass_: ShadowPass, layer: CouplingLayer, z: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    """The training direction of one mean-only coupling: z ``[batch, inter, frames]`` -> same shape.
    Its halves are views of z; the shifted half is joined to the other by cat (a new tensor, nothing
    saved); ``sign * shift`` multiplies by a Python number."""
    batch, inter, frames = z.shape
    z0, z1 = z.view(batch, inter // 2, frames), z.view(batch, inter // 2, frames)
    hidden = _wavenet(pass_, layer.enc, _masked(pass_, pass_.leaf(layer.pre, z0), mask), mask)
    shift = _masked(pass_, pass_.leaf(layer.post, hidden), mask)
    shifted = _masked(pass_, pass_.elementwise(z1, shift), mask)
    return pass_.cat(z0, shifted)


def _flow_encode(pass_: ShadowPass, generator: PiperGenerator, z: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    """z -> z_p through every coupling and flip (torch.flip: a new tensor, nothing saved)."""
    for flow in generator.flow.flows:
        if isinstance(flow, CouplingLayer):
            z = _coupling_encode(pass_, flow, z, mask)
        elif isinstance(flow, Flip):
            z = pass_.new(z.shape, z.dtype, z.requires_grad)
        else:
            raise TypeError(f"no activation rule for the flow's {type(flow).__name__}")
    return z


def _prior_kl(
    pass_: ShadowPass,
    z_p: ShadowTensor,
    logs_q: ShadowTensor,
    m_p: ShadowTensor,
    logs_p: ShadowTensor,
    mask: ShadowTensor,
) -> None:
    """The prior expanded to frames along the alignment (``[batch, inter, text] @ path [batch, text,
    frames]``: the path, no gradient, is saved when the prior needs one), then
    :func:`~chorus.training.piper_adapt.prior_kl`: pow saves ``z_p - m_p``; ``0.5 * pow`` (a Python
    number) times ``exp(-2 logs_p)`` saves each factor the other's gradient needs, exp its result; the
    masked sum is divided by ``mask.sum()``, a new 0-dim tensor it saves."""
    batch, _, frames = z_p.shape
    path = pass_.new((batch, m_p.shape[2], frames), torch.float32)
    m_p, logs_p = pass_.bmm(m_p, path), pass_.bmm(logs_p, path)
    kl = pass_.elementwise(logs_p, logs_q)  # logs_p - logs_q - 0.5
    squared = _saves_input(pass_, pass_.elementwise(z_p, m_p))
    scaled = pass_.new(squared.shape, squared.dtype, squared.requires_grad)
    spread = pass_.relu(pass_.new(logs_p.shape, logs_p.dtype, logs_p.requires_grad))  # exp saves its result
    kl = pass_.elementwise(kl, pass_.mul(scaled, spread))
    if _masked(pass_, kl, mask).requires_grad:
        pass_.save(pass_.new((), mask.dtype))


# -- the text encoder (mirrors chorus.models.piper_vits.TextEncoder) -----------------------------------


@register_activation_rule(ChannelLayerNorm)
def _channel_layer_norm(pass_: ShadowPass, norm: ChannelLayerNorm, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, channels, time]`` normalized over channels through a transposed view: layer norm saves
    that view (x's storage) and a float32 mean and rstd ``[batch, time, 1]``."""
    batch, channels, time = x.shape
    return pass_.layer_norm(x.view(batch, time, channels), 1, norm.gamma, norm.beta).view(batch, channels, time)


def _gather_in_window(
    pass_: ShadowPass, x: ShadowTensor, shape: tuple[int, ...], table: tuple[int, int]
) -> ShadowTensor:
    """``x.gather(3, index) * in_window``, RelativeAttention's moves between relative and absolute
    positions: x ``[batch, heads, time, n]`` -> ``shape``. The index (int64) and the bool window are
    ``table`` tensors expanded; gather saves x and the index, the product the bool window."""
    if x.requires_grad:
        pass_.save(x, pass_.new(table, torch.int64))
    return pass_.mul(pass_.new(shape, x.dtype, x.requires_grad), pass_.new(table, torch.bool))


@register_activation_rule(RelativeAttention)
def _relative_attention(pass_: ShadowPass, attn: RelativeAttention, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, channels, time]`` -> same shape; the attention mask is implied by x's shape. Heads are
    views of the 1x1 convolutions' outputs (the query divided by a Python number: a new tensor); every
    product is a bmm over ``batch * heads`` (the relative embeddings broadcast as views of themselves);
    masked_fill saves its bool mask ``[batch, 1, time, time]``, softmax its result; the heads merged back
    are a copy, which the output convolution saves."""
    batch, channels, time = x.shape
    heads, width, window = attn.n_heads, attn.k_channels, 2 * attn.window_size + 1
    rows = batch * heads
    q = pass_.leaf(attn.conv_q, x)
    query = pass_.new((rows, time, width), q.dtype, q.requires_grad)
    key = pass_.leaf(attn.conv_k, x).view(rows, width, time)
    value = pass_.leaf(attn.conv_v, x).view(rows, time, width)
    relative_key = pass_.parameter(attn.emb_rel_k).view(rows, width, window)
    relative_logits = pass_.bmm(query, relative_key).view(batch, heads, time, window)
    absolute = _gather_in_window(pass_, relative_logits, (batch, heads, time, time), (time, time))
    scores = pass_.elementwise(pass_.bmm(query, key), absolute.view(rows, time, time))
    if scores.requires_grad:
        pass_.save(pass_.new((batch, 1, time, time), torch.bool))
    weights = pass_.relu(pass_.new(scores.shape, scores.dtype, scores.requires_grad))  # softmax
    relative = _gather_in_window(
        pass_, weights.view(batch, heads, time, time), (batch, heads, time, window), (time, window)
    )
    relative_value = pass_.parameter(attn.emb_rel_v).view(rows, window, width)
    out = pass_.elementwise(pass_.bmm(weights, value), pass_.bmm(relative.view(rows, time, window), relative_value))
    return pass_.leaf(attn.conv_o, pass_.new((batch, channels, time), out.dtype, out.requires_grad))


def _pad(pass_: ShadowPass, x: ShadowTensor, padding: tuple[int, int]) -> ShadowTensor:
    """``F.pad`` with zeros on the last axis: a new tensor, nothing saved."""
    return pass_.new((*x.shape[:-1], x.shape[-1] + sum(padding)), x.dtype, x.requires_grad)


def _feed_forward(pass_: ShadowPass, ffn: FeedForward, x: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    """x ``[batch, channels, time]`` -> same shape: masked, padded, conv, relu (saves its result), masked,
    padded, conv, masked."""
    hidden = pass_.relu(pass_.leaf(ffn.conv_1, _pad(pass_, _masked(pass_, x, mask), ffn.padding)))
    return _masked(pass_, pass_.leaf(ffn.conv_2, _pad(pass_, _masked(pass_, hidden, mask), ffn.padding)), mask)


def _text_encoder(pass_: ShadowPass, encoder: TextEncoder, batch: int, text: int) -> tuple[ShadowTensor, ShadowTensor]:
    """ids ``[batch, text]`` and the text mask ``[batch, 1, text]`` -> the prior's m_p and logs_p
    ``[batch, inter, text]`` (views of one tensor). With nothing of it trained, nothing is saved."""
    mask = pass_.new((batch, 1, text), torch.float32)
    embedded = pass_.leaf(encoder.emb, pass_.new((batch, text), torch.int64))
    # Transposed to [batch, hidden, text] and scaled by a Python number: a new tensor.
    x = _masked(pass_, pass_.new((batch, embedded.shape[2], text), embedded.dtype, embedded.requires_grad), mask)
    stack = encoder.encoder
    x = _masked(pass_, x, mask)
    for attn, norm_1, ffn, norm_2 in zip(stack.attn_layers, stack.norm_layers_1, stack.ffn_layers, stack.norm_layers_2):
        x = pass_.leaf(norm_1, pass_.elementwise(x, pass_.leaf(attn, x)))
        x = pass_.leaf(norm_2, pass_.elementwise(x, _feed_forward(pass_, ffn, x, mask)))
    stats = _masked(pass_, pass_.leaf(encoder.proj, _masked(pass_, x, mask)), mask)
    inter = (batch, stats.shape[1] // 2, text)
    return stats.view(*inter), stats.view(*inter)


def _resblock(pass_: ShadowPass, block: ResBlock, x: ShadowTensor) -> ShadowTensor:
    """A HiFi-GAN residual block without a mask, stage by stage: each convolution's leaky ReLU saves its
    input, the convolution the leaky ReLU's output; the stage's output is added to x."""
    stages = zip(block.convs1, block.convs2) if block.kind == "1" else ((conv,) for conv in block.convs)
    for stage in stages:
        y = x
        for conv in stage:
            y = pass_.leaf(conv, _saves_input(pass_, y))
        x = pass_.elementwise(x, y)
    return x


@register_activation_rule(Decoder)
def _decoder(pass_: ShadowPass, decoder: Decoder, z: ShadowTensor) -> ShadowTensor:
    """z ``[batch, inter, frames]`` (no lengths, no masks) -> audio ``[batch, frames * hop]`` (a view
    of tanh's result, which tanh saves). The blocks' mean divides by a Python number."""
    x = pass_.leaf(decoder.conv_pre, z)
    for i, up in enumerate(decoder.ups):
        x = pass_.leaf(up, _saves_input(pass_, x))
        blocks = decoder.resblocks[i * decoder.kernels : (i + 1) * decoder.kernels]
        outputs = [_resblock(pass_, block, x) for block in blocks]
        x = outputs[0]
        for output in outputs[1:]:
            x = pass_.elementwise(x, output)
    audio = pass_.relu(pass_.leaf(decoder.conv_post, _saves_input(pass_, x)))  # tanh saves its result
    return audio.view(audio.shape[0], audio.shape[2])


def _stft_magnitude(pass_: ShadowPass, audio: ShadowTensor, n_fft: int, hop: int, window: ShadowTensor) -> ShadowTensor:
    """``torch.stft(center=True, reflect) .abs()`` of audio ``[batch, samples]`` -> ``[batch, n_fft // 2 + 1,
    samples // hop + 1]``: the reflect pad saves its input (the audio), the product of the frames and
    the window saves the window, the real FFT its windowed frames ``[batch, frames, n_fft]``, abs the
    complex spectrum."""
    batch, samples = audio.shape
    frames, bins = samples // hop + 1, n_fft // 2 + 1
    if audio.requires_grad:
        pass_.save(audio)
    windowed = pass_.mul(pass_.new((batch, frames, n_fft), audio.dtype, audio.requires_grad), window)
    if windowed.requires_grad:
        pass_.save(windowed)
    spectrum = pass_.new((batch, frames, bins), torch.complex64, audio.requires_grad)
    if spectrum.requires_grad:
        pass_.save(spectrum)
    return pass_.new((batch, bins, frames), audio.dtype, audio.requires_grad)


def _l1(pass_: ShadowPass, a: ShadowTensor) -> None:
    """``F.l1_loss(a, target)``: abs saves the difference (a new tensor); the mean saves nothing."""
    _saves_input(pass_, pass_.elementwise(a, pass_.new(a.shape, a.dtype)))


def _segment_loss(pass_: ShadowPass, loss: SegmentLoss, generated: ShadowTensor) -> None:
    """:class:`~chorus.training.piper_adapt.SegmentLoss` of generated audio ``[batch, samples]`` against
    a target that needs no gradient."""
    mel = loss.mel
    window = pass_.parameter(mel.window)  # a buffer: saving it adds nothing
    magnitude = _stft_magnitude(pass_, generated, mel.config.n_fft, mel.config.hop_length, window)
    batch, _, frames = magnitude.shape
    # The mel basis is a buffer; matmul saves it (for the magnitude's gradient) and nothing else.
    mels = pass_.new((batch, mel.config.n_mels, frames), magnitude.dtype, magnitude.requires_grad)
    _l1(pass_, _saves_input(pass_, _saves_input(pass_, mels)))  # clamp, then log
    for n_fft, hop, win in STFT_RESOLUTIONS:
        # torch.hann_window(win) is periodic: it computes win + 1 values and keeps a view of win.
        fresh_window = pass_.new((win + 1,), torch.float32)
        p = _saves_input(pass_, _stft_magnitude(pass_, generated, n_fft, hop, fresh_window))  # clamp(min)
        difference = pass_.elementwise(p, pass_.new(p.shape, p.dtype))  # t - p
        if difference.requires_grad:
            pass_.save(difference, pass_.new((), p.dtype))  # the norm saves its input and its result
            pass_.save(pass_.new((), p.dtype))  # / norm(t): the divisor
        _l1(pass_, _saves_input(pass_, p))  # p.log()


def _posterior_step(
    pass_: ShadowPass, step: PosteriorStep, batch: int, text_length: int, frames: int, config: PiperAdaptConfig
) -> None:
    """:func:`~chorus.training.piper_adapt.posterior_step_terms` on shadow tensors (the alignment search
    runs without gradients and saves nothing)."""
    z, logs_q, mask = _posterior(pass_, step.posterior, batch, frames)
    m_p, logs_p = _text_encoder(pass_, step.generator.enc_p, batch, text_length)
    _prior_kl(pass_, _flow_encode(pass_, step.generator, z, mask), logs_q, m_p, logs_p, mask)
    # Each clip's window (views of z) padded to one length and stacked: new tensors, nothing saved.
    window = config.segment_frames + 2 * config.context_frames
    windows = pass_.new((batch, z.shape[1], window), z.dtype, z.requires_grad)
    audio = pass_.leaf(step.generator.dec, windows)
    size = config.segment_frames * step.generator.hop_length
    _segment_loss(pass_, step.loss, pass_.new((batch, size), audio.dtype, audio.requires_grad))


# -- the step as a module ---------------------------------------------------------------------------


class PosteriorStep(nn.Module):
    """One step of the ``posterior`` recipe as a module, for :func:`measure_training_step`: the generator
    (its voice attached), the posterior encoder and the loss, whose parameters and buffers are the
    step's weights. ``forward(clips, starts)`` -> the terms of
    :func:`~chorus.training.piper_adapt.posterior_step_terms` (``loss`` among them)."""

    def __init__(self, generator: PiperGenerator, posterior: PosteriorEncoder, config: PiperAdaptConfig) -> None:
        super().__init__()
        if config.discriminators:  # their update and terms are in neither the shadow pass nor this step
            raise ValueError("the memory of a step with discriminators is neither predicted nor measured here")
        self.generator, self.posterior, self.config = generator, posterior, config
        self.loss = SegmentLoss(generator, config.stft_weight)

    def forward(self, clips: Sequence[Clip], starts: Sequence[int]) -> dict[str, torch.Tensor]:
        return posterior_step_terms(self.generator, self.posterior, self.loss, clips, starts, self.config)


def _generator(config: PiperVitsConfig | str, device: str) -> PiperGenerator:
    """A generator of ``config``'s sizes with random weights on ``device`` (``meta``: none), or the Piper
    base ``config`` names (``"piper-joe"``, a ``voice.onnx``): on ``meta`` its sizes, else its own weights."""
    if isinstance(config, PiperVitsConfig):
        with torch.device(device):
            return PiperGenerator(config)
    from chorus.synthesis.bases import open_base

    generator = open_base(config).model
    if device == "meta":
        with torch.device("meta"):
            return PiperGenerator(generator.config, generator.voice)
    return generator


def _posterior_sizes(
    config: PiperVitsConfig | str, generator: PiperGenerator, adapt: PiperAdaptConfig, posterior: PosteriorConfig | None
) -> PosteriorConfig:
    """``posterior`` if given; for a Piper base named by string the recipe's own posterior encoder
    (``adapt.posterior``, default the one shipped for piper-joe); else VITS's layout at the generator's
    latent width."""
    if posterior is not None:
        return posterior
    if isinstance(config, str):
        folder = Path(adapt.posterior or str(files("chorus.assets") / SHIPPED_POSTERIOR))
        return PosteriorConfig(**json.loads((folder / CONFIG).read_text())["config"])
    return PosteriorConfig(generator.config.inter_channels, generator.hop_length)


def _shadow_step(
    config: PiperVitsConfig | str,
    batch: int,
    text_length: int,
    frames: int,
    adapt: PiperAdaptConfig,
    posterior: PosteriorConfig | None,
) -> tuple[PosteriorStep, ShadowPass]:
    """The step built on ``meta`` (the voice attached as ``adapt`` says) and the shadow pass of it."""
    generator = _generator(config, "meta")
    with torch.device("meta"):
        encoder = PosteriorEncoder(_posterior_sizes(config, generator, adapt, posterior))
    model, _ = attach_voice(generator, adapt)
    step = PosteriorStep(model, encoder, adapt)
    pass_ = ShadowPass()
    _posterior_step(pass_, step, batch, text_length, frames, adapt)
    return step, pass_


def _trained(pass_: ShadowPass) -> list[torch.Tensor]:
    """The parameters that get a gradient: trainable and read by the step (full fine-tuning trains the
    duration predictor's too, but the step never runs it)."""
    return [p for p in pass_.used.values() if p.requires_grad]


def predict_piper_memory(
    config: PiperVitsConfig | str,
    *,
    batch: int,
    text_length: int,
    frames: int,
    adapt: PiperAdaptConfig | None = None,
    posterior: PosteriorConfig | None = None,
) -> MemoryBreakdown:
    """Predict one step of the ``posterior`` recipe without running it: ``adapt`` (default
    :class:`PiperAdaptConfig`: the shipped placement, window and loss) on ``batch`` clips of
    ``text_length`` phoneme ids and ``frames`` latent frames each. The generator (``config``: its config,
    or a Piper base's name, whose sizes are read) and the posterior encoder (see
    :func:`measure_piper_step` for its default sizes) are built on ``meta``."""
    step, pass_ = _shadow_step(config, batch, text_length, frames, adapt or PiperAdaptConfig(), posterior)
    trained = _trained(pass_)
    # torch's AdamW: two moments like each parameter with a gradient and a float32 step.
    states = sum(2 * nbytes(p) + 4 for p in trained)
    predicted = breakdown(step, trained, states, pass_)
    # The mel's window buffer is a periodic torch.hann_window: a view of win_length of the win_length + 1
    # values its storage holds.
    return replace(predicted, weights=predicted.weights + step.loss.mel.window.element_size())


def measure_piper_step(
    config: PiperVitsConfig | str,
    *,
    batch: int,
    text_length: int,
    frames: int,
    adapt: PiperAdaptConfig | None = None,
    posterior: PosteriorConfig | None = None,
    seed: int = 0,
    warmup: bool = True,
) -> MeasuredMemory:
    """Build the step for real and measure it on ``batch`` random clips: ``text_length`` random phoneme
    ids and ``frames * hop`` samples of noise each. ``config``: the generator's config (random weights) or a
    Piper base's name (its own weights). The posterior encoder: random weights of ``posterior``'s
    sizes; by default, for a named base the recipe's own (``adapt.posterior``, else the one shipped for
    piper-joe, its trained weights), else VITS's layout at the generator's latent width.

    ``warmup`` first runs the same step on one short clip, so that one-time costs (numba compiling the
    alignment search, thread pools) stay out of the measured peak."""
    adapt = adapt or PiperAdaptConfig()
    if warmup:
        measure_piper_step(config, batch=1, text_length=2, frames=8, adapt=adapt, posterior=posterior, warmup=False)
    torch.manual_seed(seed)
    generator = _generator(config, "cpu")
    if posterior is None and isinstance(config, str):
        encoder = load_posterior(adapt)
    else:
        encoder = PosteriorEncoder(_posterior_sizes(config, generator, adapt, posterior))
    model, trainable = attach_voice(generator, adapt)
    step = PosteriorStep(model.train(), encoder.train(), adapt)
    noise = torch.Generator().manual_seed(seed)
    hop, symbols = generator.hop_length, generator.config.n_symbols
    clips = [
        Clip(
            str(i),
            torch.randint(1, symbols, (text_length,), generator=noise),
            0.1 * torch.randn(frames * hop, generator=noise),
            None,
            hop,
        )
        for i in range(batch)
    ]
    return measure_training_step(
        step,
        {"clips": clips, "starts": [0] * batch},
        lambda terms, _inputs: terms["loss"],
        posterior_optimizer(trainable, encoder, adapt),
    )


def piper_memory_report(
    config: PiperVitsConfig | str,
    *,
    batch: int = 4,
    text_length: int = 40,
    frames: int = 400,
    adapt: PiperAdaptConfig | None = None,
    posterior: PosteriorConfig | None = None,
    measure: bool = False,
    fresh_process: bool = False,
    out_png: str | Path | None = None,
    label: str = "",
) -> MemoryReport:
    """Predict (and with ``measure`` also measure, with ``fresh_process`` in a new process) one step of
    the ``posterior`` recipe; the defaults are the recipe's batch and a clip of ~4.6 s."""
    adapt = adapt or PiperAdaptConfig()
    shape = {"batch": batch, "text_length": text_length, "frames": frames}
    predicted = predict_piper_memory(config, **shape, adapt=adapt, posterior=posterior)
    measured = None
    if measure:
        settings = dict(shape, adapt=adapt, posterior=posterior)
        if fresh_process:
            measured = measure_in_fresh_process(config, step=measure_piper_step, **settings)
        else:
            measured = measure_piper_step(config, **settings)
    step, pass_ = _shadow_step(config, batch, text_length, frames, adapt, posterior)
    parameters = sum(p.numel() for p in step.parameters())
    trained = sum(p.numel() for p in _trained(pass_))
    settings = shape | {
        "placement": adapt.placement,
        "window": f"{adapt.segment_frames} + 2 x {adapt.context_frames} frames",
        "optimizer": "adamw",
    }
    label = label or f"{config if isinstance(config, str) else 'Piper generator'} ({adapt.placement})"
    report = MemoryReport(label, predicted, measured, parameters, trained, settings)
    if out_png is not None:
        report.png = plot_memory([(label, predicted, measured)], out_png)
    return report
