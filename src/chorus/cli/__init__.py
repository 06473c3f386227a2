"""The ``chorus`` command line. Thin: parses arguments, calls the library, prints what it returns.

One module per command group; this one builds the app and adds them.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from chorus.cli.adapt import adapt, adapt_many
from chorus.cli.common import console, fail
from chorus.cli.data import corpus_app, data_app
from chorus.cli.demo import demo
from chorus.cli.evaluate import evaluate
from chorus.cli.memory import memory
from chorus.cli.prune import prune
from chorus.cli.serve import serve, serve_key
from chorus.cli.speaker import speaker_app
from chorus.cli.store import store_app
from chorus.cli.synthesize import speakers, synthesize
from chorus.cli.train import pretrain, train_vocoder
from chorus.cli.voice_space import space_app
from chorus.cli.voices import voices_app

DISTRIBUTION = "chorus-tts"

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)


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


app.command()(pretrain)
app.command()(speakers)
app.command()(synthesize)
app.command()(adapt)
app.command("adapt-many")(adapt_many)
app.command()(memory)
app.command()(prune)
app.add_typer(space_app, name="voice-space")
app.command()(serve)
app.command("serve-key")(serve_key)
app.add_typer(store_app, name="store")
app.add_typer(voices_app, name="voices")
app.add_typer(speaker_app, name="speaker")
app.add_typer(data_app, name="data")
app.add_typer(corpus_app, name="corpus")
app.command("eval")(evaluate)
app.command("train-vocoder")(train_vocoder)
app.command()(demo)
