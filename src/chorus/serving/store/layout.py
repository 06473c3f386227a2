"""Where a voice store's files live under its root, and the commit marker that makes a folder a voice.

    <root>/<tenant>/<voice_id>/          one committed voice
      adapter_config.json, chorus_voice.json, adapter_model.safetensors, voice_card.json, README.md,
      LICENSE.md, speaker_vector.safetensors (a LoRA voice's)
      COMMITTED.json                     written last: sha256 and size of every file above
    <root>/<tenant>/.upload-<voice_id>-<owner>-<token>/    an upload in progress (removed by ``recover``)
    <root>/.jobs/<job_id>/               a queued job's clips, for a remote root (see ``publish_job_inputs``)
    <root>/.quarantine/<tenant>/<voice_id>-<time>/         a folder ``chorus store repair`` set aside

``root_url`` is anything fsspec opens: a plain path or ``file://`` (local disk, the default),
``s3://``, ``gs://``, ``memory://`` ... A voice folder without a valid ``COMMITTED.json`` is treated
as absent, because object stores have no atomic rename of a prefix: the marker is the commit. On
local disk the folder is also renamed into place in one step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from chorus.adapters.voice import (
    CARD_FILE,
    CHORUS_FILE,
    CONFIG_FILE,
    LICENSE_FILE,
    SPEAKER_FILE,
    WEIGHTS_FILE,
    VoiceError,
)
from chorus.serving.store.records import ID_PATTERN

MARKER_FILE = "COMMITTED.json"
QUARANTINE_DIR = ".quarantine"  # under the root: folders `chorus store repair` set aside
MARKER_FORMAT = "chorus-voice-blob"
UPLOAD_PREFIX = ".upload-"
PROBE_PREFIX = ".write-probe-"  # the write probe of BlobLayout.probe, in the voice root
# Everything a voice folder may hold. Weights are only ever safetensors: a pickle (.bin, .pt, ...)
# runs code when loaded, so a folder carrying one is refused rather than skipped.
VOICE_FILES = frozenset({CONFIG_FILE, CHORUS_FILE, WEIGHTS_FILE, SPEAKER_FILE, CARD_FILE, "README.md", LICENSE_FILE})
REQUIRED_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE})
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
JOB_INPUTS_DIR = ".jobs"  # under a remote root: the clips of queued jobs, for any server's worker

LOCAL = LocalFileSystem()


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


Manifest = dict[str, FileDigest]  # a voice folder's files by name, as its commit marker lists them


class BlobLayout:
    """The files of one store under ``root_url`` (fsspec URL or local path): ``fs`` and ``root`` as fsspec
    splits the URL; ``local`` when they are on local disk."""

    def __init__(self, root_url: str) -> None:
        self.fs, root = fsspec.core.url_to_fs(root_url, **_storage_options(root_url))
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)

    def prepare(self) -> None:
        """Make the root and write and remove a probe file there, so that a read-only or full root fails
        when the store opens, not at the first upload."""
        self.fs.makedirs(self.root, exist_ok=True)
        for stale in self.fs.glob(f"{self.root}/{PROBE_PREFIX}*"):  # a probe of a process killed mid-write
            with contextlib.suppress(OSError):
                self.fs.rm_file(stale)
        self.probe()

    def probe(self) -> None:
        """Write and remove a small file in the voice root: raises what a read-only or full root raises.
        The probe is removed even when writing it failed half-way (a full disk leaves an empty file)."""
        probe = f"{self.root}/{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            self.fs.pipe_file(probe, b"chorus")
        finally:
            with contextlib.suppress(OSError):
                self.fs.rm_file(probe)

    def url(self, path: str) -> str:
        """``path`` as a URL with its protocol (the form records and reports carry)."""
        return self.fs.unstrip_protocol(path)

    def blob(self, tenant: str, voice_id: str) -> str:
        return f"{self.root}/{tenant}/{voice_id}"

    def job_inputs(self, job_id: str) -> str:
        return f"{self.root}/{JOB_INPUTS_DIR}/{job_id}"

    def write_voice(self, tenant: str, voice_id: str, owner: str, files: dict[str, Path], manifest: Manifest) -> None:
        """Commit the local ``files`` as the folder of ``voice_id``: copied to a temporary prefix named for
        ``owner``, checked there against ``manifest``, moved into place, and committed by writing the
        marker. Whatever fails, the temporary prefix is removed and the error raised."""
        blob = self.blob(tenant, voice_id)
        temp = f"{self.root}/{tenant}/{UPLOAD_PREFIX}{voice_id}-{owner}-{uuid.uuid4().hex}"
        try:
            self.fs.makedirs(temp, exist_ok=True)
            for file, path in files.items():
                self.fs.put_file(str(path), f"{temp}/{file}")
            bad = mismatches(self.fs, temp, manifest)
            if bad:
                raise VoiceError(f"upload of {voice_id!r} does not match its source: {', '.join(bad)}")
            self._move_into_place(temp, blob, list(manifest))
            marker = {
                "format": MARKER_FORMAT,
                "version": 1,
                "files": {file: {"sha256": d.sha256, "size": d.size} for file, d in manifest.items()},
            }
            self.fs.pipe_file(f"{blob}/{MARKER_FILE}", json.dumps(marker, indent=2).encode())
        except BaseException:
            self.remove(temp)
            raise

    def _move_into_place(self, temp: str, blob: str, files: list[str]) -> None:
        # Whatever is at ``blob`` now is uncommitted or a failed voice (a ready one was refused).
        self.remove(blob)
        if self.local:
            os.replace(temp, blob)
            return
        for file in files:
            self.fs.mv(f"{temp}/{file}", f"{blob}/{file}")
        self.remove(temp)

    def read_marker(self, blob: str) -> Manifest | None:
        """The committed files of a voice folder, or None if it has no valid commit marker."""
        try:
            marker = json.loads(self.fs.cat_file(f"{blob}/{MARKER_FILE}"))
            files = {file: FileDigest(str(d["sha256"]), int(d["size"])) for file, d in marker["files"].items()}
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            return None  # a marker cut short by a crash reads as no marker
        if marker.get("format") != MARKER_FORMAT or not REQUIRED_FILES <= set(files) <= VOICE_FILES:
            return None
        return files

    def read_card(self, blob: str) -> dict:
        """A voice folder's card (``voice_card.json``) as a dict; ``{}`` where it is missing or unreadable."""
        try:
            card = json.loads(self.fs.cat_file(f"{blob}/{CARD_FILE}"))
        except (FileNotFoundError, ValueError):
            return {}
        return card if isinstance(card, dict) else {}

    def stray_files(self, blob: str) -> list[str]:
        """Names in a voice folder that are neither voice files nor the marker, sorted."""
        return sorted(set(_names(self.fs, blob)) - VOICE_FILES - {MARKER_FILE})

    def remove(self, path: str) -> None:
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass  # an object store may drop an emptied prefix on its own

    def uploads(self) -> list[tuple[str, str | None]]:
        """(path, owner) of every upload prefix under every tenant folder."""
        found = []
        for tenant_path in _subpaths(self.fs, self.root):
            if not ID_PATTERN.fullmatch(_basename(tenant_path)):
                continue  # the SQLite files, the jobs' files
            for entry in _subpaths(self.fs, tenant_path):
                name = _basename(entry)
                if name.startswith(UPLOAD_PREFIX):
                    found.append((entry, _upload_owner(name)))
        return found

    def uploads_of(self, tenant: str, voice_id: str, owner: str) -> list[str]:
        """The upload prefixes of one voice by one owner."""
        return self.fs.glob(f"{self.root}/{tenant}/{UPLOAD_PREFIX}{voice_id}-{owner}-*")

    def orphans(self, known: set[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """(tenant, voice id, path) of the voice folders (``<root>/<tenant>/<id>``) not in ``known``."""
        orphans = []
        for tenant_path in _subpaths(self.fs, self.root):
            tenant = _basename(tenant_path)
            if not ID_PATTERN.fullmatch(tenant) or not self.fs.isdir(tenant_path):
                continue  # the SQLite files, the quarantine
            for entry in _subpaths(self.fs, tenant_path):
                name = _basename(entry)
                if ID_PATTERN.fullmatch(name) and (tenant, name) not in known:
                    orphans.append((tenant, name, entry))
        return sorted(orphans)

    def orphan_urls(self, known: set[tuple[str, str]]) -> list[str]:
        """The orphan voice folders (see :meth:`orphans`) as URLs."""
        return [self.url(path) for _, _, path in self.orphans(known)]

    def quarantine(self, tenant: str, voice_id: str, path: str) -> str:
        """Move the folder at ``path`` to ``<root>/.quarantine/<tenant>/<voice id>-<time>``; its new URL."""
        target = f"{self.root}/{QUARANTINE_DIR}/{tenant}/{voice_id}-{int(time.time())}"
        if self.local:
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.mv(path, target, recursive=True)
        else:  # an object store has no folders to move: each object goes
            for file in self.fs.find(path):
                self.fs.mv(file, f"{target}/{file[len(path) :].lstrip('/')}")
            self.remove(path)
        return self.url(target)


def voice_files(folder: Path) -> dict[str, Path]:
    """The files of a voice folder to upload; refuses pickles and anything else unexpected."""
    if not folder.is_dir():
        raise VoiceError(f"{folder}: not a folder")
    entries = {path.name: path for path in folder.iterdir()}
    pickles = sorted(name for name in entries if Path(name).suffix.lower() in PICKLE_SUFFIXES)
    if pickles:  # first: a PEFT folder saved as adapter_model.bin is told why, not only what it lacks
        raise VoiceError(
            f"{folder}: refusing pickle files {pickles}: voice weights are loaded only from "
            f"safetensors (a pickle can run code when loaded)"
        )
    missing = sorted(REQUIRED_FILES - set(entries))
    if missing:  # then a folder that is no voice is told so, whatever else it holds
        raise VoiceError(f"{folder}: missing {missing} (not a voice folder)")
    # A link is refused, not followed: the copy would store, and the card route serve, whatever file it names.
    links = sorted(name for name, path in entries.items() if path.is_symlink())
    if links:
        raise VoiceError(f"{folder}: refusing symbolic links {links}: a voice folder holds its own files")
    unexpected = sorted(name for name, path in entries.items() if name not in VOICE_FILES or not path.is_file())
    if unexpected:
        raise VoiceError(f"{folder}: unexpected entries {unexpected}; a voice folder holds only {sorted(VOICE_FILES)}")
    return entries


def digest(fs: fsspec.AbstractFileSystem, path: str) -> FileDigest:
    sha256, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha256.update(block)
            size += len(block)
    return FileDigest(sha256.hexdigest(), size)


def mismatches(fs: fsspec.AbstractFileSystem, folder: str, manifest: Manifest) -> list[str]:
    """Names of the files in ``manifest`` that are missing from ``folder`` or differ."""
    bad = []
    for file, expected in manifest.items():
        try:
            if digest(fs, f"{folder}/{file}") != expected:
                bad.append(file)
        except FileNotFoundError:
            bad.append(file)
    return bad


def _subpaths(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    try:
        return [entry.rstrip("/") for entry in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


def _names(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    return [_basename(entry) for entry in _subpaths(fs, path)]


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _upload_owner(name: str) -> str | None:
    """The owner in an upload prefix's name (``.upload-<voice id>-<owner>-<token>``)."""
    parts = name.removeprefix(UPLOAD_PREFIX).rsplit("-", 2)
    return parts[1] if len(parts) == 3 else None


def _storage_options(root_url: str) -> dict:
    """No cached listings on an object store: other servers write the same prefixes."""
    protocol = root_url.split("://", 1)[0] if "://" in root_url else "file"
    return {"use_listings_cache": False} if protocol in ("s3", "s3a", "gs", "gcs", "az", "abfs") else {}
