"""What every command group shares: the console, user errors, and options read from config dataclasses."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
import typer.core
from rich.console import Console

from chorus.output_folders import OutputKind
from chorus.output_folders import output_folder_problem as folder_problem

# No markup: messages carry paths, names and hints such as pip install 'chorus-tts[serve]', which
# rich would read as tags and swallow. Styles are given with style= where wanted.
console = Console(markup=False)
errors = Console(markup=False, stderr=True)


def _check_device(value: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, available on this machine; anything else is a usage error."""
    from chorus.models.device import checked_device

    try:
        return checked_device(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def listed_help(help_text: str) -> str:
    """A command's line in its group's list: the first paragraph of its help, its lines joined. Typer's rich
    list keeps a docstring's line breaks (it joins them only without rich markup), so a paragraph wrapped in
    the source broke mid-sentence in ``chorus --help``."""
    return " ".join(inspect.cleandoc(help_text).split("\n\n")[0].split())


class ListedGroup(typer.core.TyperGroup):
    """A group whose list of commands gives each its first paragraph as one flowing line."""

    def __init__(self, **attrs: Any):
        super().__init__(**attrs)
        for command in self.commands.values():
            if command.short_help is None and command.help:
                command.short_help = listed_help(command.help)


def command_group(**settings: Any) -> typer.Typer:
    """A group of subcommands (``chorus store ...``) or one command's app. Only the ``chorus`` app itself
    offers --install-completion: under a subcommand it would install completion for that subcommand alone."""
    return typer.Typer(add_completion=False, **({"cls": ListedGroup} | settings))


DEVICE_OPTION: Any = typer.Option("cpu", help="Where the model runs: cpu, cuda or cuda:N.", callback=_check_device)
BASE_HELP = (
    "The base: piper-joe (the Piper voice installed with Chorus) or a Piper voice file (voice.onnx, its "
    "voice.onnx.json beside it). Default: the shipped Chorus base (or --model)."
)


def chosen_base(base: str | None, model: Path | None, voice: Path | None = None) -> str | Path | None:
    """What ``--base`` and ``--model`` choose (None: the shipped Chorus base). Without either, a ``voice``
    folder says which base it needs (the one it was adapted on)."""
    if base is not None and model is not None:
        raise ValueError("give --base (a Piper voice) or --model (a Chorus model folder), not both")
    if base is not None or model is not None or voice is None:
        return base if base is not None else model
    from chorus.adapters.voice import read_voice
    from chorus.synthesis.bases import base_of_voice
    from chorus.synthesis.bases.piper import JOE, claims, installed_joe_is

    needed = base_of_voice(voice)
    if needed is not None and claims(needed) and needed.lower().endswith(".onnx") and not Path(needed).is_file():
        if installed_joe_is(read_voice(voice).base_model_sha256):  # a copy of joe under another name
            return JOE
        raise ValueError(f"voice {voice} was adapted on the Piper voice {needed}: give its path with --base")
    return needed


def logged_loss(start: float, end: float, steps: int, log_every: int) -> str:
    """A run's loss as its log holds it: each row the mean of up to ``log_every`` steps, so fewer steps make one
    mean, said as one (not as a loss that did not move: "96.401 -> 96.401")."""
    if steps > log_every:
        return f"{start:.3f} -> {end:.3f} (the first and the last logged, each the mean of up to {log_every} steps)"
    return f"{end:.3f} (the mean of its {steps} steps)"


def overwrite_help(noun: str = "voice (its LICENSE.md too)") -> str:
    """``--overwrite``'s help for a command that writes one ``noun`` as a folder."""
    return f"Replace the {noun} --out already holds, if it holds nothing else."


OVERWRITE_HELP = overwrite_help()


def voice_kind() -> OutputKind:
    from chorus.adapters.voice import VOICE_FOLDER

    return VOICE_FOLDER


def model_kind() -> OutputKind:
    from chorus.models.bundle import MODEL_FILES

    return OutputKind("a model", MODEL_FILES[1:], MODEL_FILES)


def voice_space_kind() -> OutputKind:
    from chorus.adapters.hypernetwork import SPACE_FILES

    return OutputKind("a voice space", SPACE_FILES[:1], SPACE_FILES)


def output_folder_problem(out: Path, data: Path, overwrite: bool, kind: OutputKind | None = None) -> str | None:
    """Why ``kind`` (a voice unless given) may not be written to ``--out`` from the recordings in ``data``, or None
    (:func:`chorus.output_folders.output_folder_problem`, in the command line's words)."""
    return folder_problem(out, data, overwrite, kind or voice_kind())


def refuse_output_folder(out: Path, data: Path, overwrite: bool, kind: OutputKind | None = None) -> None:
    """End the command, before any work, where :func:`output_folder_problem` finds one."""
    problem = output_folder_problem(out, data, overwrite, kind)
    if problem:
        fail(f"--out {problem}")


def given_options(context: typer.Context, *names: str) -> list[str]:
    """The options of ``context``'s command among ``names`` (its parameters' names) that its user gave (on the
    command line or in the environment), as their flags (``--rank``), in the order named."""
    flags = {parameter.name: parameter.opts[0] for parameter in context.command.params}
    given = {"COMMANDLINE", "ENVIRONMENT"}  # typer's own click's ParameterSource, by name
    return [flags[name] for name in names if name in flags and context.get_parameter_source(name).name in given]


def fail(message: str) -> NoReturn:
    errors.print("error:", message, style="bold red", soft_wrap=True)  # paths stay copyable
    raise typer.Exit(2)


def skipped(where: str, why: object) -> None:
    """One line on stderr for a piece of input left out, the rest going on (a line, a clip, a file)."""
    errors.print(f"skipped {where}: {why}", style="yellow")


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input (files, configs, names) ends the command with its message, not a traceback."""
    try:
        yield
    except KeyError as error:
        fail(str(error.args[0]) if error.args else repr(error))
    except (ValueError, OSError) as error:
        fail(str(error))


@contextmanager
def interrupt_said() -> Iterator[None]:
    """Ctrl-C in a training run (:class:`~chorus.training.interrupts.RunInterrupted`): its checkpoint was saved
    at the step it stopped; say so and how to go on, and exit 130 as an interrupt does (a script stops)."""
    from chorus.training.interrupts import RunInterrupted  # here: --help and --version import no training

    try:
        yield
    except RunInterrupted as interrupted:
        console.print(str(interrupted))
        raise typer.Exit(130) from None


def config_default(config_class: type, name: str) -> Any:
    """The default of field ``name`` of the dataclass ``config_class``: an option reads its default from
    the config it fills, so the two never drift apart."""
    field = next(f for f in dataclasses.fields(config_class) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"{config_class.__name__}.{name} has no default")


def config_option(config_class: type, name: str, help: str | None = None) -> Any:
    """A ``typer.Option`` for field ``name`` of ``config_class``: its default, and its help from the
    field's ``metadata["help"]`` unless ``help`` is given."""
    if help is None:
        field = next(f for f in dataclasses.fields(config_class) if f.name == name)
        help = field.metadata.get("help", f"{config_class.__name__}.{name}.")
    return typer.Option(config_default(config_class, name), help=help)


def parameter_default(function: Callable[..., Any], name: str) -> Any:
    """The default of ``function``'s parameter ``name``, for an option that passes it through."""
    default = inspect.signature(function).parameters[name].default
    if default is inspect.Parameter.empty:
        raise ValueError(f"{function.__name__}({name}) has no default")
    return default
