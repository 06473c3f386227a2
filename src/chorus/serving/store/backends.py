"""What the parts of one open voice store share (its files, its database, who it is), and what those
backends raise while they cannot be reached."""

from __future__ import annotations

from dataclasses import dataclass

from chorus.serving.store.layout import BlobLayout
from chorus.serving.store.metadata import Database


@dataclass(frozen=True)
class Backends:
    """``layout``: the voice folders. ``db``: the metadata (:mod:`chorus.serving.store.metadata`); every write is
    one ``db.transaction()``, exclusive across the servers sharing it. ``owner``: who this store is to the
    others on the same database: work in flight (an upload, a deletion, a job) carries it, and its
    heartbeat says it is alive (see :mod:`chorus.serving.store.owners`)."""

    layout: BlobLayout
    db: Database
    owner: str


def outage_errors() -> tuple[type[Exception], ...]:
    """What a shared store raises while its database or object store cannot be reached: psycopg's and its
    pool's errors (PostgreSQL), botocore's (S3 through s3fs). Each only if installed (the serve extra)."""
    found: list[type[Exception]] = []
    try:
        import psycopg
        import psycopg_pool

        found += [psycopg.Error, psycopg_pool.PoolTimeout]
    except ImportError:
        pass
    try:
        from botocore.exceptions import BotoCoreError

        found.append(BotoCoreError)
    except ImportError:
        pass
    return tuple(found)
