"""The server plumbing the benchmarks share (bench/servers.py), against tiny stand-in servers: no chorus."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# Benchmarks run as ``python bench/<name>.py`` and import their helpers as siblings; so does this test.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import servers  # noqa: E402

METRICS = b"""# HELP chorus_batcher_busy_seconds_total busy
chorus_batcher_busy_seconds_total 12.5
chorus_batch_size_count 4
chorus_batch_size_sum 10
"""


class Stub:
    """A loopback HTTP server in a thread: ``/healthz`` says ``starting`` for the first ``not_ready`` asks,
    then ``ok``; ``/metrics`` and ``POST /echo`` as a server's; every request's headers are kept."""

    def __init__(self, not_ready: int = 0):
        self.not_ready = not_ready
        self.health_asks = 0
        self.headers: list[dict[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                stub.headers.append(dict(self.headers))
                if self.path == "/healthz":
                    stub.health_asks += 1
                    ready = stub.health_asks > stub.not_ready
                    self.answer(200, json.dumps({"status": "ok" if ready else "starting"}).encode())
                elif self.path == "/metrics":
                    self.answer(200, METRICS)
                else:
                    self.answer(404, b'{"error": "no such route"}')

            def do_POST(self) -> None:  # noqa: N802
                stub.headers.append(dict(self.headers))
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.answer(200, b"echo:" + body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Stub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_health_is_polled_until_ok():
    with Stub(not_ready=3) as stub:
        servers.wait_healthy(stub.port, every_s=0.01, limit_s=10)
        assert stub.health_asks == 4  # three "starting", then "ok"
        assert servers.healthy(stub.port)


def test_no_server_is_not_healthy_and_the_wait_gives_up():
    port = servers.free_port()  # nobody listens there
    assert not servers.healthy(port, timeout=1)
    with pytest.raises(RuntimeError, match=f"port {port} did not start"):
        servers.wait_healthy(port, limit_s=0.05, every_s=0.01)


def test_requests_carry_the_key_and_a_failed_status_is_an_error():
    with Stub() as stub:
        assert servers.get(stub.port, "/metrics", key="k1") == METRICS
        assert stub.headers[-1]["Authorization"] == "Bearer k1"
        assert servers.post_json(stub.port, "/echo", {"a": 1}) == b'echo:{"a": 1}'
        assert stub.headers[-1]["Content-Type"] == "application/json" and "Authorization" not in stub.headers[-1]
        with pytest.raises(servers.HTTPStatusError, match="GET /nowhere: status 404") as failed:
            servers.get(stub.port, "/nowhere")
        assert failed.value.status == 404
        assert servers.request(stub.port, "GET", "/nowhere")[0] == 404  # the plain request does not judge


def test_timed_request_orders_its_times():
    with Stub() as stub:
        got = servers.timed_request(stub.port, "k", b"{}", path="/echo")
    assert got["status"] == 200 and got["bytes"] == len(b"echo:{}")
    assert 0 <= got["headers_s"] <= got["first_byte_s"] <= got["total_s"]
    failed = servers.timed_request(servers.free_port(), "k", b"{}", timeout=1)
    assert failed["status"] == 0 and "error" in failed and failed["total_s"] >= 0


def test_batcher_counters_from_metrics():
    with Stub() as stub:
        assert servers.batcher_counters(stub.port, "operator") == {"busy_s": 12.5, "batches": 4.0, "rows": 10.0}


STUB_SERVER = textwrap.dedent(
    """
    import json, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def do_GET(self):
            body = json.dumps({"status": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def graceful(*_):
        print("stopping", flush=True)
        sys.exit(3)

    signal.signal(signal.SIGINT, graceful)
    print("listening", flush=True)
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


def test_launch_waits_for_health_and_stop_is_graceful(tmp_path):
    script = tmp_path / "stub_server.py"
    script.write_text(STUB_SERVER)
    port = servers.free_port()
    log = tmp_path / "logs" / "server.log"
    process = servers.launch([sys.executable, str(script), str(port)], port, log, limit_s=60)
    try:
        assert servers.healthy(port) and process.poll() is None
        assert servers.process_rss(process.pid) > 0
        assert process.pid in servers.descendants(os.getpid())
        assert servers.descendants_rss(os.getpid()) >= servers.process_rss(process.pid)
    finally:
        stopped = servers.stop(process, timeout=30)
    assert stopped["exit_code"] == 3 and not stopped["killed"]  # its SIGINT handler ran: not killed
    assert log.read_text().split() == ["listening", "stopping"]


def test_a_server_that_dies_is_reported_with_its_log(tmp_path):
    log = tmp_path / "server.log"
    command = [sys.executable, "-c", "import sys; print('bad config'); sys.exit(2)"]
    with pytest.raises(RuntimeError, match="did not start: bad config"):
        servers.launch(command, servers.free_port(), log, limit_s=60)


def test_stop_kills_what_ignores_sigint(tmp_path):
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    process.stdout.readline()  # the handler is in place
    stopped = servers.stop(process, timeout=0.5)
    process.stdout.close()
    assert stopped["killed"] and stopped["exit_code"] != 0


def test_own_rss_is_read_from_proc():
    before = servers.self_rss()
    # A fresh anonymous mapping, every page written: memory the process did not hold before. (A bytearray once
    # left VmRSS unchanged in a 2.2 GB test process: malloc serves it from a free chunk of that size in the
    # heap, already resident, before it maps new pages.)
    with mmap.mmap(-1, 64 << 20) as touched:
        for _ in range(64):
            touched.write(b"\x01" * (1 << 20))
        assert servers.self_rss() - before > 32 << 20
        assert servers.process_rss(os.getpid()) > 64 << 20 and touched[-1] == 1
