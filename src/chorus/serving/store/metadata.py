"""Where the voice store keeps its metadata: one SQLite file (one machine) or PostgreSQL (several).

Both speak the same SQL through :class:`Sql` (``?`` placeholders, rows read by column name) and carry
one schema, versioned by the same migrations: SQLite records its version in ``PRAGMA user_version``,
PostgreSQL in the one-row table ``chorus_schema``. A write transaction is exclusive on both: SQLite's
``BEGIN IMMEDIATE`` takes the file's write lock; on PostgreSQL every write transaction first takes one
transaction-level advisory lock, so a read-check-write of one server never interleaves with another
server's (the store's guarantees rest on that; its writes are a few rows each). Reads take no lock.
A job is claimed in such a transaction too, so two workers never take the same job; an idle worker
looks (a read) before it claims, so the lock is taken only when there is a job to take. (A row lock,
``FOR UPDATE SKIP LOCKED``, would add nothing under that lock: every write to a job takes it.)

Times that servers compare (heartbeats) come from the database's clock (:meth:`Database.now`), not from
each machine's.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

# The store's schema, one step per version. Types valid in both SQLite and PostgreSQL: times are Unix
# seconds in DOUBLE PRECISION (PostgreSQL's REAL is 4 bytes: a 2-minute resolution today).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: voices and jobs
        """CREATE TABLE IF NOT EXISTS voices (
            tenant TEXT NOT NULL,
            id TEXT NOT NULL,
            name TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ready', 'training', 'failed', 'deleted')),
            created DOUBLE PRECISION NOT NULL,
            updated DOUBLE PRECISION NOT NULL,
            blob_url TEXT NOT NULL,
            sha256 TEXT,
            size_bytes BIGINT,
            method TEXT,
            job_id TEXT,
            error TEXT,
            PRIMARY KEY (tenant, id)
        )""",
        """CREATE TABLE IF NOT EXISTS jobs (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            voice_id TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'interrupted')),
            progress DOUBLE PRECISION NOT NULL CHECK (progress BETWEEN 0 AND 1),
            message TEXT,
            created DOUBLE PRECISION NOT NULL,
            updated DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status)",
    ),
    (  # 2: several servers on one store: who owns the work in flight, and where a job's clips are
        "ALTER TABLE voices ADD COLUMN owner TEXT",
        "ALTER TABLE jobs ADD COLUMN owner TEXT",
        "ALTER TABLE jobs ADD COLUMN inputs TEXT",
        """CREATE TABLE IF NOT EXISTS owners (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started DOUBLE PRECISION NOT NULL,
            heartbeat DOUBLE PRECISION NOT NULL
        )""",
    ),
    (  # 3: OpenAI's custom voices: consent recordings (audit records), and a voice's consent and instant voice
        """CREATE TABLE IF NOT EXISTS consents (
            tenant TEXT NOT NULL,
            id TEXT NOT NULL,
            name TEXT NOT NULL,
            language TEXT NOT NULL,
            created DOUBLE PRECISION NOT NULL,
            heard TEXT NOT NULL,
            word_error_rate DOUBLE PRECISION NOT NULL,
            embedding TEXT NOT NULL,
            recording TEXT NOT NULL,
            recording_sha256 TEXT NOT NULL,
            PRIMARY KEY (tenant, id)
        )""",
        "ALTER TABLE voices ADD COLUMN consent_id TEXT",
        "ALTER TABLE voices ADD COLUMN instant TEXT",
    ),
    (  # 4: the consent each onboarding upload was given (its statement, what it kept), beside the voices: it
        # had been only in a jobs folder's consent.jsonl, on one machine's disk, in no backup or migration
        """CREATE TABLE IF NOT EXISTS consent_audit (
            tenant TEXT NOT NULL,
            voice_id TEXT NOT NULL,
            job_id TEXT,
            created DOUBLE PRECISION NOT NULL,
            entry TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS consent_audit_by_voice ON consent_audit (tenant, voice_id)",
    ),
    (  # 5: the base a committed voice was adapted on (its card's sha256), so that a server lists as speakable
        # only its own base's voices when one store has held voices of several bases
        "ALTER TABLE voices ADD COLUMN base TEXT",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
_ADVISORY_LOCK = 0x43686F7275  # "Choru": the one advisory lock every Chorus write transaction takes


class Sql(Protocol):
    """One connection inside a transaction (or a read)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run ``sql`` with ``?`` placeholders; the result has ``fetchone``, ``fetchall`` and ``rowcount``,
        and its rows read by column name."""


class Database(Protocol):
    url: str  # what to show a person (no password)

    def transaction(self, exclusive: bool = True) -> Any:
        """A context manager: one write transaction (committed on exit, rolled back on an exception)."""

    def read(self) -> Any:
        """A context manager: a connection for reads (each statement sees committed data)."""

    def probe_write(self) -> None:
        """Write to the database and commit (raises what a full or read-only database raises)."""

    def now(self) -> float:
        """The database's clock, in Unix seconds."""

    def close(self) -> None: ...


def is_postgres_url(url: str | None) -> bool:
    return url is not None and urlsplit(str(url)).scheme in ("postgresql", "postgres")


def public_url(url: str) -> str:
    """``url`` without its password (what a log line or an error message may show)."""
    parts = urlsplit(str(url))
    if parts.password is None:
        return str(url)
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()


def open_database(url: str | Path) -> Database:
    """The database at ``url``: ``postgresql://...`` (or ``postgres://``), else a SQLite file path or
    ``sqlite:///path`` (``sqlite:////abs/path``); its schema is created or migrated to :data:`SCHEMA_VERSION`."""
    url = str(url)
    if is_postgres_url(url):
        return PostgresDatabase(url)
    return SqliteDatabase(sqlite_path(url))


def sqlite_path(url: str) -> str:
    """The file of a SQLite database named by path or URL (SQLAlchemy's form: ``sqlite:///relative.db``,
    ``sqlite:////absolute.db``)."""
    return str(url).removeprefix("sqlite:///")


def _migrate(db: Sql, version: int, where: str) -> None:
    """Bring a database at schema ``version`` to :data:`SCHEMA_VERSION` (the caller records the new version)."""
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"{where}: store schema version {version} is newer than this Chorus ({SCHEMA_VERSION})")
    for step in MIGRATIONS[version:]:
        for statement in step:
            db.execute(statement)


class SqliteDatabase:
    """One SQLite file in WAL mode (readers in other processes do not block the writer), one connection
    behind a lock: metadata operations are tiny."""

    def __init__(self, path: str | Path):
        self.url = str(path)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        with self.transaction() as db:
            _migrate(db, db.execute("PRAGMA user_version").fetchone()[0], self.url)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def transaction(self, exclusive: bool = True) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so a read-check-write cannot interleave with
        # another process's write.
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    def probe_write(self) -> None:
        with self.transaction() as db:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")  # rewrites the database file's header

    def now(self) -> float:
        return time.time()  # one machine: its clock is the database's

    def backup(self, path: str | Path) -> sqlite3.Connection:
        """A copy of the database at ``path`` (one consistent snapshot, taken while others write), open."""
        copy = sqlite3.connect(str(path), isolation_level=None)
        with self._lock:
            self._db.backup(copy)
        copy.row_factory = sqlite3.Row
        return copy

    def close(self) -> None:
        """Checkpoint the write-ahead log into the database file and close it, so that the file alone
        holds every row (a backup of it, or a lost ``-wal``, loses nothing)."""
        with self._lock:
            try:
                # Another process with the file open (a store shared by servers) may keep part of the log.
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()


class _PostgresSql:
    """A psycopg connection that takes SQLite's ``?`` placeholders (the store's SQL has no other ``?``
    and no ``%``)."""

    def __init__(self, connection):
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._connection.execute(sql.replace("?", "%s"), tuple(params))


class PostgresDatabase:
    """PostgreSQL through psycopg 3 and its connection pool (a few connections: each server's metadata
    traffic is one short statement per request)."""

    def __init__(self, url: str, max_connections: int = 8):
        try:
            import psycopg
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool
        except ImportError as error:
            raise ValueError(
                f"a PostgreSQL store needs psycopg ({error.name} is missing): pip install 'chorus-tts[serve]'"
            ) from None
        psycopg.connect(url, connect_timeout=10).close()  # an unreachable database: its own reason, at once

        self.url = public_url(url)
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            kwargs={"row_factory": dict_row, "autocommit": True},
            open=False,
            name="chorus-store",
        )
        self._pool.open(wait=True, timeout=10.0)
        try:
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

    def _migrate(self) -> None:
        with self.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS chorus_schema (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM chorus_schema").fetchone()
            _migrate(db, 0 if row is None else row["version"], self.url)
            if row is None:
                db.execute("INSERT INTO chorus_schema VALUES (?)", (SCHEMA_VERSION,))
            else:
                db.execute("UPDATE chorus_schema SET version=?", (SCHEMA_VERSION,))

    @contextmanager
    def transaction(self, exclusive: bool = True) -> Iterator[Sql]:
        with self._pool.connection() as connection, connection.transaction():
            if exclusive:
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_LOCK,))
            yield _PostgresSql(connection)

    @contextmanager
    def read(self) -> Iterator[Sql]:
        with self._pool.connection() as connection:
            yield _PostgresSql(connection)

    def probe_write(self) -> None:
        with self.transaction() as db:
            db.execute("UPDATE chorus_schema SET version=version")

    def now(self) -> float:
        with self.read() as db:
            return float(db.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp()) AS now").fetchone()["now"])

    def close(self) -> None:
        self._pool.close()
