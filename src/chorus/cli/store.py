"""``chorus store``: look after a voice server's store."""

from __future__ import annotations

import functools
from pathlib import Path

import typer
from rich.table import Table

from chorus.cli.common import command_group, console, fail, user_errors

# Lines that name folders or URLs are printed with soft_wrap: a path cut at the terminal's width cannot
# be copied (nor found by a script reading the output).
store_app = command_group(help="Look after a voice server's store (what `chorus serve --store/--database` was given).")
DATABASE_OPTION = typer.Option(
    None,
    "--database",
    "--db",
    help="Its metadata: a postgresql:// URL or a SQLite file (default: STORE/store.sqlite3; needed for a remote STORE).",
)


def existing(store: str, database: str | None) -> None:
    """Refuse a store that is not there: opening it would make a new, empty one, and a mistyped path had
    passed verify ('0 ready voice(s) checked') and made an empty backup."""
    from chorus.serving.store import new_store

    with user_errors():  # a URL fsspec cannot read (foo://x) says so in one line
        missing = new_store(store, database)
    if missing is not None:
        fail(f"{store}: no voice store there ({missing} does not exist); check the path (and --database)")


@store_app.command()
def verify(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    database: str | None = DATABASE_OPTION,
) -> None:
    """Hash every ready voice's files against its commit marker and record, and list voice folders that
    no record lists and voices marked failed for changed files whose files check out again. It changes no voice, so it is safe beside running servers; exits 1 when anything is wrong."""
    from chorus.serving.store import VoiceStore

    existing(store, database)
    with user_errors(), VoiceStore(store, database) as voices:
        report = voices.verify()
    console.print(f"{report.checked} ready voice(s) checked")
    if report.corrupt:
        table = Table("tenant", "voice", "problem", title="corrupt voices")
        for tenant, voice_id, problem in report.corrupt:
            table.add_row(tenant, voice_id, problem)
        console.print(table)
    for folder in report.orphan_folders:
        console.print(f"orphan folder (no record lists it): {folder}", soft_wrap=True)
    for tenant, voice_id, why in report.restorable:
        console.print(
            f"{tenant}/{voice_id}: marked failed ({why}), and its files check out now: `chorus store repair` "
            "makes it ready again",
            soft_wrap=True,
        )
    if not report.ok:
        raise typer.Exit(1)
    console.print("no corrupt voice, no orphan folder")


@store_app.command()
def add(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    tenant: str = typer.Argument(..., help="The tenant the voice belongs to ('default' on a server without keys)."),
    voice_id: str = typer.Argument(..., help="Its id in requests' voice field."),
    folder: Path = typer.Argument(..., help="A voice folder (chorus adapt's output)."),
    database: str | None = DATABASE_OPTION,
) -> None:
    """Add a voice adapted offline (chorus adapt, any --base) to a store, ready at once: how voices of a Piper
    base, which servers do not onboard, reach `chorus serve --base`. The folder is checked as the server
    would load it first."""
    from chorus.serving.store import VoiceConflict, VoiceStore

    with user_errors():
        voice = _checked_voice(voice_id, folder)
        with VoiceStore(store, database) as voices:
            try:
                voices.put_voice(tenant, voice_id, folder)
            except VoiceConflict as error:  # a store error, not bad input: user_errors would let it through
                fail(
                    f"{error}: add it under another id, or delete the voice through a server on this store "
                    f"(chorus voices delete {voice_id}) first"
                )
    base = voice.base_model or "chorus"
    console.print(
        f"{tenant}/{voice_id}: ready in {store} (made on base {base}: serve it with that --base)", soft_wrap=True
    )


def _checked_voice(voice_id: str, folder: Path):
    """The voice at ``folder``, read as a server reads it (its entries first: a link is refused before anything is
    read through it); ``ValueError`` where it is no voice, or ``voice_id`` is a speaker of its base, whom a server
    speaks for that id, so the stored voice was never heard, and no route could delete it (a probe's "flite-rms")."""
    from chorus.adapters.voice import read_voice
    from chorus.serving.store.layout import voice_files
    from chorus.synthesis.bases import CHORUS

    voice_files(folder)
    voice = read_voice(folder)
    base = voice.base_model
    if voice_id in _speakers(None if base in (None, "", CHORUS) else base):
        raise ValueError(
            f"{voice_id!r} is a speaker of the base the voice was made on ({base or CHORUS}): choose another id"
        )
    return voice


@functools.cache
def _speakers(base: str | None) -> frozenset[str]:
    """The speakers of ``base`` (opened once a process: add-many asks for each voice); none where this machine
    cannot open it (a Piper voice file elsewhere: the server, which has it, refuses the id)."""
    from chorus.synthesis.bases import base_speakers

    try:
        return frozenset(base_speakers(base)[0])
    except (OSError, ValueError):
        return frozenset()


@store_app.command("add-many")
def add_many(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    tenant: str = typer.Argument(..., help="The tenant the voices belong to ('default' on a server without keys)."),
    folder: Path = typer.Argument(..., help="A folder of voice folders (chorus adapt-many's --out)."),
    database: str | None = DATABASE_OPTION,
) -> None:
    """Add every voice folder in FOLDER to a store, each under its folder's name, ready at once: chorus store add
    for many voices in one process (each `chorus store add` starts Python and torch again: 6-10 s a voice). A voice
    that cannot be added is named with why and the rest go on; the exit status is 1 if any could not. Like
    `store add`, an operator's command: the tenant's voice quota is the server's to enforce on onboarding."""
    from rich.progress import track

    from chorus.adapters.voice import is_voice_folder
    from chorus.serving.store import VoiceConflict, VoiceStore

    if not folder.is_dir():
        fail(f"{folder}: no such folder")
    folders = sorted(path for path in folder.iterdir() if is_voice_folder(path))
    if not folders:
        fail(f"{folder}: no voice folders in it (folders holding an adapter_config.json, as chorus adapt-many writes)")
    refused: dict[str, str] = {}
    with user_errors(), VoiceStore(store, database) as voices:
        for voice_folder in track(folders, description="adding voices", console=console):
            voice_id = voice_folder.name
            try:
                _checked_voice(voice_id, voice_folder)
                voices.put_voice(tenant, voice_id, voice_folder)
            except (ValueError, OSError, VoiceConflict) as error:  # a bad id or folder, a voice there: the next
                refused[voice_id] = str(error)
    console.print(
        f"{len(folders) - len(refused)} of {len(folders)} voice(s) ready for {tenant} in {store}", soft_wrap=True
    )
    for voice_id, why in refused.items():
        console.print(f"not added: {voice_id}: {why}", soft_wrap=True)
    if refused:
        raise typer.Exit(1)


@store_app.command()
def backup(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    destination: str = typer.Argument(..., help="A new local folder for the copy (it opens as a store)."),
    database: str | None = DATABASE_OPTION,
) -> None:
    """Copy a store, consistently while its server runs: the database through SQLite's online backup, then
    every voice ready in that snapshot, each checked against its commit marker."""
    from chorus.serving.store import VoiceStore

    existing(store, database)
    with user_errors(), VoiceStore(store, database) as voices:
        copied, gone = voices.backup(destination)
    console.print(f"{copied} voice(s) copied to {destination}", soft_wrap=True)
    for tenant, voice_id in gone:
        console.print(f"left out {tenant}/{voice_id}: deleted while the backup ran")


@store_app.command()
def repair(
    store: str = typer.Argument(..., help="The voice store: a folder or an fsspec URL."),
    database: str | None = DATABASE_OPTION,
    force: bool = typer.Option(False, "--force", help="Repair even while a server uses the store."),
) -> None:
    """Deal with voice folders no record lists, deleting none: one whose commit marker and files check out
    becomes a ready voice again; any other moves to the store's .quarantine folder. A voice a server marked
    failed because its files had changed is ready again once they check out (put back from a backup).
    Refused while another process is seen using the store by its heartbeat (a server's upload in flight is a
    folder no record lists yet; one that starts during the repair is not seen): stop it first, or pass
    --force."""
    from chorus.serving.store import VoiceStore

    existing(store, database)
    with user_errors(), VoiceStore(store, database) as voices:
        others = voices.live_others()
        if others and not force:
            who = "; ".join(
                f"{o['host']} pid {o['pid']}, heartbeat {o['beat_seconds_ago']:.0f} s ago" for o in others[:3]
            )
            raise typer.BadParameter(
                f"{len(others)} process(es) use this store now ({who}): stop the server first, or pass --force",
                param_hint="STORE",
            )
        report = voices.repair()
    for tenant, voice_id in report.restored:
        console.print(f"restored {tenant}/{voice_id}: marked failed for changed files, they check out again: ready")
    for tenant, voice_id in report.adopted:
        console.print(f"adopted {tenant}/{voice_id}: its files check out, it is a ready voice again")
    for folder in report.quarantined:
        console.print(f"quarantined: {folder}", soft_wrap=True)
    if not report.adopted and not report.quarantined and not report.restored:
        console.print("no orphan folder, no failed voice whole again: nothing to repair")


@store_app.command()
def migrate(
    source: str = typer.Option(..., "--from", help="The store to copy from: a folder or an fsspec URL."),
    target: str = typer.Option(..., "--to", help="The store to copy into: a folder or an fsspec URL (s3://...)."),
    from_database: str | None = typer.Option(None, help="The source's metadata (default: FROM/store.sqlite3)."),
    to_database: str | None = typer.Option(
        None, help="The target's metadata: a postgresql:// URL for a shared store (default: TO/store.sqlite3)."
    ),
) -> None:
    """Copy every ready voice of one store into another, with its consent recordings and the custom voices
    that speak as their instant voice: a single-machine store (SQLite + folder) into a
    shared one (PostgreSQL + object store), or back. Each voice's files are checked against its commit
    marker and checksum before the copy, again where they land, and the copy's checksums are compared
    with the source's; the target is verified at the end. Voices already in the target are skipped, so a
    migration cut short can be run again. Exits 1 when anything was left out."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from chorus.serving.store import VoiceStore

    existing(source, from_database)
    with user_errors(), VoiceStore(source, from_database) as origin, VoiceStore(target, to_database) as copy:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console) as bar:
            task = bar.add_task("copying voices", total=len(origin.all_voices()))
            report = origin.copy_to(copy, on_voice=lambda voice: bar.advance(task))
        verified = copy.verify()
    console.print(f"{len(report.copied)} voice(s) copied from {source} to {target}, checksums equal", soft_wrap=True)
    if report.instant:
        console.print(
            f"{len(report.instant)} voice(s) that speak as their instant voice (refinement failed or still training) copied"
        )
    console.print(
        f"{report.consents} consent recording(s) and {report.consents_given} consent(s) given with uploads copied"
    )
    for tenant, voice_id, why in report.skipped:
        console.print(f"skipped {tenant}/{voice_id}: {why}")
    for tenant, voice_id in report.gone:
        console.print(f"left out {tenant}/{voice_id}: deleted or replaced while the copy ran")
    for tenant, voice_id, problem in verified.corrupt:
        console.print(f"target: {tenant}/{voice_id} {problem}")
    console.print(f"target verified: {verified.checked} ready voice(s), {len(verified.corrupt)} corrupt")
    if report.gone or not verified.ok or any("not ready" in why for *_, why in report.skipped):
        raise typer.Exit(1)
