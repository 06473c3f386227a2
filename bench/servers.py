"""The plumbing of the benchmarks that talk to a real ``chorus serve``: start one and wait for its health,
send it requests, read its memory, stop it.

- :func:`launch` / :func:`wait_healthy` / :func:`stop`: a server subprocess on a loopback port, up once
  ``GET /healthz`` says ``ok`` (or an error with its log's tail if it dies or never does), stopped with
  SIGINT (uvicorn's graceful shutdown) and killed only if that hangs.
- :func:`request`, :func:`get`, :func:`post_json`, :func:`timed_request`: HTTP on a fresh loopback
  connection per request (an idle kept-alive one closed by the server would fail the next request for a
  reason of the client's making).
- :func:`batcher_counters` (``/metrics``) and :func:`wait_idle` (the server's start-up work done).
- :func:`process_rss`, :func:`self_rss`, :func:`descendants_rss`: resident memory from ``/proc``.

Benchmarks run as ``python bench/<name>.py``, so they import this module as ``servers``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

# The throwaway services live with the tests (tests/local_services.py), outside the package that ships.
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
from local_services import free_port  # noqa: E402

HOST = "127.0.0.1"
__all__ = [
    "HTTPStatusError",
    "batcher_counters",
    "chorus_command",
    "descendants_rss",
    "free_port",
    "get",
    "multipart",
    "launch",
    "post_json",
    "process_rss",
    "request",
    "self_rss",
    "stop",
    "timed_request",
    "wait_healthy",
    "wait_idle",
]


class HTTPStatusError(RuntimeError):
    """An answer with a status other than the one expected."""

    def __init__(self, method: str, path: str, status: int, body: bytes):
        super().__init__(f"{method} {path}: status {status}: {body[:300].decode(errors='replace')}")
        self.status = status
        self.body = body


# -- HTTP ----------------------------------------------------------------------------------------
def headers_for(key: str | None, content_type: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if content_type:
        headers["Content-Type"] = content_type
    return headers


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    key: str | None = None,
    content_type: str | None = None,
    timeout: float = 120.0,
) -> tuple[int, bytes]:
    """``(status, body)`` of one request on a fresh connection; connection errors are raised."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers_for(key, content_type))
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def get(port: int, path: str, key: str | None = None, timeout: float = 30.0) -> bytes:
    """The body of ``GET path``; :class:`HTTPStatusError` unless it answered 2xx (a failed request is never
    read as if it were the figure asked for)."""
    status, data = request(port, "GET", path, key=key, timeout=timeout)
    if not 200 <= status < 300:
        raise HTTPStatusError("GET", path, status, data)
    return data


def post_json(port: int, path: str, body: dict, key: str | None = None, timeout: float = 120.0) -> bytes:
    """The body of ``POST path`` with ``body`` as JSON; :class:`HTTPStatusError` unless it answered 2xx."""
    status, data = request(port, "POST", path, json.dumps(body).encode(), key, "application/json", timeout)
    if not 200 <= status < 300:
        raise HTTPStatusError("POST", path, status, data)
    return data


def multipart(fields: dict[str, str], files: list[tuple[str, str, bytes, str]]) -> tuple[bytes, str]:
    """A multipart/form-data body of text ``fields`` and ``(field, filename, bytes, type)`` files."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, filename, data, kind in files:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
        parts.append(f"{head}Content-Type: {kind}\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def timed_request(
    port: int, key: str | None, body: bytes, path: str = "/v1/audio/speech", timeout: float = 300.0
) -> dict:
    """One JSON ``POST``; its status and seconds to the response headers, the first body byte (for speech:
    the first audio, as a client playing it would hear it) and the last. Without an answer: status 0, the
    error, and the seconds until it failed."""
    began = time.perf_counter()
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        connection.request("POST", path, body, headers_for(key, "application/json"))
        response = connection.getresponse()
        headers = time.perf_counter()
        first = response.read(1)  # blocks until the first byte of the body is here
        first_at = time.perf_counter()
        rest = response.read()
        status = response.status
    except (OSError, http.client.HTTPException) as error:
        return {"status": 0, "error": repr(error), "total_s": time.perf_counter() - began}
    finally:
        connection.close()
    return {
        "status": status,
        "headers_s": headers - began,
        "first_byte_s": first_at - began,
        "total_s": time.perf_counter() - began,
        "bytes": len(first) + len(rest),
    }


def batcher_counters(port: int, key: str | None) -> dict[str, float]:
    """The batcher's counters from ``/metrics``: busy seconds, batches, requests in them (NaN if absent)."""
    text = get(port, "/metrics", key).decode()

    def value(name: str) -> float:
        found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else float("nan")

    return {
        "busy_s": value("chorus_batcher_busy_seconds_total"),
        "batches": value("chorus_batch_size_count"),
        "rows": value("chorus_batch_size_sum"),
    }


# -- the server process --------------------------------------------------------------------------
def chorus_command() -> list[str]:
    """This tree's ``chorus`` command line (the one beside this Python)."""
    return [str(Path(sys.executable).with_name("chorus"))]


def healthy(port: int, timeout: float = 5.0) -> bool:
    """Whether ``GET /healthz`` answers ``{"status": "ok"}`` now (no answer, or not JSON: not yet)."""
    try:
        status, data = request(port, "GET", "/healthz", timeout=timeout)
        return status == 200 and json.loads(data)["status"] == "ok"
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
        return False


def wait_healthy(
    port: int,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
    limit_s: float = 300.0,
    every_s: float = 0.5,
) -> float:
    """Poll ``/healthz`` until it says ``ok``; seconds waited. If ``process`` exits first or ``limit_s``
    passes, the process is killed and :class:`RuntimeError` says so, with the tail of ``log_path``."""
    began = time.monotonic()
    while not healthy(port):
        if (process is not None and process.poll() is not None) or time.monotonic() - began > limit_s:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
            tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
            raise RuntimeError(f"the server on port {port} did not start: {tail}")
        time.sleep(every_s)
    return time.monotonic() - began


def launch(
    command: list[str],
    port: int,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    limit_s: float = 300.0,
) -> subprocess.Popen:
    """Start ``command`` (a server that listens on ``port``), its output to ``log_path``, and return it once
    healthy (:func:`wait_healthy`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:  # the child writes to its own copy of the descriptor
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    wait_healthy(port, process, log_path, limit_s)
    return process


def stop(process: subprocess.Popen, timeout: float = 120.0) -> dict:
    """SIGINT (uvicorn's graceful shutdown: the lifespan closes the worker, batcher and store), killed if it
    has not exited within ``timeout``: its exit code, seconds, and whether it was killed."""
    began = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        code, killed = process.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        process.kill()
        code, killed = process.wait(), True
    return {"exit_code": code, "seconds": round(time.monotonic() - began, 1), "killed": killed}


def wait_idle(pid: int, quiet_s: float = 3.0, limit_s: float = 300.0) -> float:
    """Wait until the process's CPU time grows by less than 10% of one core over ``quiet_s`` (a server's
    start-up work in the background is done); seconds waited."""
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime

    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        start = cpu()
        time.sleep(quiet_s)
        if cpu() - start < 0.1 * quiet_s:
            break
    return time.monotonic() - began


# -- memory --------------------------------------------------------------------------------------
def process_rss(pid: int | str) -> int:
    """Resident bytes of process ``pid`` (``VmRSS`` of ``/proc/PID/status``; ``"self"`` for this one)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def self_rss() -> int:
    """Resident bytes of this process."""
    return process_rss("self")


def descendants(pid: int) -> set[int]:
    """The processes started by ``pid``, and by them, and so on (from ``/proc/*/stat``'s parent ids)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def descendants_rss(pid: int) -> int:
    """The summed RSS of ``pid``'s descendants (a server's onboarding fork server and the job processes it
    forks): memory the server's own RSS does not show. Shared pages count once per process (an upper
    bound); a process that ended meanwhile counts 0."""
    total = 0
    for child in descendants(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += process_rss(child)
    return total
