"""The ``chorus`` command line. Thin: parses arguments, calls the library, prints."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from chorus.atomic import atomic_write_text

app = typer.Typer(help="Chorus: many voices on one text-to-speech model.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False)
data_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)
corpus_app = typer.Typer(help="Build the offline multi-speaker training corpus.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(corpus_app, name="corpus")
space_app = typer.Typer(help="A voice space: a voice as a short vector that generates its adapter.", no_args_is_help=True)
app.add_typer(space_app, name="voice-space")
console = Console()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True)  # paths stay copyable
    raise typer.Exit(2)


@contextmanager
def _user_errors():
    """Bad input (files, configs, names) ends the command with its message, not a traceback."""
    try:
        yield
    except KeyError as error:
        _fail(str(error.args[0]) if error.args else repr(error))
    except (ValueError, OSError) as error:
        _fail(str(error))


@app.command()
def pretrain(
    data: Path = typer.Argument(..., help="Corpus root: a folder of LJSpeech-style speaker folders."),
    out: Path = typer.Option(Path("runs/base"), help="Run folder (features, checkpoint/, log.csv, loss.png)."),
    steps: int = typer.Option(30_000, help="Total optimizer steps (a resumed run continues to this)."),
    max_frames: int = typer.Option(4_800, help="Padded mel frames per batch and process."),
    anneal_from: Optional[int] = typer.Option(
        None, help="From this step the learning rate falls linearly to 0 at --steps (also on resume)."),
    config: Optional[Path] = typer.Option(None, help="JSON file with AcousticConfig fields (new runs only)."),
    default_speaker: Optional[str] = typer.Option(None, help="Voice used when none is asked for."),
    threads: int = typer.Option(2, help="CPU threads per process."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:1 ..."),
) -> None:
    """Pretrain (or resume) the multi-speaker base model. Run under `torchrun` for DDP."""
    from chorus.models.config import AcousticConfig
    from chorus.training.pretrain import PretrainConfig
    from chorus.training.pretrain import pretrain as run_pretrain

    with _user_errors():
        model_config = AcousticConfig.from_dict(json.loads(config.read_text())) if config else AcousticConfig()
        recipe = PretrainConfig(data=str(data), out=str(out), model=model_config, steps=steps,
                                max_frames=max_frames, anneal_from=anneal_from, threads=threads,
                                device=device, default_speaker=default_speaker)
        checkpoint = run_pretrain(recipe)
    console.print(f"checkpoint: {checkpoint}")


@app.command()
def speakers(model: Optional[Path] = typer.Option(None, help="Model folder (default: the shipped base).")) -> None:
    """List the base model's voices."""
    from chorus.models.bundle import load_bundle
    from chorus.synthesis import DEFAULT_BASE

    with _user_errors():
        bundle = load_bundle(model or DEFAULT_BASE)
    table = Table("index", "voice", "default")
    for index, name in enumerate(bundle.speakers):
        table.add_row(str(index), name, "yes" if name == bundle.default_speaker else "")
    console.print(table)


@app.command()
def synthesize(
    text: Optional[str] = typer.Option(None, help="Text to speak."),
    text_file: Optional[Path] = typer.Option(None, help="File with one utterance per line."),
    speaker: Optional[str] = typer.Option(None, help="Voice name or index (default: the model's default voice)."),
    voice: Optional[Path] = typer.Option(None, help="An adapted voice folder (from `chorus adapt`) to speak with."),
    out: Path = typer.Option(Path("out.wav"), help="Output WAV; with --text-file, a folder of 0001.wav, 0002.wav ... named by line number."),
    model: Optional[Path] = typer.Option(None, help="Model folder (default: the shipped base)."),
    vocoder: Optional[str] = typer.Option(
        None, help="Vocoder: griffin-lim, neural (the shipped one), or a folder. Default: the model's."),
    length_scale: float = typer.Option(1.0, help="> 1 speaks slower, < 1 faster."),
) -> None:
    """Speak text with a base voice and report the real-time factor."""
    from chorus.audio.io import save_audio
    from chorus.synthesis import load_base

    if (text is None) == (text_file is None):
        _fail("give exactly one of --text or --text-file")
    if text_file is not None:
        if not text_file.is_file():
            _fail(f"{text_file}: no such file")
        numbered = [(number, line.strip()) for number, line in
                    enumerate(text_file.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]
        if not numbered:
            _fail(f"{text_file}: no text lines")
        # One clip per line, named by its line number so files map back to the text file.
        folder = out if out.suffix == "" else out.parent / out.stem
        jobs = [(f"{text_file}:{number}", line, folder / f"{number:04d}.wav") for number, line in numbered]
    else:
        jobs = [("--text", text, out)]
    if voice is not None and speaker is not None:
        _fail("give --speaker (a base voice) or --voice (an adapted voice), not both")
    with _user_errors():
        tts = load_base(model, vocoder)
        speaker_index = tts.resolve_speaker(speaker)
        voice_name = tts.load_voice(voice) if voice is not None else None
    table = Table("file", "voice", "seconds", "RTF", "text")
    written: list[tuple[Path, str]] = []
    for where, line, path in jobs:
        try:
            result = tts.synthesize(line, speaker_index, length_scale, voice=voice_name)
        except ValueError as error:
            console.print(f"[yellow]skipped {where}: {error}[/]")
            continue
        save_audio(path, result.audio, result.sample_rate)
        written.append((path, line))
        table.add_row(str(path), result.speaker, f"{result.duration:.2f}", f"{result.real_time_factor:.3f}",
                      line[:60])
    console.print(table)
    if not written:
        _fail("nothing was synthesized (see the skipped lines above)")
    if text_file is not None:
        # id|text beside the clips, so `chorus eval FOLDER` can judge them as they are.
        atomic_write_text(written[0][0].parent / "metadata.csv", "".join(f"{p.stem}|{t}\n" for p, t in written))


@app.command()
def adapt(
    data: Path = typer.Argument(..., help="One speaker's LJSpeech-style folder (1-10 minutes of clips)."),
    out: Path = typer.Option(..., help="Voice folder to write, e.g. voices/NAME."),
    method: str = typer.Option("lora", help="lora, residual, prefix, speaker, cln, bitfit or full; combine "
                                              "adapters with + (lora+speaker)."),
    rank: Optional[int] = typer.Option(None, help="LoRA rank (default 4)."),
    alpha: Optional[float] = typer.Option(None, help="LoRA alpha (default 8)."),
    targets: Optional[str] = typer.Option(None, help="Comma-separated module names/suffixes for the first "
                                                      "method, or a regex (full match) if it starts with ^."),
    bottleneck: Optional[int] = typer.Option(None, help="Residual adapter width (default 6)."),
    prefix_length: Optional[int] = typer.Option(None, help="Prefix tuning key/value pairs (default 8)."),
    train_projection: bool = typer.Option(False, help="speaker: also learn a delta of the speaker projection."),
    steps: int = typer.Option(600, help="Most optimizer steps (early stopping usually ends sooner)."),
    learning_rate: Optional[float] = typer.Option(None, help="Default: per method."),
    max_minutes: float = typer.Option(10.0, help="Wall-clock budget of the training loop."),
    optimizer: str = typer.Option("adamw", help="adamw | adamw8bit | adamw8bit-torchao: 8-bit Adam moments, "
                                                "~4x less optimizer memory, same update up to quantization."),
    checkpointing: bool = typer.Option(False, help="Recompute each block in backward: only block inputs "
                                                   "stored, ~30% slower steps, identical gradients."),
    reversible: bool = typer.Option(False, help="For bases built with reversible blocks: O(1) block "
                                                "activations in depth, one extra forward per step."),
    precision: str = typer.Option("fp32", help="fp32 | bf16 (autocast: ~half the activation memory)."),
    frozen_dtype: str = typer.Option("fp32", help="fp32 | bf16: keep the frozen base in bfloat16 (half the weight "
                                                  "memory; needs --precision bf16)."),
    base: Optional[Path] = typer.Option(None, help="Base model folder (default: the shipped base)."),
    threads: int = typer.Option(2, help="CPU threads."),
) -> None:
    """Learn a new voice from a few minutes of one speaker's recordings; writes a voice folder."""
    from chorus.models.bundle import load_bundle
    from chorus.synthesis import DEFAULT_BASE
    from chorus.training.adapt import AdaptConfig
    from chorus.training.adapt import adapt as run_adapt
    from chorus.training.efficiency import MemoryOptions

    with _user_errors():
        options = _method_options(method, rank, alpha, targets, bottleneck, prefix_length, train_projection)
        config = AdaptConfig(method=method, method_options=options, steps=steps, learning_rate=learning_rate,
                             max_minutes=max_minutes, threads=threads,
                             memory=MemoryOptions(optimizer=optimizer, checkpointing=checkpointing,
                                                  reversible=reversible, precision=precision,
                                                  frozen_dtype=frozen_dtype))
        config.method_configs()
        bundle = load_bundle(base or DEFAULT_BASE)
        result = run_adapt(data, bundle, out, config)
    card = result.card
    console.print(f"voice: {result.voice_dir}  ({card.data_minutes:.1f} min of data, {card.steps} steps in "
                  f"{card.train_seconds:.0f} s, {card.trainable_parameters:,} trained parameters, held-out mel L1 "
                  f"{card.metrics['validation_mel_l1_start']:.3f} -> {card.metrics['validation_mel_l1_best']:.3f})")
    console.print(f"speak with it: chorus synthesize --voice {result.voice_dir} --text \"Hello.\"")


def _method_options(method: str, rank, alpha, targets, bottleneck, prefix_length, train_projection) -> dict:
    """Per-method config fields from the command-line flags; a flag for a method not chosen is an error."""
    chosen = [m.strip() for m in method.split("+")]
    parsed_targets = None
    if targets is not None:
        parsed_targets = targets if targets.startswith("^") else [t.strip() for t in targets.split(",") if t.strip()]
    options: dict[str, dict] = {}
    for owner, key, value in (("lora", "r", rank), ("lora", "alpha", alpha), ("residual", "bottleneck", bottleneck),
                              ("prefix", "n_prefix", prefix_length),
                              ("speaker", "train_projection", train_projection or None),
                              (chosen[0], "targets", parsed_targets)):
        if value is not None:
            if owner not in chosen:
                raise ValueError(f"--{key.replace('_', '-')} applies to {owner}, not to --method {method}")
            options.setdefault(owner, {})[key] = value
    return options


@app.command("adapt-many")
def adapt_many(
    root: Path = typer.Argument(..., help="A folder of voice folders (LJSpeech-style), one per new voice."),
    out: Path = typer.Option(Path("voices"), help="Each voice is written to OUT/<its folder name>."),
    method: str = typer.Option("lora+speaker", help="Adapter method(s), as for `chorus adapt` (not full)."),
    rank: Optional[int] = typer.Option(None, help="LoRA rank (default 4)."),
    alpha: Optional[float] = typer.Option(None, help="LoRA alpha (default 8)."),
    targets: Optional[str] = typer.Option(None, help="Targets of the first method, as for `chorus adapt`."),
    bottleneck: Optional[int] = typer.Option(None, help="Residual adapter width (default 6)."),
    prefix_length: Optional[int] = typer.Option(None, help="Prefix tuning key/value pairs (default 8)."),
    train_projection: bool = typer.Option(False, help="speaker: also learn a delta of the speaker projection."),
    steps: int = typer.Option(200, help="Updates every voice gets."),
    clips_per_voice: int = typer.Option(2, help="Clips of each voice in every (mixed-voice) batch."),
    learning_rate: Optional[float] = typer.Option(None, help="Default: per method."),
    optimizer: str = typer.Option("adamw", help="adamw | adamw8bit | adamw8bit-torchao."),
    base: Optional[Path] = typer.Option(None, help="Base model folder (default: the shipped base)."),
    threads: int = typer.Option(2, help="CPU threads."),
) -> None:
    """Adapt many voices in one job (mixed-voice batches through batched adapters); each voice is
    exported as a standalone voice folder. A voice whose data fails its checks does not stop the others."""
    from chorus.models.bundle import load_bundle
    from chorus.synthesis import DEFAULT_BASE
    from chorus.training.adapt import AdaptConfig
    from chorus.training.adapt_many import ManyVoicesConfig
    from chorus.training.adapt_many import adapt_many as run_adapt_many
    from chorus.training.efficiency import MemoryOptions

    with _user_errors():
        options = _method_options(method, rank, alpha, targets, bottleneck, prefix_length, train_projection)
        config = ManyVoicesConfig(
            adapt=AdaptConfig(method=method, method_options=options, learning_rate=learning_rate, threads=threads,
                              memory=MemoryOptions(optimizer=optimizer)),
            steps=steps, clips_per_voice=clips_per_voice)
        config.adapt.method_configs()
        bundle = load_bundle(base or DEFAULT_BASE)
        result = run_adapt_many(root, bundle, out, config)
    table = Table("voice", "status", "minutes", "held-out mel L1", "folder or reason")
    for outcome in result.outcomes:
        if outcome.status == "ok":
            table.add_row(outcome.name, "ok", f"{outcome.data_minutes:.1f}",
                          f"{outcome.validation_mel_l1_start:.3f} -> {outcome.validation_mel_l1_best:.3f}",
                          outcome.voice_dir)
        else:
            table.add_row(outcome.name, "[red]failed[/]", "", "", outcome.message)
    console.print(table)
    trained = sum(o.status == "ok" for o in result.outcomes)
    console.print(f"{trained} voice(s) in {result.setup_seconds + result.train_seconds:.0f} s "
                  f"({result.steps} steps each; training {result.train_seconds:.0f} s); summary in {out}/adapt-many.json")
    if trained == 0:
        raise typer.Exit(1)


@app.command()
def memory(
    method: str = typer.Option("lora", help="Adaptation method (as for `chorus adapt`), or full."),
    model: str = typer.Option("shipped", help="shipped (the shipped base's size), 500m (a 506M-parameter "
                                              "configuration), or a JSON file of AcousticConfig fields."),
    batch: int = typer.Option(8, help="Utterances per batch."),
    text_length: int = typer.Option(60, help="Phonemes per utterance (padded)."),
    frames: int = typer.Option(300, help="Mel frames per utterance (padded)."),
    optimizer: str = typer.Option("adamw", help="adamw | adamw8bit | adamw8bit-torchao."),
    precision: str = typer.Option("fp32", help="fp32 | bf16."),
    checkpointing: bool = typer.Option(False, help="Activation checkpointing."),
    frozen_dtype: str = typer.Option("fp32", help="fp32 | bf16 (frozen base stored in bfloat16; needs --precision bf16)."),
    measure: bool = typer.Option(True, help="Also run one real training step and measure it (CPU)."),
    out: Optional[Path] = typer.Option(None, help="Write the bar chart PNG here (and a .md beside it)."),
) -> None:
    """Training memory per category, predicted analytically (any size, on the meta device) and
    measured on a real step: weights, gradients, optimizer states, activations."""
    from chorus.memory.presets import model_config_by_name
    from chorus.memory.report import memory_report
    from chorus.training.adapt import AdaptConfig, trainable_for

    with _user_errors():
        config = model_config_by_name(model)
        AdaptConfig(method=method).method_configs()
        if measure and model == "500m":
            raise ValueError("measuring the 500m configuration needs tens of GB; use --no-measure")
        report = memory_report(config, trainable=trainable_for(method), batch=batch, text_length=text_length,
                               frames=frames, optimizer=optimizer, precision=precision,
                               checkpointing=checkpointing, frozen_dtype=frozen_dtype, measure=measure,
                               fresh_process=measure,
                               out_png=out, label=f"{method} on {model}")
    console.print(report.rich_table())
    console.print(f"{report.parameters:,} parameters, {report.trainable_parameters:,} trained")
    if out is not None:
        atomic_write_text(out.with_suffix(".md"), report.markdown())
        console.print(f"chart: {out}; table: {out.with_suffix('.md')}")


@space_app.command("train")
def voice_space_train(
    root: Path = typer.Argument(..., help="A folder of voice folders to learn the space from."),
    out: Path = typer.Option(..., help="Folder for voice_space.safetensors + voice_space.json."),
    dim: int = typer.Option(64, help="Numbers per voice."),
    method: str = typer.Option("lora+speaker", help="The adapter the space generates."),
    steps: int = typer.Option(300, help="Updates; each takes one clip of every voice."),
    virtual: int = typer.Option(0, help="Also learn over this many new virtual voices, made from ROOT's voices "
                                        "with sox (in OUT-voices/, beside links to ROOT's voices): voices the "
                                        "base never heard, which widen the space; each step then costs more."),
    virtual_minutes: float = typer.Option(1.0, help="Audio of each virtual voice."),
    base: Optional[Path] = typer.Option(None, help="Base model folder (default: the shipped base)."),
    threads: int = typer.Option(2, help="CPU threads."),
) -> None:
    """Learn a voice space over many voices (each gets a vector; a shared hypernetwork makes adapters)."""
    from chorus.corpus.virtual import with_virtual_voices
    from chorus.models.bundle import load_bundle
    from chorus.synthesis import DEFAULT_BASE
    from chorus.training.voice_space_training import VoiceSpaceConfig, train_voice_space

    with _user_errors():
        config = VoiceSpaceConfig(method=method, dim=dim, steps=steps, threads=threads)
        if virtual:
            root = with_virtual_voices(root, out.with_name(out.name + "-voices"), virtual, minutes=virtual_minutes)
            console.print(f"{virtual} virtual voices in {root}")
        space, history = train_voice_space(root, load_bundle(base or DEFAULT_BASE), out, config)
    console.print(f"voice space: {out} (dim {space.dim}); mean held-out mel L1 {history[0]['val_mel']:.3f} -> "
                  f"{min(h['val_mel'] for h in history):.3f}")


@space_app.command("fit")
def voice_space_fit(
    data: Path = typer.Argument(..., help="One speaker's LJSpeech-style folder (30 s or more)."),
    space: Path = typer.Option(..., help="A voice space folder (`chorus voice-space train`)."),
    out: Path = typer.Option(..., help="Voice folder to write."),
    steps: int = typer.Option(600, help="Most steps (it stops earlier once the held-out loss stops improving)."),
    init: str = typer.Option("nearest", help="Where the vector starts: nearest (the training voice whose speaker "
                                             "d-vector is closest to the clips'), embedding (the clips' d-vector "
                                             "through a linear map) or mean (the space's center)."),
    base: Optional[Path] = typer.Option(None, help="Base model folder (default: the shipped base)."),
    threads: int = typer.Option(2, help="CPU threads."),
) -> None:
    """A new voice as a point of a voice space: only its vector learns. Writes a normal voice folder."""
    from chorus.adapters.hypernetwork import VoiceSpace
    from chorus.models.bundle import load_bundle
    from chorus.synthesis import DEFAULT_BASE
    from chorus.training.voice_space_training import fit_voice

    with _user_errors():
        voice_space, _, _ = VoiceSpace.load(space)
        result = fit_voice(data, load_bundle(base or DEFAULT_BASE), voice_space, out, steps=steps, init=init,
                           threads=threads)
    card = result.card
    if result.start_voice:
        console.print(f"started from the nearest training voice: {result.start_voice}")
    console.print(f"voice: {result.voice_dir} ({card.data_minutes:.1f} min of data, {voice_space.dim} numbers, "
                  f"{card.train_seconds:.0f} s; held-out mel L1 {card.metrics['validation_mel_l1_start']:.3f} -> "
                  f"{card.metrics['validation_mel_l1_best']:.3f})")


@app.command()
def serve(
    store: str = typer.Option(..., help="Voice store: a folder (or an fsspec URL) for voices, jobs and metadata."),
    host: str = typer.Option("127.0.0.1", help="Address to bind. Without API keys only loopback is allowed."),
    port: int = typer.Option(8000, help="TCP port."),
    base: Optional[Path] = typer.Option(None, help="Base model folder (default: the shipped base)."),
    vocoder: Optional[str] = typer.Option(None, help="griffin-lim, neural or a folder (default: the model's)."),
    keys: Optional[Path] = typer.Option(None, help="API keys file: 'KEY TENANT' lines or JSON {\"KEY\": \"TENANT\"}."),
    cache_mb: float = typer.Option(64.0, help="Adapter cache budget in MB (least recently used voices are evicted)."),
    adapt_steps: int = typer.Option(300, help="Most training steps of an onboarded voice (early stopping)."),
    adapt_method: str = typer.Option("residual", help="Adapter method(s) of onboarded voices (residual scored best "
                                                      "in bench/adaptation.py), e.g. lora+speaker."),
    adapt_threads: int = typer.Option(1, help="CPU threads of an onboarding job."),
    max_text_chars: int = typer.Option(2000, help="Longest text of one speech request."),
    # -- scale-out on Ray Serve (chorus.serving.ray_app) --
    ray: bool = typer.Option(False, "--ray", help="Serve on a local Ray cluster started on this machine's "
                                                  "resources: --ray-replicas copies of the base, voices routed to "
                                                  "replicas holding them, onboarding as Ray tasks (needs the ray "
                                                  "extra)."),
    ray_replicas: int = typer.Option(2, help="With --ray: speech replicas, one resident base each."),
    ray_voices_per_replica: int = typer.Option(32, help="With --ray: adapted voices one replica holds (least "
                                                        "recently used dropped first)."),
) -> None:
    """Run the multi-tenant voice server (one resident base, voices loaded on demand).

    Routes: POST /v1/audio/speech (OpenAI-compatible), /v1/voices (list, onboard,
    delete), /v1/jobs/ID, /healthz, /metrics.

    API keys map to tenants, from --keys FILE and/or the environment variable
    CHORUS_API_KEYS="key1:tenant1,key2:tenant2"; clients send
    "Authorization: Bearer KEY". With no key configured the server runs
    single-tenant (tenant "default", no authentication) on loopback only.

    With --ray the same HTTP API runs on Ray Serve: a local Ray cluster is
    started on this machine (no dashboard, no usage reporting); each speech
    replica holds one base and the voices it was last asked for (Ray model
    multiplexing by voice), and onboarding jobs run as Ray tasks. Install
    with pip install 'chorus-tts\\[serve,ray]'.
    """
    if ray:
        _serve_ray(store, host, port, base, vocoder, keys, cache_mb, adapt_steps, adapt_method, adapt_threads,
                   max_text_chars, ray_replicas, ray_voices_per_replica)
        return
    try:
        from chorus.serving.api import ServerSettings
        from chorus.serving.api import serve as run_server
    except ImportError as error:
        _fail(f"the server needs the serve extra ({error.name} is missing): pip install 'chorus-tts[serve]'")
    with _user_errors():
        settings = _server_settings(ServerSettings, adapt_method, adapt_steps, adapt_threads, max_text_chars)
        run_server(store, host=host, port=port, base=base, vocoder=vocoder, keys=keys, cache_mb=cache_mb,
                   settings=settings, announce=console.print)


def _server_settings(settings_class, adapt_method: str, adapt_steps: int, adapt_threads: int, max_text_chars: int):
    """Server settings from the command line; a bad onboarding method fails here, before the server starts."""
    from chorus.training.adapt import AdaptConfig

    adapt_config = AdaptConfig(method=adapt_method, steps=adapt_steps, threads=adapt_threads)
    adapt_config.method_configs()
    return settings_class(max_text_chars=max_text_chars, adapt=adapt_config)


def _serve_ray(store, host, port, base, vocoder, keys, cache_mb, adapt_steps, adapt_method, adapt_threads,
               max_text_chars, replicas, voices_per_replica) -> None:
    """``chorus serve --ray``."""
    try:
        from chorus.serving.api import ServerSettings
        from chorus.serving.ray_app import serve_ray
    except ImportError as error:
        _fail(f"--ray needs the serve and ray extras ({error.name} is missing): pip install 'chorus-tts\\[serve,ray]'")
    with _user_errors():
        settings = _server_settings(ServerSettings, adapt_method, adapt_steps, adapt_threads, max_text_chars)
        serve_ray(store, host=host, port=port, base=base, vocoder=vocoder, keys=keys, cache_mb=cache_mb,
                  settings=settings, replicas=replicas, voices_per_replica=voices_per_replica,
                  announce=console.print)


@data_app.command("check")
def data_check(
    root: Path = typer.Argument(..., help="LJSpeech-style folder, a folder of them, or id|speaker|text metadata."),
    max_problems: int = typer.Option(50, help="Problems to list (0 = all)."),
    jobs: int = typer.Option(1, help="Threads reading audio."),
) -> None:
    """Per speaker: clips, minutes, and every problem with its file and line. Exit 1 if any."""
    from chorus.data.check import data_check_command

    raise typer.Exit(data_check_command(root, max_problems, jobs))


@corpus_app.command("build")
def corpus_build(
    out_dir: Path = typer.Argument(..., help="Output folder: train/<voice>/, heldout/<voice>/, voices.json."),
    scale: float = typer.Option(1.0, help="Multiply every voice's utterance count (0.1 for a quick try)."),
    jobs: int = typer.Option(2, help="Voices synthesized in parallel."),
    install: bool = typer.Option(False, help="apt-get install missing Debian packages first (root)."),
) -> None:
    """Synthesize the offline multi-speaker corpus (resumable: re-running skips finished clips)."""
    from chorus.corpus.build import corpus_build_command

    corpus_build_command(out_dir, scale, jobs, install)


@app.command("eval")
def evaluate(
    audio_dir: Path = typer.Argument(..., help="Folder of <id>.wav clips to judge."),
    metadata: Optional[Path] = typer.Option(None, help="id|text file (default: AUDIO_DIR/metadata.csv)."),
    references: Optional[Path] = typer.Option(None, help="Real clips of the target voice (same ids: MCD, F0)."),
    out: Optional[Path] = typer.Option(None, help="Write report.md/report.json here (or a .md/.json file)."),
) -> None:
    """Judge synthesized clips: Whisper WER/CER, speaker similarity, MCD, F0 RMSE, speaking rate."""
    from chorus.evaluation.report import eval_command

    with _user_errors():
        eval_command(audio_dir, metadata, references, out)


@app.command("train-vocoder")
def train_vocoder(
    data: Path = typer.Argument(..., help="Folder of LJSpeech-style speaker folders (any **/wavs/*.wav)."),
    out: Path = typer.Option(Path("runs/vocoder"), help="Run folder; the trained vocoder is saved here."),
    steps: int = typer.Option(20_000, help="Total steps (a resumed run continues to this)."),
    resume: bool = typer.Option(True, help="Continue from OUT's checkpoint if there is one."),
    threads: int = typer.Option(1, help="CPU threads."),
    init_from: Optional[Path] = typer.Option(None, help="Fine-tune this saved vocoder (its architecture)."),
    aligned_model: Optional[Path] = typer.Option(
        None, help="Feed the vocoder this acoustic model's teacher-forced mels of the clips (GTA fine-tuning)."),
    aligned_clips: int = typer.Option(40, help="With --aligned-model: clips per voice forced through it."),
    learning_rate: Optional[float] = typer.Option(None, help="Peak learning rate (default 1e-3)."),
) -> None:
    """Train the Vocos-style neural vocoder on real (or corpus) audio, or fine-tune one on an acoustic
    model's output (--init-from + --aligned-model), so it fits the spectra that model makes."""
    from chorus.training.vocoder import train_vocoder_command

    with _user_errors():
        train_vocoder_command(data, out, steps, resume, threads, init_from, aligned_model, aligned_clips,
                              learning_rate)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo"), help="Folder for the clips and report.md."),
    voices: Optional[str] = typer.Option(None, help="Comma-separated voices (default: four showcase voices)."),
    sentences: int = typer.Option(3, help="Sentences per voice (from the held-out benchmark set)."),
    model: Optional[Path] = typer.Option(None, help="Model folder (default: the shipped base)."),
    adapt_method: str = typer.Option("residual", help="Method for the new voice from the shipped sample "
                                                          "('' to skip adaptation)."),
    adapt_steps: int = typer.Option(150, help="Most adaptation steps for the new voice."),
) -> None:
    """The main job: speak unseen sentences in base voices, adapt a new voice from a 1-minute sample,
    speak with it, and judge everything (WER, similarity, RTF, what the voice cost)."""
    from chorus.audio.io import save_audio
    from chorus.corpus.text import benchmark_sentences
    from chorus.evaluation.report import Judges
    from chorus.evaluation.voices import (
        judge_clips,
        same_versus_different,
        synthesize_grid,
    )
    from chorus.synthesis import load_base

    with _user_errors():
        tts = load_base(model)
    chosen = voices.split(",") if voices else tts.bundle.info.get("showcase_speakers", tts.speakers[:4])
    for voice in chosen:
        if voice not in tts.speakers:
            _fail(f"unknown voice {voice!r}; see `chorus speakers`")
    texts = benchmark_sentences()[:sentences]

    def speak(text: str, voice: str):
        result = tts.synthesize(text, voice)
        return result.audio, result.sample_rate, result.seconds

    clips = synthesize_grid(speak, chosen, texts)
    for clip in clips:
        save_audio(out / f"{clip.voice}_{clip.sentence_index:03d}.wav", clip.audio, clip.sample_rate)
    judges = Judges(reference=False)
    report = judge_clips(clips, judges)
    table = Table("voice", "WER %", "RTF", "transcript of the first sentence")
    for voice in chosen:
        rows = [r for r in report.rows if r.id.startswith(voice + "/")]
        edits = sum(r.word_edits for r in rows)
        words = sum(r.reference_words for r in rows)
        rtf = sum(r.synthesis_seconds for r in rows) / sum(r.audio_seconds for r in rows)
        table.add_row(voice, f"{100 * edits / words:.1f}", f"{rtf:.3f}", rows[0].transcript or "")
    console.print(table)
    similarity = same_versus_different(clips, judges.speaker)
    console.print(f"speaker similarity (resemblyzer): same voice {similarity.same:.3f}, "
                  f"different voices {similarity.different:.3f}"
                  + (f" ({similarity.silent_clips} clip(s) had no speech)" if similarity.silent_clips else ""))
    report.write(out / "report.md")
    console.print(f"clips and report.md in {out}/")
    if adapt_method:
        _demo_adaptation(tts, texts, judges, out, adapt_method, adapt_steps)


def _demo_adaptation(tts, texts: list[str], judges, out: Path, method: str, steps: int) -> None:
    """Second half of the demo: a new voice from the shipped 1-minute sample, and what it cost."""
    import resource

    from chorus.audio.io import save_audio
    from chorus.data.formats import discover
    from chorus.evaluation.voices import VoiceClip, judge_clips
    from chorus.synthesis import SAMPLE_VOICE
    from chorus.training.adapt import AdaptConfig
    from chorus.training.adapt import adapt as run_adapt

    console.print(f"\n[bold]Adapting a new voice[/] from {SAMPLE_VOICE} (held out of pretraining) with {method}")
    base_parameters = sum(p.numel() for p in tts.bundle.model.parameters())
    base_bytes = sum(p.numel() * p.element_size() for p in tts.bundle.model.parameters())
    with _user_errors():
        result = run_adapt(SAMPLE_VOICE, tts.bundle, out / "voices" / "piper-joe",
                           AdaptConfig(method=method, steps=steps), name="piper-joe")
    card = result.card
    artifact = (result.voice_dir / "adapter_model.safetensors").stat().st_size
    name = tts.load_voice(result.voice_dir)
    clips = []
    for index, text in enumerate(texts):
        spoken = tts.synthesize(text, voice=name)
        clips.append(VoiceClip(name, index, text, spoken.audio, spoken.sample_rate, spoken.seconds))
        save_audio(out / f"{name}_{index:03d}.wav", spoken.audio, spoken.sample_rate)
    references, _ = discover(SAMPLE_VOICE)
    report = judge_clips(clips, judges, {name: [u.audio_path for u in references]})
    table = Table("cost / result", "value")
    table.add_row("data", f"{card.data_minutes:.2f} min, {card.metrics['training_clips']} clips "
                          f"(+{card.metrics['held_out_clips']} held out)")
    table.add_row("training", f"{card.steps} steps in {card.train_seconds:.0f} s on the CPU")
    table.add_row("trained parameters", f"{card.trainable_parameters:,} "
                                        f"({100 * card.trainable_parameters / base_parameters:.2f}% of the base)")
    table.add_row("voice artifact", f"{artifact / 1024:.1f} KB ({100 * artifact / base_bytes:.2f}% of the base's weights)")
    table.add_row("peak memory (process RSS)", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    table.add_row("held-out mel L1", f"{card.metrics['validation_mel_l1_start']:.3f} -> "
                                     f"{card.metrics['validation_mel_l1_best']:.3f}")
    table.add_row("WER of the new voice", f"{100 * report.corpus_wer:.1f}%")
    table.add_row("similarity to the real sample", f"{report.means().get('speaker_similarity', float('nan')):.3f}")
    console.print(table)
    console.print(f"voice folder: {result.voice_dir}; speak with it: chorus synthesize --voice {result.voice_dir} "
                  "--text \"...\"")
