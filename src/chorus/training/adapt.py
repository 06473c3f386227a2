"""Adapting the base to a new voice: one readable loop (check data, set up, step, evaluate, save).

Data is a single-speaker LJSpeech-style folder. Everything that can be wrong with it (too little
speech, transcripts that do not fit their clips, a target pattern that matches nothing) is refused
before the first step; an unknown method or option already where the recipe is made
(:func:`chorus.adapters.parse_methods`). A share of the clips is held out; training stops early
when their loss stops improving, and the best adapter seen is what gets saved.
"""

from __future__ import annotations

import copy
import functools
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import add_adapter, mark_trainable, set_active
from chorus.adapters.inject import adapter_layers, adapter_state_dict, load_adapter_state_dict
from chorus.adapters.layer import innermost
from chorus.adapters.speaker import SpeakerVector
from chorus.adapters.voice import VOICE_FOLDER, VoiceCard, save_voice
from chorus.data.batching import collate, make_batches
from chorus.data.check import NARROW_BAND_HZ, DatasetReport, check_dataset, tenths_down
from chorus.data.features import FeatureCache, build_feature_cache
from chorus.data.formats import needs_transcripts
from chorus.models.acoustic import AcousticModel, build_model
from chorus.models.bundle import ModelBundle
from chorus.models.device import torch_threads
from chorus.models.losses import compute_losses, step_inputs
from chorus.output_folders import output_folder_problem
from chorus.recipe import TEXT_SIDE_PATTERN, AdaptConfig, MemoryOptions
from chorus.speaker_recognition.bundle import load_encoder, shipped_encoder_dir
from chorus.speaker_recognition.one_speaker import CHECKED_CLIPS, FEWEST_CHECKED, SAME_PERSON, spread, two_voices
from chorus.speaker_recognition.start import similarity_to_clips, speaker_map
from chorus.training.efficiency import apply_memory_options, autocast, build_optimizer, store_frozen_base
from chorus.training.progress import step_progress
from chorus.training.step_loop import LoopResult, StepLoop
from chorus.training.transcripts import auto_transcribe

VOICE = "voice"  # adapter name while training; a voice folder is named by the user


@dataclass
class AdaptResult:
    voice_dir: Path
    card: VoiceCard
    # The base with the voice added as adapter ``VOICE`` (a copy of it unless adapted in place); not printed.
    model: AcousticModel = field(repr=False)
    history: list[dict] = field(repr=False)  # per evaluation: step, train and validation mel loss
    stopped: str = "steps"  # why training ended: a key of step_loop.STOPPED_BY


class DataRefused(ValueError):
    """A refusal of the data to adapt from: ``reason`` says why to anyone, ``advice`` (a command to run, a flag to
    pass) is for the command line's user, and ``str()`` joins them. A server's job tells its uploader the reason
    alone, whose API has no such commands or flags."""

    def __init__(self, reason: str, advice: str = ""):
        super().__init__(reason + advice)
        self.reason, self.advice = reason, advice


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
        raise DataRefused(
            f"{data}: {bad_text} of {len(report.utterances)} transcripts do not fit their clips' "
            "durations (mismatched transcripts?)",
            "; see `chorus data check`",
        )
    valid = report.valid_utterances()
    if not valid:
        reason = report.problems[0].message if report.problems else "no utterances"
        hint = ""
        if any(p.kind == "too_long" for p in report.problems):
            hint = (
                "; long recordings: cut them into sentences, or leave their text out (id|, or no metadata.csv) "
                "and `chorus adapt` cuts them at their silences and has Whisper transcribe the pieces"
            )
        raise DataRefused(f"{data}: nothing usable ({reason})", f"; see `chorus data check {data}`{hint}")
    # Speech, not audio: silence, noise or pauses around the words teach a voice nothing.
    minutes = report.speech_seconds(u.key for u in valid) / 60
    if minutes < config.min_minutes:
        audio = sum(report.durations[u.key] for u in valid)
        raise ValueError(
            f"{data}: {tenths_down(minutes * 60)} s of speech in the usable clips ({audio:.1f} s of audio, with "
            f"the silence, noise and pauses around the words); a voice needs at least {config.min_minutes * 60:g} s of speech "
            "(1-10 minutes is the intended range): record more clips"
        )
    if len(valid) < 2:
        raise ValueError(f"{data}: a voice needs at least 2 usable clips (one is held out for validation)")
    if config.one_speaker_check:
        check_one_speaker(data, valid, report.narrow_band)
    return report


@functools.lru_cache(maxsize=1)
def _checking_encoder(folder: str):
    """The encoder the one-speaker check embeds with, loaded once per process (adapt-many checks each voice's
    folder). Building it draws its initial weights: the training's seed is left as it was (CPU only: the
    encoder runs there, and forking every GPU's state would start each one)."""
    with torch.random.fork_rng(devices=[]):
        return load_encoder(folder)


def check_one_speaker(data: str | Path, clips: list, narrow_band: frozenset[str] = frozenset()) -> None:
    """Refuse ``clips`` (utterances) that sound like two people to the shipped speaker encoder
    (:func:`chorus.speaker_recognition.one_speaker.two_voices`), naming a few clips of each voice, and saying so
    where one voice's clips are the ones with nothing above 4.2 kHz (``narrow_band``: the data check's keys of
    such clips), as one person recorded directly and through a phone line would be."""
    folder = shipped_encoder_dir()
    if folder is None or len(clips) < FEWEST_CHECKED:  # judged as calibrated: up to CHECKED_CLIPS, spread
        return
    chosen = spread(clips, CHECKED_CLIPS)
    found = two_voices(_checking_encoder(str(folder)).embed([u.audio_path for u in chosen]))
    if found is None:
        return
    named = [", ".join(chosen[i].id for i in group[:3]) for group in found.groups]
    narrow = [np.mean([chosen[i].key in narrow_band for i in group]) for group in found.groups]
    channels = (
        f"; the {'first' if narrow[0] > narrow[1] else 'second'} voice's clips hold nothing above "
        f"{NARROW_BAND_HZ / 1000:g} kHz and the other's do: one person recorded directly and through a phone line "
        "(or at 8 kHz)? Keep the clips of one channel"
        if max(narrow) >= 0.75 and min(narrow) <= 0.25
        else ""
    )
    raise DataRefused(
        f"{data}: these recordings sound like two people to Chorus's speaker encoder: {len(found.groups[0])} of "
        f"the {len(chosen)} clips checked like one voice (e.g. {named[0]}), {len(found.groups[1])} like another "
        f"(e.g. {named[1]}); the two score {found.similarity:.2f}, under one person's {SAME_PERSON:.2f}. A voice "
        "is learnt from one person: remove the other's clips (one person recorded on two very different "
        "microphones or lines sounds like two)" + channels,
        "; the command line's --no-one-speaker-check trains anyway",
    )


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
    progress: bool = False,
) -> np.ndarray:
    """The speaker whose conditioning fits each new voice best (lowest teacher-forced mel L1,
    averaged over that voice's clips): the voices' speaker-vector starting points.

    ``groups[i]`` is the voice of clip ``indices[i]`` (default: every clip its own voice); returns one
    speaker index per group, in sorted group order. One forward per speaker for all clips, or with
    ``max_frames`` per length-bucketed batch of at most that many padded frames (many voices' clips
    padded to the longest make attention, quadratic in length, the bulk of the cost). ``progress`` draws a bar
    over the speakers (a forward each: 12 s for 16 clips and 36 speakers on 2 CPU threads).
    """
    groups = np.arange(len(indices)) if groups is None else np.asarray(groups)
    losses = np.zeros((model.config.n_speakers, len(indices)))
    was_training = model.training
    model.eval()
    if max_frames is None:
        buckets = [np.arange(len(indices))]
    else:
        buckets = make_batches(cache.frames()[indices], max_frames, shuffle=False)
    with torch.no_grad(), step_progress("choosing the start speaker", progress) as bar:
        task = bar.add_task("speakers", total=len(buckets) * model.config.n_speakers, status="")
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
                bar.advance(task)
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
            parameter.requires_grad_(not _frozen_base(name, config))
        trainable = [p for p in model.parameters() if p.requires_grad]
    return trainable


def trainable_for(config: AdaptConfig) -> Callable[[AcousticModel], None]:
    """``trainable(model)`` callback for :mod:`chorus.memory`: prepares ``config``'s voice adapter
    (:func:`prepare_for_training`). A partial of a module-level function, so it can be sent to a fresh
    measuring process."""
    return functools.partial(prepare_for_training, config=config)


def refuse_voice_folder(out: str | Path | None, data: str | Path) -> None:
    """``ValueError``, before any work, where writing a voice to ``out`` (swapping the old folder out) would destroy
    what is not a voice: the recordings ``data`` (``out`` is, holds or lies in them), the current folder, a folder
    of other files or of several voices (the library had deleted them: the command line alone checked). A voice
    already at ``out`` is replaced, as a file written again is."""
    if out is None:
        return
    problem = output_folder_problem(Path(out), Path(data), True, VOICE_FOLDER, option="`out`")
    if problem:
        raise ValueError(problem)


def adapt(
    data: str | Path,
    bundle: ModelBundle,
    out: str | Path,
    config: AdaptConfig,
    keep_transcribed: str | Path | None = None,
    **options,
) -> AdaptResult:
    """Make a voice from ``data`` on ``bundle``'s base and save it to ``out`` (:func:`refuse_voice_folder` says
    which ``out`` are refused, before any work; see :func:`_adapt` for
    ``options``). Recordings without transcripts (no ``metadata.csv``, or lines with no text) are
    transcribed by Whisper first (:mod:`chorus.training.transcripts`); the card says how many. With
    ``keep_transcribed`` the clips and Whisper's transcripts stay there, an LJSpeech-style folder to read,
    mend and adapt from again (else they are made in a temporary folder)."""
    if not isinstance(bundle, ModelBundle):
        raise TypeError(f"bundle is a Chorus ModelBundle (a Synthesizer's: tts.bundle), got {type(bundle).__name__}")
    refuse_voice_folder(out, data)
    # The methods on an empty model of the base's shape first (nothing allocated): a target that matches no layer
    # is said before any audio is read or transcribed.
    prepare_for_training(build_model(bundle.model.config, "meta"), config)
    if not needs_transcripts(data):
        return _adapt(data, bundle, out, config, **options)
    if keep_transcribed is not None:
        kept = Path(keep_transcribed).resolve()
        if kept.exists():
            raise ValueError(f"{keep_transcribed}: exists; --keep-transcribed writes a new folder")
        if kept.is_relative_to(Path(data).resolve()):
            raise ValueError(f"{keep_transcribed}: inside {data}, where it would be read as recordings next time")
    with tempfile.TemporaryDirectory(prefix="chorus-transcribed-") as temporary:
        work = str(keep_transcribed or temporary)
        auto = auto_transcribe(
            data, work, max_seconds=config.transcribed_clip_seconds, progress=options.get("progress", True)
        )
        if options.get("progress", True):  # a server's job has no terminal: its card's notes say it
            print(
                f"{auto.automatic} of {auto.clips} clip(s) transcribed by Whisper ({auto.automatic_seconds / 60:.1f} "
                f"of {auto.seconds / 60:.1f} min of audio)"
            )
        notes = {"automatic_transcripts": f"{auto.automatic} of {auto.clips} clips (Whisper tiny.en)"}
        try:
            # Kept, the transcribed folder is what its user reads and mends: a line is named there and by its origin.
            sources = (
                {line: f"{line} (from {origin})" for line, origin in auto.sources.items()}
                if keep_transcribed
                else auto.sources
            )
            return _adapt(auto.folder, bundle, out, config, extra_notes=notes, sources=sources, **options)
        except ValueError as error:
            reason, advice = (error.reason, error.advice) if isinstance(error, DataRefused) else (str(error), "")
            if keep_transcribed is not None:  # the kept folder is what to read and mend: named as it is
                raise DataRefused(reason, f"{advice} (the transcribed clips: {keep_transcribed})") from None
            # Name the recordings given, not the temporary folder made from them.
            named = reason.replace(str(auto.folder), str(data)).replace(work, str(data))
            advice = advice.replace(str(auto.folder), str(data)).replace(work, str(data))
            raise DataRefused(named, f"{advice} (--keep-transcribed DIR keeps the transcribed clips to read)") from None


@dataclass
class _VoiceData:
    """The voice's clips, checked and turned into features, split into training and held-out clips."""

    valid: list  # the usable utterances, in the folder's order
    cache: FeatureCache
    train_indices: np.ndarray
    val_indices: np.ndarray
    minutes: float  # of the features' audio
    speech_minutes: float  # of it speech, as the data check counts it
    notes: dict[str, str]  # for the card: what was left out, and the data check's warning (left_out_notes)


@dataclass
class _Start:
    """Where the voice starts: the base speaker (and its vector) nearest the clips."""

    speaker: int
    vector: torch.Tensor | None  # the speaker encoder's guess at a vector; None: the speaker's own row
    notes: dict
    encoder: object | None  # Chorus's speaker encoder: it also judges the finished voice


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
    in_place: bool = False,
    keep_on_interrupt: bool = False,
    sources: dict[str, str] | None = None,
) -> AdaptResult:
    """Make a voice from ``data`` (an LJSpeech-style folder with its transcripts) on ``bundle``'s base
    and save it to ``out``.

    The voice is trained on a copy of ``bundle.model``, which is left as it was (to adapt again, or to speak
    its base speakers). ``in_place``: adapter methods add their tensors to ``bundle.model`` itself (its base
    weights untouched), for a caller that loaded the base for this voice alone (the command line, a server's
    job) and so saves the copy; full fine-tuning and a bf16 or int8 frozen base train a copy either way. The torch
    thread count is ``config.threads`` while it runs and is set back after. ``progress`` draws a progress bar; ``on_step(steps_done, steps_at_most)`` is called
    after every optimizer step (early stopping may end the loop before ``steps_at_most``), and with 0
    steps done after the data check and after the features (an exception it raises stops ``adapt``);
    ``on_evaluate(step, model)`` after every held-out evaluation, with the voice active in ``model``
    (to follow more than the mel loss over the steps; it must leave the model as it found it);
    ``on_start(speaker)`` with the base speaker index the voice starts from, before the first step (the
    base speaker that fits the data best: what a sample's voice speaks as until it is refined).
    ``keep_on_interrupt``: an interrupt (Ctrl-C) ends training and the best evaluation so far is saved
    (``AdaptResult.stopped`` is "interrupted"; the caller says so and exits as interrupted); else it propagates.
    ``sources``: where each line of ``data``'s metadata.csv came from, when ``data`` was written from the user's
    recordings (``AutoTranscripts.sources``): a clip left out is named by the user's own line.
    """
    with torch_threads(config.threads):
        torch.manual_seed(config.seed)
        voice = _read_voice_data(data, bundle, config, progress, on_step, sources or {})
        # Full fine-tuning and a lighter frozen base train a copy however the caller asks: the base stays as it is.
        copied = not in_place or config.methods.full or config.memory.frozen_dtype != "fp32"
        model = copy.deepcopy(bundle.model) if copied else bundle.model
        apply_memory_options(model, config.memory)
        start = _starting_speaker(bundle, model, config, voice, progress)
        if on_start is not None:
            on_start(start.speaker)
        trainable = _add_voice(model, config, start)
        loop = _train(model, trainable, voice, config, progress, on_step, on_evaluate, keep_on_interrupt)
        _freeze_best(model, trainable, loop.best.state)
        trained = sum(p.numel() for p in trainable)
        if config.memory.frozen_dtype != "fp32":
            voice_tensors = _voice_of(model, config)
            del model, trainable  # the lighter model itself goes before the stored base is copied
            model = _on_the_stored_base(bundle, voice_tensors, config)
        card = _card(bundle, model, config, voice, start, loop, trained, name or Path(out).name)
        card.notes.update({**(extra_notes or {}), **voice.notes})
        voice_dir = save_voice(out, model, VOICE, config.method_configs(), card, full=config.methods.full)
    return AdaptResult(Path(voice_dir), card, model, loop.history, loop.stopped)


def _voice_of(model: AcousticModel, config: AdaptConfig) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of what ``model``'s voice holds: its adapter's tensors (``adapter_state_dict``: the trained ones
    and those it keeps as they started, like a speaker vector that does not train) and, for full
    fine-tuning, the base weights it trained (by name)."""
    trained = {}
    if config.methods.full:
        trained = {name: p.detach().clone() for name, p in model.named_parameters() if not _frozen_base(name, config)}
    adapter = {key: value.detach().clone() for key, value in adapter_state_dict(model, VOICE).items()}
    return {"adapter": adapter, "trained": trained}


def _frozen_base(name: str, config: AdaptConfig) -> bool:
    """Whether full fine-tuning leaves parameter ``name`` as the base has it (prepare_for_training's rule)."""
    kept = re.fullmatch(TEXT_SIDE_PATTERN, name) or name.startswith(("speaker_embedding.", "speaker_proj."))
    return bool(config.keep_text_side and kept)


def _on_the_stored_base(bundle: ModelBundle, voice: dict, config: AdaptConfig) -> AcousticModel:
    """The voice (:func:`_voice_of`) on a copy of the base as it is stored: what the voice is judged on (its
    card), saved from and returned with, as it will be spoken. The lighter base it trained on (bf16 or
    int8, :func:`store_frozen_base`) runs only under autocast, and is not what serves it."""
    stored = copy.deepcopy(bundle.model)
    prepare_for_training(stored, config)
    load_adapter_state_dict(stored, VOICE, voice["adapter"])
    with torch.no_grad():
        for name, parameter in stored.named_parameters():
            if name in voice["trained"]:
                parameter.copy_(voice["trained"][name])
    return stored.requires_grad_(False).eval()


def _read_voice_data(
    data: str | Path,
    bundle: ModelBundle,
    config: AdaptConfig,
    progress: bool,
    on_step: Callable | None,
    sources: dict[str, str],
) -> _VoiceData:
    """Check the folder (refusing what cannot make a voice), make its features, hold some clips out; a clip left
    out is named by its line in ``sources`` where it has one there (``_adapt``'s ``sources``)."""
    report = check_adaptation_data(data, config, progress)
    if on_step is not None:
        on_step(0, config.steps)  # the data check done: a caller may stop here (a cancelled job)
    valid = report.valid_utterances()
    say_left_out(report, sources)
    cache, skipped = voice_features(valid, bundle, progress)
    for line in skipped:
        print(f"skipped {_named(line, sources)}")
    if on_step is not None:
        on_step(0, config.steps)  # the features made
    train_indices, val_indices = split_held_out(len(cache), config.validation_fraction, config.seed)
    minutes = float(cache.frames().sum()) * bundle.mel_config.hop_length / bundle.mel_config.sample_rate / 60
    speech_minutes = report.speech_seconds(cache.keys) / 60
    notes = left_out_notes(report, features_failed=len(skipped))
    return _VoiceData(valid, cache, train_indices, val_indices, minutes, speech_minutes, notes)


def _named(line: str, sources: dict[str, str]) -> str:
    """``line`` ("<source>: why") with its source named as ``sources`` names it, where it has a name there."""
    source = next((source for source in sources if line.startswith(f"{source}: ")), None)
    return line if source is None else sources[source] + line[len(source) :]


def say_left_out(report: DatasetReport, sources: dict[str, str] | None = None) -> None:
    """Print each clip the data check left out, and its warnings (nothing above 4.2 kHz, noise); ``sources``
    names a line of a transcribed folder by its origin (:attr:`~chorus.training.transcripts.AutoTranscripts.sources`)."""
    for problem in report.problems:
        print(f"skipped {_named(f'{problem.source}: {problem.message}', sources or {})}")
    for warning in report.warning_notes().values():
        print(f"warning: {warning}")


def left_out_notes(report: DatasetReport, features_failed: int = 0) -> dict[str, str]:
    """The voice card's account of the data (a server's job has no terminal to print to): ``skipped_clips``,
    how many clips were left out and why (``features_failed``: of the usable ones, those whose features could
    not be made), and the data check's warnings (``narrow_band``, ``noisy``), where there are such."""
    left_out = _left_out(report) + Counter({"features": features_failed})
    notes = {}
    if left_out:
        why = ", ".join(f"{n} {kind}" for kind, n in left_out.most_common())
        notes["skipped_clips"] = f"{left_out.total()} ({why})"
    return notes | report.warning_notes()


def _left_out(report: DatasetReport) -> Counter[str]:
    """How many clips the data check left out, by the kind of each one's first problem (a metadata line that
    cannot be used, such as an id given twice, counts as one)."""
    first = {}
    for problem in report.problems:
        if problem.utterance is not None:
            first.setdefault(problem.utterance.key, problem.kind)
    return Counter(first.values()) + Counter(p.kind for p in report.problems if p.kind == "metadata")


def voice_features(valid: list, bundle: ModelBundle, progress: bool) -> tuple[FeatureCache, list[str]]:
    """One voice's utterances as ``bundle``'s features (all as one speaker), and the lines skipped."""
    return build_feature_cache(
        valid,
        bundle.front_end,
        bundle.mel_config,
        speaker_names=[valid[0].speaker],
        with_pitch=bundle.model.config.use_pitch,
        progress=progress,
    )


def _starting_speaker(
    bundle: ModelBundle, model: AcousticModel, config: AdaptConfig, voice: _VoiceData, progress: bool
) -> _Start:
    """The base speaker the voice starts from: by the speaker encoder where ``config`` names one (and a
    vector mapped from its embedding), else the speaker whose conditioning fits 16 clips best."""
    encoder_dir = config.speaker_encoder or shipped_encoder_dir()  # also judges the voice at the end
    encoder = load_encoder(encoder_dir) if encoder_dir is not None else None
    if config.speaker_encoder is None:
        first = voice.train_indices[:16]
        speaker = int(closest_speakers(model, voice.cache, first, np.zeros(len(first)), progress=progress)[0])
        return _Start(speaker, None, {"start": "mel loss"}, encoder)
    mapping = speaker_map(bundle, encoder)
    clips = encoder.embed([u.audio_path for u in voice.valid[:16]]).mean(0)
    speaker = mapping.nearest(clips)
    notes = {
        "start": "speaker encoder",
        "speaker_encoder": str(config.speaker_encoder),
        "start_similarity": round(float(mapping.embeddings[speaker] @ (clips / np.linalg.norm(clips))), 4),
        "speaker_map_ridge": mapping.ridge,
    }
    return _Start(speaker, torch.from_numpy(mapping.vector(clips)), notes, encoder)


def _add_voice(model: AcousticModel, config: AdaptConfig, start: _Start) -> list[torch.nn.Parameter]:
    """Add the voice's adapter (a target that matches nothing fails here) and start its speaker vector
    at the starting speaker's; returns what trains."""
    trainable = prepare_for_training(model, config)
    for _, layer in adapter_layers(model):
        if isinstance(layer, SpeakerVector):
            with torch.no_grad():
                vector = innermost(layer).weight[start.speaker] if start.vector is None else start.vector
                layer.speaker_vector[VOICE].copy_(vector)
    store_frozen_base(model, config.memory.frozen_dtype)  # after: the vector starts at the table's row as stored
    return trainable


def _train(
    model: AcousticModel,
    trainable: list[torch.nn.Parameter],
    voice: _VoiceData,
    config: AdaptConfig,
    progress: bool,
    on_step: Callable[[int, int], None] | None,
    on_evaluate: Callable[[int, AcousticModel], None] | None,
    keep_on_interrupt: bool = False,
) -> LoopResult[list[torch.Tensor]]:
    """The step loop: batches of the training clips, epoch after epoch; the held-out mel loss every
    ``config.eval_every`` steps, stopping after ``config.patience`` evaluations without improvement or
    ``config.max_minutes``."""
    optimizer = build_optimizer(trainable, config.memory.optimizer, config.learning_rate_for(), weight_decay=0.0)
    # Autocast on the device the model was loaded on (`--device`): bf16 on the CPU as on a GPU.
    precision, device = config.memory.precision, model.mel_mean.device
    batches = _epochs(voice, config)

    def train_step(step: int) -> float:
        batch = next(batches)
        batch.speakers.zero_()
        inputs = step_inputs(model, batch)
        with autocast(precision, device):
            losses = compute_losses(model, model(**inputs), inputs["mel"], inputs["text_lengths"])
        optimizer.zero_grad(set_to_none=True)
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        if on_step is not None:
            on_step(step, config.steps)
        return losses["mel"].item()

    def evaluate(step: int) -> float:
        value = mel_loss(model, voice.cache, voice.val_indices, config.max_frames, precision=precision)
        if on_evaluate is not None:
            on_evaluate(step, model)
        return value

    loop = StepLoop(
        steps=config.steps,
        eval_every=config.eval_every,
        title=f"adapt ({config.methods.spec})",
        patience=config.patience,
        max_seconds=config.max_minutes * 60,
        progress=progress,
        keep_on_interrupt=keep_on_interrupt,
    )
    model.train()
    return loop.run(train_step, evaluate, lambda: [p.detach().clone() for p in trainable])


def _epochs(voice: _VoiceData, config: AdaptConfig):
    """Training batches without end: each epoch the clips bucketed by length in a new order."""
    epoch = 0
    while True:
        frames = voice.cache.frames()[voice.train_indices]
        for positions in make_batches(frames, config.max_frames, seed=config.seed + epoch):
            yield collate(voice.cache, voice.train_indices[positions])
        epoch += 1


def _freeze_best(model: AcousticModel, trainable: list[torch.nn.Parameter], best: list[torch.Tensor]) -> None:
    """Put the best evaluation's tensors back, freeze everything and leave training-only memory options."""
    with torch.no_grad():
        for parameter, value in zip(trainable, best, strict=True):
            parameter.copy_(value)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.eval()
    apply_memory_options(model, MemoryOptions())


def _card(
    bundle: ModelBundle,
    model: AcousticModel,
    config: AdaptConfig,
    voice: _VoiceData,
    start: _Start,
    loop: LoopResult,
    trainable_count: int,
    name: str,
) -> VoiceCard:
    """The voice's card: how it was made and how close it came (held-out mel loss, and the speaker
    encoder's similarity of held-out texts in the new voice to its clips)."""
    similarity = None
    if start.encoder is not None:
        by_key = {u.key: u for u in voice.valid}
        held_out = [by_key[voice.cache.keys[i]] for i in voice.val_indices[:3] if voice.cache.keys[i] in by_key]
        texts = [u.text for u in held_out]
        clips = [u.audio_path for u in voice.valid[:16]]
        similarity = similarity_to_clips(bundle, model, VOICE, start.speaker, start.encoder, texts, clips)
    return VoiceCard(
        name=name,
        methods=config.voice_methods(),
        base_model_sha256=bundle.weights_sha256,
        data_minutes=round(voice.minutes, 2),
        speech_minutes=round(voice.speech_minutes, 2),
        train_seconds=round(loop.seconds, 1),
        steps=loop.steps,
        trainable_parameters=trainable_count,
        metrics={
            "validation_mel_l1_start": round(loop.history[0]["val_mel"], 4),
            "validation_mel_l1_best": round(loop.best.value, 4),
            "best_step": loop.best.step,
            "held_out_clips": len(voice.val_indices),
            "training_clips": len(voice.train_indices),
            # Chorus's speaker encoder: held-out texts in the new voice against its clips (cosine).
            **({"encoder_similarity_to_clips": round(similarity, 4)} if similarity is not None else {}),
        },
        notes={
            "speaker_vector_start": bundle.speakers[start.speaker],
            **start.notes,
            "recipe": config.recipe(),
            "memory_options": asdict(config.memory),
            "stopped": loop.stop_note(),
        },
    )
