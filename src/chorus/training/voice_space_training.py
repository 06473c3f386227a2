"""Learning a voice space over many voices, and fitting a new voice as one short vector.

Training: every voice under a root folder gets a vector z; the shared hypernetwork
(:class:`~chorus.adapters.hypernetwork.VoiceSpace`) turns all the z into adapter tensors, which a
voice bank serves to mixed-voice batches (as in ``adapt-many``); the loss is the sum of each voice's
own mean loss, and the hypernetwork and every z learn together.

Fitting: a new voice from 24 seconds of speech to a few minutes learns only its z (``dim`` numbers),
starting from the z of the training voice whose speaker embedding is nearest its clips' (the default),
from its embedding through a linear map fitted on the training voices, or from the space's center;
the embeddings are Chorus's own speaker encoder's where it ships (resemblyzer's otherwise; the
space records which);
the generated adapter is saved as an ordinary voice folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from chorus.adapters import add_adapter, load_adapter_state_dict, parse_methods, remove_adapter
from chorus.adapters.bank import banked, pack_bank
from chorus.adapters.hypernetwork import VoiceSpace, generated
from chorus.adapters.voice import VoiceCard, save_voice
from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.data.batching import collate
from chorus.evaluation.similarity import EncoderJudge, SpeakerJudge
from chorus.models.bundle import ModelBundle
from chorus.models.losses import step_inputs
from chorus.recipe import AdaptConfig
from chorus.speaker_recognition.bundle import load_encoder, shipped_encoder_dir
from chorus.training.adapt import check_adaptation_data, split_held_out, voice_features
from chorus.training.adapt_many import (
    ClipSampler,
    _validation,
    add_voice_adapters,
    banked_step,
    load_voices,
    per_voice_losses,
    slots_for,
)
from chorus.training.step_loop import StepLoop

FITTED = "voice"  # adapter name of the voice being fitted


@dataclass
class VoiceSpaceConfig:
    """method: the adapter the space generates; dim: numbers per voice."""

    method: str = "lora+speaker"
    dim: int = 64
    steps: int = 300
    clips_per_voice: int = 1
    learning_rate: float = 5e-4  # on the hypernetwork: each step moves every generated tensor
    # by about lr x |z|_1, so it must be far below an adapter's own
    eval_every: int = 50
    min_minutes: float = 0.15  # of speech: each voice only places its vector; a little per voice is enough
    threads: int = 2
    seed: int = 1234

    def __post_init__(self) -> None:
        # full had trained a speaker vector alone under its name, and dim 0 a space of no numbers
        if parse_methods(self.method).full:
            raise ValueError("full fine-tuning makes one model per voice; a voice space generates adapters")
        for name in ("dim", "steps", "clips_per_voice", "eval_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def train_voice_space(
    root: str | Path, bundle: ModelBundle, out: str | Path, config: VoiceSpaceConfig, *, progress: bool = True
) -> tuple[VoiceSpace, list[dict]]:
    """Learn a space over every speaker folder under ``root``; saves it to ``out``. Returns the space
    and the validation history (mean held-out mel L1 over voices)."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    # The space's bases adapt every layer the method targets, text side included: the recipe its
    # benchmark measured (bench/voice_space.py), where each voice is one vector, not a free adapter.
    adapt_config = AdaptConfig(
        methods=parse_methods(config.method),
        threads=config.threads,
        min_minutes=config.min_minutes,
        keep_text_side=False,
        one_speaker_check=False,  # the corpus's voices, one engine voice a folder: as its benchmark trained them
    )
    configs = adapt_config.method_configs()
    voices = load_voices(root, bundle, adapt_config, config.seed, progress)
    for name, message in voices.failed.items():
        print(f"left out {name}: {message}")
    model = bundle.model
    add_voice_adapters(model, voices, configs)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    names, adapters = [voices.names[v] for v in voices.train], [voices.adapter(v) for v in voices.train]
    bank = pack_bank(model, adapters)
    slot_of = slots_for(voices)
    space = VoiceSpace.from_bank(bank, config.dim, configs, bundle.weights_sha256)
    # Each voice's starting adapter (its closest speaker's vector) is folded into the
    # centers; z starts random (unit norm on average) so that every voice pulls the bases its own way
    # from the first step.
    z = nn.Parameter(torch.randn(len(names), config.dim) / config.dim**0.5)
    optimizer = torch.optim.AdamW([*space.parameters(), z], lr=config.learning_rate, weight_decay=0.0)
    sampler = ClipSampler(voices.train, config.clips_per_voice, config.seed)

    def train_step(step: int) -> float:
        batch = sampler.next_batch()
        return banked_step(
            model, bank, voices.cache, batch, slot_of, optimizer, around=lambda: generated(bank, space.generate(z))
        )

    def validate(step: int) -> float:
        with generated(bank, space.generate(z.detach())):
            return float(np.mean(list(_validation(model, bank, voices.cache, voices.validation, slot_of).values())))

    title = f"voice space ({len(names)} voices, dim {config.dim})"
    loop = StepLoop(steps=config.steps, eval_every=config.eval_every, title=title, progress=progress)
    model.train()
    result = loop.run(train_step, validate, lambda: _copy(space, z))
    _restore(space, z, result.best.state)
    bank.remove()
    for adapter in adapters:
        remove_adapter(model, adapter)
    model.eval()
    space.set_voices(names, z.detach())
    _fit_embedding_map(space, voices)
    space.save(out)
    return space, result.history


def _copy(space: VoiceSpace, z: torch.Tensor) -> list[torch.Tensor]:
    return [p.detach().clone() for p in space.parameters()] + [z.detach().clone()]


def _restore(space: VoiceSpace, z: torch.Tensor, values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for parameter, value in zip([*space.parameters(), z], values, strict=True):
            parameter.copy_(value)


ENCODER_EMBEDDER = "chorus-speaker-encoder"


def _fit_embedding_map(space: VoiceSpace, voices) -> None:
    """Keep the training voices' mean speaker embeddings and map them to z: by Chorus's shipped speaker
    encoder where it is installed, else by resemblyzer when the judges are; neither, no map."""
    if (folder := shipped_encoder_dir()) is not None:
        encoder = load_encoder(folder)
        judge, space.embedder = EncoderJudge(encoder), f"{ENCODER_EMBEDDER}:{encoder.weights_sha256}"
    else:
        try:
            judge = SpeakerJudge()
            judge.encoder  # noqa: B018  (loads resemblyzer, which comes with the `judges` extra)
        except ImportError:
            return
        space.embedder = "resemblyzer"
    embeddings = [torch.from_numpy(speaker_embedding(judge, voices.audio[voices.names[v]][:5])) for v in voices.train]
    space.fit_embedding_map(torch.stack(embeddings).float())


def embedder_of(space: VoiceSpace):
    """The judge that made ``space``'s embeddings, to embed a new voice the same way; ValueError if
    the space was made with a speaker encoder other than the one installed."""
    if space.embedder == "resemblyzer":
        return SpeakerJudge()
    folder = shipped_encoder_dir()
    encoder = load_encoder(folder) if folder is not None else None
    if encoder is None or space.embedder != f"{ENCODER_EMBEDDER}:{encoder.weights_sha256}":
        raise ValueError(
            f"this voice space's embeddings come from {space.embedder}, which is not the installed speaker "
            "encoder: fit with --init mean, or learn the space again"
        )
    return EncoderJudge(encoder)


def speaker_embedding(judge, paths: list[Path]) -> np.ndarray:
    """Mean speaker embedding of a few clips of one voice (``judge``: resemblyzer's or Chorus's encoder)."""
    return judge.reference_embedding([load_audio(path, SAMPLE_RATE) for path in paths], SAMPLE_RATE)


FIT_STARTS = ("nearest", "embedding", "mean")


@dataclass
class FittedVoice:
    """``start_voice``: the training voice whose z the fit started from (``init="nearest"``), else None."""

    voice_dir: Path
    card: VoiceCard
    z: torch.Tensor
    history: list[dict]
    start_voice: str | None = None


def _check_start(init: str) -> None:
    if init not in FIT_STARTS:
        raise ValueError(f"init must be one of {', '.join(FIT_STARTS)}, got {init!r}")


def starting_z(space: VoiceSpace, embedding: torch.Tensor, init: str) -> tuple[torch.Tensor, str | None]:
    """Where a new voice's z starts, and the training voice it is (if any), from its mean speaker embedding ``[D]``.

    ``nearest``: the z of the training voice with the closest embedding; ``embedding``: the embedding
    through the fitted linear map; ``mean``: the center (z = 0). A space that kept no embeddings (or
    no map) starts at its center.
    """
    _check_start(init)
    if init == "nearest" and (index := space.nearest_voice(embedding)) is not None:
        return space.voice_z[index].clone(), space.voice_names[index]
    if init == "embedding" and (z := space.z_from_embedding(embedding)) is not None:
        return z.clone(), None
    return torch.zeros(space.dim), None


def fit_voice(
    data: str | Path,
    bundle: ModelBundle,
    space: VoiceSpace,
    out: str | Path,
    *,
    steps: int = 600,
    learning_rate: float = 3e-2,
    eval_every: int = 25,
    patience: int = 4,
    init: str = "nearest",
    threads: int = 2,
    seed: int = 1234,
    progress: bool = True,
) -> FittedVoice:
    """A new voice from ``data`` as a point of ``space``: only z (``space.dim`` numbers) learns, from
    the start ``init`` names (see :func:`starting_z`).

    ``steps`` is a cap: the fit stops once the held-out mel L1 has not improved for ``patience``
    evaluations and keeps the best z. (A cap of 150 stopped every benchmark voice while its held-out
    loss still fell; with 600, early stopping ended them at 375-400 steps.)
    """
    if space.base_model_sha256 and bundle.weights_sha256 and space.base_model_sha256 != bundle.weights_sha256:
        raise ValueError("this voice space was learned on another base model")
    _check_start(init)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    valid, cache, train, val, speech_minutes = _fitting_data(data, bundle, seed, progress)
    model = bundle.model
    add_adapter(model, FITTED, space.configs)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    bank = pack_bank(model, [FITTED])
    start, start_voice = torch.zeros(space.dim), None
    if init != "mean":
        embedding = torch.from_numpy(speaker_embedding(embedder_of(space), [u.audio_path for u in valid[:10]])).float()
        start, start_voice = starting_z(space, embedding, init)
    z = nn.Parameter(start)
    optimizer = torch.optim.Adam([z], lr=learning_rate)

    def loss_on(indices: np.ndarray, grad: bool) -> torch.Tensor:
        batch = collate(cache, indices)
        inputs = step_inputs(model, batch)
        index = torch.zeros(len(indices), dtype=torch.long)
        with torch.set_grad_enabled(grad), generated(bank, space.generate(z.view(1, -1))), banked(model, bank, index):
            losses = per_voice_losses(model, model(**inputs), inputs["mel"], inputs["text_lengths"], index)[0]
            if grad:
                optimizer.zero_grad(set_to_none=True)
                losses["total"].backward()
        return losses["mel"].detach()

    rng = np.random.default_rng(seed)

    def train_step(step: int) -> float:
        mel = loss_on(rng.choice(train, size=min(8, len(train)), replace=False), grad=True)
        optimizer.step()
        return float(mel)

    def evaluate(step: int) -> float:
        # Without dropout: the held-out loss decides which z is kept, so it must not be a noisy draw.
        model.eval()
        value = float(loss_on(val, grad=False))
        model.train()
        return value

    loop = StepLoop(steps=steps, eval_every=eval_every, title="fit voice vector", patience=patience, progress=progress)
    model.train()
    fitted = loop.run(train_step, evaluate, lambda: z.detach().clone())
    bank.remove()
    model.eval()
    best_z = fitted.best.state
    load_adapter_state_dict(model, FITTED, space.voice_tensors(best_z))
    minutes = float(cache.frames().sum()) * bundle.mel_config.hop_length / bundle.mel_config.sample_rate / 60
    card = VoiceCard(
        name=Path(out).name,
        methods=[c.method for c in space.configs] + ["voice-space"],
        base_model_sha256=bundle.weights_sha256,
        data_minutes=round(minutes, 2),
        speech_minutes=round(speech_minutes, 2),
        train_seconds=round(fitted.seconds, 1),
        steps=fitted.steps,
        trainable_parameters=space.dim,
        metrics={
            "validation_mel_l1_start": round(fitted.history[0]["val_mel"], 4),
            "validation_mel_l1_best": round(fitted.best.value, 4),
            "held_out_clips": len(val),
            "training_clips": len(train),
        },
        notes={
            "voice_space_z": [round(v, 6) for v in best_z.tolist()],
            "init": init,
            "start_voice": start_voice,
            "recipe": {"steps": steps, "learning_rate": learning_rate, "seed": seed},
        },
    )
    voice_dir = save_voice(out, model, FITTED, space.configs, card)
    remove_adapter(model, FITTED)
    return FittedVoice(Path(voice_dir), card, best_z, fitted.history, start_voice)


def _fitting_data(data: str | Path, bundle: ModelBundle, seed: int, progress: bool):
    """(usable utterances, their features, training indices, held-out indices, minutes of speech) of a voice to fit: data
    checked as for ``adapt`` but from 24 seconds of speech, a tenth held out."""
    report = check_adaptation_data(data, AdaptConfig(min_minutes=0.4), progress=False)
    valid = report.valid_utterances()
    cache, _ = voice_features(valid, bundle, progress)
    train, val = split_held_out(len(cache), 0.1, seed)
    speech_minutes = report.speech_seconds(cache.keys) / 60
    return valid, cache, train, val, speech_minutes
