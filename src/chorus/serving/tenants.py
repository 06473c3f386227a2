"""API keys and tenants of the voice server.

Every API key maps to one tenant; a tenant sees, uses and deletes only its own voices (plus the base
voices, which every tenant shares). Keys come from a file (``chorus serve --keys FILE``) and/or the
environment variable ``CHORUS_API_KEYS``:

* file, one key per line: ``KEY TENANT`` (blank lines and ``#`` comments are skipped), or
* file, JSON: ``{"KEY": "TENANT", ...}`` or ``[{"key": "KEY", "tenant": "TENANT"}, ...]``;
* ``CHORUS_API_KEYS="key1:tenant1,key2:tenant2"``.

A key is at least :data:`MIN_KEY_LENGTH` characters. In a file it may be given as its digest,
``sha256:<64 hex digits>`` (what ``chorus serve-key TENANT`` prints), so the file holds no secret.
The tenant :data:`OPERATOR_TENANT` is the operator's: its key also reads ``/metrics`` and the detailed
``/healthz``.

Tenant names are store ids (``[a-z0-9][a-z0-9_-]{0,63}``). Keys are kept only as SHA-256 digests, so
looking one up compares digests, not the secrets themselves.

With no key configured the server is single-tenant: every request is tenant ``default`` and no key
is asked for. That mode has no authentication at all, so :func:`check_bind` refuses any host but a
loopback one.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chorus.serving.store import InvalidId, check_id

ENV_VAR = "CHORUS_API_KEYS"
DEFAULT_TENANT = "default"
MIN_KEY_LENGTH = 16  # a guessable key is no key; ``make_key`` gives 43 characters
MAX_KEY_LENGTH = 512
HASHED_PREFIX = "sha256:"
OPERATOR_TENANT = "operator"


class Unauthorized(Exception):
    """No key, a malformed ``Authorization`` header or an unknown key (the message says which, never the key)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _key_digest(key: str, where: str) -> bytes:
    """The digest a key is kept as: of the key itself, or the one a ``sha256:HEX`` entry spells out."""
    if key.startswith(HASHED_PREFIX):
        hex_digest = key[len(HASHED_PREFIX) :]
        if len(hex_digest) != 64 or any(c not in "0123456789abcdef" for c in hex_digest.lower()):
            raise ValueError(f"{where}: a hashed key is '{HASHED_PREFIX}' and 64 hex digits")
        return bytes.fromhex(hex_digest)
    if not MIN_KEY_LENGTH <= len(key) <= MAX_KEY_LENGTH or any(c.isspace() for c in key) or not key.isprintable():
        raise ValueError(
            f"{where}: an API key must be {MIN_KEY_LENGTH}-{MAX_KEY_LENGTH} printable characters without spaces "
            "(`chorus serve-key TENANT` makes one)"
        )
    return _digest(key)


def make_key(tenant: str) -> tuple[str, str]:
    """A new random key for ``tenant`` and its keys-file line (``sha256:HEX TENANT``, no secret in it)."""
    check_id(tenant, "tenant")
    key = secrets.token_urlsafe(32)
    return key, f"{HASHED_PREFIX}{_digest(key).hex()} {tenant}"


@dataclass
class Tenants:
    """Which tenant an API key belongs to. Empty: single-tenant mode (tenant ``default``, no keys)."""

    _by_digest: dict[bytes, str] = field(default_factory=dict)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]], where: str = "keys") -> Tenants:
        tenants = cls()
        tenants._add(pairs, where)
        return tenants

    def _add(self, pairs: Iterable[tuple[str, str]], where: str) -> None:
        """Add ``(key, tenant)`` pairs; a bad one is refused naming ``where`` it came from."""
        for key, tenant in pairs:
            digest = _key_digest(key, where)
            try:
                check_id(tenant, "tenant")
            except InvalidId as error:
                raise ValueError(f"{where}: {error}") from None
            if self._by_digest.get(digest, tenant) != tenant:
                raise ValueError(f"{where}: one API key is given to two tenants")
            self._by_digest[digest] = tenant

    @classmethod
    def load(cls, keys_file: str | Path | None = None, env: Mapping[str, str] | None = None) -> Tenants:
        """Keys from ``keys_file`` (if given) and ``CHORUS_API_KEYS`` of ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env
        tenants = cls()
        if keys_file is not None:
            pairs = parse_keys_file(keys_file)
            if not pairs:  # a keys file that lost its lines must not open the server to everyone
                raise ValueError(
                    f"{keys_file}: no API keys in it (blank or comments only); to serve single-tenant without "
                    "keys on purpose, start without --keys (loopback only)"
                )
            tenants._add(pairs, str(keys_file))
        if env.get(ENV_VAR, "").strip():
            # Named as the variable: a bad key there had been blamed on a good keys file.
            tenants._add(parse_env(env[ENV_VAR]), f"{ENV_VAR}{f' (with {keys_file})' if keys_file else ''}")
        return tenants

    @property
    def single_tenant(self) -> bool:
        return not self._by_digest

    @property
    def names(self) -> list[str]:
        return sorted(set(self._by_digest.values())) if self._by_digest else [DEFAULT_TENANT]

    def authenticate(self, authorization: str | None) -> str:
        """The tenant of an ``Authorization: Bearer KEY`` header; raises :class:`Unauthorized`.
        In single-tenant mode any header (the OpenAI client always sends one) gives ``default``."""
        if self.single_tenant:
            return DEFAULT_TENANT
        if not authorization:
            raise Unauthorized("missing API key: send 'Authorization: Bearer KEY'")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("malformed Authorization header: expected 'Bearer KEY'")
        tenant = self._by_digest.get(_digest(key))
        if tenant is None:
            raise Unauthorized("invalid API key")
        return tenant


def parse_keys_file(path: str | Path) -> list[tuple[str, str]]:
    """``(key, tenant)`` pairs of a keys file (JSON object or list, or ``KEY TENANT`` lines)."""
    path = Path(path)
    if not path.exists() or path.is_dir():  # a pipe (--keys <(...)) is no file, and reads as one
        raise ValueError(
            f"{path}: {'a folder, not a keys file' if path.is_dir() else 'no such keys file'} "
            f"(`chorus serve-key TENANT >> {path}` makes a key and its line)"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: invalid JSON ({error})") from None
        if isinstance(data, dict):
            items = list(data.items())
        else:
            items = []
            for number, entry in enumerate(data, start=1):
                if not isinstance(entry, dict) or not {"key", "tenant"} <= set(entry):
                    raise ValueError(f"{path}: entry {number} must be an object with 'key' and 'tenant'")
                items.append((entry["key"], entry["tenant"]))
        for key, tenant in items:
            if not isinstance(key, str) or not isinstance(tenant, str):
                raise ValueError(f"{path}: keys and tenants must be strings")
        return items
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'KEY TENANT', found {len(fields)} fields")
        pairs.append((fields[0], fields[1]))
    return pairs


def parse_env(value: str) -> list[tuple[str, str]]:
    """``(key, tenant)`` pairs of ``key1:tenant1,key2:tenant2`` (a key may hold ":" but not ",")."""
    pairs = []
    for number, item in enumerate(value.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        key, sep, tenant = item.rpartition(":")
        if not sep or not key:
            raise ValueError(f"{ENV_VAR}: item {number} must be 'key:tenant'")
        pairs.append((key.strip(), tenant.strip()))
    return pairs


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tenants: Tenants) -> None:
    """Refuse to serve without keys on anything but loopback: single-tenant mode has no authentication."""
    if tenants.single_tenant and not is_loopback(host):
        raise ValueError(
            f"no API keys configured (--keys FILE or {ENV_VAR}): the server runs single-tenant "
            f"without authentication and binds only to a loopback host (127.0.0.1, ::1, localhost), "
            f"not {host!r}"
        )
