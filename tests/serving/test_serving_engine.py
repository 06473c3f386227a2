"""Serving engine and dynamic batcher on the tiny base: speakers without onboarding, adapted voices
loaded on demand into a byte-bounded LRU cache with pinned voices, unknown voices refused; concurrent
requests over several voices batched into one forward and equal to each request synthesized alone
through the Synthesizer; failures isolated to their own request; the merged fast path; the benchmark's
baselines (bench/serving_baselines.py)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from chorus.adapters import (
    adapter_names,
    adapter_state_dict,
)
from chorus.adapters.bitfit import BitFitConfig
from chorus.adapters.lora import LoraConfig
from chorus.adapters.residual import ResidualAdapterConfig
from chorus.adapters.speaker import SpeakerConfig
from chorus.models.bundle import load_bundle
from chorus.serving.batcher import Batcher
from chorus.serving.engine import Engine, SentenceRequest, UnknownVoice
from chorus.synthesis import load_base
from conftest import random_voice

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the baselines live with the benchmark
from serving_baselines import ModelPerVoice, swap_one_at_a_time  # noqa: E402

TEXTS = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "Rice is often served in round bowls.",
]
# Voice k's methods: a Chorus voice usually carries a speaker vector (not mergeable); k % 4 == 1 and 3 merge.
CONFIGS = [
    lambda: [LoraConfig(r=4), SpeakerConfig()],
    lambda: [LoraConfig(r=2)],
    lambda: [ResidualAdapterConfig(bottleneck=4), SpeakerConfig()],
    lambda: [LoraConfig(r=3), BitFitConfig()],
]


@pytest.fixture(scope="module")
def voices(tiny_base, tmp_path_factory) -> dict[str, Path]:
    """Eight voice folders v0..v7 for the tiny base (random adapter values, so each sounds its own)."""
    bundle = load_bundle(tiny_base)
    root = tmp_path_factory.mktemp("voices")
    folders = {}
    for k in range(8):
        name = f"v{k}"
        folders[name] = random_voice(bundle, name, CONFIGS[k % 4](), root / name, k)
    return folders


@pytest.fixture(scope="module")
def reference(tiny_base, voices):
    """A plain Synthesizer with every voice loaded: what one request alone should give."""
    tts = load_base(tiny_base, "griffin-lim")
    for name, folder in voices.items():
        tts.load_voice(folder, name)
    return tts


def alone(tts, request: SentenceRequest) -> torch.Tensor:
    base = request.voice in tts.speakers
    return tts.mel(
        [request.text],
        speaker=request.voice if base else None,
        speed=request.speed,
        voice=None if base else request.voice,
    )[0]


def assert_same_as_alone(tts, request: SentenceRequest, result) -> None:
    expected = alone(tts, request)
    assert result.mel.shape == expected.shape, request
    torch.testing.assert_close(result.mel, expected, rtol=1e-4, atol=1e-4)


def make_engine(tiny_base, voices, **kwargs) -> Engine:
    def resolve(voice) -> Path:
        return voices[voice.key]  # KeyError: unknown

    return Engine.load(tiny_base, "griffin-lim", resolve=resolve, **kwargs)


def test_speakers_work_without_onboarding_and_unknown_voices_raise(tiny_base, reference):
    engine = Engine.load(tiny_base, "griffin-lim")  # no resolver, no voices
    requests = [
        SentenceRequest(TEXTS[0], "m3"),
        SentenceRequest(TEXTS[1], "f2", 1.25),
        SentenceRequest(TEXTS[2], "nobody"),
    ]
    results = engine.synthesize(requests)
    for request, result in zip(requests[:2], results[:2]):
        assert result.path == "base" and result.batch_size == 2
        assert_same_as_alone(reference, request, result)
        expected = reference.synthesize(request.text, request.voice, request.speed).audio
        assert result.audio.shape == expected.shape
        # The mels agree to 1e-4 (above); Griffin-Lim's iterations amplify that float noise of a padded
        # batch to ~1e-3 on a few samples (measured 1.1e-3 on 17 of 12,288), so the audio gets more room.
        np.testing.assert_allclose(result.audio, expected, atol=5e-3)
    assert isinstance(results[2], UnknownVoice) and isinstance(results[2], KeyError)
    assert "nobody" in str(results[2])
    with pytest.raises(UnknownVoice):
        engine.handle("nobody")
    with pytest.raises(UnknownVoice):
        engine.remove_voice("nobody")
    assert engine.stats().loads == 0 and not adapter_names(engine.model)


def test_cache_loads_on_demand_evicts_lru_by_bytes_and_keeps_pinned(tiny_base, voices, reference):
    # v1 and v5 have the same methods, so the same size.
    engine = make_engine(tiny_base, voices, cache_bytes=0)
    request = SentenceRequest(TEXTS[0], "v1")
    first = engine.synthesize([request])[0]
    assert_same_as_alone(reference, request, first)
    stats = engine.stats()
    assert (stats.misses, stats.loads, stats.evictions, stats.resident_voices) == (1, 1, 1, 0), (
        "a budget of 0 keeps nothing once the batch is done"
    )
    with engine.using(["v1"]) as (handles, _):
        size = engine.cached("v1").nbytes
        assert size == sum(
            t.numel() * t.element_size() for t in adapter_state_dict(engine.model, handles["v1"].adapter).values()
        )
    engine.resize(1 << 20)
    sizes = {}
    for voice in ("v0", "v1", "v2", "v3"):
        with engine.using([voice]):
            sizes[voice] = engine.cached(voice).nbytes
    assert sizes["v1"] == size and engine.resident() == ["v0", "v1", "v2", "v3"]
    with engine.using(["v1"]):  # a hit: v1 becomes the most recent
        pass
    assert engine.resident() == ["v0", "v2", "v3", "v1"]
    engine.resize(sizes["v2"] + sizes["v3"] + sizes["v1"])
    assert engine.resident() == ["v2", "v3", "v1"], "the least recently used voice goes first"
    engine.pin("v2")  # pinned: never evicted
    engine.resize(sizes["v2"] + sizes["v1"])
    assert engine.resident() == ["v1", "v2"]
    with engine.using(["v5"]) as (handles, errors):  # v5 is v1's size: v1 makes room, not pinned v2
        assert not errors and handles["v5"].adapter in adapter_names(engine.model)
    assert engine.resident() == ["v2", "v5"]
    stats = engine.stats()
    assert stats.resident_bytes == sizes["v2"] + sizes["v1"] <= engine.cache_bytes
    assert (stats.pinned_voices, stats.evictions, stats.hits) == (1, 5, 2) and stats.load_seconds > 0
    assert len(adapter_names(engine.model)) == 2, "eviction removes the adapter from the model"

    # An evicted voice comes back on demand, identical.
    again = engine.synthesize([request])[0]
    assert torch.equal(again.mel, first.mel)
    assert "v2" in engine.resident()

    # Voices added and removed without a restart; unknown ids are refused, never replaced.
    engine.resize(1 << 20)
    engine.add_voice("guest/7", voices["v6"])
    assert "guest/7" in engine.resident()
    engine.remove_voice("guest/7")
    assert "guest/7" not in engine.resident()
    results = engine.synthesize([SentenceRequest(TEXTS[0], "guest/7"), SentenceRequest(TEXTS[1], "v2")])
    assert isinstance(results[0], UnknownVoice) and results[1].path == "active"
    engine.remove_voice("v2")
    assert "v2" not in engine.resident() and engine.stats().pinned_voices == 0
    with pytest.raises(ValueError, match="is a speaker"):
        engine.add_voice("m3", voices["v0"])


def test_batcher_serves_concurrent_requests_in_one_forward_each_equal_to_alone(tiny_base, voices, reference):
    engine = make_engine(tiny_base, voices, cache_bytes=1 << 20)
    mix = ["v0", "v2", "v3", "f2"]
    requests = [SentenceRequest(TEXTS[i % len(TEXTS)], mix[i % 4], (1.0, 1.3, 0.8)[i % 3]) for i in range(12)]
    bad = [SentenceRequest("?!", "v0"), SentenceRequest(TEXTS[0], "nobody"), SentenceRequest(TEXTS[1], "v2", -1.0)]
    everything = requests + bad
    results: list = [None] * len(everything)

    def call(index: int) -> None:
        try:
            results[index] = batcher.synthesize(
                everything[index].text, everything[index].voice, everything[index].speed, timeout=60
            )
        except Exception as error:  # noqa: BLE001 - checked below
            results[index] = error

    # Held until all 15 wait in the queue: then they go out as one batch.
    with Batcher(engine, max_batch=16, max_wait_ms=50) as batcher:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(everything))]
        with batcher.held():
            for thread in threads:
                thread.start()
            assert batcher.wait_queued(len(everything), timeout=60)
        for thread in threads:
            thread.join()

    for request, result in zip(requests, results):
        assert not isinstance(result, Exception), (request, result)
        assert_same_as_alone(reference, request, result)
        assert result.speaker == request.voice and result.seconds > 0 and np.isfinite(result.audio).all()
    assert isinstance(results[12], ValueError) and "speakable" in str(results[12])
    assert isinstance(results[13], UnknownVoice)
    assert isinstance(results[14], ValueError) and "speed" in str(results[14])
    assert batcher.stats.batch_sizes == Counter({15: 1}) and batcher.stats.paths == Counter({"bank": 12})
    assert batcher.stats.completed == 12 and batcher.stats.failed == 3 and batcher.stats.requests == 15

    # Audio too: rows of equal length are vocoded together, each as the Synthesizer would alone.
    request, result = requests[1], results[1]
    expected = reference.synthesize(request.text, voice=request.voice, speed=request.speed).audio
    assert result.audio.shape == expected.shape
    np.testing.assert_allclose(result.audio, expected, atol=1e-3)


def test_batcher_from_asyncio_tasks(tiny_base, voices, reference):
    engine = make_engine(tiny_base, voices)
    requests = [SentenceRequest(TEXTS[i % 2], ("v1", "v4", "m3")[i % 3]) for i in range(6)]

    async def main(batcher):
        with batcher.held():  # until all six wait in the queue: then one batch
            tasks = [asyncio.create_task(batcher.synthesize_async(r.text, r.voice, r.speed)) for r in requests]
            assert await asyncio.to_thread(batcher.wait_queued, len(requests), 60)
        return await asyncio.gather(*tasks)

    with Batcher(engine, max_batch=8, max_wait_ms=30) as batcher:
        results = asyncio.run(main(batcher))
    for request, result in zip(requests, results):
        assert_same_as_alone(reference, request, result)
    assert batcher.stats.batch_sizes == Counter({6: 1})


def test_one_voice_batches_merge_or_activate_and_leave_the_base_exact(tiny_base, voices, reference):
    engine = make_engine(tiny_base, voices)
    base_before = engine.synthesize([SentenceRequest(TEXTS[0], "m3")])[0].mel
    for voice, merge, path in [("v1", True, "merged"), ("v3", "auto", "active"), ("v0", True, "active")]:
        requests = [SentenceRequest(text, voice) for text in TEXTS[:3]]
        results = engine.synthesize(requests, merge=merge)
        for request, result in zip(requests, results):
            assert result.path == path, (voice, merge)
            assert_same_as_alone(reference, request, result)
    assert torch.equal(engine.synthesize([SentenceRequest(TEXTS[0], "m3")])[0].mel, base_before)


def test_baselines_match_the_batched_engine(tiny_base, voices, reference):
    engine = make_engine(tiny_base, voices)
    requests = [SentenceRequest(TEXTS[i % 4], f"v{i % 3}", 1.1) for i in range(4)] + [SentenceRequest(TEXTS[1], "f2")]
    batched = engine.synthesize(requests, vocode=False)
    swapped = swap_one_at_a_time(engine, requests, vocode=False)
    assert all(r.batch_size == 1 and r.path in ("active", "base") for r in swapped)
    per_voice = ModelPerVoice(engine, {f"v{k}": voices[f"v{k}"] for k in range(3)})
    separate = per_voice.run(requests + [SentenceRequest(TEXTS[0], "nobody")], vocode=False)
    assert isinstance(separate[-1], UnknownVoice)
    for request, a, b, c in zip(requests, batched, swapped, separate):
        for result in (a, b, c):
            assert_same_as_alone(reference, request, result)
    one_model = sum(t.numel() * t.element_size() for t in [*per_voice.base.parameters(), *per_voice.base.buffers()])
    assert per_voice.resident_bytes > 3 * one_model, "a whole model per voice"
    assert per_voice.models["v1"][1] and not per_voice.models["v0"][1], "merged where the methods allow"


def test_a_failing_batched_forward_is_retried_row_by_row(tiny_base, voices, reference, monkeypatch):
    import chorus.synthesis.forward as forward_module

    engine = make_engine(tiny_base, voices)
    poison = engine.bundle.front_end.encode([TEXTS[3]])[0]
    real_infer = forward_module.infer_mels

    def flaky_infer(model, ids, speakers, speeds):
        if poison in ids:
            raise RuntimeError("this row breaks the forward")
        return real_infer(model, ids, speakers, speeds)

    monkeypatch.setattr(forward_module, "infer_mels", flaky_infer)
    requests = [SentenceRequest(TEXTS[0], "v0"), SentenceRequest(TEXTS[3], "v1"), SentenceRequest(TEXTS[2], "m3")]
    results = engine.synthesize(requests)
    assert isinstance(results[1], RuntimeError)
    for request, result in zip([requests[0], requests[2]], [results[0], results[2]]):
        assert result.batch_size == 1
        assert_same_as_alone(reference, request, result)


def test_blends_beside_adapted_voices_keep_each_voices_speaker_vector(tiny_base, voices, reference):
    """v0 and v2 carry their own speaker vector: a blend in the same batch must not replace it."""
    engine = make_engine(tiny_base, voices)
    requests = [
        SentenceRequest(TEXTS[0], "m3(2)+f2(1)"),
        SentenceRequest(TEXTS[1], "v0"),
        SentenceRequest(TEXTS[2], "v2"),
    ]
    results = engine.synthesize(requests)
    assert [r.path for r in results] == ["split"] * 3
    for request, result in zip(requests[1:], results[1:]):
        assert_same_as_alone(reference, request, result)
    blend_alone = engine.synthesize(requests[:1])[0]
    assert blend_alone.path == "base" and torch.allclose(results[0].mel, blend_alone.mel, atol=1e-5)
    expected = reference.mel([TEXTS[0]], speaker="m3(2)+f2(1)")[0]
    torch.testing.assert_close(blend_alone.mel, expected, atol=1e-5, rtol=1e-4)


def test_a_batch_takes_each_tenant_in_turn(tiny_base):
    """ann queues ten sentences, then bob and carl one each: theirs go in the first batch (their start tags
    are ann's first's, ties by arrival), not after all of ann's."""
    engine = Engine.load(tiny_base, "griffin-lim")
    order: list[str] = []
    with Batcher(engine, max_batch=4, max_wait_ms=0) as batcher:
        with batcher.held():
            futures = [(f"ann{k}", batcher.submit(f"SentenceRequest {k}.", "m3", tenant="ann")) for k in range(10)]
            futures += [("bob", batcher.submit("Hello.", "f2", tenant="bob"))]
            futures += [("carl", batcher.submit("Hi there.", "f2", tenant="carl"))]
            for name, future in futures:
                future.add_done_callback(lambda _, name=name: order.append(name))
            assert batcher.wait_queued(12, timeout=60)
        for _, future in futures:
            future.result(timeout=60)
    assert set(order[:4]) == {"ann0", "bob", "carl", "ann1"}, order  # first batch: each tenant in turn
    assert [name for name in order if name.startswith("ann")] == [f"ann{k}" for k in range(10)]
    assert batcher.stats.batch_sizes == {4: 3}


def run_in_order(batcher: Batcher, submissions: list[tuple[str, str]]) -> list[str]:
    """Queue ``(tenant, text)`` while the batcher is held; the names (``tenant`` + index) in completion order."""
    order: list[str] = []
    with batcher.held():
        futures = []
        for index, (tenant, text) in enumerate(submissions):
            future = batcher.submit(text, "m3", tenant=tenant)
            future.add_done_callback(lambda _, name=f"{tenant}{index}": order.append(name))
            futures.append(future)
        assert batcher.wait_queued(len(submissions), timeout=60)
    for future in futures:
        future.result(timeout=120)
    return order


LONG = "The birch canoe slid on the smooth planks, and the sheet was glued to the dark blue background at once."


def test_tenants_share_the_batcher_by_work_not_by_sentence(tiny_base):
    """ann's long sentences and bob's short ones, both queued, one row a batch: bob gets about as many
    characters spoken as ann, so several of his sentences go for each of hers (round robin would alternate)."""
    engine = Engine.load(tiny_base, "griffin-lim")
    with Batcher(engine, max_batch=1, max_wait_ms=0) as batcher:
        order = run_in_order(batcher, [("ann", LONG)] * 6 + [("bob", "Hi.")] * 6)
    ann = [order.index(f"ann{k}") for k in range(6)]
    bob = [order.index(f"bob{k}") for k in range(6, 12)]
    assert ann == sorted(ann) and bob == sorted(bob), order  # each tenant's own order kept
    assert max(bob) < ann[2], order  # costs 28 against 128 characters: all of bob's before ann's third


def test_a_tenant_that_starts_waiting_goes_before_anothers_backlog(tiny_base):
    """carl comes while ann's backlog is being spoken: his sentence is in the next batch, whatever ann queued."""
    engine = Engine.load(tiny_base, "griffin-lim")
    with Batcher(engine, max_batch=1, max_wait_ms=0) as batcher:
        ann = [batcher.submit(LONG, "m3", tenant="ann") for _ in range(8)]
        ann[1].result(timeout=120)
        carl = batcher.submit("Hello.", "m3", tenant="carl")
        carl.result(timeout=120)
        assert sum(f.done() for f in ann) <= 4, [f.done() for f in ann]  # at most the batch running meanwhile
        for future in ann:
            future.result(timeout=120)


def test_a_short_sentence_is_not_padded_to_a_long_one_and_batches_stay_within_their_time(tiny_base):
    engine = Engine.load(tiny_base, "griffin-lim")
    # pad_ratio 2: bob's "Hi." (28) goes first (lowest tag, ties by arrival); ann's long ones (128) would pad it.
    with Batcher(engine, max_batch=8, max_wait_ms=0, pad_ratio=2.0) as batcher:
        order = run_in_order(batcher, [("bob", "Hi.")] + [("ann", LONG)] * 3)
    assert order[0] == "bob0" and batcher.stats.batch_sizes == {1: 1, 3: 1}, (order, batcher.stats.batch_sizes)
    # max_batch_ms: with an estimate of 1 ms per padded character, 128-character rows, 400 ms: 3 rows a batch.
    with Batcher(engine, max_batch=8, max_wait_ms=0, max_batch_ms=400) as batcher:
        with batcher.held():
            batcher.seconds_per_cost = 0.001
            futures = [batcher.submit(LONG, "m3", tenant="ann") for _ in range(3)]
            futures += [batcher.submit(LONG, "m3", tenant="bob") for _ in range(3)]
            assert batcher.wait_queued(6, timeout=60)
        for future in futures:
            future.result(timeout=120)
    first, *_ = batcher.stats.batch_sizes
    assert first == 3, batcher.stats.batch_sizes  # the first batch, on the estimate set above
    assert batcher.seconds_per_cost != 0.001  # then learned from the batches that ran


def test_a_cancelled_sentence_is_not_charged_to_its_tenant(tiny_base):
    """ann's stream is cut short (its five sentences queued ahead cancelled), then she asks for one more:
    it goes before bob's, which came after it, as if the cancelled ones had never been queued."""
    engine = Engine.load(tiny_base, "griffin-lim")
    order: list[str] = []
    with Batcher(engine, max_batch=1, max_wait_ms=0) as batcher:
        with batcher.held():
            for future in [batcher.submit(LONG, "m3", tenant="ann") for _ in range(5)]:
                future.cancel()
            futures = {"ann": batcher.submit("Hi.", "m3", tenant="ann")}
            futures |= {f"bob{k}": batcher.submit("Hi.", "m3", tenant="bob") for k in range(2)}
            for name, future in futures.items():
                future.add_done_callback(lambda _, name=name: order.append(name))
        for future in futures.values():
            future.result(timeout=60)
    assert order == ["ann", "bob0", "bob1"], order  # charged, ann's would have gone last (5 x 128 characters)
    assert batcher.stats.batches == 3
