"""What every command group shares: the console, user errors, and options read from config dataclasses."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console

console = Console()


def fail(message: str) -> NoReturn:
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True)  # paths stay copyable
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
