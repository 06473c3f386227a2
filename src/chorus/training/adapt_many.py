"""Many voices in one job: K voices' adapters trained together in mixed-voice batches.

Every step takes ``clips_per_voice`` clips of every voice still training, runs them through the
frozen base in one batch, and routes each sample to its own voice's adapter through the batched
bank (gather + batched matmul, :mod:`chorus.adapters.bank`). The loss is the sum over voices of
each voice's own mean loss, so a voice's gradient comes only from its own samples and has the
scale it would have alone. A step's clips go through the model in forwards of similar length (each
voice's clips together, at most ``max_frames`` padded frames each, as one voice's batches are):
padding every clip to the longest of K voices' made a K-voice job slower per voice than K jobs of
one (attention is quadratic in the padded length). Each voice keeps its best held-out snapshot and is exported as a
standalone voice folder, the same format as ``chorus adapt`` writes. A voice whose data fails its
checks is reported and left out; the others train.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from rich.markup import escape

from chorus.adapters import add_adapter, parse_methods
from chorus.adapters.bank import banked, pack_bank
from chorus.adapters.inject import adapter_layers
from chorus.adapters.layer import innermost
from chorus.adapters.speaker import SpeakerVector
from chorus.adapters.voice import VoiceCard, save_voice
from chorus.atomic import atomic_write_text
from chorus.data.batching import Batch, collate
from chorus.data.features import FeatureCache, build_feature_cache
from chorus.data.formats import AUDIO_SUFFIXES, Utterance
from chorus.models.acoustic import AcousticModel, AcousticOutput
from chorus.models.bundle import ModelBundle
from chorus.models.losses import compute_losses, step_inputs
from chorus.recipe import AdaptConfig
from chorus.training.adapt import (
    check_adaptation_data,
    closest_speakers,
    refuse_voice_folder,
    split_held_out,
)
from chorus.training.efficiency import build_optimizer
from chorus.training.progress import step_progress
from chorus.training.step_loop import BestSnapshot


@dataclass
class ManyVoicesConfig:
    """Recipe of a many-voice job. ``adapt`` gives the method and its options (as for one voice);
    every voice gets ``steps`` updates, each from ``clips_per_voice`` of its clips."""

    adapt: AdaptConfig = field(default_factory=lambda: AdaptConfig(methods=parse_methods("lora+speaker")))
    steps: int = 200
    clips_per_voice: int = 2
    eval_every: int = 25
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.adapt.methods.full:
            raise ValueError("full fine-tuning makes one model per voice; adapt-many trains adapters")
        if self.steps <= 0 or self.clips_per_voice <= 0:
            raise ValueError("steps and clips_per_voice must be positive")


@dataclass
class VoiceOutcome:
    name: str
    status: str  # "ok" or "failed"
    message: str = ""
    voice_dir: str | None = None
    data_minutes: float = 0.0
    validation_mel_l1_start: float | None = None
    validation_mel_l1_best: float | None = None


@dataclass
class ManyVoicesResult:
    outcomes: list[VoiceOutcome]
    train_seconds: float  # the shared training loop
    setup_seconds: float  # data checks, features, starting points
    steps: int
    model: AcousticModel  # the base with every voice as an adapter (named by VoiceSet.adapter)


def speaker_folders(root: str | Path) -> list[Path]:
    """The speaker folders under ``root``: every sub-folder with a ``metadata.csv``, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder")
    folders = sorted(p for p in root.iterdir() if (p / "metadata.csv").is_file())
    if not folders:
        raise ValueError(f"{root}: no speaker folders (sub-folders with a metadata.csv)")
    return folders


def untranscribed_folders(root: str | Path) -> list[Path]:
    """The sub-folders of ``root`` with recordings (in it or its ``wavs/``) and no ``metadata.csv``: no voice of
    one job (a new user's probe: such a folder was left out without a word), named as failed instead. Hidden
    folders and a zip's ``__MACOSX`` are no speakers."""

    def has_audio(folder: Path) -> bool:
        return folder.is_dir() and any(p.suffix.lower() in AUDIO_SUFFIXES for p in folder.iterdir() if p.is_file())

    return sorted(
        folder
        for folder in Path(root).iterdir()
        if not folder.name.startswith((".", "__MACOSX"))
        and not (folder / "metadata.csv").is_file()
        and (has_audio(folder) or has_audio(folder / "wavs"))
    )


def _rows(out: AcousticOutput, rows: torch.Tensor) -> AcousticOutput:
    values = {name: (value[rows] if torch.is_tensor(value) else value) for name, value in vars(out).items()}
    return AcousticOutput(**values)


def banked_inputs(model: AcousticModel, batch: Batch) -> dict:
    """``model(...)`` keyword arguments for a mixed-voice batch. The batch's speaker ids are feature-cache
    voice indices, not rows of the base's speaker table (there may be more voices than rows): every
    voice carries its own speaker vector, which replaces the table lookup, so the ids sent are zeros."""
    inputs = step_inputs(model, batch)
    inputs["speaker_ids"] = torch.zeros_like(inputs["speaker_ids"])
    return inputs


def per_voice_losses(
    model: AcousticModel,
    out: AcousticOutput,
    target: torch.Tensor,
    text_lengths: torch.Tensor,
    voice_index: torch.Tensor,
) -> dict[int, dict[str, torch.Tensor]]:
    """Each voice's own mean losses over its rows (as :func:`compute_losses` would give it alone)."""
    losses = {}
    for voice in voice_index.unique().tolist():
        rows = (voice_index == voice).nonzero().squeeze(1)
        losses[voice] = compute_losses(model, _rows(out, rows), target[rows], text_lengths[rows])
    return losses


def length_groups(frames: np.ndarray, voices: np.ndarray, max_frames: int | None) -> list[np.ndarray]:
    """Positions ``[rows]`` of a mixed-voice batch cut into forwards of similar length: voices in order
    of their longest clip, each voice's rows kept together (its mean loss is over all of them), a
    forward closed before it would exceed ``max_frames`` padded frames (rows x longest; at least one
    voice). ``frames[i]`` and ``voices[i]`` are row i's length and voice; None: one forward."""
    if max_frames is None:
        return [np.arange(len(frames))]
    members = {voice: np.flatnonzero(voices == voice) for voice in np.unique(voices)}
    groups, current, rows = [], [], 0
    for voice in sorted(members, key=lambda v: frames[members[v]].max()):
        longest = frames[members[voice]].max()  # the largest so far: voices come in ascending order
        if current and (rows + len(members[voice])) * longest > max_frames:
            groups.append(np.concatenate(current))
            current, rows = [], 0
        current.append(members[voice])
        rows += len(members[voice])
    groups.append(np.concatenate(current))
    return groups


@torch.no_grad()
def _validation(
    model, bank, cache, val_indices: dict[int, np.ndarray], slot_of: torch.Tensor, max_frames: int | None = None
) -> dict[int, float]:
    """Each voice's held-out mel L1 (keyed by cache speaker index), all voices through the bank in
    forwards of at most ``max_frames`` padded frames (None: one forward)."""
    model.eval()
    indices = np.concatenate(list(val_indices.values()))
    speakers = cache.speakers[indices]
    result = {}
    for positions in length_groups(cache.frames()[indices], speakers, max_frames):
        inputs = banked_inputs(model, collate(cache, indices[positions]))
        rows = torch.from_numpy(speakers[positions])
        with banked(model, bank, slot_of[rows]):
            out = model(**inputs)
        losses = per_voice_losses(model, out, inputs["mel"], inputs["text_lengths"], rows)
        result.update({voice: float(values["mel"]) for voice, values in losses.items()})
    model.train()
    return result


@dataclass
class VoiceSet:
    """The usable voices under a root folder, featurized together: cache speaker k is ``names[k]``."""

    names: list[str]
    cache: FeatureCache
    train: dict[int, np.ndarray]  # cache speaker index -> training utterance indices
    validation: dict[int, np.ndarray]  # cache speaker index -> held-out utterance indices
    failed: dict[str, str]  # voice name -> why it was left out
    audio: dict[str, list[Path]]  # voice name -> its usable clips' files
    speech_seconds: dict[str, float]  # cache key -> the clip's speech, as the data check counts it

    @staticmethod
    def adapter(voice: int) -> str:
        """The adapter name of cache speaker ``voice`` in the model: not its folder's name, which may hold what an
        adapter name may not (a folder "dot.name" ended a whole job after its data work, nothing saved)."""
        return f"voice{voice}"


def load_voices(
    root: str | Path, bundle: ModelBundle, config: AdaptConfig, seed: int, progress: bool = True
) -> VoiceSet:
    """Check every speaker folder under ``root`` (a failure leaves that voice out, with its reason) and
    featurize the rest in one cache; hold out a share of each voice's clips."""
    folders = speaker_folders(root)  # first: a root that is no folder is refused as such
    failed = {
        folder.name: "recordings without a metadata.csv: transcribe them first (`chorus adapt "
        f"{shlex.quote(str(folder))} --out VOICE --keep-transcribed DIR` writes Whisper's transcripts to DIR), "
        "then put DIR in its place"
        for folder in untranscribed_folders(root)
    }
    voices: dict[str, list[Utterance]] = {}
    speech: dict[str, float] = {}
    # A bar over the folders: the checks take seconds a voice (a probe's 29 folders printed nothing for 93 s).
    with step_progress(f"checking {len(folders)} speaker folders", progress) as bar:
        task = bar.add_task("folders", total=len(folders), status="")
        for folder in folders:
            bar.update(task, status=escape(folder.name))  # a name is no markup: "x[/]" had ended the run
            try:
                report = check_adaptation_data(folder, config, progress=False)
            except ValueError as error:
                failed[folder.name] = str(error)
                continue
            finally:
                bar.advance(task)
            # The folder name is the voice's name, whatever the metadata calls its speaker.
            voices[folder.name] = [
                Utterance(u.key, folder.name, u.text, u.audio_path, u.source) for u in report.valid_utterances()
            ]
            speech |= {f"{folder.name}/{u.key}": report.speech_durations[u.key] for u in report.valid_utterances()}
    if not voices:
        raise ValueError(f"{root}: no voice has usable data: " + "; ".join(f"{n}: {m}" for n, m in failed.items()))
    names = sorted(voices)
    cache, skipped = build_feature_cache(
        [u for n in names for u in voices[n]],
        bundle.front_end,
        bundle.mel_config,
        speaker_names=names,
        with_pitch=bundle.model.config.use_pitch,
        progress=progress,
    )
    for line in skipped:
        print(f"skipped {line}")
    train, validation = {}, {}
    for voice, name in enumerate(names):
        members = np.flatnonzero(cache.speakers == voice)
        if len(members) < 2:
            failed[name] = "fewer than 2 usable clips after featurizing"
            continue
        train_part, val_part = split_held_out(len(members), config.validation_fraction, seed)
        train[voice], validation[voice] = members[train_part], members[val_part]
    audio = {name: [u.audio_path for u in voices[name]] for name in names}
    return VoiceSet(names, cache, train, validation, failed, audio, speech)


def add_voice_adapters(model: AcousticModel, voices: VoiceSet, configs: list, max_frames: int | None = None) -> None:
    """Add each training voice's adapter, its speaker vector starting at its closest speaker (found
    in forwards of at most ``max_frames`` padded frames; None: one)."""
    starts = closest_speakers(
        model, voices.cache, np.array([voices.train[v][0] for v in voices.train]), max_frames=max_frames
    )
    for voice, start in zip(voices.train, starts):
        adapter = voices.adapter(voice)
        add_adapter(model, adapter, configs)
        for _, layer in adapter_layers(model):
            if isinstance(layer, SpeakerVector) and adapter in layer.configs:
                with torch.no_grad():
                    layer.speaker_vector[adapter].copy_(innermost(layer).weight[start])


class ClipSampler:
    """Each call gives ``clips_per_voice`` clips of every training voice, walking each voice's clips in
    its own shuffled order. One random stream per voice, so a voice's batches do not depend on the
    other voices' data."""

    def __init__(self, train: dict[int, np.ndarray], clips_per_voice: int, seed: int):
        self.train, self.clips_per_voice = train, clips_per_voice
        self.rngs = {voice: np.random.default_rng([seed, voice]) for voice in train}
        self.order = {voice: self.rngs[voice].permutation(indices) for voice, indices in train.items()}
        self.cursor = dict.fromkeys(train, 0)

    def next_batch(self) -> np.ndarray:
        chosen = []
        for voice in self.train:
            for _ in range(self.clips_per_voice):
                if self.cursor[voice] == len(self.order[voice]):
                    self.order[voice], self.cursor[voice] = self.rngs[voice].permutation(self.train[voice]), 0
                chosen.append(self.order[voice][self.cursor[voice]])
                self.cursor[voice] += 1
        return np.asarray(chosen)


def slots_for(voices: VoiceSet) -> torch.Tensor:
    """Cache speaker index -> bank slot (-1: the voice does not train)."""
    slot_of = torch.full((len(voices.names),), -1, dtype=torch.long)
    slot_of[list(voices.train)] = torch.arange(len(voices.train))
    return slot_of


def banked_step(
    model: AcousticModel,
    bank,
    cache: FeatureCache,
    chosen: np.ndarray,
    slot_of: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    around: Callable[[], AbstractContextManager] = nullcontext,
    max_frames: int | None = None,
) -> float:
    """One optimizer step on the mixed-voice batch ``chosen`` (cache indices) through ``bank``; the loss
    is the sum of each voice's own mean loss. The batch runs as forwards of similar length of at most
    ``max_frames`` padded frames (:func:`length_groups`; None: one forward), their gradients summed
    (the same sum: each voice lies in one forward). ``around()`` wraps each forward and backward (a
    voice space generating the bank's tensors). Returns the mean over voices of their mel L1."""
    voice_index = slot_of[torch.from_numpy(cache.speakers[chosen])]
    optimizer.zero_grad(set_to_none=True)
    mels = []
    for positions in length_groups(cache.frames()[chosen], voice_index.numpy(), max_frames):
        inputs = banked_inputs(model, collate(cache, chosen[positions]))
        rows = voice_index[positions]
        # Backward inside the block too: checkpointed layers read the routing again.
        with around(), banked(model, bank, rows):
            losses = per_voice_losses(model, model(**inputs), inputs["mel"], inputs["text_lengths"], rows)
            sum(values["total"] for values in losses.values()).backward()
        mels += [values["mel"].item() for values in losses.values()]
    optimizer.step()
    return float(np.mean(mels))


def adapt_many(
    root: str | Path, bundle: ModelBundle, out: str | Path, config: ManyVoicesConfig, *, progress: bool = True
) -> ManyVoicesResult:
    """Adapt every speaker folder under ``root`` in one job; voice ``NAME`` goes to ``out/NAME``."""
    torch.set_num_threads(config.adapt.threads)
    torch.manual_seed(config.seed)
    configs = config.adapt.method_configs()
    out = Path(out)
    for folder in speaker_folders(root):  # before any work, as the command line checks them and adapt() its one
        refuse_voice_folder(out / folder.name, folder)
    started = time.perf_counter()
    voices = load_voices(root, bundle, config.adapt, config.seed, progress)
    outcomes = {name: VoiceOutcome(name, "failed", message) for name, message in voices.failed.items()}
    model = bundle.model
    add_voice_adapters(model, voices, configs, config.adapt.max_frames)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    bank = pack_bank(model, [voices.adapter(v) for v in voices.train], trainable=True)
    slot_of = slots_for(voices)
    trainable = list(bank.parameters())
    optimizer = build_optimizer(
        trainable, config.adapt.memory.optimizer, config.adapt.learning_rate_for(), weight_decay=0.0
    )
    setup_seconds = time.perf_counter() - started

    start_val, best, train_seconds = _train_bank(model, bank, voices, slot_of, optimizer, config, progress)
    outcomes |= _save_voices(model, bundle, voices, out, config, start_val, best, train_seconds)
    result = ManyVoicesResult(
        sorted(outcomes.values(), key=lambda o: o.name), train_seconds, setup_seconds, config.steps, model
    )
    atomic_write_text(
        out / "adapt-many.json",
        json.dumps(
            {
                "train_seconds": train_seconds,
                "setup_seconds": setup_seconds,
                "steps": config.steps,
                "voices": [asdict(o) for o in result.outcomes],
            },
            indent=1,
        ),
    )
    return result


def _train_bank(model, bank, voices: VoiceSet, slot_of, optimizer, config: ManyVoicesConfig, progress: bool):
    """The step loop of every voice at once: (each voice's held-out mel L1 at the start, each voice's
    ``BestSnapshot``, training seconds). The bank ends holding each voice's best slot, unpacked into
    the model's adapters."""
    max_frames = config.adapt.max_frames
    start_val = _validation(model, bank, voices.cache, voices.validation, slot_of, max_frames)
    best = {voice: BestSnapshot(loss, bank.snapshot(int(slot_of[voice]))) for voice, loss in start_val.items()}
    sampler = ClipSampler(voices.train, config.clips_per_voice, config.seed)
    started = time.perf_counter()
    model.train()
    with step_progress(f"adapt-many ({len(voices.train)} voices)", progress) as bar:
        task = bar.add_task("steps", total=config.steps, status="")
        for step in range(1, config.steps + 1):
            batch = sampler.next_batch()
            mean_mel = banked_step(model, bank, voices.cache, batch, slot_of, optimizer, max_frames=max_frames)
            bar.update(task, completed=step, status=f"mean mel {mean_mel:.3f}")
            if step % config.eval_every == 0 or step == config.steps:
                for voice, loss in _validation(
                    model, bank, voices.cache, voices.validation, slot_of, max_frames
                ).items():
                    best[voice].offer(loss, step, lambda voice=voice: bank.snapshot(int(slot_of[voice])))
    train_seconds = time.perf_counter() - started
    for voice, kept in best.items():
        bank.restore(int(slot_of[voice]), kept.state)
    bank.unpack()
    bank.remove()
    model.eval()
    return start_val, best, train_seconds


def _save_voices(
    model, bundle: ModelBundle, voices: VoiceSet, out: Path, config: ManyVoicesConfig, start_val, best, train_seconds
) -> dict[str, VoiceOutcome]:
    """Each trained voice saved as an ordinary voice folder ``out/NAME`` with its card."""
    configs = config.adapt.method_configs()
    frames_to_minutes = bundle.mel_config.hop_length / bundle.mel_config.sample_rate / 60
    outcomes = {}
    for voice in voices.train:
        name, adapter = voices.names[voice], voices.adapter(voice)
        members = np.flatnonzero(voices.cache.speakers == voice)
        minutes = float(voices.cache.frames()[members].sum()) * frames_to_minutes
        speech_minutes = sum(voices.speech_seconds[voices.cache.keys[i]] for i in members) / 60
        card = VoiceCard(
            name=name,
            methods=config.adapt.voice_methods(),
            base_model_sha256=bundle.weights_sha256,
            data_minutes=round(minutes, 2),
            speech_minutes=round(speech_minutes, 2),
            train_seconds=round(train_seconds, 1),
            steps=config.steps,
            trainable_parameters=sum(
                p.numel()
                for _, layer in adapter_layers(model)
                if layer.configs.get(adapter) and layer.configs[adapter].trains()
                for p in layer.adapter_parameters(adapter)
            ),
            metrics={
                "validation_mel_l1_start": round(start_val[voice], 4),
                "validation_mel_l1_best": round(best[voice].value, 4),
                "held_out_clips": len(voices.validation[voice]),
                "training_clips": len(voices.train[voice]),
            },
            notes={
                "job": f"adapt-many: {len(voices.train)} voices in one job",
                "recipe": {**asdict(config), "adapt": config.adapt.recipe()},
            },
        )
        voice_dir = save_voice(out / name, model, adapter, configs, card)
        outcomes[name] = VoiceOutcome(
            name, "ok", "", str(voice_dir), card.data_minutes, start_val[voice], best[voice].value
        )
    return outcomes
