"""Bases behind one interface: the Piper generator spoken through the engine as the Chorus base is (voices
by adapter name, mixed-voice batches, timestamps, pace), voices that record their base, full fine-tunes as
models of their own, and a registry and runtime that import neither Piper's loader nor training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from chorus.adapters import adapter_names
from chorus.adapters.voice import VoiceError, read_voice
from chorus.synthesis import Synthesizer
from chorus.synthesis.bases import base_of_voice
from chorus.synthesis.engine import Engine, SentenceRequest
from chorus.training.piper_adapt import PLACEMENTS
from conftest import random_voice, tiny_piper_base

TEXTS = ["Hello there.", "It is a fine day, is it not?", "Good day to you.", "See you soon."]


@pytest.fixture(scope="module")
def piper_voices(tmp_path_factory) -> dict:
    """Three voices with random adapters on the tiny Piper base: two LoRA + BitFit everywhere, one residual."""
    base, root = tiny_piper_base(), tmp_path_factory.mktemp("piper_voices")
    placements = {"ann": "all", "bob": "all", "cy": "residual"}
    return {
        name: random_voice(base, name, PLACEMENTS[placement](), root / name, seed)
        for seed, (name, placement) in enumerate(placements.items())
    }


def library(voices: dict) -> Synthesizer:
    tts = Synthesizer(tiny_piper_base())
    for name, folder in voices.items():
        tts.load_voice(folder, name)
    return tts


def test_a_mixed_batch_on_the_piper_base_speaks_each_voice_as_alone(piper_voices):
    """One forward through the voice bank: each row as the library speaks it alone (noise drawn per row)."""
    engine = Engine(tiny_piper_base(), resolve=lambda voice: piper_voices[voice.key])
    requests = [
        SentenceRequest(TEXTS[0], "ann"),
        SentenceRequest(TEXTS[1], "tiny-piper", 1.25),
        SentenceRequest(TEXTS[2], "cy", 0.8),
        SentenceRequest(TEXTS[3], "bob"),
        SentenceRequest(TEXTS[0], "nobody"),
    ]
    results = engine.synthesize(requests)
    tts = library(piper_voices)
    for request, result in zip(requests[:4], results[:4]):
        assert result.path == "bank" and result.batch_size == 4 and result.speaker == request.voice
        voice = None if request.voice == "tiny-piper" else request.voice
        alone = tts.synthesize_batch([request.text], voice=voice, speed=request.speed)[0]
        assert alone.path in ("base", "active") and alone.audio.shape == result.audio.shape
        np.testing.assert_allclose(result.audio, alone.audio, atol=1e-4)
    assert "unknown voice 'nobody'" in str(results[4])
    # Eight rows of one voice whose methods all merge: folded into the weights for the batch, then out again.
    merged = engine.synthesize([SentenceRequest(TEXTS[0], "ann")] * 8)
    assert {r.path for r in merged} == {"merged"}
    np.testing.assert_allclose(merged[3].audio, results[0].audio, atol=1e-4)
    (after,) = engine.synthesize([requests[1]])  # the base as it was: unmerged
    np.testing.assert_allclose(after.audio, results[1].audio, atol=1e-4)
    spoken = [r.audio for r in results[:4]]
    assert not np.allclose(spoken[0][:1000], tts.synthesize_batch([TEXTS[0]])[0].audio[:1000], atol=1e-3)


def test_piper_timestamps_pace_and_speakers():
    tts = Synthesizer(tiny_piper_base())
    result = tts.synthesize("Hello there. Good day to you.")
    assert [w.text for w in result.words] == ["Hello", "there.", "Good", "day", "to", "you."]
    assert all(a.end <= b.start for a, b in zip(result.words, result.words[1:]))
    assert result.words[-1].end <= result.duration and result.phonemes[0].text == "h"
    assert np.array_equal(result.audio, tts.synthesize("Hello there. Good day to you.").audio)  # seeded noise
    slow, fast = (tts.synthesize_batch(["It is a fine day."], speed=s)[0].duration for s in (0.5, 2.0))
    assert slow > 1.5 * fast  # not 4x: each id keeps at least one frame (durations are rounded up)
    assert tts.speakers == ["tiny-piper"] and tts.resolve_speaker(None).name == "tiny-piper"
    assert tts.resolve_speaker("TINY-Piper").name == "tiny-piper"  # any case, as the Chorus base's names
    with pytest.raises(ValueError, match="nothing to blend"):
        tts.synthesize("Hi.", "tiny-piper(1)+other(1)")
    with pytest.raises(ValueError, match="makes audio itself"):
        tts.mel(["Hi."])
    with pytest.raises(ValueError, match="nothing speakable"):
        tts.synthesize_batch(["..."])


def test_a_voice_records_its_base_and_another_base_refuses_it_naming_both(piper_voices, tiny_base):
    voice = read_voice(piper_voices["ann"])
    assert voice.base_model == "tiny-piper" and voice.base_model_sha256 == f"{0:064x}"
    assert base_of_voice(piper_voices["ann"]) == "tiny-piper"
    with pytest.raises(VoiceError, match=r"made on base tiny-piper \(sha256 000000000000\.\.\.\), not on tiny-piper"):
        Synthesizer(tiny_piper_base(seed=1)).load_voice(piper_voices["ann"])
    from chorus.synthesis import load_base

    with pytest.raises(VoiceError, match=r"made on base tiny-piper .* not on chorus .*--base tiny-piper"):
        load_base(tiny_base, "griffin-lim").load_voice(piper_voices["ann"])


def test_a_full_fine_tune_is_a_model_of_its_own_in_the_library_and_the_server(tmp_path):
    """One rule on both sides: a fully fine-tuned voice is held beside the resident base, never in it."""
    from chorus.adapters import add_adapter
    from chorus.adapters.bitfit import BitFitConfig
    from chorus.adapters.voice import VoiceCard, save_voice
    from chorus.training.piper_adapt import DECODER_CONVS

    base = tiny_piper_base()
    tuned = tiny_piper_base(seed=5).model  # other weights of the same layout
    configs = [BitFitConfig(targets=DECODER_CONVS)]  # a full voice may carry adapters too (Chorus's: a speaker vector)
    add_adapter(tuned, "full", configs)
    card = VoiceCard(name="full", methods=["full"], base_model_sha256=base.sha256, base_model=base.name)
    folder = save_voice(tmp_path / "full", tuned, "full", configs, card, full=True)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    engine = Engine(base, resolve=lambda voice: folder)
    full, plain = engine.synthesize([SentenceRequest(TEXTS[0], "full"), SentenceRequest(TEXTS[0], "tiny-piper")])
    assert full.batch_size == plain.batch_size == 1  # one forward per model
    assert all(torch.equal(v, base.model.state_dict()[k]) for k, v in before.items())
    assert not adapter_names(base.model) and engine.cached("full").base is not None
    assert engine.stats().resident_bytes >= sum(p.numel() * 4 for p in tuned.parameters())
    tts = Synthesizer(tiny_piper_base(seed=5))
    np.testing.assert_allclose(full.audio, tts.synthesize_batch([TEXTS[0]])[0].audio, atol=1e-5)


def test_the_registry_and_the_runtime_import_neither_piper_nor_training_until_asked():
    code = (
        "import sys; import chorus.synthesis.bases, chorus.synthesis.engine;"
        "assert 'chorus.synthesis.bases.piper' not in sys.modules and 'onnx' not in sys.modules;"
        "import chorus.synthesis.bases.piper, chorus.serving.engine;"
        "assert not [m for m in sys.modules if m.startswith('chorus.training')], 'training imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_adapted_piper_voice_speaks_at_its_own_pace_and_noise(piper_voices, tmp_path):
    """A voice's card records its pace (the posterior recipe measures it) and its prior noise: the engine
    stretches its durations by the one and draws the prior at the other, in a mixed batch as alone; the
    same adapter without them is unchanged."""
    import json
    import shutil

    from chorus.adapters.voice import CARD_FILE
    from chorus.synthesis.bases.piper import PiperSettings

    def copy_with(name: str, **card_fields) -> Path:
        folder = tmp_path / name
        shutil.copytree(piper_voices["ann"], folder)
        card = json.loads((folder / CARD_FILE).read_text())
        (folder / CARD_FILE).write_text(json.dumps({**card, **card_fields}))
        return folder

    slow, quiet = copy_with("slow", length_scale=2.0), copy_with("quiet", noise_scale=0.0)
    voices = {"ann": piper_voices["ann"], "slow": slow, "quiet": quiet}
    engine = Engine(tiny_piper_base(), resolve=lambda voice: voices[voice.key])
    ann, slow_ann = engine.synthesize([SentenceRequest(TEXTS[1], "ann"), SentenceRequest(TEXTS[1], "slow")])
    assert sum(slow_ann.frames) > 1.5 * sum(ann.frames)
    np.testing.assert_allclose(
        ann.audio, library(piper_voices).synthesize_batch([TEXTS[1]], voice="ann")[0].audio, atol=1e-4
    )
    (alone,) = library(voices).synthesize_batch([TEXTS[1]], voice="slow")
    assert alone.frames == slow_ann.frames
    # The quiet voice in a batch beside a noisy one: as ann on a base told to draw no prior noise at all.
    _, quiet_ann = engine.synthesize([SentenceRequest(TEXTS[1], "ann"), SentenceRequest(TEXTS[1], "quiet")])
    noiseless = Engine(tiny_piper_base(settings=PiperSettings(noise_scale=0.0)), resolve=lambda v: voices[v.key])
    (expected,) = noiseless.synthesize([SentenceRequest(TEXTS[1], "ann")])
    np.testing.assert_allclose(quiet_ann.audio, expected.audio, atol=1e-4)
    assert not np.allclose(quiet_ann.audio[:1000], ann.audio[:1000], atol=1e-3)
