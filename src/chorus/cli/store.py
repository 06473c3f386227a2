"""``chorus store``: look after a voice server's store."""

from __future__ import annotations

import typer
from rich.table import Table

from chorus.cli.common import console, user_errors

store_app = typer.Typer(help="Look after a voice server's store (the folder given to `chorus serve --store`).")


@store_app.command()
def verify(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    db: str | None = typer.Option(None, help="Its SQLite file, for a store on an object store."),
) -> None:
    """Hash every ready voice's files against its commit marker and record, and list voice folders that
    no record lists. Reads only, so it is safe beside a running server; exits 1 when anything is wrong."""
    from chorus.serving.store import VoiceStore

    with user_errors(), VoiceStore(store, db) as voices:
        report = voices.verify()
    console.print(f"{report.checked} ready voice(s) checked")
    if report.corrupt:
        table = Table("tenant", "voice", "problem", title="corrupt voices")
        for tenant, voice_id, problem in report.corrupt:
            table.add_row(tenant, voice_id, problem)
        console.print(table)
    for folder in report.orphan_folders:
        console.print(f"orphan folder (no record lists it): {folder}")
    if not report.ok:
        raise typer.Exit(1)
    console.print("no corrupt voice, no orphan folder")


@store_app.command()
def backup(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    destination: str = typer.Argument(..., help="A new local folder for the copy (it opens as a store)."),
    db: str | None = typer.Option(None, help="Its SQLite file, for a store on an object store."),
) -> None:
    """Copy a store, consistently while its server runs: the database through SQLite's online backup, then
    every voice ready in that snapshot, each checked against its commit marker."""
    from chorus.serving.store import VoiceStore

    with user_errors(), VoiceStore(store, db) as voices:
        copied, gone = voices.backup(destination)
    console.print(f"{copied} voice(s) copied to {destination}")
    for tenant, voice_id in gone:
        console.print(f"left out {tenant}/{voice_id}: deleted while the backup ran")


@store_app.command()
def repair(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    db: str | None = typer.Option(None, help="Its SQLite file, for a store on an object store."),
) -> None:
    """Deal with voice folders no record lists, deleting none: one whose commit marker and files check out
    becomes a ready voice again; any other moves to the store's .quarantine folder. Stop the server first."""
    from chorus.serving.store import VoiceStore

    with user_errors(), VoiceStore(store, db) as voices:
        report = voices.repair()
    for tenant, voice_id in report.adopted:
        console.print(f"adopted {tenant}/{voice_id}: its files check out, it is a ready voice again")
    for folder in report.quarantined:
        console.print(f"quarantined: {folder}")
    if not report.adopted and not report.quarantined:
        console.print("no orphan folder: nothing to repair")
