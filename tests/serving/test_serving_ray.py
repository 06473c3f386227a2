"""The voice server on Ray Serve, on a local two-CPU Ray cluster with the tiny base: speech through the
ingress's HTTP API in base and adapted voices, voices routed by Ray's model multiplexing to a replica
that already holds them (a replica-local load counter says they are not loaded again), onboarding as a
Ray task (uploaded through the API, and submitted directly) after which the new voice speaks; an OpenAI-style
custom voice (consent, sample, instant voice, refined by a Ray task).
Also the replica's bookkeeping without Ray: a voice dropped while in use leaves when its requests end."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
requests = pytest.importorskip("requests")

from chorus.adapters import parse_methods  # noqa: E402
from chorus.adapters.lora import LoraConfig  # noqa: E402
from chorus.adapters.speaker import SpeakerConfig  # noqa: E402
from chorus.models.bundle import load_bundle  # noqa: E402
from chorus.recipe import AdaptConfig  # noqa: E402
from chorus.serving.ray_app import (  # noqa: E402
    VOICES_DEPLOYMENT,
    RayServeConfig,
    RemoteResult,
    VoiceHost,
    build_app,
    submit_onboarding,
)
from chorus.serving.settings import (  # noqa: E402
    ServeConfig,
    ServerSettings,
    UploadLimits,  # noqa: E402
)
from chorus.serving.store import VoiceStore  # noqa: E402
from chorus.serving.voice_keys import voice_key  # noqa: E402
from conftest import clip_files, decode, random_voice, wait_for  # noqa: E402
from local_services import free_port  # noqa: E402

APP = "chorus-test"
CONSENT = "Fiona Four consented in writing on 2024-05-01 to a synthetic voice made from these recordings."
SETTINGS = ServerSettings(
    max_wait_ms=20,
    progress_interval=0.5,
    upload=UploadLimits(max_upload_bytes=8 << 20),
    adapt=AdaptConfig(methods=parse_methods("lora"), steps=2, threads=1, eval_every=2, max_frames=1500),
    adapt_sample=dataclasses.replace(ServerSettings().adapt_sample, steps=40, eval_every=10, threads=1),
)


@pytest.fixture(scope="module")
def voice_folders(tiny_base, tmp_path_factory) -> dict[str, Path]:
    """Two voices with random adapter values (as tests/serving/test_serving_api.py makes them)."""
    bundle = load_bundle(tiny_base)
    root = tmp_path_factory.mktemp("ray_voices")
    folders = {}
    for k, name in enumerate(["ann", "bob"]):
        folders[name] = random_voice(bundle, name, [LoraConfig(r=2), SpeakerConfig()], root / name, 200 + k)
    return folders


def make_store(
    root: Path | str, folders: dict[str, Path], database: str | None = None, cache_dir: Path | None = None
) -> tuple[VoiceStore, dict[str, str]]:
    """A store with ann and bob for tenant ``default``; returns it and their engine keys."""
    store = VoiceStore(str(root), database, None if cache_dir is None else str(cache_dir))
    keys = {name: voice_key(store.put_voice("default", name, folder)) for name, folder in folders.items()}
    return store, keys


def test_voice_host_drops_a_voice_only_when_its_requests_end(tiny_base, voice_folders, tmp_path):
    store, keys = make_store(tmp_path / "store", voice_folders)
    host = VoiceHost(
        RayServeConfig(
            ServeConfig(store=str(tmp_path / "store"), base=tiny_base, vocoder="griffin-lim", settings=SETTINGS)
        )
    )
    try:
        loaded = host.load(keys["ann"])
        assert host.engine.resident() == [keys["ann"]] and host.loads[keys["ann"]] == 1
        with host.using(keys["ann"]):
            loaded.__del__()  # what Ray's multiplexer calls when it drops the voice
            assert host.engine.resident() == [keys["ann"]]  # a request still uses it
            assert host.batcher.synthesize("Hello there.", keys["ann"]).audio.size > 0
        assert host.engine.resident() == [] and host.held == set()
        loaded.__del__()  # garbage collection after Ray's call: nothing more happens
        assert host.stats()["loads"] == {keys["ann"]: 1}
    finally:
        host.close()
        store.close()


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory, s3_environment):
    # s3_environment: the AWS variables that reach moto's S3 server are set before the cluster starts, so
    # its processes inherit them.
    # A new local cluster on loopback, its files in the test's temporary folder: without
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 it picks a non-loopback node address and binds its ports on all
    # interfaces; without RAY_AUTH_MODE=disabled it writes a token under the home folder. A request for a
    # voice whose replica is not yet known to the router waits up to
    # RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S for the news (default 1 s) before trying another
    # replica: generous here, as the test CPUs are shared.
    env = {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S": "10",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # before ray.init: the cluster's processes inherit it
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def replica_stats(handle, replicas: int) -> dict[str, dict]:
    """``voice_stats`` of every replica: calls without a model id go to a random one of two, so ask until
    each has answered."""
    seen: dict[str, dict] = {}
    for _ in range(60):
        stats = handle.voice_stats.remote().result(timeout_s=60)
        seen[stats["replica"]] = stats
        if len(seen) == replicas:
            return seen
    raise AssertionError(f"only replicas {sorted(seen)} answered")


@pytest.mark.parametrize("shared", [False, True], ids=["one-machine-store", "postgres-s3-store"])
def test_ray_serve_routes_voices_to_replicas_holding_them(
    ray_cluster, tiny_base, voice_folders, new_voice_data, custom_voice_recordings, tmp_path, shared, request
):
    if shared:  # the store of servers on several machines: every replica and task opens it
        root = f"{request.getfixturevalue('s3_bucket')}/voices"
        database, cache_dir = request.getfixturevalue("postgres_url"), tmp_path / "node" / "cache"
        jobs = cache_dir.parent / ".jobs"
    else:
        root, database, cache_dir = tmp_path / "store", None, None
        jobs = root / ".jobs"
    store, keys = make_store(root, voice_folders, database, cache_dir)
    request.addfinalizer(store.close)
    request.addfinalizer(serve.shutdown)  # the next run starts Serve afresh on its own port
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # 2 x 0.5 CPU voices replicas + 0.25 ingress + 0.5 per onboarding task: fits the two CPUs.
    config = RayServeConfig(
        ServeConfig(
            store=str(root),
            database=database,
            cache_dir=None if cache_dir is None else str(cache_dir),
            base=tiny_base,
            vocoder="griffin-lim",
            settings=SETTINGS,
        ),
        replicas=2,
        voices_per_replica=2,
        replica_cpus=0.5,
        ingress_cpus=0.25,
        job_cpus=0.5,
    )
    serve.run(build_app(config, APP), name=APP, route_prefix="/")
    url = f"http://127.0.0.1:{port}"

    def speak(voice: str | dict, text: str = "Hello there.") -> requests.Response:
        return requests.post(
            f"{url}/v1/audio/speech",
            json={"model": "chorus", "input": text, "voice": voice, "response_format": "wav"},
            timeout=60,
        )

    assert requests.get(f"{url}/healthz", timeout=30).json()["status"] == "ok"
    # The same HTTP API: base and adapted voices speak; errors keep their status and shape.
    for voice in ["m3", "ann", "bob", "ann", "bob"]:
        response = speak(voice)
        assert response.status_code == 200, response.text
        audio, rate = decode(response.content)
        assert rate == 22050 and audio.size > 0 and np.isfinite(audio).all()
    streamed = speak("ann", "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background.")
    assert streamed.status_code == 200 and decode(streamed.content)[0].size > 0
    unspeakable = speak("ann", "!!! ???")  # refused by the voices replica, re-raised by the ingress
    assert unspeakable.status_code == 400 and "speakable" in unspeakable.json()["error"]["message"]
    missing = speak("nobody")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "voice_not_found"
    listed = {v["id"] for v in requests.get(f"{url}/v1/voices", timeout=30).json()["data"]}
    assert {"m3", "ann", "bob"} <= listed

    # Multiplexing: a voice goes to a replica that holds it, which does not load it again. The HTTP
    # requests above loaded each adapted voice on one replica, or on both when a request came before
    # Ray's routers heard of the first load (replicas report what they hold asynchronously, so routing
    # is best effort until then). Once they have heard, requests for the voice load nothing anywhere.
    handle = serve.get_deployment_handle(VOICES_DEPLOYMENT, app_name=APP)

    def cluster_loads(key: str) -> int:
        return sum(s["loads"].get(key, 0) for s in replica_stats(handle, 2).values())

    def served_where_held(key: str) -> list | None:
        """Three requests for the voice, or None while they still load it somewhere."""
        before = cluster_loads(key)
        results = [
            handle.options(multiplexed_model_id=key).synthesize.remote("Hi.", key, 1.0).result(timeout_s=60)
            for _ in range(3)
        ]
        return results if cluster_loads(key) == before else None

    for name in ["ann", "bob"]:
        key = keys[name]
        assert 1 <= cluster_loads(key) <= 2
        results = wait_for(functools.partial(served_where_held, key), 120, f"{name}'s requests stop loading it", 0.5)
        assert all(isinstance(r, RemoteResult) and r.audio.size > 0 and r.speaker == key for r in results), results
        assert all(r.voice_loads == 1 for r in results)  # each replica that served it had loaded it once
        for replica in {r.replica for r in results}:
            stats = replica_stats(handle, 2)[replica]
            assert stats["loads"][key] == 1 and key in stats["held"] and key in stats["resident"], stats
    # An adapted voice asked for without its model id is refused rather than loaded behind Ray's back.
    unrouted = handle.synthesize.remote("Hi.", keys["ann"], 1.0).result(timeout_s=60)
    assert isinstance(unrouted, ValueError) and "multiplexed_model_id" in str(unrouted)

    # Onboarding through the API: the upload becomes a Ray task; the new voice then speaks.
    files, transcripts = clip_files(new_voice_data)
    created = requests.post(
        f"{url}/v1/voices",
        files=files,
        timeout=60,
        data={"name": "Fiona", "consent": CONSENT, "transcripts": transcripts},
    )
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    # And directly: a Ray task for a folder on disk, whose result is the job's final status.
    direct_job, task = submit_onboarding(config, "default", "gina", new_voice_data, CONSENT, name="Gina")
    assert ray.get(task, timeout=300) == "done"  # slow on a busy 2-core machine
    assert requests.get(f"{url}/v1/jobs/{direct_job}", timeout=30).json()["status"] == "done"
    wait_for(
        lambda: requests.get(f"{url}/v1/jobs/{job_id}", timeout=30).json()["status"] in ("done", "failed"),
        300,
        f"job {job_id} ends",
        interval=0.3,
    )
    job = requests.get(f"{url}/v1/jobs/{job_id}", timeout=30).json()
    assert job["status"] == "done", job
    for voice in ["fiona", "gina"]:
        response = speak(voice)
        assert response.status_code == 200, response.text
        assert decode(response.content)[0].size > 0
    assert not [p for p in jobs.iterdir() if p.is_dir()]  # job files removed by the tasks ...
    if shared:  # ... and their published copies
        assert not store.fs.exists(f"{store.root}/.jobs") or not store.fs.find(f"{store.root}/.jobs")
    consent = [json.loads(line)["voice_id"] for line in (jobs / "consent.jsonl").read_text().splitlines()]
    assert sorted(consent) == ["fiona", "gina"]

    # OpenAI's custom voices through the ingress: a consent, a voice from a sample that speaks at once (its
    # instant voice, a blend of base speakers, on any replica), refined by a Ray task, then speaking as itself.
    with open(custom_voice_recordings["consent"], "rb") as recording:
        consent = requests.post(
            f"{url}/v1/audio/voice_consents",
            files={"recording": ("consent.wav", recording, "audio/wav")},
            data={"name": "Fiona", "language": "en"},
            timeout=300,
        )
    assert consent.status_code == 200, consent.text
    with open(custom_voice_recordings["sample"], "rb") as sample:
        made = requests.post(
            f"{url}/v1/audio/voices",
            files={"audio_sample": ("sample.wav", sample, "audio/wav")},
            data={"name": "Fiona's sample", "consent": consent.json()["id"]},
            timeout=300,
        )
    assert made.status_code == 200 and made.json()["stage"] == "instant", made.text
    sample_voice = {"id": made.json()["id"]}
    instant = speak(sample_voice)
    assert instant.status_code == 200 and decode(instant.content)[0].size > 0, instant.text

    def refined() -> dict | None:
        now = requests.get(f"{url}/v1/audio/voices/{sample_voice['id']}", timeout=30).json()
        assert now["refinement"] != "failed", now
        return now if now["stage"] == "adapted" else None

    wait_for(refined, 300, "the sample's voice is refined", interval=0.5)
    adapted = speak(sample_voice)
    assert adapted.status_code == 200 and adapted.content != instant.content, adapted.text

    # Five voices, two replicas of at most two each: whatever Ray dropped has left the engine too.
    for replica in replica_stats(handle, 2).values():
        assert len(replica["held"]) <= 2 and set(replica["resident"]) <= set(replica["held"]), replica


@pytest.mark.parametrize(
    "failing,said",
    [
        ("copytree", "could not copy the voice's data"),
        ("record_consent", "could not record its consent"),
        ("publish", "could not publish its clips to the store"),
    ],
)
def test_a_ray_onboarding_that_cannot_start_says_which_step_failed(
    tiny_base, new_voice_data, tmp_path, monkeypatch, failing, said
):
    # A review: a store that refused the consent entry was reported as "could not copy the voice's data".
    import chorus.serving.ray_app as ray_app

    def refuse(*args, **kwargs):
        raise OSError("refused")

    if failing == "publish":
        monkeypatch.setattr(VoiceStore, "publish_job_inputs", refuse)
    else:
        monkeypatch.setattr(ray_app.shutil if failing == "copytree" else ray_app, failing, refuse)
    config = RayServeConfig(ServeConfig(store=str(tmp_path / "store"), base=tiny_base, settings=SETTINGS))
    with pytest.raises(OSError, match="refused"):
        submit_onboarding(config, "default", "gina", new_voice_data, CONSENT, name="Gina")
    with VoiceStore(str(tmp_path / "store")) as store:
        job = store.get_job("default", store.voice("default", "gina").job_id)
        assert job.status == "failed" and job.message == said


def test_chorus_serve_ray_stops_cleanly_on_sigterm(tiny_base, tmp_path):
    """`systemctl stop` sends SIGTERM: Ray's own handler answered it with an abort (exit -6) and left the cluster's
    dashboard and runtime-env agents running, orphaned (an operator's probe). It stops as Ctrl-C does now."""
    import signal
    import subprocess
    import sys

    import psutil

    port = free_port()
    chorus = Path(sys.executable).with_name("chorus")
    command = [str(chorus), "serve", "--ray", "--ray-replicas", "1", "--store", str(tmp_path / "store")]
    command += ["--model", str(tiny_base), "--vocoder", "griffin-lim", "--port", str(port)]
    with open(tmp_path / "server.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster = []
    try:
        up = wait_for(
            lambda: _answers(f"http://127.0.0.1:{port}/healthz") or process.poll() is not None, 300, "the server"
        )
        assert up and process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        cluster = psutil.Process(process.pid).children(recursive=True)
        assert cluster, "a Ray cluster of processes under the server"
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, (tmp_path / "server.log").read_text()[-3000:]
        _, alive = psutil.wait_procs(cluster, timeout=30)
        assert [p.name() for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        for member in [process, *cluster]:
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                member.kill()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
