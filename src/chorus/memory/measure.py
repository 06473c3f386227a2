"""Measure the memory of one real training step, per category, to set beside the prediction.

* activations: every tensor autograd saves during forward and losses, seen through
  ``torch.autograd.graph.saved_tensors_hooks`` and counted once per storage (a tensor saved twice,
  or two views of one buffer, count once); parameters and buffers are not activations. Non-reentrant
  checkpointing saves each block's inputs through the same hooks (it installs its own hooks only
  inside the block), so what it keeps is seen too.
* gradients: ``p.grad`` of every parameter after backward.
* optimizer states: every tensor in ``optimizer.state`` after the step.
* weights: parameters and buffers.
* recompute: what backward rebuilds and holds for one block at a time. With gradient checkpointing a
  block's forward reruns in its backward, under checkpointing's own saved-tensor hooks, which hide it
  from ours; reversible stacks rebuild one branch (attention or feed-forward) at a time, the speaker
  encoder's reversible stages one F or G of a block. Forward notes each rebuilt block's or branch's input
  (shape, dtype, requires-grad; the bool mask is copied); after the step one of each kind and input (a
  stack's blocks are alike) is rerun on a fresh input of that kind under our hooks, and the largest is
  reported: the bytes it saves beyond its input and mask, which the forward already keeps.
* peak: on CPU the process's peak resident set after the step and its growth over the resident
  set before it (Linux: the peak is reset before the step through ``/proc/self/clear_refs``;
  elsewhere only a rise of ``ru_maxrss`` above earlier peaks shows); on CUDA
  ``torch.cuda.max_memory_allocated`` over the step and its growth above what was allocated before.
  The growth includes backward's temporaries and what the allocator keeps, so it is context for
  the categories, not their sum. :func:`measure_in_fresh_process` runs the step in a new process,
  away from the caller's allocator history.
"""

from __future__ import annotations

import multiprocessing
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from queue import Empty
from typing import Any

import torch
from torch import nn

from chorus.models.acoustic import AcousticModel, FFTBlock, TransformerStack, build_model
from chorus.models.config import AcousticConfig
from chorus.models.losses import compute_losses
from chorus.recipe import MemoryOptions
from chorus.speaker_recognition.encoder import Stage
from chorus.training.efficiency import autocast, build_optimizer, optimizer_state_bytes, store_frozen_base

NO_MASK = torch.zeros(0, dtype=torch.bool)


@dataclass
class MeasuredMemory:
    """Bytes of one real training step (see the module docstring for what each field counts)."""

    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    device: str
    recompute: int = 0  # checkpointing / reversible stacks: the largest rebuilt block or branch
    peak_kind: str = ""  # "RSS" (CPU process) or "CUDA allocated"
    peak: int | None = None  # after the step: process peak RSS, or max_memory_allocated
    peak_growth: int | None = None  # how much the step raised the peak above its level before

    @property
    def total(self) -> int:
        """Sum of the categories, recompute included (what is live at the step's peak, before
        backward's temporaries and allocator slack: compare with ``peak_growth`` + ``weights``)."""
        return sum(self.categories().values())

    def categories(self) -> dict[str, int]:
        """``{"weights": ..., "gradients": ..., "optimizer_states": ..., "activations": ...}``, plus
        ``recompute`` when checkpointing or a reversible stack adds any (as :class:`MemoryBreakdown`)."""
        values = {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer_states": self.optimizer_states,
            "activations": self.activations,
        }
        if self.recompute:
            values["recompute"] = self.recompute
        return values


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


def _unique_bytes(tensors) -> int:
    seen: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        seen.setdefault(_storage_key(tensor), tensor.untyped_storage().nbytes())
    return sum(seen.values())


def _rss() -> tuple[int, int | None]:
    """(peak, current) resident set of this process in bytes; current is None without Linux's /proc."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        # ru_maxrss is in kilobytes on Linux and in bytes on macOS.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return (peak if sys.platform == "darwin" else peak * 1024), None
    values = dict(line.split(":", 1) for line in status.splitlines() if line.startswith(("VmHWM", "VmRSS")))
    return int(values["VmHWM"].split()[0]) * 1024, int(values["VmRSS"].split()[0]) * 1024


def _reset_peak_rss() -> bool:
    """Lower the process's peak RSS to its current RSS (Linux, clear_refs 5); False where impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass
class _Rebuild:
    """A block or branch that backward reruns, and the kind of input it reruns on."""

    run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [batch, time, dim], mask [batch, time])
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    mask: torch.Tensor
    kind: tuple  # what it is made of (:func:`_made_of`): rebuilds of one kind and input save alike

    def key(self) -> tuple:
        return (self.kind, self.shape, self.dtype, self.requires_grad, tuple(self.mask.shape))


def _made_of(run: Callable | nn.Module) -> tuple:
    """A rebuilt block's or branch's kind: its name, its module's class and its parameters' shapes (the blocks of
    one stack or stage share them)."""
    module = getattr(run, "__self__", run)
    return (getattr(run, "__name__", ""), type(module).__name__, tuple(tuple(p.shape) for p in module.parameters()))


def _watch_rebuilds(model: nn.Module, watching: list[bool], rebuilds: list[_Rebuild]) -> list:
    """Forward pre-hooks that note, while ``watching[0]``, the input of every block (checkpointed
    stacks) or branch (reversible stacks) that backward will rebuild; returns the hook handles.

    Only metadata of the hidden states is kept (holding them would raise the step's peak); the bool
    mask, ``[batch, time]``, is copied."""
    handles = []
    for stage in model.modules():
        if isinstance(stage, Stage) and stage.reversible:
            handles += _watch_reversible_stage(stage, watching, rebuilds)
    for stack in model.modules():
        if not isinstance(stack, TransformerStack) or not len(stack.layers):
            continue
        if stack.reversible:
            masks: list[torch.Tensor] = []

            def note_mask(_module, args, masks=masks):
                if watching[0]:
                    masks[:] = [args[1].detach().clone()]

            def note_branch(run, masks=masks):
                def hook(_module, args):
                    if watching[0]:
                        x = args[0]
                        rebuilds.append(_Rebuild(run, tuple(x.shape), x.dtype, True, masks[0], _made_of(run)))

                return hook

            handles.append(stack.register_forward_pre_hook(note_mask))
            for block in stack.layers:
                handles.append(block.norm1.register_forward_pre_hook(note_branch(block.attention_branch)))
                handles.append(block.norm2.register_forward_pre_hook(note_branch(block.feed_forward_branch)))
        elif stack.gradient_checkpointing:

            def note_block(block: FFTBlock, args):
                if watching[0]:
                    x, mask = args
                    rebuilds.append(
                        _Rebuild(
                            block, tuple(x.shape), x.dtype, x.requires_grad, mask.detach().clone(), _made_of(block)
                        )
                    )

            handles += [block.register_forward_pre_hook(note_block) for block in stack.layers]
    return handles


def _watch_reversible_stage(stage: Stage, watching: list[bool], rebuilds: list[_Rebuild]) -> list:
    """The speaker encoder's reversible stage: backward rebuilds each branch (F, then G, of every
    block) on its recovered input ``[batch, C / 2, F, T]``; no mask."""

    def note_branch(branch: nn.Module):
        def hook(_module, args):
            if watching[0]:
                x = args[0]
                rebuilds.append(
                    _Rebuild(lambda x, _mask: branch(x), tuple(x.shape), x.dtype, True, NO_MASK, _made_of(branch))
                )

        return hook

    return [
        branch.register_forward_pre_hook(note_branch(branch))
        for block in stage.blocks
        for branch in (block.branch_f, block.branch_g)
    ]


def _largest_rebuild(rebuilds: list[_Rebuild], resident_keys: set, precision: str, device: torch.device) -> int:
    """Bytes the largest of ``rebuilds`` saves when rerun with grad under ``precision``, beyond its
    input and mask (see the module docstring); 0 without rebuilds."""
    largest = 0
    # One of each kind and input: the blocks of a stack save alike, and rerunning all of them (120 branches of
    # DF-ResNet-179) had raised the measuring process's RSS to 8 GB after the step (the allocator's keep).
    for rebuild in {rebuild.key(): rebuild for rebuild in rebuilds}.values():
        x = torch.zeros(rebuild.shape, dtype=rebuild.dtype, device=device).requires_grad_(rebuild.requires_grad)
        kept = resident_keys | {_storage_key(x), _storage_key(rebuild.mask)}
        saved: dict[tuple[str, int], torch.Tensor] = {}

        def pack(tensor: torch.Tensor, kept=kept, saved=saved) -> torch.Tensor:
            key = _storage_key(tensor)
            if key not in kept and tensor.untyped_storage().nbytes():
                saved.setdefault(key, tensor)
            return tensor

        with (
            torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            autocast(precision, device),
        ):
            rebuild.run(x, rebuild.mask)
        largest = max(largest, sum(tensor.untyped_storage().nbytes() for tensor in saved.values()))
    return largest


def measure_training_step(
    model: nn.Module,
    batch_inputs: dict[str, Any],
    loss_fn: Callable[[Any, dict[str, Any]], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    precision: str = "fp32",
) -> MeasuredMemory:
    """Run one forward (``model(**batch_inputs)``), ``loss_fn(output, batch_inputs)`` -> scalar,
    backward and optimizer step, and report what each category used.

    Forward and loss run under the precision's autocast (:func:`chorus.training.efficiency.autocast`),
    backward outside it. The optimizer should hold only trainable parameters. The rebuilt blocks or
    branches of checkpointed or reversible stacks are rerun after the step (``recompute``), so the
    peak is the step's own.
    """
    device = next(model.parameters()).device
    resident = list(model.parameters()) + list(model.buffers())
    resident_keys = {_storage_key(t) for t in resident}
    saved: dict[tuple[str, int], torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key not in resident_keys and tensor.untyped_storage().nbytes():
            # Holding the tensor keeps its storage, so its address cannot be reused by another
            # saved tensor during this forward pass (two allocations would merge into one key).
            saved.setdefault(key, tensor)
        return tensor

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        # Where the peak can be reset (Linux) the step's peak is its own; elsewhere only a rise above
        # earlier peaks shows.
        peak_so_far, current = _rss()
        before = current if current is not None and _reset_peak_rss() else peak_so_far

    watching, rebuilds = [True], []
    handles = _watch_rebuilds(model, watching, rebuilds)
    optimizer.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast(precision, device):
        loss = loss_fn(model(**batch_inputs), batch_inputs)
    activations = sum(tensor.untyped_storage().nbytes() for tensor in saved.values())
    saved.clear()
    watching[0] = False  # backward reruns the same blocks: those calls are the rebuilds, not new ones
    loss.backward()
    gradients = _unique_bytes(p.grad for p in model.parameters() if p.grad is not None)
    optimizer.step()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak_kind, peak = "CUDA allocated", torch.cuda.max_memory_allocated(device)
    else:
        peak_kind, peak = "RSS", _rss()[0]
    recompute = _largest_rebuild(rebuilds, resident_keys, precision, device)
    for handle in handles:
        handle.remove()
    return MeasuredMemory(
        weights=_unique_bytes(resident),
        gradients=gradients,
        optimizer_states=optimizer_state_bytes(optimizer),
        activations=activations,
        device=str(device),
        recompute=recompute,
        peak_kind=peak_kind,
        peak=peak,
        peak_growth=max(0, peak - before),
    )


def synthetic_batch(
    config: AcousticConfig,
    *,
    batch: int,
    text_length: int,
    frames: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random inputs of ``AcousticModel.forward`` at full length (no padding).

    Returns phonemes ``[batch, text_length]`` (ids 1..n_symbols-1), text_lengths and frame_lengths
    ``[batch]``, mel ``[batch, frames, n_mels]`` (already normalized), speaker_ids ``[batch]``, and
    pitch / energy ``[batch, frames]`` when the config predicts them.
    """
    generator = torch.Generator().manual_seed(seed)
    mel = torch.randn(batch, frames, config.n_mels, generator=generator)
    inputs = {
        "phonemes": torch.randint(1, config.n_symbols, (batch, text_length), generator=generator),
        "text_lengths": torch.full((batch,), text_length),
        "mel": mel,
        "frame_lengths": torch.full((batch,), frames),
        "speaker_ids": torch.randint(0, config.n_speakers, (batch,), generator=generator),
    }
    if config.use_pitch:
        inputs["pitch"] = torch.randn(batch, frames, generator=generator)
    if config.use_energy:
        inputs["energy"] = mel.mean(-1)
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def acoustic_loss(model: AcousticModel) -> Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]:
    """``loss_fn`` for :func:`measure_training_step`: the pretraining loss (``compute_losses``)."""

    def loss(output, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return compute_losses(model, output, inputs["mel"], inputs["text_lengths"])["total"]

    return loss


def measure_acoustic_step(
    config: AcousticConfig,
    *,
    trainable: Callable[[nn.Module], None] | None = None,
    batch: int,
    text_length: int,
    frames: int,
    options: MemoryOptions | None = None,
    device: str = "cpu",
    seed: int = 0,
    warmup: bool = True,
) -> MeasuredMemory:
    """Build ``config`` for real on ``device``, set what trains, and measure one step on a
    :func:`synthetic_batch` with the training run's memory ``options`` (default :class:`MemoryOptions`;
    ``reversible`` is ``config``'s own). ``trainable(model)`` sets ``requires_grad`` (None: everything
    trains). ``options.frozen_dtype`` ``"bf16"`` then stores the parameters left frozen in bfloat16, as
    :func:`chorus.training.adapt.adapt` does.

    ``warmup`` first runs one step of a toy model with the same options, so that one-time costs
    (numba loading the alignment search, kernel and thread-pool setup, the optimizer's library,
    together ~100 MiB of RSS) do not land in the measured step's peak.
    """
    options = options or MemoryOptions()
    settings = {"options": options, "device": device, "seed": seed}
    if warmup:
        # ff_hidden 512 gives conv weights of >= 4096 values, so torchao's 8-bit states load their kernels too.
        toy = replace(
            config,
            d_model=4 * config.n_heads,
            ff_hidden=512,
            predictor_hidden=8,
            speaker_dim=4,
            encoder_layers=1,
            decoder_layers=1,
            max_positions=16,
        )
        measure_acoustic_step(toy, batch=1, text_length=4, frames=8, warmup=False, **settings)
    torch.manual_seed(seed)
    model = build_model(config, device)
    model.train()
    if trainable is not None:
        trainable(model)
    store_frozen_base(model, options.frozen_dtype)
    for module in model.modules():
        if isinstance(module, TransformerStack):
            module.gradient_checkpointing = options.checkpointing
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("nothing to train: trainable() left no parameter with requires_grad")
    inputs = synthetic_batch(config, batch=batch, text_length=text_length, frames=frames, device=device, seed=seed)
    return measure_training_step(
        model,
        inputs,
        acoustic_loss(model),
        build_optimizer(parameters, options.optimizer, lr=1e-4, weight_decay=0.0),
        precision=options.precision,
    )


def _measure_worker(queue, step: Callable[..., MeasuredMemory], kwargs: dict) -> None:
    try:
        torch.set_num_threads(kwargs.pop("threads"))
        queue.put(step(**kwargs))
    except Exception as error:  # noqa: BLE001 - the parent re-raises it; a child's error is otherwise lost
        queue.put(error)


def measure_in_fresh_process(
    config: Any,
    *,
    step: Callable[..., MeasuredMemory] | None = None,
    threads: int = 1,
    timeout: float = 3600,
    **kwargs,
) -> MeasuredMemory:
    """``step(config, **kwargs)`` in a new Python process, for a peak RSS that is the step's own.

    ``step`` (default :func:`measure_acoustic_step`; any module-level measuring function, such as the
    speaker encoder's) gets ``config`` and ``kwargs``; ``trainable`` must be picklable (a module-level
    function). ``threads`` are torch's intra-op threads in the child. Raises what the
    child raised, RuntimeError if it died without an answer, TimeoutError after ``timeout`` s.
    """
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(
        target=_measure_worker,
        args=(queue, step or measure_acoustic_step, dict(config=config, threads=threads, **kwargs)),
    )
    process.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                result = queue.get(timeout=1.0)
                break
            except Empty:
                if not process.is_alive():
                    raise RuntimeError(f"the measuring process died (exit code {process.exitcode})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the measuring process took over {timeout:.0f} s") from None
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    if isinstance(result, BaseException):
        raise result
    return result
