"""The web page at ``/`` end to end in headless Chromium against a live server on the tiny base: the API
key (kept in localStorage, sent as a Bearer token), the voice list, speech played from a blob URL, and
onboarding a voice (clips + transcripts + consent) with its job followed to the end, after which the new
voice is listed and speaks; and a voice made OpenAI's way (a consent recording from the microphone, a sample). Uses Debian's ``chromium`` (scripts/browser-packages.sh) through Playwright;
skipped when either is missing. Leaves a screenshot at ``/tmp/chorus-web.png``."""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import soundfile as sf

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from chorus.adapters import parse_methods  # noqa: E402
from chorus.recipe import AdaptConfig  # noqa: E402
from chorus.serving.api import create_app  # noqa: E402
from chorus.serving.engine import Engine  # noqa: E402
from chorus.serving.onboarding.consent_checks import CustomVoiceChecks  # noqa: E402
from chorus.serving.onboarding.job_runner import JobRunner  # noqa: E402
from chorus.serving.page import WEB_FILES  # noqa: E402
from chorus.serving.settings import (  # noqa: E402
    CONSENT_PHRASES,
    ServerSettings,
    UploadLimits,  # noqa: E402
    jobs_dir,
)
from chorus.serving.store import JobStatus, VoiceStore  # noqa: E402
from chorus.serving.tenants import Tenants  # noqa: E402
from chorus.serving.voice_keys import stored_voice_folder  # noqa: E402
from conftest import heard_as, random_voice  # noqa: E402

KEY = "acme-key-0123456789abcdef"
SETTINGS = ServerSettings(
    max_wait_ms=20,
    upload=UploadLimits(max_upload_bytes=8 << 20, max_clips=40),
    progress_interval=0.2,
    adapt=AdaptConfig(methods=parse_methods("lora"), steps=4, threads=1, eval_every=2, max_frames=1500),
)
SETTINGS = dataclasses.replace(SETTINGS, adapt_sample=dataclasses.replace(SETTINGS.adapt_sample, steps=4, threads=1))
CONSENT = "Fiona Four consented in writing on 2024-05-01 to a synthetic voice made from these recordings."
SECOND_SENTENCE = "Glue the sheet to the dark blue background."
TWO_SENTENCES = f"The birch canoe slid on the smooth planks. {SECOND_SENTENCE}"
SCREENSHOT = Path("/tmp/chorus-web.png")


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CHORUS_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def training_gate() -> threading.Event:
    """Set by the test once the page has shown a job training: until then the job is held."""
    return threading.Event()


@pytest.fixture(scope="module")
def heard() -> dict[str, str]:
    """What the server's Whisper "hears" in a consent recording: the test says (the speaker encoder is
    the shipped one)."""
    return {"text": CONSENT_PHRASES["en"]}


@pytest.fixture(scope="module")
def live_app(tiny_base, training_gate, heard, tmp_path_factory):
    """What ``live_server`` serves: one API key (so the page must send it)."""
    store = VoiceStore(str(tmp_path_factory.mktemp("store_web")))
    engine = Engine.load(
        tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store), cache_bytes=1 << 20
    )

    # A few training steps take well under the page's poll interval: hold each job at "running" (before
    # it copies the base) until the test has seen the page show it, then let it finish; a server that
    # stops meanwhile (a test that failed before) lets it go too, and its first step ends it.
    def held_bundle():
        while not (training_gate.wait(0.1) or runner.closing.is_set()):
            pass
        return engine.base_copy()

    runner = JobRunner(
        store,
        jobs_dir(SETTINGS, store),
        held_bundle,
        SETTINGS.adapt,
        progress_interval=SETTINGS.progress_interval,
        sample_config=SETTINGS.adapt_sample,
    )
    checks = CustomVoiceChecks(
        engine, SETTINGS.consent, transcriber=lambda audio, rate, beam: heard_as(heard["text"], audio, rate)
    )
    return create_app(store, engine, Tenants.from_pairs([(KEY, "acme")]), SETTINGS, jobs=runner, custom_voices=checks)


@pytest.fixture(scope="module")
def chromium():
    """A function that launches Debian's chromium with extra arguments (one Playwright for the module)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("needs Debian chromium (bash scripts/browser-packages.sh as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[dev]')")
    with sync_api.sync_playwright() as playwright:
        yield lambda *args: playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage", *args]
        )


@pytest.fixture(scope="module")
def browser(chromium):
    launched = chromium()
    yield launched
    launched.close()


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_page_and_assets_are_served(live_server):
    live_server = live_server[0]
    status, headers, body = fetch(f"{live_server}/")  # no key needed for the page itself
    assert status == 200 and headers["content-type"].startswith("text/html"), (status, body[:200])
    assert b'src="web/app.js"' in body and b'href="web/style.css"' in body
    assert "script-src 'self'" in headers["content-security-policy"]
    assert b"http://" not in body and b"https://" not in body  # nothing from outside: works offline
    for name, media_type in WEB_FILES.items():
        status, headers, body = fetch(f"{live_server}/web/{name}")
        assert status == 200 and headers["content-type"] == media_type and body, name
        assert b"http://" not in body and b"https://" not in body, name
    for path in ["/web/api.py", "/web/..%2Fapi.py", "/web/%2E%2E", "/web/"]:
        status, _, body = fetch(f"{live_server}{path}")
        assert status == 404 and "error" in json.loads(body), path
    assert fetch(f"{live_server}/v1/voices")[0] == 401  # the API still needs the key


def test_web_page_speaks_and_onboards_a_voice(live_server, training_gate, browser, new_voice_data):
    from playwright.sync_api import expect

    live_server, _ = live_server
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    outside, problems, requests = [], [], []
    page.on(
        "request",
        lambda r: (
            requests.append(r)
            if r.url.startswith(live_server)
            else r.url.startswith(("blob:", "data:")) or outside.append(r.url)
        ),
    )
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text and problems.append(m.text))

    page.goto(f"{live_server}/")
    expect(page).to_have_title("Chorus voice server")
    unlabelled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, progress, audio')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id)""")
    assert unlabelled == []

    # Without the key the server refuses the listing, and the page says what to do.
    expect(page.locator("#voices-status")).to_contain_text("API key")
    key = page.get_by_role("textbox", name="API key")
    key.fill(KEY)
    key.press("Tab")  # "change": lists the voices with the key
    voice = page.get_by_label("Voice", exact=True)
    expect(voice.locator("option[value=m3]")).to_have_count(1)
    expect(voice).to_have_value("m3")  # the base's default voice
    assert page.evaluate("localStorage.getItem('chorus.apiKey')") == KEY

    # Speak: two sentences come streamed (a WAV header of unknown length); the page fixes the sizes,
    # so the <audio> element knows the real duration.
    voice.select_option("f2")
    page.get_by_label("Text", exact=True).fill(TWO_SENTENCES)
    with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
        page.get_by_role("button", name="Speak", exact=True).click()
    response = answer.value
    assert response.status == 200 and response.headers["content-type"] == "audio/wav"
    assert response.request.headers["authorization"] == f"Bearer {KEY}"
    assert json.loads(response.request.post_data)["voice"] == "f2"
    seconds = (len(response.body()) - 44) / 2 / 22050
    duration = page.wait_for_function("""() => { const a = document.getElementById('audio');
        return a.src.startsWith('blob:') && a.readyState >= 1 && isFinite(a.duration) && a.duration; }""").json_value()
    assert seconds > 1 and abs(duration - seconds) < 0.05, (duration, seconds)
    expect(page.locator("#speak-status")).to_contain_text("s of audio from f2")
    first_audio = page.eval_on_selector("#audio", "a => a.src")

    # Onboard: choosing the clips writes a "filename|" line for each; then the transcripts, the name and consent.
    clips = sorted((new_voice_data / "wavs").glob("*.wav"))
    lines = [line.split("|", 1) for line in (new_voice_data / "metadata.csv").read_text().splitlines()]
    page.get_by_label("Name", exact=True).fill("Fiona Four")
    page.get_by_label("Clips").set_input_files(clips)
    transcripts = page.get_by_label("Transcripts")
    assert sorted(transcripts.input_value().splitlines()) == sorted(f"{c.name}|" for c in clips)
    transcripts.fill("\n".join(f"{name}.wav|{text}" for name, text in lines))
    page.get_by_label("Consent statement").fill(CONSENT)
    page.get_by_role("button", name="Make voice").click()  # not yet confirmed: refused on the page
    expect(page.locator("#onboard-error")).to_contain_text("Confirm that the person recorded consented")
    page.get_by_label("The person recorded consented").check()
    with page.expect_response(lambda r: r.url.endswith("/v1/voices") and r.request.method == "POST") as answer:
        page.get_by_role("button", name="Make voice").click()
    assert answer.value.status == 202, answer.value.text()
    job = answer.value.json()
    assert job["voice"] == "fiona-four" and job["clips"] == len(clips)
    expect(page.locator("#onboard-error")).to_be_hidden()

    # Follow the job as the page shows it: a progress bar and a status line, until done.
    progress = page.get_by_label("Progress of voice")
    shown, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        # Bar, line and job status read in one go: read one by one, a render between the reads showed
        # a "Done" line beside the bar's value from the poll before.
        value, text, job_status = progress.evaluate("""p => [p.value, document.getElementById('job-status').innerText,
                                                         document.getElementById('job').dataset.status]""")
        value = float(value)
        shown.append((value, text))
        if text.startswith("Training") and 0 < value < 1:
            training_gate.set()
        if job_status in ("done", "failed"):
            break
        time.sleep(0.05)
    if not shown[-1][1].startswith("Done"):  # say where it stuck: the server's view and every thread
        faulthandler.dump_traceback(all_threads=True)
        server_view = fetch(f"{live_server}/v1/jobs/{job['id']}", {"Authorization": f"Bearer {KEY}"})
        pytest.fail(
            f"the page showed {shown[-5:]}; the server says {server_view[0]} {server_view[2][:300]!r}; "
            f"page errors {problems}; onboard error {page.locator('#onboard-error').inner_text()!r}"
        )
    assert shown[-1][0] == 1.0 and shown[-1][1].startswith("Done: voice fiona-four is ready"), shown[-1]
    assert any(text.startswith("Training (2%): checking the clips") for _, text in shown), shown
    values = [value for value, text in shown if not text.startswith("Uploading")]
    assert values == sorted(values) and any(0 < value < 1 for value in values), values
    assert any(f"/v1/jobs/{job['id']}" in r.url and r.headers.get("authorization") == f"Bearer {KEY}" for r in requests)

    # The new voice is listed, chosen, and speaks.
    expect(voice).to_have_value("fiona-four")
    expect(page.locator("#voices-status")).to_contain_text("1 of yours")
    page.get_by_label("Text", exact=True).fill("Hello there.")
    with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
        page.get_by_role("button", name="Speak", exact=True).click()
    assert answer.value.status == 200 and answer.value.headers["content-type"] == "audio/wav"
    assert json.loads(answer.value.request.post_data)["voice"] == "fiona-four"
    page.wait_for_function(
        """first => { const a = document.getElementById('audio');
        return a.src.startsWith('blob:') && a.src !== first && a.readyState >= 1 && a.duration > 0; }""",
        arg=first_audio,
    )
    expect(page.locator("#speak-error")).to_be_hidden()
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # A server refusal is shown as such: the same voice again is a conflict.
    page.get_by_role("button", name="Make voice").click()
    expect(page.locator("#onboard-error")).to_contain_text("exists")

    # After a reload the key is still there, and so is the voice.
    page.reload()
    expect(page.get_by_role("textbox", name="API key")).to_have_value(KEY)
    expect(page.get_by_label("Voice", exact=True).locator("option[value=fiona-four]")).to_have_count(1)
    assert outside == [] and problems == [], (outside, problems)
    context.close()


def open_page(browser, live_server: str):
    context = browser.new_context(viewport={"width": 1000, "height": 1100})
    page = context.new_page()
    page.set_default_timeout(30_000)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.goto(f"{live_server}/")
    key = page.get_by_role("textbox", name="API key")
    key.fill(KEY)
    key.press("Tab")
    return context, page, problems


def test_web_page_formats_streaming_voice_card_and_delete(live_server, browser, tiny_base, tmp_path):
    from playwright.sync_api import expect

    from chorus.adapters.lora import LoraConfig
    from chorus.models.bundle import load_bundle

    live_server, app = live_server
    store = app.state.server.store
    store.put_voice("acme", "ann", random_voice(load_bundle(tiny_base), "ann", [LoraConfig(r=2)], tmp_path / "ann", 3))
    context, page, problems = open_page(browser, live_server)
    voice = page.get_by_label("Voice", exact=True)
    expect(voice.locator("option[value=ann]")).to_have_count(1)

    # A format: MP3 comes back as MP3, plays, and downloads under its name.
    page.get_by_label("Format").select_option("mp3")
    with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
        page.get_by_role("button", name="Speak", exact=True).click()
    assert answer.value.headers["content-type"] == "audio/mpeg"
    expect(page.locator("#download")).to_have_attribute("download", "m3.mp3")
    page.wait_for_function(
        "() => document.getElementById('audio').readyState >= 1 && document.getElementById('audio').duration > 0"
    )

    # Play while it streams: raw PCM read piece by piece into Web Audio, one piece per sentence at least.
    # The second sentence is made half a second late, so the page has read the first before it arrives
    # (otherwise a loaded machine can hand the page both in one read).
    engine = app.state.server.batcher.engine
    synthesize, delayed = engine.synthesize, []

    def second_sentence_late(requests, **options):
        if any(SECOND_SENTENCE in request.text for request in requests):
            delayed.append(len(requests))
            time.sleep(0.5)
        return synthesize(requests, **options)

    engine.synthesize = second_sentence_late
    page.get_by_label("Play while it streams").check()
    page.get_by_label("Text", exact=True).fill(TWO_SENTENCES)
    try:
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
            page.get_by_role("button", name="Speak", exact=True).click()
        assert json.loads(answer.value.request.post_data)["response_format"] == "pcm"
        expect(page.locator("#speak-status")).to_contain_text("s of audio from m3")
    finally:
        engine.synthesize = synthesize
    assert delayed == [1]  # the second sentence was made alone, after the first
    pieces = int(page.eval_on_selector("#audio", "a => a.dataset.streamedPieces"))
    assert pieces >= 2  # the first sentence was scheduled before the second arrived
    expect(page.locator("#download")).to_have_attribute("download", "m3.wav")

    # A voice of yours: its card, then deleting it (after the browser's confirmation).
    expect(page.get_by_role("button", name="Delete voice")).to_be_disabled()  # m3 is a speaker
    voice.select_option("ann")
    expect(page.locator("#voice-card")).to_be_visible()
    expect(page.locator("#voice-card-body")).to_contain_text("lora")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete voice").click()
    expect(voice.locator("option[value=ann]")).to_have_count(0)
    assert store.list_voices("acme") == [] or "ann" not in {r.voice_id for r in store.list_voices("acme")}
    assert problems == [], problems
    context.close()


def test_web_page_shows_only_what_is_so(live_server, browser, tiny_base, tmp_path, request):
    """A user's probe of the page: streamed answers played over each other (each in an AudioContext never
    closed, which the player's pause did not reach); a voice chosen while an answer came named it; a key the
    server refused left the last tenant's voices, card and Delete up (and was kept); a failed answer left the
    last one's audio and download; text the voice could not read went unsaid; text over the limit was cut to
    4,096 characters unsaid; a failed voice of yours could not be chosen, so not deleted; a server's refusal
    naming a voice 'network-...' read as the server not reached; dark mode's buttons were white on light blue
    (2.1:1)."""
    from playwright.sync_api import expect

    from chorus.adapters.lora import LoraConfig
    from chorus.models.bundle import load_bundle

    live_server, app = live_server
    store = app.state.server.store
    store.update_job(store.create_job("acme", "broken", name="Broken"), status=JobStatus.FAILED, message="no speech")
    store.put_voice("acme", "ann", random_voice(load_bundle(tiny_base), "ann", [LoraConfig(r=2)], tmp_path / "ann", 3))
    request.addfinalizer(lambda: store.delete_voice("acme", "ann"))  # leaves the module's other tests as they were
    context = browser.new_context(viewport={"width": 1000, "height": 1100})
    context.add_init_script("""(() => { const Made = window.AudioContext; window.madeContexts = [];
        window.AudioContext = function (...args) { const c = new Made(...args); window.madeContexts.push(c); return c; };
    })();""")
    page = context.new_page()
    page.set_default_timeout(30_000)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.goto(f"{live_server}/")
    key, voice = page.get_by_role("textbox", name="API key"), page.get_by_label("Voice", exact=True)
    speak, error, status = (
        page.get_by_role("button", name="Speak", exact=True),
        page.locator("#speak-error"),
        page.locator("#speak-status"),
    )
    text = page.get_by_label("Text", exact=True)
    key.fill(KEY)
    key.press("Tab")

    # A failed voice of yours: listed, chosen, refused on the page, deleted under its name.
    expect(voice.locator("option[value=broken]")).to_be_enabled()
    voice.select_option("broken")
    speak.click()
    expect(error).to_have_text("Broken (broken) cannot speak: it is failed (no speech).")
    page.get_by_role("button", name="Refresh voices").click()  # the list again: the voice chosen stays chosen
    expect(page.locator("#voices-status")).to_contain_text("of yours")
    expect(voice).to_have_value("broken")
    asked: list[str] = []
    page.once("dialog", lambda dialog: asked.append(dialog.message) or dialog.accept())
    page.get_by_role("button", name="Delete voice").click()
    expect(voice.locator("option[value=broken]")).to_have_count(0)
    assert asked == ["Delete voice Broken (broken)? This cannot be undone."]
    expect(page.locator("#voices-status")).to_contain_text("of yours")

    # A voice chosen while the answer is made: the answer is named by the voice it was asked of.
    engine = app.state.server.batcher.engine
    synthesize = engine.synthesize
    engine.synthesize = lambda requests, **options: time.sleep(0.8) or synthesize(requests, **options)
    try:
        voice.select_option("f2")
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
            speak.click()
            voice.select_option("m3")
        assert json.loads(answer.value.request.post_data)["voice"] == "f2"
        expect(status).to_contain_text("s of audio from f2")
        expect(page.locator("#download")).to_have_attribute("download", "f2.wav")
    finally:
        engine.synthesize = synthesize

    # Text in a script the voice cannot read: the rest is spoken, and the page says what was not.
    text.fill("Hello there. 你好。 Goodbye now.")
    with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
        speak.click()
    assert answer.value.status == 200 and "x-skipped-text" in answer.value.headers
    expect(page.locator("#speak-note")).to_contain_text("not spoken: 你好")

    # A refused answer takes the last one's audio and download away.
    text.fill("!!! ???")
    speak.click()
    expect(error).to_contain_text("Speech failed: 'input' has nothing speakable")
    expect(page.locator("#download")).to_be_hidden()
    expect(page.locator("#speak-note")).to_have_text("")
    assert page.eval_on_selector("#audio", "a => a.getAttribute('src')") is None
    # A refusal is said as the server words it, whatever words it holds (a voice named network-...).
    page.route("**/v1/audio/speech", lambda route: route.fulfill(
        status=404, content_type="application/json",
        body=json.dumps({"error": {"message": "voice 'network-news' not found", "type": "not_found_error"}}),
    ))  # fmt: skip
    text.fill("Hello there.")
    speak.click()
    expect(error).to_have_text("Speech failed: voice 'network-news' not found")
    page.unroute("**/v1/audio/speech")

    # Over the server's limit: counted as typed (an emoji is one character, as the server counts), and the
    # server's refusal said (the field had cut the text at 4,096 unsaid).
    text.fill("a" * 4995 + "🎉" * 5)
    expect(page.locator("#text-count")).to_contain_text("5,000 characters: over the 4,096 a server takes by default")
    speak.click()
    expect(error).to_contain_text("'input' is 5000 characters; at most 4096")

    # Streamed twice: the first answer stops playing when the second starts; one context plays at most.
    page.get_by_label("Play while it streams").check()
    text.fill(TWO_SENTENCES)
    for _ in range(2):
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")):
            speak.click()
        expect(status).to_contain_text("s of audio from")
    states = page.evaluate("() => window.madeContexts.map(c => c.state)")
    assert len(states) == 2 and states[0] == "closed", states
    page.eval_on_selector("#audio", "a => a.play().catch(() => {})")  # the player's own play stops the stream
    page.wait_for_function("() => window.madeContexts.every(c => c.state === 'closed')")

    # A key the server refuses: nothing of the tenant stays (its voice's card, Delete, the consent phrase),
    # and the key is not kept; a key no header can carry is named as the problem (the browser had blamed the
    # server).
    voice.select_option("ann")
    expect(page.locator("#voice-card")).to_be_visible()
    expect(page.get_by_role("button", name="Delete voice")).to_be_enabled()
    expect(page.locator("#cv-phrase")).not_to_have_text("")
    key.fill("not-a-key")
    key.press("Tab")
    expect(page.locator("#voices-status")).to_contain_text("invalid API key")
    expect(voice.locator("option")).to_have_count(0)
    expect(page.locator("#voice-card")).to_be_hidden()
    expect(page.get_by_role("button", name="Delete voice")).to_be_disabled()
    expect(page.locator("#cv-phrase")).to_have_text("")
    assert page.evaluate("localStorage.getItem('chorus.apiKey')") == KEY  # the key the server took
    key.fill("clé secrète")
    key.press("Tab")
    expect(page.locator("#voices-status")).to_contain_text("The API key holds a character no key has")
    key.fill(KEY)
    key.press("Tab")
    expect(voice.locator("option[value=m3]")).to_have_count(1)

    # Dark mode: the buttons' text against their colour, by WCAG's contrast ratio (AA: 4.5:1).
    page.emulate_media(color_scheme="dark")
    ratio = page.eval_on_selector(
        "#speak",
        """b => { const style = getComputedStyle(b);
        const lum = (c) => { const [r, g, bl] = c.match(/\\d+/g).slice(0, 3).map(v => { v /= 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * bl; };
        const [a, b2] = [lum(style.color), lum(style.backgroundColor)].sort((x, y) => y - x);
        return (a + 0.05) / (b2 + 0.05); }""",
    )
    assert ratio >= 4.5, ratio
    assert problems == [], problems
    context.close()


def test_web_page_keeps_following_a_job_through_refusals_and_cancels_it(live_server, browser, new_voice_data):
    """The onboarding job as the page follows it, the server's side played by routes: a second upload
    refused leaves the job followed (it had been dropped); a key refused while polling keeps the job, which
    is followed again once a key is taken; Cancel asks, posts the cancel, and the failed job ends the
    following with its reason."""
    from playwright.sync_api import expect

    live_server, _ = live_server
    job = {"id": "job-held", "voice": "held", "status": "running", "progress": 0.25, "message": "training"}
    polls, cancels, refuse_polls, uploads = [], [], [], []

    def voices(route):
        if route.request.method != "POST":
            return route.continue_()
        uploads.append(route.request)
        if len(uploads) == 1:
            return route.fulfill(status=202, content_type="application/json", body=json.dumps({**job, "clips": 3}))
        error = {"message": "voice 'held' exists", "type": "invalid_request_error", "code": "conflict"}
        return route.fulfill(status=409, content_type="application/json", body=json.dumps({"error": error}))

    def poll(route):
        polls.append(route.request.headers.get("authorization"))
        if refuse_polls:
            error = {"message": "invalid API key", "type": "authentication_error"}
            return route.fulfill(status=401, content_type="application/json", body=json.dumps({"error": error}))
        return route.fulfill(status=200, content_type="application/json", body=json.dumps(job))

    def cancel(route):
        cancels.append(route.request.method)
        job.update(status="failed", error="cancelled by the tenant")
        return route.fulfill(status=200, content_type="application/json", body=json.dumps(job))

    context, page, problems = open_page(browser, live_server)
    page.route("**/v1/voices", voices)
    page.route("**/v1/jobs/job-held", poll)
    page.route("**/v1/jobs/job-held/cancel", cancel)
    clips = sorted((new_voice_data / "wavs").glob("*.wav"))[:3]
    page.get_by_label("Name", exact=True).fill("Held")
    page.get_by_label("Clips").set_input_files(clips)
    page.get_by_label("Transcripts").fill("\n".join(f"{clip.name}|Some words here." for clip in clips))
    page.get_by_label("Consent statement").fill(CONSENT)
    page.get_by_label("The person recorded consented").check()
    make, status, error = (
        page.get_by_role("button", name="Make voice"),
        page.locator("#job-status"),
        page.locator("#onboard-error"),
    )
    make.click()
    expect(status).to_have_text("Training (25%): training")
    cancel_button = page.get_by_role("button", name="Cancel this voice")
    expect(cancel_button).to_be_visible()

    # A second upload refused: the job before is followed still.
    make.click()
    expect(error).to_have_text("Upload refused: voice 'held' exists")
    seen, deadline = len(polls), time.monotonic() + 10
    while len(polls) <= seen + 1 and time.monotonic() < deadline:  # two more polls (each 0.5 s apart)
        page.wait_for_timeout(100)
    assert len(polls) > seen + 1 and page.locator("#job-voice").inner_text() == "held"

    # A key refused while polling: the job is kept, and followed again once a key is taken.
    refuse_polls.append(True)
    expect(error).to_contain_text("Could not follow job job-held: invalid API key")
    expect(error).to_contain_text("it is followed again once its key is given")
    assert page.evaluate("localStorage.getItem('chorus.job')") == "job-held"
    refuse_polls.clear()
    job["progress"] = 0.5
    key = page.get_by_role("textbox", name="API key")
    key.fill(KEY)
    key.dispatch_event("change")
    expect(status).to_have_text("Training (50%): training")
    assert polls[-1] == f"Bearer {KEY}"

    # Cancel: asked first, then posted; the failed job ends the following and says why.
    asked: list[str] = []
    page.once("dialog", lambda dialog: asked.append(dialog.message) or dialog.accept())
    cancel_button.click()
    expect(status).to_have_text("Failed.")
    expect(error).to_contain_text("Making voice held failed: cancelled by the tenant")
    expect(cancel_button).to_be_hidden()
    assert asked == ["Stop making voice held?"] and cancels == ["POST"]
    assert page.evaluate("localStorage.getItem('chorus.job')") is None
    assert problems == [], problems
    context.close()


def test_web_page_records_clips_from_the_microphone(live_server, chromium, new_voice_data, tmp_path):
    """Chromium's fake microphone plays a real recording; the page keeps what it hears as a WAV clip."""
    from playwright.sync_api import expect

    from chorus.audio.io import load_audio, save_audio

    speech = tmp_path / "microphone.wav"
    save_audio(speech, load_audio(sorted((new_voice_data / "wavs").glob("*.wav"))[0]), 22050)
    browser = chromium(
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={speech}",
    )
    try:
        context, page, problems = open_page(browser, live_server[0])
        context.grant_permissions(["microphone"])
        page.get_by_role("button", name="Record", exact=True).click()
        expect(page.get_by_role("button", name="Stop", exact=True)).to_be_enabled()
        page.wait_for_timeout(2000)
        page.get_by_role("button", name="Stop", exact=True).click()
        expect(page.locator("#record-status")).to_contain_text("Recorded recording-1.wav")
        listed = page.locator("#recordings li").first.inner_text()
        seconds = float(listed.split("(")[1].split(" s)")[0])
        assert seconds > 1.0, listed
        assert problems == [], problems
    finally:
        browser.close()


def test_web_page_creates_a_voice_from_a_consent_and_a_sample(
    live_server, training_gate, heard, chromium, new_voice_data, custom_voice_recordings
):
    """OpenAI-style custom voices on the page: the server's phrase shown, the consent recorded from the
    (fake) microphone and posted as the browser's webm, the refusals shown as the server words them (what
    was heard, the speaker score), then a sample file accepted, the voice's stage followed from
    instant to its end (adapted, or its refinement failed and why), and the voice speaking."""
    from playwright.sync_api import expect

    consent = custom_voice_recordings["consent"]  # what the fake microphone plays
    sample, other = custom_voice_recordings["sample"], custom_voice_recordings["other"]  # other: another speaker
    short = sorted((new_voice_data / "wavs").glob("*.wav"))[0]
    browser = chromium(
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={consent}",
    )
    live_server, app = live_server
    try:
        context, page, problems = open_page(browser, live_server)
        context.grant_permissions(["microphone"])
        posts = []
        page.on("request", lambda r: r.method == "POST" and posts.append(r.url.removeprefix(live_server)))
        expect(page.locator("#cv-phrase")).to_have_text(CONSENT_PHRASES["en"])  # from .../phrases, with the key
        expect(page.get_by_label("Language of the consent")).to_have_value("en")
        error = page.locator("#cv-error")
        create = page.get_by_role("button", name="Create voice")

        # The consent from the microphone: the browser's own format, decoded by the server.
        page.get_by_label("Voice name").fill("Fiona")
        page.get_by_role("button", name="Record consent").click()
        page.wait_for_timeout(1000 * sf.info(consent).duration + 300)  # the phrase once (the fake device loops it)
        page.get_by_role("button", name="Stop consent").click()
        expect(page.locator("#cv-consent-status")).to_contain_text("Recorded")
        create.click()  # no sample yet: refused on the page, nothing posted
        expect(error).to_contain_text("Record a sample")
        page.get_by_label("Or a sample file").set_input_files(short)
        expect(page.locator("#cv-sample-status")).to_contain_text(f"{short.name} chosen")

        # Whisper heard something else: the server's refusal, quoted.
        heard["text"] = "I do not give anyone permission."
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/voice_consents")) as answer:
            create.click()
        assert answer.value.status == 400
        expect(error).to_contain_text("The consent recording was refused: the consent recording must read")
        expect(error).to_contain_text("heard: 'I do not give anyone permission.'")

        # The right phrase: the consent is taken; the sample is too short, then another speaker's.
        heard["text"] = CONSENT_PHRASES["en"]
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/voices")) as answer:
            create.click()
        assert answer.value.status == 400
        expect(error).to_contain_text("The sample was refused: the sample holds")
        expect(page.locator("#cv-create-status")).to_contain_text("Consent cons_")
        [taken] = app.state.server.store.list_consents("acme", None, 10)
        assert app.state.server.store.consent_recording("acme", taken.consent_id)[:4] == b"fLaC"  # the WebM, decoded
        page.get_by_label("Or a sample file").set_input_files(other)
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/voices")) as answer:
            create.click()
        assert answer.value.status == 400
        expect(error).to_contain_text("does not match the consent recording's (speaker score")

        # Fiona's own sample: the voice speaks at once (instant), and is refined once the gate opens.
        page.get_by_label("Or a sample file").set_input_files(sample)
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/voices")) as answer:
            create.click()
        assert answer.value.status == 200, answer.value.text()
        voice = answer.value.json()
        assert voice["stage"] == "instant" and voice["name"] == "Fiona"
        assert posts.count("/v1/audio/voice_consents") == 2  # the taken consent was not posted again
        expect(error).to_be_hidden()
        stage = page.locator("#cv-stage")
        expect(page.locator("#cv-voice-id")).to_have_text(voice["id"])
        expect(stage).to_contain_text("instant voice")
        expect(page.get_by_label("Voice", exact=True)).to_have_value(voice["id"])  # it speaks: chosen above
        training_gate.set()
        box = page.locator("#cv-voice")
        page.wait_for_function(
            """() => { const b = document.getElementById('cv-voice');
            return b.dataset.stage === 'adapted' || b.dataset.refinement === 'failed'; }""",
            timeout=300_000,
        )
        final = fetch(f"{live_server}/v1/audio/voices/{voice['id']}", {"Authorization": f"Bearer {KEY}"})
        final = json.loads(final[2])
        if final["stage"] == "adapted":
            expect(stage).to_have_text("adapted: refined on the sample, it speaks as its own voice.")
        else:
            assert final["refinement"] == "failed" and final["refinement_error"], final
            expect(box).to_have_attribute("data-refinement", "failed")
            expect(stage).to_contain_text(f"the refinement failed: {final['refinement_error']}")

        # Speak with it: the Speak form's text, in the new voice.
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech")) as answer:
            page.get_by_role("button", name="Speak with this voice").click()
        assert answer.value.status == 200 and json.loads(answer.value.request.post_data)["voice"] == voice["id"]
        expect(page.locator("#speak-status")).to_contain_text(f"s of audio from Fiona ({voice['id']})")
        assert problems == [], problems
        app.state.server.store.delete_voice("acme", voice["id"])  # leaves the module's other tests as they were
    finally:
        browser.close()
