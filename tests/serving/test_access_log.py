"""Request ids and the access log (an operator's probe: access lines had no tenant, id or duration, and no
answer carried an X-Request-Id)."""

from __future__ import annotations

import logging
import re

import pytest

pytest.importorskip("fastapi")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import StreamingResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from chorus.serving.access_log import AccessLogMiddleware, RequestIdFilter, logged_path, request_id_of  # noqa: E402
from chorus.serving.errors import add_error_handlers  # noqa: E402

NEW_ID = re.compile(r"req_[0-9a-f]{32}")
log = logging.getLogger("chorus.test.handler")


@pytest.fixture()
def client():
    app = FastAPI()
    app.add_middleware(AccessLogMiddleware)
    add_error_handlers(app)

    @app.get("/hello")
    def hello(request: Request):
        request.state.tenant = "acme"  # as the server's authentication sets it
        log.warning("handled in a thread")
        return {"ok": True}

    @app.get("/stream")
    def stream():
        return StreamingResponse(iter([b"ab", b"cde"]))

    @app.get("/boom")
    def boom():
        raise RuntimeError("boom")

    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def access_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "chorus.access"]


def test_every_answer_carries_an_id_kept_from_the_client_when_it_is_a_plain_token(client):
    fresh = client.get("/hello").headers["x-request-id"]
    assert NEW_ID.fullmatch(fresh) and fresh != client.get("/hello").headers["x-request-id"]
    assert client.get("/hello", headers={"X-Request-Id": "trace-42.a:b_c"}).headers["x-request-id"] == "trace-42.a:b_c"
    # Nothing a log line could be split or forged on, nor an id too long to be one, is echoed or logged
    for given in ["a b", "x" * 129, "", "id\u00e9", 'id" 200 1 ms']:
        assert NEW_ID.fullmatch(request_id_of(given)), given
    assert NEW_ID.fullmatch(client.get("/hello", headers={"X-Request-Id": "a;b"}).headers["x-request-id"])
    assert NEW_ID.fullmatch(client.get("/missing").headers["x-request-id"])
    # An internal error is answered outside the middleware: its answer still names the id, to quote to support
    failed = client.get("/boom", headers={"X-Request-Id": "support-7"})
    assert failed.status_code == 500 and failed.headers["x-request-id"] == "support-7"
    assert failed.json()["error"]["message"] == "internal server error (logged on the server with request id support-7)"


def test_one_access_line_per_request_with_status_duration_bytes_tenant_and_id(client, caplog):
    caplog.set_level(logging.INFO, "chorus.access")
    answer = client.get("/hello", headers={"X-Request-Id": "probe-1"})
    client.get("/stream", headers={"X-Request-Id": "probe-2"})
    client.get("/boom", headers={"X-Request-Id": "probe-3"})
    hello, stream, boom = access_lines(caplog)
    pattern = r'testclient:\d+ "GET /hello" 200 \d+\.\d ms (\d+) B tenant=acme request_id=probe-1'
    assert int(re.fullmatch(pattern, hello).group(1)) == len(answer.content)
    assert re.fullmatch(r'testclient:\d+ "GET /stream" 200 \d+\.\d ms 5 B tenant=- request_id=probe-2', stream)
    # An internal error's answer is sent from outside the middleware: its bytes are not known there
    assert re.fullmatch(r'testclient:\d+ "GET /boom" 500 \d+\.\d ms - B tenant=- request_id=probe-3', boom)


def test_a_path_cannot_forge_or_split_a_line(client, caplog):
    """A review: the decoded path had been logged, so %0A and %22 in a 404's path wrote a second, forged line."""
    caplog.set_level(logging.INFO, "chorus.access")
    client.get("/v1/x%22%200%20B%20tenant=acme%0AINFO:%20chorus.access:%209.9.9.9:1%20%22GET%20/admin%22")
    (line,) = access_lines(caplog)
    assert "\n" not in line and line.count('"') == 2 and "%0A" in line and "%22" in line
    assert logged_path({"raw_path": b'/a"b\n c\\d\xe9'}) == "/a%22b%0A%20c%5Cd%E9"  # as a raw request could send it


def test_lines_logged_while_a_request_is_handled_end_with_its_id(client, caplog):
    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(RequestIdFilter())
    client.get("/hello", headers={"X-Request-Id": "probe-4"})
    logging.getLogger("chorus.test.outside").warning("between requests")
    by_name = {r.name: r for r in caplog.records}
    assert by_name["chorus.test.handler"].request == " [probe-4]"  # in the thread the handler ran in
    assert by_name["chorus.test.outside"].request == ""
    assert by_name["chorus.access"].request == ""  # its line names the id already
