"""A client of a running server's custom voices, OpenAI's way (``chorus voices``): consent recordings, voices
made from one sample, their stage while they are refined.

Plain HTTP with ``requests`` rather than the ``openai`` SDK: the SDK has no call for the stage of a voice
(``GET /v1/audio/voices/{id}``) nor for the consent phrases, and a client must not need the server's extra.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import requests

DEFAULT_SERVER = "http://127.0.0.1:8000"
WAIT_POLL_SECONDS = 1.0


class ServerRefused(ValueError):
    """The server answered with an error: its status, its message (what it heard, the similarity...) and, where
    the answer was Chorus's own JSON error, its ``code`` (None from a proxy in between)."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(f"the server refused ({status}): {message}")
        self.status, self.code = status, code


class ServerUnreachable(ConnectionError):
    """No server answered at the URL (none running, another port, a firewall)."""


def server_root(url: str) -> str:
    """The server's root URL as the routes are joined to it, from what a user gives: OpenAI's ``base_url``
    habit (".../v1") and a bare "host:port" (http, as ``chorus serve`` speaks) are taken too."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url.removesuffix("/v1")


class VoicesClient:
    """The custom-voice routes of the server at ``url`` as tenant of ``key`` (None: a server without keys)."""

    def __init__(self, url: str = DEFAULT_SERVER, key: str | None = None, timeout: float = 300.0):
        self.url = server_root(url)
        self.session = requests.Session()
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"
        self.timeout = timeout  # a consent or sample is checked by Whisper and the encoder before the answer

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self.session.request(method, f"{self.url}{path}", timeout=self.timeout, **kwargs)
        except requests.ConnectionError:
            raise ServerUnreachable(
                f"no Chorus server answers at {self.url} (start one with `chorus serve`, or point at yours with "
                "--server or CHORUS_SERVER)"
            ) from None
        if not response.ok:
            try:
                error = response.json()["error"]
                message, code = error["message"], error.get("code")
            except (ValueError, KeyError, TypeError, AttributeError):
                message, code = response.text[:300] or response.reason, None
            raise ServerRefused(response.status_code, message, code)
        return response.json()

    def phrases(self) -> dict:
        """``{"phrases": {language: phrase}, "min_sample_seconds": ..., "max_file_bytes": ...}``."""
        return self._call("GET", "/v1/audio/voice_consents/phrases")

    def _upload(self, path: str, fields: dict[str, str], name: str, file: Path) -> dict:
        with open(file, "rb") as opened:
            return self._call("POST", path, data=fields, files={name: (Path(file).name, opened)})

    def create_consent(self, name: str, language: str, recording: Path) -> dict:
        """A consent recording (it must read the server's phrase for ``language``): its ``audio.voice_consent``."""
        return self._upload("/v1/audio/voice_consents", {"name": name, "language": language}, "recording", recording)

    def create_voice(self, name: str, consent_id: str, sample: Path) -> dict:
        """A voice from ``sample`` (the consent's speaker, 10-30 s): its ``audio.voice`` (stage instant)."""
        return self._upload("/v1/audio/voices", {"name": name, "consent": consent_id}, "audio_sample", sample)

    def delete_consent(self, consent_id: str) -> dict:
        """Delete a consent recording (refused, 409, while a voice made under it exists)."""
        return self._call("DELETE", f"/v1/audio/voice_consents/{consent_id}")

    def voice(self, voice_id: str) -> dict:
        """The voice's ``audio.voice``: ``stage`` (instant, adapted), ``refinement``, ``refinement_error``."""
        return self._call("GET", f"/v1/audio/voices/{voice_id}")

    def voices(self) -> list[dict]:
        """The tenant's voices (``GET /v1/voices``, the base's speakers left out), each with its ``stage``."""
        return [v for v in self._call("GET", "/v1/voices")["data"] if v.get("type") != "base"]

    def delete(self, voice_id: str) -> dict:
        return self._call("DELETE", f"/v1/audio/voices/{voice_id}")

    def refinement(self, voice_id: str) -> tuple[dict, dict | None]:
        """The voice's ``audio.voice`` and its refinement job (``progress`` 0-1, ``message``; None once gone)."""
        voice = self.voice(voice_id)
        job_id = self._call("GET", f"/v1/voices/{voice_id}").get("job_id")
        if job_id is None:
            return voice, None
        try:
            return voice, self._call("GET", f"/v1/jobs/{job_id}")
        except ServerRefused as error:
            if error.status != 404:
                raise
            return voice, None

    def follow(
        self, voice_id: str, poll_seconds: float = WAIT_POLL_SECONDS, sleep: Callable[[float], None] = time.sleep
    ) -> Iterator[tuple[dict, dict | None]]:
        """:meth:`refinement` every ``poll_seconds`` until the voice is adapted or its refinement failed (or
        is gone); the last one yielded is that end."""
        while True:
            voice, job = self.refinement(voice_id)
            yield voice, job
            if voice["stage"] == "adapted" or voice["refinement"] in ("failed", None):
                return
            sleep(poll_seconds)
