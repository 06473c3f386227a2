"""Adapting the base to a new voice: one readable loop (check data, set up, step, evaluate, save).

Data is a single-speaker LJSpeech-style folder. Everything that can be wrong with it (too little
audio, transcripts that do not fit their clips, a target pattern that matches nothing) is refused
before the first step; an unknown method or option already where the recipe is made
(:func:`chorus.adapters.parse_methods`). A share of the clips is held out; training stops early
when their loss stops improving, and the best adapter seen is what gets saved.
"""

from __future__ import annotations

import copy
import functools
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import add_adapter, mark_trainable, set_active
from chorus.adapters.inject import adapter_layers
from chorus.adapters.layer import innermost
from chorus.adapters.speaker import SpeakerVector
from chorus.adapters.voice import VoiceCard, save_voice
from chorus.data.batching import collate, make_batches
from chorus.data.check import DatasetReport, check_dataset
from chorus.data.features import FeatureCache, build_feature_cache
from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle
from chorus.models.losses import compute_losses, step_inputs
from chorus.recipe import TEXT_SIDE_PATTERN, AdaptConfig, MemoryOptions
from chorus.speaker.bundle import load_encoder, shipped_encoder_dir
from chorus.speaker.start import similarity_to_clips, speaker_map
from chorus.training.efficiency import apply_memory_options, autocast, build_optimizer, cast_frozen_parameters
from chorus.training.progress import step_progress
from chorus.training.transcripts import auto_transcribe, needs_transcripts

VOICE = "voice"  # adapter name while training; a voice folder is named by the user


@dataclass
class AdaptResult:
    voice_dir: Path
    card: VoiceCard
    model: AcousticModel  # the base with the voice added as adapter ``VOICE`` (a copy for full)
    history: list[dict]  # per evaluation: step, train and validation mel loss


def check_adaptation_data(data: str | Path, config: AdaptConfig, progress: bool = True) -> DatasetReport:
    """Refuse data that cannot make a voice, with the reason, before any model is loaded."""
    report = check_dataset(data, progress=progress)
    if len(report.speakers) > 1:
        raise ValueError(
            f"{data}: {len(report.speakers)} speakers found ({', '.join(sorted(report.speakers))}); "
            "`chorus adapt` makes one voice from one speaker's folder"
        )
    bad_text = sum(1 for p in report.problems if p.kind == "text_length")
    if bad_text > config.max_bad_transcript_fraction * len(report.utterances):
        raise ValueError(
            f"{data}: {bad_text} of {len(report.utterances)} transcripts do not fit their clips' "
            "durations (mismatched transcripts?); see `chorus data check`"
        )
    valid = report.valid_utterances()
    if not valid:
        reason = report.problems[0].message if report.problems else "no utterances"
        raise ValueError(f"{data}: nothing usable ({reason}); see `chorus data check {data}`")
    minutes = sum(report.durations[u.key] for u in valid) / 60
    if minutes < config.min_minutes:
        raise ValueError(
            f"{data}: {minutes * 60:.0f} s of usable audio; a voice needs at least "
            f"{config.min_minutes * 60:.0f} s (1-10 minutes is the intended range)"
        )
    if len(valid) < 2:
        raise ValueError(f"{data}: a voice needs at least 2 usable clips (one is held out for validation)")
    return report


def split_held_out(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices: ``fraction`` of the clips (at least 1, at most 16) held out."""
    held = int(np.clip(round(count * fraction), 1, min(16, count - 1)))
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[held:]), np.sort(order[:held])


@torch.no_grad()
def mel_loss(
    model: AcousticModel,
    cache: FeatureCache,
    indices: np.ndarray,
    max_frames: int,
    speaker_id: int = 0,
    precision: str = "fp32",
) -> float:
    """Mean teacher-forced mel L1 over ``indices`` (speaker ids go to the embedding table, which a
    voice's speaker vector overrides)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for positions in make_batches(cache.frames()[indices], max_frames, shuffle=False):
        batch = collate(cache, indices[positions])
        batch.speakers.fill_(speaker_id)
        inputs = step_inputs(model, batch)
        with autocast(precision, model.mel_mean.device):
            out = model(**inputs)
            total += float(compute_losses(model, out, inputs["mel"], inputs["text_lengths"])["mel"]) * len(positions)
        count += len(positions)
    model.train(was_training)
    return total / max(count, 1)


def closest_speakers(
    model: AcousticModel,
    cache: FeatureCache,
    indices: np.ndarray,
    groups: np.ndarray | None = None,
    max_frames: int | None = None,
) -> np.ndarray:
    """The speaker whose conditioning fits each new voice best (lowest teacher-forced mel L1,
    averaged over that voice's clips): the voices' speaker-vector starting points.

    ``groups[i]`` is the voice of clip ``indices[i]`` (default: every clip its own voice); returns one
    speaker index per group, in sorted group order. One forward per speaker for all clips, or with
    ``max_frames`` per length-bucketed batch of at most that many padded frames (many voices' clips
    padded to the longest make attention, quadratic in length, the bulk of the cost).
    """
    groups = np.arange(len(indices)) if groups is None else np.asarray(groups)
    losses = np.zeros((model.config.n_speakers, len(indices)))
    was_training = model.training
    model.eval()
    if max_frames is None:
        buckets = [np.arange(len(indices))]
    else:
        buckets = make_batches(cache.frames()[indices], max_frames, shuffle=False)
    with torch.no_grad():
        for positions in buckets:
            batch = collate(cache, indices[positions])
            for speaker in range(model.config.n_speakers):
                batch.speakers.fill_(speaker)
                inputs = step_inputs(model, batch)
                out = model(**inputs)
                mask = out.frame_mask
                losses[speaker, positions] = (
                    (((out.mel - inputs["mel"]).abs().mean(-1) * mask).sum(-1) / mask.sum(-1)).cpu().numpy()
                )
    model.train(was_training)
    return np.array([losses[:, groups == group].mean(1).argmin() for group in np.unique(groups)])


def prepare_for_training(model: AcousticModel, config: AdaptConfig) -> list[torch.nn.Parameter]:
    """Add the voice adapter ``VOICE`` of ``config``'s methods to ``model``, make it active, and set
    what trains (adapters only; every weight for full fine-tuning). Works on the ``meta`` device, so
    memory can be predicted for any base size. Returns the trained parameters."""
    add_adapter(model, VOICE, config.method_configs())
    set_active(model, VOICE)
    trainable = mark_trainable(model, VOICE)
    if config.methods.full:
        for name, parameter in model.named_parameters():
            kept = re.fullmatch(TEXT_SIDE_PATTERN, name) or name.startswith(("speaker_embedding.", "speaker_proj."))
            parameter.requires_grad_(not (config.keep_text_side and kept))
        trainable = [p for p in model.parameters() if p.requires_grad]
    return trainable


def trainable_for(config: AdaptConfig) -> Callable[[AcousticModel], None]:
    """``trainable(model)`` callback for :mod:`chorus.memory`: prepares ``config``'s voice adapter
    (:func:`prepare_for_training`). A partial of a module-level function, so it can be sent to a fresh
    measuring process."""
    return functools.partial(prepare_for_training, config=config)


def adapt(data: str | Path, bundle: ModelBundle, out: str | Path, config: AdaptConfig, **options) -> AdaptResult:
    """Make a voice from ``data`` on ``bundle``'s base and save it to ``out`` (see :func:`_adapt` for
    ``options``). Recordings without transcripts (no ``metadata.csv``, or lines with no text) are
    transcribed by Whisper first (:mod:`chorus.training.transcripts`); the card says how many."""
    if not needs_transcripts(data):
        return _adapt(data, bundle, out, config, **options)
    with tempfile.TemporaryDirectory(prefix="chorus-transcribed-") as work:
        auto = auto_transcribe(
            data, work, max_seconds=config.transcribed_clip_seconds, progress=options.get("progress", True)
        )
        print(f"{auto.automatic} of {auto.clips} clip(s) transcribed by Whisper ({auto.seconds / 60:.1f} min of audio)")
        notes = {"automatic_transcripts": f"{auto.automatic} of {auto.clips} clips (Whisper tiny.en)"}
        try:
            return _adapt(auto.folder, bundle, out, config, extra_notes=notes, **options)
        except ValueError as error:  # name the recordings given, not the temporary folder made from them
            raise ValueError(str(error).replace(str(auto.folder), str(data)).replace(work, str(data))) from None


def _adapt(
    data: str | Path,
    bundle: ModelBundle,
    out: str | Path,
    config: AdaptConfig,
    *,
    progress: bool = True,
    name: str | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_evaluate: Callable[[int, AcousticModel], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    extra_notes: dict | None = None,
) -> AdaptResult:
    """Make a voice from ``data`` (an LJSpeech-style folder with its transcripts) on ``bundle``'s base
    and save it to ``out``.

    Adapter methods add tensors to ``bundle.model`` (base weights untouched); full fine-tuning
    trains a copy. ``progress`` draws a progress bar; ``on_step(steps_done, steps_at_most)`` is called
    after every optimizer step (early stopping may end the loop before ``steps_at_most``), and with 0
    steps done after the data check and after the features (an exception it raises stops ``adapt``);
    ``on_evaluate(step, model)`` after every held-out evaluation, with the voice active in ``model``
    (to follow more than the mel loss over the steps; it must leave the model as it found it);
    ``on_start(speaker)`` with the base speaker index the voice starts from, before the first step (the
    base speaker that fits the data best: what a sample's voice speaks as until it is refined).
    """
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    configs = config.method_configs()
    full = config.methods.full
    report = check_adaptation_data(data, config, progress)
    if on_step is not None:
        on_step(0, config.steps)  # the data check done: a caller may stop here (a cancelled job)
    valid = report.valid_utterances()
    for problem in report.problems:
        print(f"skipped {problem.source}: {problem.message}")
    speaker = valid[0].speaker
    cache, skipped = build_feature_cache(
        valid,
        bundle.front_end,
        bundle.mel_config,
        speaker_names=[speaker],
        with_pitch=bundle.model.config.use_pitch,
        progress=progress,
    )
    for line in skipped:
        print(f"skipped {line}")
    if on_step is not None:
        on_step(0, config.steps)  # the features made
    train_indices, val_indices = split_held_out(len(cache), config.validation_fraction, config.seed)
    minutes = float(cache.frames().sum()) * bundle.mel_config.hop_length / bundle.mel_config.sample_rate / 60

    # Full fine-tuning and a bf16 frozen base train a copy: the shared base stays as it is.
    copied = full or config.memory.frozen_dtype == "bf16"
    model = copy.deepcopy(bundle.model) if copied else bundle.model
    apply_memory_options(model, config.memory)
    start_vector, start_notes = None, {"start": "mel loss"}
    encoder_dir = config.speaker_encoder or shipped_encoder_dir()  # also judges the voice at the end
    encoder = load_encoder(encoder_dir) if encoder_dir is not None else None
    if config.speaker_encoder is not None:
        mapping = speaker_map(bundle, encoder)
        clips = encoder.embed([u.audio_path for u in valid[:16]]).mean(0)
        start_speaker = mapping.nearest(clips)
        start_vector = torch.from_numpy(mapping.vector(clips))
        start_notes = {
            "start": "speaker encoder",
            "speaker_encoder": str(config.speaker_encoder),
            "start_similarity": round(float(mapping.embeddings[start_speaker] @ (clips / np.linalg.norm(clips))), 4),
            "speaker_map_ridge": mapping.ridge,
        }
    else:
        start_speaker = int(closest_speakers(model, cache, train_indices[:16], np.zeros(len(train_indices[:16])))[0])
    if on_start is not None:
        on_start(start_speaker)
    trainable = prepare_for_training(model, config)  # a target that matches nothing fails here
    if config.memory.frozen_dtype == "bf16":
        cast_frozen_parameters(model, torch.bfloat16)
    for _, layer in adapter_layers(model):
        if isinstance(layer, SpeakerVector):
            with torch.no_grad():
                start = innermost(layer).weight[start_speaker] if start_vector is None else start_vector
                layer.speaker_vector[VOICE].copy_(start)
    trainable_count = sum(p.numel() for p in trainable)
    optimizer = build_optimizer(trainable, config.memory.optimizer, config.learning_rate_for(), weight_decay=0.0)

    # Autocast on the device the model was loaded on (`--device`): bf16 on the CPU as on a GPU.
    precision, device = config.memory.precision, model.mel_mean.device
    history = [{"step": 0, "val_mel": mel_loss(model, cache, val_indices, config.max_frames, precision=precision)}]
    best = (history[0]["val_mel"], 0, _snapshot(trainable))
    if on_evaluate is not None:
        on_evaluate(0, model)
    started = time.perf_counter()
    step, stale, epoch, running = 0, 0, 0, []
    model.train()
    with step_progress(f"adapt ({config.methods.spec})", progress) as bar:
        task = bar.add_task("steps", total=config.steps, status="")
        while step < config.steps and stale < config.patience:
            for positions in make_batches(cache.frames()[train_indices], config.max_frames, seed=config.seed + epoch):
                batch = collate(cache, train_indices[positions])
                batch.speakers.zero_()
                inputs = step_inputs(model, batch)
                with autocast(precision, device):
                    losses = compute_losses(model, model(**inputs), inputs["mel"], inputs["text_lengths"])
                optimizer.zero_grad(set_to_none=True)
                losses["total"].backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                step += 1
                running.append(losses["mel"].item())
                bar.update(task, completed=step, status=f"mel {running[-1]:.3f} best val {best[0]:.3f}")
                if on_step is not None:
                    on_step(step, config.steps)
                if step % config.eval_every == 0 or step == config.steps:
                    value = mel_loss(model, cache, val_indices, config.max_frames, precision=precision)
                    history.append({"step": step, "train_mel": float(np.mean(running)), "val_mel": value})
                    running = []
                    if value < best[0]:
                        best, stale = (value, step, _snapshot(trainable)), 0
                    else:
                        stale += 1
                    if on_evaluate is not None:
                        on_evaluate(step, model)
                out_of_time = time.perf_counter() - started > config.max_minutes * 60
                if step >= config.steps or stale >= config.patience or out_of_time:
                    break
            epoch += 1
            if time.perf_counter() - started > config.max_minutes * 60:
                break
    train_seconds = time.perf_counter() - started
    with torch.no_grad():
        for parameter, value in zip(trainable, best[2]):
            parameter.copy_(value)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.eval()
    apply_memory_options(model, MemoryOptions())

    similarity = None
    if encoder is not None:
        by_key = {u.key: u for u in valid}
        held_out = [by_key[cache.keys[i]] for i in val_indices[:3] if cache.keys[i] in by_key]
        similarity = similarity_to_clips(
            bundle,
            model,
            VOICE,
            start_speaker,
            encoder,
            [u.text for u in held_out],
            [u.audio_path for u in valid[:16]],
        )
    card = VoiceCard(
        name=name or Path(out).name,
        methods=config.methods.names,
        base_model_sha256=bundle.weights_sha256,
        data_minutes=round(minutes, 2),
        train_seconds=round(train_seconds, 1),
        steps=step,
        trainable_parameters=trainable_count,
        metrics={
            "validation_mel_l1_start": round(history[0]["val_mel"], 4),
            "validation_mel_l1_best": round(best[0], 4),
            "best_step": best[1],
            "held_out_clips": len(val_indices),
            "training_clips": len(train_indices),
            # Chorus's speaker encoder: held-out texts in the new voice against its clips (cosine).
            **({"encoder_similarity_to_clips": round(similarity, 4)} if similarity is not None else {}),
        },
        notes={
            "speaker_vector_start": bundle.speakers[start_speaker],
            **start_notes,
            "recipe": config.recipe(),
            "memory_options": asdict(config.memory),
            **(extra_notes or {}),
        },
    )
    voice_dir = save_voice(out, model, VOICE, configs, card, full=full)
    return AdaptResult(Path(voice_dir), card, model, history)


def _snapshot(parameters: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in parameters]
