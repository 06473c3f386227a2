"""``chorus voices``: make, list and delete voices on a running server, OpenAI's way (a consent recording and
one sample; :mod:`chorus.serving.client`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Column, Table

from chorus.cli.common import command_group, console, user_errors
from chorus.serving.client import DEFAULT_SERVER, ServerRefused, VoicesClient

voices_app = command_group(
    help="Voices on a running `chorus serve`, OpenAI's way: a consent recording, then a sample of the same speaker."
)
SERVER_OPTION = typer.Option(
    DEFAULT_SERVER, "--server", envvar="CHORUS_SERVER", help="The server's URL (env CHORUS_SERVER)."
)
KEY_OPTION = typer.Option(
    None, "--key", envvar="CHORUS_API_KEY", help="Your API key (env CHORUS_API_KEY; none for a server without keys)."
)


def _stage(voice: dict) -> str:
    if voice["stage"] == "adapted":
        return "adapted (refined on the sample)"
    if voice["refinement"] == "failed":
        return f"instant; its refinement failed: {voice.get('refinement_error') or 'no reason given'}"
    return f"instant (as {voice.get('instant') or 'the base'}); refinement {voice['refinement'] or 'gone'}"


@voices_app.command()
def phrase(
    language: str = typer.Option("en", help="The consent's language (BCP 47: en, en-US)."),
    server: str = SERVER_OPTION,
    key: str | None = KEY_OPTION,
) -> None:
    """Print what a consent recording in LANGUAGE must read (the server's phrase), to record it."""
    with user_errors():
        phrases = VoicesClient(server, key).phrases()["phrases"]
        primary = language.split("-")[0].lower()
        if primary not in phrases:
            raise ValueError(f"no consent phrase for {language!r}; the server has {', '.join(sorted(phrases))}")
    console.print(phrases[primary], soft_wrap=True)


# The server's 429s that refuse a sample before any voice is made (chorus.serving.quotas).
REFUSED_FIRST = frozenset({"busy", "too_many_jobs", "rate_limit_exceeded", "voice_quota_exceeded"})


@voices_app.command()
def create(
    consent: Path = typer.Option(
        ..., exists=True, dir_okay=False, help="The consent recording: the phrase read aloud."
    ),
    sample: Path = typer.Option(..., exists=True, dir_okay=False, help="A sample of the same speaker, 10-30 s."),
    name: str = typer.Option(..., help="The voice's name (the consent recording's too)."),
    language: str = typer.Option(
        "en", help="The consent's language (BCP 47); `chorus voices phrase` prints its phrase."
    ),
    server: str = SERVER_OPTION,
    key: str | None = KEY_OPTION,
    wait: bool = typer.Option(False, "--wait", help="Follow the refinement until the voice is adapted or it failed."),
) -> None:
    """Post the consent recording, then the sample; print the voice's id and stage. The voice speaks at once
    (its instant voice) and is refined in the background; exits 1 if --wait saw the refinement fail."""
    client = VoicesClient(server, key)
    with user_errors():
        taken = client.create_consent(name, language, consent)
        console.print(f"consent {taken['id']} accepted", soft_wrap=True)
        try:
            voice = client.create_voice(name, taken["id"], sample)
        except ServerRefused as refused:
            # The sample was refused, so no voice was made under the consent: left behind, each retry would keep
            # one more (100 at most a tenant). Not after a 5xx, a 408 or a proxy's 429, where the voice may still
            # be made under it; the server's own 429s (busy, too many jobs) come before any voice is made.
            if 400 <= refused.status < 500 and (refused.status not in (408, 429) or refused.code in REFUSED_FIRST):
                try:
                    client.delete_consent(taken["id"])
                    console.print(f"consent {taken['id']} deleted: no voice was made under it", soft_wrap=True)
                except ServerRefused:
                    pass  # the sample's refusal is what to tell; the consent stays
            raise
    console.print(f"voice {voice['id']}: {_stage(voice)}", soft_wrap=True)  # whole lines: ids stay copyable
    if wait:
        voice = _follow(client, voice["id"])
        console.print(f"voice {voice['id']}: {_stage(voice)}", soft_wrap=True)
        if voice["stage"] != "adapted":
            raise typer.Exit(1)


def _follow(client: VoicesClient, voice_id: str) -> dict:
    """The refinement's progress as a bar until its end; the voice then."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    with user_errors(), Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("refining", total=1.0)
        for voice, job in client.follow(voice_id):
            message = (job or {}).get("message") or voice["refinement"] or ""
            bar.update(task, completed=(job or {}).get("progress") or 0.0, description=f"refining: {message}"[:80])
    return voice


@voices_app.command("list")
def list_voices(server: str = SERVER_OPTION, key: str | None = KEY_OPTION) -> None:
    """Your voices on the server, with what each speaks as now."""
    with user_errors():
        voices = VoicesClient(server, key).voices()
    # The id whole, to be copied: a narrow terminal had cut it with "…".
    table = Table(Column("id", no_wrap=True), "name", "stage", "speaks as", "status")
    for voice in voices:
        table.add_row(voice["id"], voice["name"], voice["stage"], speaks_as(voice), listed_status(voice))
    console.print(table)


def speaks_as(voice: dict) -> str:
    """What a voice speaks as now (the list had said "what each speaks as" and shown only its stage): its own
    adapted voice ("itself"), the base speaker or blend its instant voice is, or nothing yet (nothing here for a
    voice adapted on another base than the server's)."""
    if voice.get("this_base") is False:
        return "nothing here: made on another base"
    if voice.get("stage") == "adapted":
        return "itself"
    return voice.get("instant") or "" if voice.get("stage") == "instant" else ""


def listed_status(voice: dict) -> str:
    """A voice's status as the list shows it: an instant voice whose refinement failed still speaks, as its
    instant voice (the server's record says "failed", of the refinement)."""
    if voice.get("stage") == "instant" and voice["status"] == "failed":
        return "speaks; refinement failed"
    return voice["status"]


@voices_app.command()
def delete(
    voice_id: str = typer.Argument(..., help="The voice's id (voice_...)."),
    server: str = SERVER_OPTION,
    key: str | None = KEY_OPTION,
) -> None:
    """Delete a voice (its consent recording stays, as an audit record, until deleted through the API)."""
    with user_errors():
        VoicesClient(server, key).delete(voice_id)
    console.print(f"deleted {voice_id}")
