"""Local copies of the voices of a remote root: a voice is served from a folder on local disk, downloaded
again whenever it does not match its commit marker."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

from chorus.atomic import atomic_write_folder
from chorus.serving.store.layout import LOCAL, BlobLayout, Manifest, mismatches
from chorus.serving.store.metadata import is_postgres_url, sqlite_path


class DownloadCache:
    """Downloaded voices under ``folder`` (``<folder>/<tenant>/<voice id>``); safe to share between
    threads: one download per voice at a time."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._voice_locks: dict[tuple[str, str], threading.Lock] = {}

    def fetch(self, layout: BlobLayout, tenant: str, voice_id: str, manifest: Manifest) -> tuple[Path, list[str]]:
        """The cached folder of a committed voice, downloaded from ``layout`` unless its files already
        match ``manifest``; with the names of the files that still do not match (none when it is whole)."""
        local = self.folder / tenant / voice_id
        blob = layout.blob(tenant, voice_id)
        with self._voice_lock(tenant, voice_id):
            bad = mismatches(LOCAL, str(local), manifest)
            if bad:
                atomic_write_folder(
                    local, lambda temp: [layout.fs.get_file(f"{blob}/{file}", str(temp / file)) for file in manifest]
                )
                bad = mismatches(LOCAL, str(local), manifest)
        return local, bad

    def evict(self, tenant: str, voice_id: str) -> None:
        shutil.rmtree(self.folder / tenant / voice_id, ignore_errors=True)

    def _voice_lock(self, tenant: str, voice_id: str) -> threading.Lock:
        with self._lock:
            return self._voice_locks.setdefault((tenant, voice_id), threading.Lock())


def default_cache_dir(root_url: str, database: str) -> Path:
    """Where a store caches its downloads when no ``cache_dir`` is given: ``voice-cache`` next to a SQLite
    file, or, with a shared (PostgreSQL) database, a folder of this root under ``~/.cache/chorus``."""
    if not is_postgres_url(database):
        return Path(sqlite_path(database)).parent / "voice-cache"
    digest = hashlib.sha256(root_url.encode()).hexdigest()[:16]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chorus" / f"store-{digest}" / "voices"
