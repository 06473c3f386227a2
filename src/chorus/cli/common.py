"""What every command group shares: the console, user errors, and options read from config dataclasses."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

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
    from chorus.synthesis.bases import base_of_voice
    from chorus.synthesis.bases.piper import claims

    needed = base_of_voice(voice)
    if needed is not None and claims(needed) and needed.endswith(".onnx") and not Path(needed).is_file():
        raise ValueError(f"voice {voice} was adapted on the Piper voice {needed}: give its path with --base")
    return needed


OVERWRITE_HELP = "Replace a voice folder that already exists (its LICENSE.md too)."


def voice_folder_problem(out: Path, data: Path, overwrite: bool) -> str | None:
    """Why a voice may not be written to ``out`` from the recordings in ``data``, or None.

    A voice is written whole, the old folder swapped out (``chorus.atomic.atomic_write_folder``), so this
    refuses what the swap would destroy: the recordings (``out`` is, holds or lies inside ``data``); a folder
    of anything but a voice (``--overwrite`` or not: ``--out voices`` for ``--out voices/NAME`` would lose
    them all); and a voice unless ``overwrite``."""
    from chorus.adapters.voice import CARD_FILE, CHORUS_FILE, CONFIG_FILE

    out_path, data_path = out.resolve(), data.resolve()
    if out_path == data_path or out_path in data_path.parents:
        return f"{out} holds the recordings ({data}), which the voice would replace: give another --out"
    if out_path.is_relative_to(data_path):
        return (
            f"{out} is inside the recordings' folder ({data}), where it would be read as recordings: give another --out"
        )
    if out.is_symlink() and not out.exists():
        return f"{out} is a broken link: give another --out"
    if out.exists() and not out.is_dir():
        return f"{out} is a file, and a voice is a folder: give another --out"
    try:
        if not out.is_dir() or not any(out.iterdir()):
            return None
    except OSError as error:
        return f"{out}: {error}"
    if not any((out / name).is_file() for name in (CARD_FILE, CHORUS_FILE, CONFIG_FILE)):
        return f"{out} holds files that are no voice, which the voice would replace: give another --out (a new folder)"
    return None if overwrite else f"{out} already holds a voice: give another --out, or --overwrite to replace it"


def fail(message: str) -> NoReturn:
    errors.print("error:", message, style="bold red", soft_wrap=True)  # paths stay copyable
    raise typer.Exit(2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input (files, configs, names) ends the command with its message, not a traceback."""
    try:
        yield
    except KeyError as error:
        fail(str(error.args[0]) if error.args else repr(error))
    except (ValueError, OSError) as error:
        fail(str(error))


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
