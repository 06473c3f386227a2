"""The ``chorus`` command line. Thin: parses arguments, calls the library, prints what it returns.

One module per command group; this one builds the app and adds them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import warnings
from importlib.metadata import PackageNotFoundError, version

import click
import typer
import typer.core
import typer.main

from chorus.cli.common import command_group, console, errors, fail, listed_help

DISTRIBUTION = "chorus-tts"

# Every command, in the order `chorus --help` lists them: (module, attribute: a command function or a
# typer app of subcommands). A command's module loads only when it runs, so `chorus --help` and
# `chorus --version` start without torch or the training stack.
COMMANDS: dict[str, tuple[str, str]] = {
    "pretrain": ("chorus.cli.train", "pretrain"),
    "speakers": ("chorus.cli.synthesize", "speakers"),
    "synthesize": ("chorus.cli.synthesize", "synthesize"),
    "adapt": ("chorus.cli.adapt", "adapt"),
    "adapt-many": ("chorus.cli.adapt", "adapt_many"),
    "memory": ("chorus.cli.memory", "memory"),
    "prune": ("chorus.cli.prune", "prune"),
    "voice-space": ("chorus.cli.voice_space", "space_app"),
    "serve": ("chorus.cli.serve", "serve"),
    "serve-key": ("chorus.cli.serve", "serve_key"),
    "store": ("chorus.cli.store", "store_app"),
    "voices": ("chorus.cli.voices", "voices_app"),
    "speaker": ("chorus.cli.speaker", "speaker_app"),
    "data": ("chorus.cli.data", "data_app"),
    "corpus": ("chorus.cli.data", "corpus_app"),
    "eval": ("chorus.cli.evaluate", "evaluate"),
    "train-vocoder": ("chorus.cli.train", "train_vocoder"),
    "demo": ("chorus.cli.demo", "demo"),
}

# oneDNN (PyTorch's CPU convolutions) keeps compiled primitives for every input shape it meets, up to 1,024,
# and the vocoder meets a new length at nearly every sentence (about 10 primitives a sentence): the CLI's peak
# RSS grew with the text until that cache filled (3,000 words against 100, 1 thread: +18 %, 476 against 402
# MiB). Bounded at 32 it is +8 % (432 MiB; n 3, +5 to +9 %), as with no cache at all less the 5 % a long
# text's larger batches take; the price is primitives made again: +3 to +7 % CPU time (medians of 3-5
# interleaved runs, 1,000-3,000 words, on a shared CPU). 64 kept +9 % in-process, near issue 39's 10 %; 16
# cost the same as 32; 0 (no cache) 10-30 %. Set before the command's module imports torch; a value already
# in the environment wins. bench/cli_speed.py measures the bound against 1,024.
ONEDNN_CACHE_CAPACITY = {"synthesize": "32"}


def written_help(module: str, attribute: str) -> str:
    """The help of a command as its source states it, read without importing its module: a function's
    docstring, or the ``help=`` of the ``command_group(...)`` (a ``typer.Typer``) assigned to ``attribute``."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())  # noqa: SIM115 - read whole at once
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attribute:
            return ast.get_docstring(node) or ""
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == attribute for t in node.targets):
            keywords = getattr(node.value, "keywords", [])
            return next((ast.literal_eval(k.value) for k in keywords if k.arg == "help"), "")
    raise LookupError(f"{module} has no command {attribute!r}")


def load_command(name: str) -> click.Command:
    """The click command ``name`` runs, built by typer from its module (imported now)."""
    module, attribute = COMMANDS[name]
    if name in ONEDNN_CACHE_CAPACITY:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY[name])
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        return typer.main.get_group(target)
    single = command_group()
    single.command(name)(target)
    return typer.main.get_command(single)


_typer_type_column = typer.core.TyperOption.display_type_rich


def _type_column(option: typer.core.TyperOption, ctx: click.Context) -> str | None:
    """What --help shows in an option's type column: nothing for a flag. Typer 0.29 shows ``<bool>`` beside
    every flag (--help and --overwrite too), which reads as if the flag took a value."""
    return None if option.is_flag and option.metavar is None else _typer_type_column(option, ctx)


typer.core.TyperOption.display_type_rich = _type_column


class _LazyCommand(click.Command):
    """A command listed by its written help; the real one is built when it is run (or asked for --help)."""

    def __init__(self, name: str):
        written = written_help(*COMMANDS[name])
        super().__init__(name, help=written, short_help=listed_help(written))

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        # The context (and so the command invoked in it) is the real command's.
        return load_command(self.name).make_context(info_name, args, parent=parent, **extra)


class _LazyGroup(typer.core.TyperGroup):
    """The app's group: every command of :data:`COMMANDS`, each loaded when run (typos still get
    typer's "Did you mean")."""

    def __init__(self, **attrs):
        super().__init__(**attrs)
        self.commands = {name: _LazyCommand(name) for name in COMMANDS}


# -h as well as --help, as piper, espeak-ng and most tools take it (subcommands inherit it from this context).
app = typer.Typer(
    cls=_LazyGroup,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Chorus's own warnings (text left out, characters dropped) as one plain line on stderr, as a user
    reads them; anything else keeps Python's form, with its source line, for whoever must fix it."""
    if category.__module__.startswith("chorus."):
        errors.print(f"warning: {message}")
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def _print_version(value: bool) -> None:
    if not value:
        return
    try:
        console.print(f"chorus {version(DISTRIBUTION)}")
    except PackageNotFoundError:
        fail(f"{DISTRIBUTION} is not installed (pip install -e .), so it has no version")
    raise typer.Exit()


@app.callback()
def main(
    show_version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the installed chorus-tts version and exit.",
    ),
) -> None:
    """Chorus: many voices on one text-to-speech model.

    A speaker is a voice the base model knows (`chorus speakers`).
    A voice is an adapted voice folder (`chorus adapt`).
    A source is an engine that speaks the corpus (espeak-ng, flite, festival)."""
    warnings.showwarning = _show_warning
