"""What OpenAI's clients and the tools around a server do that the API answered wrongly (a new user's
probe): ``HEAD`` (uptime checkers, load balancers, ``curl -I``), ``client.models.retrieve``, a field sent
with the wrong type, and ``instructions`` that ask for a pace by a factor ("twice as fast", "20% slower")."""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import unquote

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from chorus.serving.api import create_app  # noqa: E402
from chorus.serving.engine import Engine  # noqa: E402
from chorus.serving.schemas.speech import parse_speech  # noqa: E402
from chorus.serving.store import VoiceStore  # noqa: E402
from chorus.serving.tenants import OPERATOR_TENANT, Tenants  # noqa: E402
from chorus.serving.voice_keys import stored_voice_folder  # noqa: E402

ACME = {"Authorization": "Bearer acme-key-0123456789abcdef"}
OPERATOR = {"Authorization": "Bearer operator-key-0123456789abcdef"}


@pytest.fixture(scope="module")
def client(tiny_base: Path, tmp_path_factory):
    store = VoiceStore(str(tmp_path_factory.mktemp("store_habits")))
    engine = Engine.load(
        tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store), cache_bytes=1 << 20
    )
    keys = [("acme-key-0123456789abcdef", "acme"), ("operator-key-0123456789abcdef", OPERATOR_TENANT)]
    with TestClient(create_app(store, engine, Tenants.from_pairs(keys))) as client:
        yield client


def speak(client: TestClient, **body):
    payload = {"model": "tts-1", "input": "Hello there.", "voice": "m3", "response_format": "pcm"} | body
    return client.post("/v1/audio/speech", json=payload, headers=ACME)


def refusal(response, status: int) -> dict:
    """The OpenAI-shaped error of ``response``, which must have ``status``."""
    assert response.status_code == status, (response.status_code, response.text)
    assert set(response.json()) == {"error"}, response.text
    return response.json()["error"]


# -- HEAD --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/healthz", "/v1/models", "/", "/web/app.js"])
def test_head_answers_as_get_without_the_body(client, path):
    got, head = client.get(path, headers=ACME), client.head(path, headers=ACME)
    assert got.status_code == 200 and head.status_code == 200, (head.status_code, head.headers)
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == got.headers["content-length"] == str(len(got.content))


def test_head_where_get_is_refused_is_refused_alike(client):
    head = client.head("/v1/audio/speech", headers=ACME)  # a POST-only route
    assert head.status_code == 405 and head.headers["allow"] == "POST" and head.content == b""
    assert client.head("/v1/models").status_code == 401  # no key: as GET without one


def test_head_is_counted_as_head_under_its_route(client):
    assert client.head("/healthz").status_code == 200
    metrics = client.get("/metrics", headers=OPERATOR).text
    assert 'chorus_http_requests_total{method="HEAD",route="/healthz",status="200"}' in metrics


# -- GET /v1/models/{model_id} -------------------------------------------------------------------------
def test_a_model_is_retrieved_as_the_list_gives_it(client):
    listed = client.get("/v1/models", headers=ACME).json()["data"]
    for card in listed:
        retrieved = client.get(f"/v1/models/{card['id']}", headers=ACME)
        assert retrieved.status_code == 200 and retrieved.json() == card


def test_an_unknown_model_is_refused_as_the_speech_route_refuses_it(client):
    error = refusal(client.get("/v1/models/whisper-1", headers=ACME), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model" and "'whisper-1'" in error["message"]
    assert error == refusal(speak(client, model="whisper-1"), 404)
    refusal(client.get("/v1/models/tts-1"), 401)  # a key, as for the list


def test_openai_client_retrieves_a_model(client):
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=ACME["Authorization"][7:], http_client=client)
    model = sdk.models.retrieve("tts-1")
    assert model.id == "tts-1" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.models.retrieve("tts-2")
    assert refused.value.code == "model_not_found"


# -- fields of the wrong type ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        ({"input": 5}, "'input' must be a string (the text to speak), not an integer"),
        ({"input": ["Hello."]}, "'input' must be a string (the text to speak), not an array"),
        ({"input": True}, "'input' must be a string (the text to speak), not a boolean"),
        ({"voice": 3}, "'voice' must be a string (a speaker name or one of your voice ids)"),
        ({"voice": {"name": "alloy"}}, "not an object"),
        ({"voice": {"id": 3}}, "not an object"),
        ({"voice": 2.5}, "not a number"),
        # Missing stays missing: left out, null, or empty.
        ({"input": None}, "'input' is required"),
        ({"voice": None}, "'voice' is required"),
        ({"voice": " "}, "'voice' is required"),
    ],
)
def test_a_field_of_the_wrong_type_is_named_as_such(client, change, message):
    error = refusal(speak(client, **change), 400)
    assert message in error["message"] and error["param"] == next(iter(change))


@pytest.mark.parametrize("field", ["input", "voice"])
def test_a_field_left_out_is_required(client, field):
    body = {k: v for k, v in {"input": "Hello there.", "voice": "m3"}.items() if k != field}
    error = refusal(client.post("/v1/audio/speech", json=body, headers=ACME), 400)
    assert error["message"].startswith(f"'{field}' is required") and error["param"] == field


def test_openai_voice_object_still_speaks(client):
    spoken = speak(client, voice={"id": "m3"})
    assert spoken.status_code == 200 and spoken.content == speak(client, voice="m3").content


# -- instructions that name a factor ------------------------------------------------------------------
PACES = [
    # instructions, the body's speed, the speed spoken, X-Instructions-Ignored (None: no header)
    ("Talk twice as fast.", 1.0, 2.0, None),
    ("2x faster", 1.0, 2.0, None),
    ("Speak at double speed.", 1.0, 2.0, None),
    ("Read it three times slower", 1.0, 1 / 3, None),
    ("Speak 3 times slower", 1.5, 0.5, None),
    ("speak at half speed", 1.0, 0.5, None),
    ("half as fast, with a smile", 1.0, 0.5, "with a smile"),
    ("Twice as slow", 1.0, 0.5, None),
    ("Speak 20% faster.", 1.0, 1.2, None),
    ("Speak 20 percent slower and sound happy", 1.0, 0.8, "sound happy"),
    ("Speak slower than usual.", 1.0, 0.8, None),
    ("a bit faster than usual", 1.0, 1.25**0.5, None),
    ("Speak at 1.5x speed. Sound calm.", 1.0, 1.5, "Sound calm"),
    # A review's cases: a decimal comma was a clause break (pace 4 from "1"), "than usual" after a percentage
    # was named as ignored, and "five times" was taken for "fast".
    ("Read at 1,5x speed", 1.0, 1.5, None),
    ("50% faster than usual", 1.0, 1.5, None),
    ("five times faster", 1.0, 4.0, None),
    # Within the bounds of speed (0.25 to 4), as the field itself.
    ("Talk twice as fast.", 3.0, 4.0, None),
    ("Speak 150% slower", 1.0, 0.25, None),
    ("10x faster", 1.0, 4.0, None),
    # A factor is a pace like any other: negated, or beside the other way, it is not taken.
    ("Don't talk twice as fast", 1.0, 1.0, "Don't talk twice as fast"),
    ("Speak twice as fast, then slowly", 1.0, 1.0, "Speak twice as fast; slowly"),
]


@pytest.mark.parametrize("instructions, speed, spoken, ignored", PACES, ids=[f"{row[0]} at {row[1]}" for row in PACES])
def test_instructions_read_a_pace_by_its_factor(client, instructions, speed, spoken, ignored):
    body = {"input": "Hello there.", "voice": "m3", "speed": speed, "instructions": instructions}
    assert parse_speech(body, max_text_chars=4096).speed == pytest.approx(spoken)
    answer = speak(client, speed=speed, instructions=instructions)
    assert answer.status_code == 200, answer.text
    header = answer.headers.get("x-instructions-ignored")
    assert (header if header is None else unquote(header)) == ignored


def test_a_pace_by_factor_is_spoken_at_that_speed(client):
    assert len(speak(client, instructions="Talk twice as fast.").content) == len(speak(client, speed=2.0).content)
