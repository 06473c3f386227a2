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


def test_the_installed_voice_answers_to_its_names_and_a_voice_file_to_its_own(tmp_path):
    """A Piper user's probe: "Piper-Joe" and Piper's own "en_US-joe-medium" were unknown bases, a voice file named
    .ONNX or its .onnx.json a 'missing config.json'."""
    from chorus.peers.piper import joe_paths
    from chorus.synthesis.bases.piper import claims, open_base

    assert all(claims(name) for name in ("piper-joe", "Piper-Joe", "en_US-joe-medium", "v.ONNX", "v.onnx.json"))
    assert open_base("en_US-joe-medium").name == "piper-joe"
    with pytest.raises(ValueError, match=r"v.onnx.json: give the voice's .onnx file"):
        open_base(str(tmp_path / "v.onnx.json"))
    onnx, config = joe_paths()
    (tmp_path / "UP.ONNX").symlink_to(onnx)
    (tmp_path / "UP.ONNX.json").symlink_to(config)  # Piper's rule: the model's path and .json
    upper = open_base(str(tmp_path / "UP.ONNX"))
    assert upper.name == "UP.ONNX" and upper.sha256 == open_base("piper-joe").sha256


def test_a_voice_made_on_a_copy_of_joe_under_another_name_speaks_without_its_path(monkeypatch, tmp_path):
    """adapt's own 'speak with it' hint had failed for a voice made on a renamed joe.onnx: its name alone is
    recorded, and its sha256 is the installed joe's."""
    from chorus.adapters import voice as voice_module
    from chorus.cli.common import chosen_base
    from chorus.peers.piper import joe_paths
    from chorus.synthesis.bases import piper as piper_base

    joe_sha = piper_base.piper_sha256(joe_paths()[0])
    recorded = {"sha": joe_sha}
    named = {"file": "myvoice.onnx"}
    monkeypatch.setattr("chorus.synthesis.bases.base_of_voice", lambda folder: named["file"])
    monkeypatch.setattr(
        voice_module, "read_voice", lambda folder: type("V", (), {"base_model_sha256": recorded["sha"]})()
    )
    assert chosen_base(None, None, tmp_path / "voice") == "piper-joe"
    named["file"] = "MyJoe.ONNX"  # a voice file's suffix in any case, as --base takes it
    assert chosen_base(None, None, tmp_path / "voice") == "piper-joe"
    named["file"] = "myvoice.onnx"
    recorded["sha"] = "b" * 64  # another voice file of that name: its path is needed
    with pytest.raises(ValueError, match="was adapted on the Piper voice myvoice.onnx: give its path with --base"):
        chosen_base(None, None, tmp_path / "voice")


def test_adapting_the_base_to_its_own_voice_or_with_another_voices_posterior_is_refused(tmp_path):
    """piper-joe's recordings on joe trained a voice of the base's own voice unsaid; joe's distilled posterior on
    another Piper voice read its recordings as joe's latents, unsaid."""
    from chorus.peers.piper import joe_paths
    from chorus.synthesis.bases.piper import piper_sha256
    from chorus.training.piper_adapt import PiperAdaptConfig, check_target_and_posterior

    joe = piper_sha256(joe_paths()[0])
    own = tmp_path / "piper-joe"
    with pytest.raises(ValueError, match="piper-joe's recordings are this base's own voice"):
        check_target_and_posterior(own, joe, PiperAdaptConfig())
    check_target_and_posterior(own, "a" * 64, PiperAdaptConfig(posterior=str(tmp_path / "its-own")))  # not joe
    check_target_and_posterior(tmp_path / "flite-slt", joe, PiperAdaptConfig())  # another voice on joe
    with pytest.raises(ValueError, match="distil its own .* --posterior DIR"):
        check_target_and_posterior(tmp_path / "flite-slt", "a" * 64, PiperAdaptConfig())
    check_target_and_posterior(tmp_path / "flite-slt", "a" * 64, PiperAdaptConfig(recipe="aligned"))  # no posterior
