"""The onboarding form of ``POST /v1/voices``, read and checked: multipart ``name``, ``consent``, optional
``id``, then either files ``clips`` with an optional field ``transcripts`` (without it, the job transcribes
the clips with Whisper) or one ``archive`` (an LJSpeech-style zip). Every refusal names its field; the
files themselves are checked by :mod:`chorus.serving.onboarding.uploads` when :meth:`OnboardingForm.prepare` reads
them."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.types import Message

from chorus.serving.errors import ApiError, UploadError, in_bytes
from chorus.serving.onboarding.uploads import PreparedUpload, parse_transcripts, prepare_archive, prepare_clips
from chorus.serving.settings import UploadLimits


def _slug(name: str) -> str:
    """A voice id from its name: accents folded ("Zoë Ünïcode": "zoe-unicode"; they had been cut out, "zo-n-code"),
    anything else that is no letter or digit of an id a hyphen."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9_-]+", "-", folded.lower()).strip("-_")[:64]


def _text(form: FormData, name: str, required: bool, max_chars: int) -> str | None:
    value = form.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"the form field {name!r} is required", param=name)
        return None
    if isinstance(value, UploadFile):
        raise ApiError(400, f"{name!r} must be a text field, not a file", param=name)
    if len(value) > max_chars:
        raise ApiError(413 if name == "transcripts" else 400, f"{name!r} is over {max_chars} characters", param=name)
    return value


async def _read_upload(upload: UploadFile, limits: UploadLimits) -> tuple[str, bytes]:
    data = await upload.read(limits.max_clip_bytes + 1)
    if len(data) > limits.max_clip_bytes:
        raise UploadError(f"{(upload.filename or 'a file')[:100]}: over {in_bytes(limits.max_clip_bytes)}", 413)
    return upload.filename or "", data


@dataclass
class OnboardingForm:
    """A checked onboarding form; :meth:`close` it when done (its files may be spooled to disk)."""

    form: FormData
    limits: UploadLimits
    name: str
    consent: str
    voice_id: str  # as given, or made from the name
    clips: list[UploadFile]
    archive: UploadFile | None

    async def prepare(self, folder: Path) -> PreparedUpload:
        """The uploaded audio checked and written to ``folder`` as a voice's training data."""
        limits = self.limits
        if self.clips:
            text = _text(self.form, "transcripts", False, limits.max_clips * (limits.max_transcript_chars + 300))
            # Without transcripts the job transcribes the clips with Whisper (long ones cut at silences).
            transcripts = parse_transcripts(text) if text is not None else None
            files = [await _read_upload(clip, limits) for clip in self.clips]
            return await run_in_threadpool(prepare_clips, files, transcripts, folder, limits)
        if self.archive.size is not None and self.archive.size > limits.max_upload_bytes:
            raise UploadError("the archive is too large", 413)
        data = await self.archive.read(limits.max_upload_bytes + 1)
        return await run_in_threadpool(prepare_archive, data, folder, limits)

    async def close(self) -> None:
        await self.form.close()


async def read_multipart(
    request: Request, max_bytes: int, max_files: int, expected: str, max_part_size: int = 1 << 20, file_bytes: int = 0
) -> FormData:
    """The request's multipart form (415 not multipart, saying ``expected``; 411 no length; 413 over
    ``max_bytes``, said as ``file_bytes`` of file and the rest of form fields where given); close it when done."""
    allowed = in_bytes(max_bytes)
    if file_bytes:  # "at most 10.1 MiB" had read as another limit than the documented 10 MiB file
        allowed = f"{allowed}: a file of {in_bytes(file_bytes)} and {in_bytes(max_bytes - file_bytes)} of fields"
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(415, f"expected a multipart/form-data upload ({expected}), got {content_type[:60] or 'none'!r}")
    declared = request.headers.get("content-length")
    if not declared or not declared.isdigit():
        raise ApiError(411, "uploads need a Content-Length header")
    if int(declared) > max_bytes:
        raise ApiError(413, f"the upload is {in_bytes(int(declared))}; at most {allowed}", type="request_too_large")
    return await _counted(request, max_bytes, allowed).form(
        max_files=max_files, max_fields=16, max_part_size=max_part_size
    )


def _counted(request: Request, max_bytes: int, allowed: str) -> Request:
    """``request`` whose body is refused (413, saying ``allowed``) once more than ``max_bytes`` of it arrive,
    whatever its headers said: a chunked body under a small Content-Length was read whole to disk before any check
    (a probe held 1.5 GB)."""
    received = 0

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > max_bytes:
            raise ApiError(413, f"the upload is over {allowed}", type="request_too_large")
        return message

    return Request(request.scope, receive)


def form_text(form: FormData, name: str, required: bool, max_chars: int) -> str | None:
    """A text field of ``form`` (400 when a required one is missing, a file, or over ``max_chars``)."""
    return _text(form, name, required, max_chars)


async def form_file(form: FormData, name: str, max_bytes: int) -> tuple[str, bytes]:
    """The one file ``name`` of ``form``: its file name and bytes (400 missing or not a file, 413 too large)."""
    upload = form.get(name)
    if not isinstance(upload, UploadFile):
        raise ApiError(400, f"the form field {name!r} must be an audio file", param=name)
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ApiError(413, f"{name!r} is over {in_bytes(max_bytes)}", param=name, type="request_too_large")
    return upload.filename or name, data


async def read_onboarding_form(request: Request, limits: UploadLimits) -> OnboardingForm:
    """The request's form, its fields checked (415 not multipart, 411 no length, 413 too large, 400 a bad
    or missing field)."""
    form = await read_multipart(
        request,
        limits.max_upload_bytes,
        limits.max_clips + 1,
        "fields name, consent, and files 'clips' with 'transcripts', or one 'archive'",
        max_part_size=max(1 << 20, 200 * limits.max_clips),
    )
    try:
        return _checked(form, limits)
    except Exception:
        await form.close()
        raise


def _checked(form: FormData, limits: UploadLimits) -> OnboardingForm:
    name = (_text(form, "name", True, 100) or "").strip()
    if not name or not name.isprintable():
        raise ApiError(400, "'name' must be 1-100 printable characters", param="name")
    consent = (_text(form, "consent", False, 2_000) or "").strip()
    if len(consent) < 10:
        given = (
            f"'consent' has {len(consent)} characters, at least 10 are needed" if consent else "'consent' is required"
        )
        raise ApiError(
            400,
            f"{given}: a statement that the person recorded consented to a "
            "synthetic voice made from these recordings (e.g. 'Jane Doe consented in "
            "writing on 2024-05-01'); uploads without it are refused",
            param="consent",
            code="consent_required",
        )
    voice_id = (_text(form, "id", False, 64) or "").strip() or _slug(name)
    if not voice_id:
        raise ApiError(
            400,
            f"the name {name[:80]!r} has no letter or digit to make a voice id from: give an 'id' "
            "(1-64 of a-z, 0-9, '_' and '-') or a name with a letter or digit",
            param="name",
        )
    clips = [f for f in form.getlist("clips") if isinstance(f, UploadFile)]
    if len(clips) != len(form.getlist("clips")):
        raise ApiError(400, "'clips' must be files", param="clips")
    archive = form.get("archive")
    if archive is not None and not isinstance(archive, UploadFile):
        raise ApiError(400, "'archive' must be a file (a zip)", param="archive")
    if bool(clips) == (archive is not None):
        raise ApiError(400, "send either files 'clips' (with 'transcripts') or one 'archive', not both or neither")
    return OnboardingForm(form, limits, name, consent, voice_id, clips, archive)
