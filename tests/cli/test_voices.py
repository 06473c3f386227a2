"""``chorus voices`` against a live server on the tiny base (uvicorn in a thread): the phrase, a voice made
from a consent recording and a sample and followed to the end of its refinement, the list, delete, and the
refusals as the server words them. Recordings are espeak-ng's; the speaker encoder is the shipped one and
Whisper's part in the consent check is played by a stand-in (the e2e test in tests/serving hears it)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")

from chorus.cli import app  # noqa: E402
from chorus.serving.api import create_app  # noqa: E402
from chorus.serving.engine import Engine  # noqa: E402
from chorus.serving.onboarding.consent_checks import CustomVoiceChecks  # noqa: E402
from chorus.serving.onboarding.job_runner import JobRunner  # noqa: E402
from chorus.serving.routes.custom_voices import audio_voice_json  # noqa: E402
from chorus.serving.settings import CONSENT_PHRASES, ServerSettings, jobs_dir  # noqa: E402
from chorus.serving.store import VoiceStore  # noqa: E402
from chorus.serving.tenants import Tenants  # noqa: E402
from chorus.serving.voice_keys import stored_voice_folder  # noqa: E402
from conftest import heard_as

KEY = "acme-key-0123456789abcdef"
SETTINGS = ServerSettings(progress_interval=0.2)
SETTINGS = dataclasses.replace(SETTINGS, adapt_sample=dataclasses.replace(SETTINGS.adapt_sample, steps=4, threads=1))
runner = CliRunner()


@pytest.fixture(scope="module")
def heard() -> dict[str, str]:
    """What the server's Whisper "hears" in a consent recording: the test says."""
    return {"text": CONSENT_PHRASES["en"]}


@pytest.fixture(scope="module")
def live_app(tiny_base, heard, tmp_path_factory):
    """What ``live_server`` serves: one API key, a consent heard as ``heard`` says."""
    store = VoiceStore(str(tmp_path_factory.mktemp("store_voices_cli")))
    engine = Engine.load(
        tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store), cache_bytes=1 << 20
    )
    jobs = JobRunner(
        store, jobs_dir(SETTINGS, store), engine.base_copy, SETTINGS.adapt, sample_config=SETTINGS.adapt_sample
    )
    checks = CustomVoiceChecks(
        engine, SETTINGS.consent, transcriber=lambda audio, rate, beam: heard_as(heard["text"], audio, rate)
    )
    return create_app(store, engine, Tenants.from_pairs([(KEY, "acme")]), SETTINGS, jobs=jobs, custom_voices=checks)


def voices(url: str, *args: str, key: str = KEY):
    return runner.invoke(app, ["voices", *args, "--server", url], env={"CHORUS_API_KEY": key}, catch_exceptions=False)


def test_voices_create_wait_list_delete(live_server, custom_voice_recordings):
    recordings = custom_voice_recordings
    url, server_app = live_server
    phrase = voices(url, "phrase", "--language", "en-US")
    assert phrase.exit_code == 0 and phrase.output.strip() == CONSENT_PHRASES["en"], phrase.output

    create = ["create", "--consent", str(recordings["consent"]), "--name", "Fiona"]
    made = voices(url, *create, "--sample", str(recordings["sample"]), "--wait")
    lines = made.output.splitlines()
    assert lines[0].startswith("consent cons_") and lines[0].endswith(" accepted"), made.output
    voice_id = lines[1].split()[1].rstrip(":")
    assert voice_id.startswith("voice_") and ": instant (as " in lines[1], lines[1]  # the encoder's blend, first
    server = server_app.state.server
    final = audio_voice_json(server, server.store.voice("acme", voice_id))
    if final["stage"] == "adapted":  # a few steps on the tiny base may or may not improve on the held-out clip
        assert made.exit_code == 0 and lines[-1] == f"voice {voice_id}: adapted (refined on the sample)", made.output
    else:
        assert made.exit_code == 1 and final["refinement"] == "failed", (made.output, final)
        assert lines[-1] == f"voice {voice_id}: instant; its refinement failed: {final['refinement_error']}"

    listed = voices(url, "list")
    assert listed.exit_code == 0 and voice_id in listed.output and final["stage"] in listed.output, listed.output
    # OpenAI's base_url habit (".../v1/") and a bare host:port name the same server.
    for spelling in (f"{url}/v1/", url.removeprefix("http://")):
        assert voices(spelling, "list").output == listed.output
    deleted = voices(url, "delete", voice_id)
    assert deleted.exit_code == 0 and deleted.output.strip() == f"deleted {voice_id}"
    assert voice_id not in voices(url, "list").output


def test_voices_create_shows_the_refusals(live_server, heard, custom_voice_recordings):
    url, server_app = live_server
    recordings = custom_voice_recordings
    create = ["create", "--name", "Fiona", "--consent", str(recordings["consent"])]
    heard["text"] = "I do not give anyone permission."
    wrong = voices(url, *create, "--sample", str(recordings["sample"]))
    assert wrong.exit_code == 2 and "the consent recording must read" in wrong.output, wrong.output
    assert "heard: 'I do not give anyone permission.'" in wrong.output
    heard["text"] = CONSENT_PHRASES["en"]
    other = voices(url, *create, "--sample", str(recordings["other"]))
    assert other.exit_code == 2 and "consent cons_" in other.output, other.output
    assert "does not match the consent recording's (speaker score" in other.output
    # The consent the refused sample was posted under is deleted, not left to count against the 100 kept
    # (a new user's probe: each retry kept one more).
    consent_id = other.output.split()[1]
    assert f"consent {consent_id} deleted: no voice was made under it" in " ".join(other.output.split())
    assert consent_id not in {c.consent_id for c in server_app.state.server.store.list_consents("acme", None, 100)}
    assert voices(url, "list", key="not-a-key-0123456789").exit_code == 2
    unknown = voices(url, "phrase", "--language", "xx")
    assert unknown.exit_code == 2 and "no consent phrase for 'xx'; the server has en" in unknown.output


def test_a_sample_the_busy_server_refuses_leaves_no_consent_behind(live_server, custom_voice_recordings):
    """The server's own 429 (no turn free to check the sample) comes before any voice is made, so the consent
    the command posted is deleted; a 429 without Chorus's error code (a proxy's) would keep it."""
    from chorus.serving.errors import ApiError

    url, server_app = live_server
    server = server_app.state.server
    real = server.check_slots

    class ConsentOnly:  # a turn for the consent; the sample finds the server busy
        def turn(self, tenant, gone=None):
            if ConsentOnly.given:  # as CheckSlots refuses past its queue
                raise ApiError(429, "the server is checking as many recordings as it can at once", code="busy")
            ConsentOnly.given = True
            return real.turn(tenant, gone)

    ConsentOnly.given = False
    server.check_slots = ConsentOnly()
    try:
        before = {c.consent_id for c in server.store.list_consents("acme", None, 100)}
        recordings = custom_voice_recordings
        create = ["create", "--name", "Fiona", "--consent", str(recordings["consent"])]
        busy = voices(url, *create, "--sample", str(recordings["sample"]))
    finally:
        server.check_slots = real
    said = " ".join(busy.output.split())
    assert busy.exit_code == 2 and "(429)" in said and "no voice was made under it" in said, busy.output
    assert {c.consent_id for c in server.store.list_consents("acme", None, 100)} == before


def test_an_instant_voice_whose_refinement_failed_is_listed_as_speaking():
    """An operator's probe: `chorus voices list` said "failed" of an instant voice that speaks."""
    from chorus.cli.voices import listed_status

    assert listed_status({"stage": "instant", "status": "failed"}) == "speaks; refinement failed"
    assert listed_status({"stage": "instant", "status": "training"}) == "training"
    assert listed_status({"stage": "adapted", "status": "ready"}) == "ready"
    assert listed_status({"stage": "failed", "status": "failed"}) == "failed"  # an upload of clips that failed


def test_the_list_says_what_each_voice_speaks_as():
    """The list said "what each speaks as now" and showed only the stage (a docs reader's probe)."""
    from chorus.cli.voices import speaks_as

    assert speaks_as({"stage": "instant", "instant": "flite-kal16"}) == "flite-kal16"
    assert speaks_as({"stage": "adapted", "instant": "m3"}) == "itself"
    assert speaks_as({"stage": "training", "instant": None}) == ""
    assert speaks_as({"stage": "adapted", "this_base": False}) == "nothing here: made on another base"


def test_no_server_is_one_plain_line_and_the_url_comes_from_the_environment(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = runner.invoke(app, ["voices", "list"], env={"CHORUS_SERVER": url})
    assert result.exit_code == 2, result.output
    assert f"no Chorus server answers at {url}" in result.output and "HTTPConnectionPool" not in result.output
