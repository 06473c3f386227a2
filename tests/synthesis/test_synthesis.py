"""Python synthesis API: vocoder choice, speakers, real-time factor, the shipped assets."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

from chorus.audio.vocoders import GriffinLim, Vocos
from chorus.synthesis import DEFAULT_BASE, DEFAULT_VOCODER, load_base


def test_default_vocoder_comes_from_the_model(tiny_base, tmp_path):
    assert isinstance(load_base(tiny_base).vocoder, GriffinLim), "a model naming none gets Griffin-Lim"
    if (DEFAULT_VOCODER / "vocoder.json").is_file():
        assert isinstance(load_base(tiny_base, "neural").vocoder, Vocos)
    config = json.loads((tiny_base / "config.json").read_text())
    config["info"]["default_vocoder"] = "griffin-lim"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").write_bytes((tiny_base / "model.safetensors").read_bytes())
    assert isinstance(load_base(model).vocoder, GriffinLim)


def test_synthesize_by_name_index_and_default(tiny_base):
    tts = load_base(tiny_base, "griffin-lim")
    by_name = tts.synthesize("A short test.", "f2")
    by_index = tts.synthesize("A short test.", tts.speakers.index("f2"))
    np.testing.assert_array_equal(by_name.audio, by_index.audio)
    assert tts.synthesize("A short test.").speaker == "m3", "the model's default voice"
    assert by_name.sample_rate == 22_050 and by_name.real_time_factor > 0
    assert np.abs(by_name.audio).max() <= 0.99
    with pytest.raises(KeyError, match="unknown speaker"):
        tts.synthesize("A short test.", "nobody")


def test_bad_arguments_are_named_before_any_work(tiny_base, tmp_path):
    """Wrong types are TypeErrors naming the argument (not an AttributeError from the text front end); a
    speed outside the server's 0.25-4 is refused; a loaded voice's name given as a speaker says to pass
    voice=; a device this machine lacks is named."""
    tts = load_base(tiny_base, "griffin-lim")
    assert len(tts.synthesize_batch(t for t in ["Hello there.", "Hi."])) == 2  # any iterable, read once
    assert tts.synthesize("Hi.", speaker=np.int64(1)).speaker == tts.speakers[1]  # a numpy index
    for text in (42, None, ["A.", "B."], b"Hello."):
        with pytest.raises(TypeError, match="text must be a str"):
            tts.synthesize(text)
    with pytest.raises(TypeError, match="speaker must be a name, an index or None, got float"):
        tts.synthesize("Hello.", speaker=1.5)
    with pytest.raises(TypeError, match="speed must be a number"):
        tts.synthesize("Hello.", speed="fast")
    for speed in (0.1, 10.0, float("nan")):
        with pytest.raises(ValueError, match="speed must be from 0.25 to 4"):
            tts.synthesize("Hello.", speed=speed)
        with pytest.raises(ValueError, match="speed must be from 0.25 to 4"):
            tts.synthesize_batch(["Hello."], speed=speed)
    with pytest.raises(TypeError, match="a list of sentences"):
        tts.synthesize_batch("Hello.")
    with pytest.raises(ValueError, match="is not a device"):
        load_base(tiny_base, "griffin-lim", device="gpu")


def test_a_library_users_mistakes_are_named(tiny_base, tmp_path):
    """A library user's probe: a str given for a list of texts was read as its characters; a string silence, a
    number for a voice, a folder set as a voice in memory, a Synthesizer made from a name, a transposed mel, a
    rate of 0 Hz or of a fraction failed deep inside (or not at all); max_chars 0 split forever, memory growing."""
    import torch

    import chorus
    from chorus.adapters.lora import LoraConfig
    from chorus.synthesis import Synthesizer
    from chorus.text.sentences import split_sentences
    from conftest import random_voice

    tts = load_base(tiny_base, "griffin-lim")
    with pytest.raises(TypeError, match=r"texts is a list of sentences: mel\(\[text\]\)"):
        tts.mel("Hi.")
    with pytest.raises(TypeError, match="sentence_silence is a number of seconds"):
        tts.synthesize("Hi. There.", sentence_silence="1")
    with pytest.raises(TypeError, match="voice is a loaded voice's name"):
        tts.synthesize("Hi.", voice=3)
    with pytest.raises(TypeError, match=r"tts.load_voice\(folder, name\)"):
        tts.voices["x"] = str(tmp_path)
    with pytest.raises(KeyError, match="no adapter 'nope' on that model"):
        tts.voices["x"] = (tts.bundle.model, "nope")
    with pytest.raises(TypeError, match=r"use chorus.load_base\('piper-joe'\)"):
        Synthesizer("piper-joe")
    n_mels = tts.bundle.mel_config.n_mels
    for shape in ((n_mels, 50), (1, 50, n_mels), (0, n_mels)):
        with pytest.raises(ValueError, match=f"recorded_mel must be a tensor \\[frames, {n_mels}\\]"):
            tts.teacher_forced("Hi.", torch.zeros(shape))
    result = tts.synthesize("Hi.")
    for rate in (0, -5, 22_050.5, 1_000, 192_000, True):
        with pytest.raises(ValueError, match="sample_rate must be a whole number of Hz from 8,000 to 48,000"):
            result.to_bytes("wav", sample_rate=rate)
    assert len(result.to_bytes("wav", sample_rate=np.int64(16_000))) > 44
    for chars in (0, -1):
        with pytest.raises(ValueError, match="max_chars must be a whole number of characters, at least 1"):
            split_sentences("Hi there friend.", chars)
        with pytest.raises(ValueError, match="max_chars"):
            list(tts.stream("Hi there friend.", max_chars=chars))

    # Two Synthesizers on one model: each its own voices (the second's load had taken the first's adapter name,
    # and its failure removed the first's voice).
    other = Synthesizer(tts.bundle, tts.vocoder)
    first = random_voice(tts.bundle, "first", [LoraConfig(r=2)], tmp_path / "first", 1)
    second = random_voice(tts.bundle, "second", [LoraConfig(r=2)], tmp_path / "second", 2)
    tts.load_voice(first)
    before = tts.synthesize("Hello there.", voice="first").audio
    other.load_voice(second)
    np.testing.assert_array_equal(tts.synthesize("Hello there.", voice="first").audio, before)
    assert not np.array_equal(other.synthesize("Hello there.", voice="second").audio, before)
    assert chorus.VoiceError.__module__ == "chorus.adapters.voice" and issubclass(chorus.BaseMismatch, ValueError)


def test_warnings_about_the_text_point_at_the_callers_line(tiny_base):
    """What was left out of a text is warned of at the line that asked for the speech, not deep inside
    Chorus, however many of its frames (a generator among them) the text went through."""
    import warnings

    tts = load_base(tiny_base, "griffin-lim")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        tts.synthesize("Hello 你好 there. 再见。 Bye.")  # the line every warning names
    assert {w.category.__name__ for w in caught} >= {"UnknownCharacterWarning", "UnspeakableTextWarning"}
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, line)}


def test_openai_voice_names_speak_as_their_speakers(tiny_base):
    """ "alloy" speaks as the server and the CLI take it: its speaker where the base has it, else the default."""
    from chorus.synthesis.voices import OPENAI_VOICE_ALIASES

    tts = load_base(tiny_base, "griffin-lim")
    assert OPENAI_VOICE_ALIASES["alloy"] not in tts.speakers  # the tiny base: the default speaker speaks
    alloy, default = tts.synthesize("Hello.", speaker="Alloy"), tts.synthesize("Hello.")
    assert np.array_equal(alloy.audio, default.audio) and alloy.speaker == tts.default_speaker
    assert tts.resolve_speaker("f2").name == "f2"  # a speaker of the base is itself


def test_results_say_what_they_hold_and_write_any_format_name(tiny_base, tmp_path):
    tts = load_base(tiny_base, "griffin-lim")
    result = tts.synthesize("Hello there.")
    assert (result == tts.synthesize("Hello there.")) is False  # by identity: == on their arrays would raise
    assert result.to_bytes("WAV") == result.to_bytes("wav") and result.to_bytes("ogg")[:4] == b"OggS"  # Opus in Ogg
    with pytest.raises(ValueError, match="unknown audio format 'wma'"):
        result.to_bytes("wma")
    with pytest.raises(ValueError, match="or name the format"):
        result.save(tmp_path / "speech")


def test_a_batch_of_sentences_reads_each_as_one_sentence_alone_does(tiny_base):
    """``synthesize_batch``: one forward for every text, each read as ``synthesize`` reads one sentence, in a
    speaker or a blend: the lengths exactly, the samples to Griffin-Lim's amplified float noise (rows are
    padded to the longest)."""
    tts = load_base(tiny_base, "griffin-lim")
    texts = ["A short test.", "Another, longer sentence to read."]
    for speaker in ("f2", "m3(2)+f2(1)"):
        batch = tts.synthesize_batch(texts, speaker=speaker)
        alone = [tts.synthesize(text, speaker=speaker) for text in texts]
        assert [r.text for r in batch] == texts and all(r.sample_rate == 22_050 for r in batch)
        assert all(r.batch_size == 2 and r.words for r in batch)
        for together, single in zip(batch, alone):
            assert together.audio.shape == single.audio.shape
            np.testing.assert_allclose(together.audio, single.audio, atol=5e-3)
    with pytest.raises(KeyError, match="unknown speaker"):
        tts.synthesize_batch(texts, speaker="nobody")


@pytest.mark.skipif(not (DEFAULT_BASE / "config.json").is_file(), reason="no shipped base model")
def test_shipped_base_loads_and_speaks_every_voice_it_lists():
    tts = load_base()
    assert len(tts.speakers) >= 24
    result = tts.synthesize("Hello.", tts.speakers[-1])
    assert result.duration > 0.2 and np.isfinite(result.audio).all()


def test_blends_of_speakers_are_weighted_speaker_vectors(tiny_base):
    import torch

    from chorus.models.speaker_mix import parse_mix

    tts = load_base(tiny_base, "griffin-lim")
    text = "Hello there."
    m3, f2 = (tts.synthesize(text, speaker=s).audio for s in ("m3", "f2"))
    assert np.array_equal(tts.synthesize(text, speaker="m3(1)").audio, m3)  # a blend of one is that speaker
    blend = tts.synthesize(text, speaker="m3(2)+f2(1)")
    assert (
        blend.speaker == "m3(2)+f2(1)" and not np.array_equal(blend.audio, m3) and not np.array_equal(blend.audio, f2)
    )
    table = tts.bundle.model.speaker_embedding.weight.detach()
    expected = (2 * table[tts.speakers.index("m3")] + table[tts.speakers.index("f2")]) / 3
    torch.testing.assert_close(tts.bundle.speaker_mix("m3(2)+f2(1)"), expected)
    assert parse_mix("a + b(3)") == [("a", 0.25), ("b", 0.75)]
    for bad, message in [("m3(0)+f2", "positive"), ("m3+m3", "twice"), ("m3(x)", r"NAME or NAME\(WEIGHT\)")]:
        with pytest.raises(ValueError, match=message):
            tts.synthesize(text, speaker=bad)
    with pytest.raises(KeyError, match="an adapted voice cannot be blended"):
        tts.synthesize(text, speaker="m3+nobody")


def test_teacher_forced_speech_keeps_the_recordings_frames_in_a_speaker_or_a_voice(tiny_base, tmp_path):
    """What bench/naturalness.py calls "timed": the recording's length, the speaker's (or voice's) spectra."""
    import torch

    from chorus.adapters.residual import ResidualAdapterConfig
    from chorus.audio.mel import log_mel
    from chorus.models.bundle import load_bundle, teacher_forced_mel
    from conftest import random_voice

    tts = load_base(tiny_base, "griffin-lim")
    recorded = torch.from_numpy(log_mel(tts.synthesize("Hello there.", "f2").audio, tts.bundle.mel_config))
    as_f2 = tts.teacher_forced("Hello there.", recorded, "f2")
    assert as_f2.shape == recorded.shape
    torch.testing.assert_close(
        as_f2, teacher_forced_mel(tts.bundle, "Hello there.", recorded, tts.speakers.index("f2"))
    )
    folder = random_voice(load_bundle(tiny_base), "mine", [ResidualAdapterConfig()], tmp_path / "mine", seed=0)
    name = tts.load_voice(folder)
    as_voice = tts.teacher_forced("Hello there.", recorded, voice=name)
    assert as_voice.shape == recorded.shape and not torch.equal(as_voice, tts.teacher_forced("Hello there.", recorded))
    with pytest.raises(ValueError, match="blend"):
        tts.teacher_forced("Hello there.", recorded, "m3+f2")
    # A new user's probe: a voice named in another case, or by its folder, was "unknown voice" with no hint.
    with pytest.raises(KeyError, match="did you mean 'mine'"):
        tts.synthesize("Hello there.", voice="MINE")
    with pytest.raises(KeyError, match=r"loaded first: name = tts.load_voice\(folder\)"):
        tts.synthesize("Hello there.", voice=str(folder))
    with pytest.raises(KeyError, match="is an adapted voice's folder, not a speaker: load it"):  # -s voices/joe
        tts.synthesize("Hello there.", speaker=str(folder))


def test_postfilter_spreads_each_bin_over_time_and_each_frame_around_its_peak():
    import torch

    from chorus.audio.postfilter import MelPostFilter

    mel = torch.randn(50, 80) * torch.linspace(0.1, 2, 80) - 4
    torch.testing.assert_close(MelPostFilter()(mel), mel)
    spread = MelPostFilter(global_variance=1.3)(mel)
    torch.testing.assert_close(spread.mean(0), mel.mean(0))
    torch.testing.assert_close(spread.std(0), 1.3 * mel.std(0))
    sharp = MelPostFilter(contrast=1.5)(mel)
    torch.testing.assert_close(sharp.amax(-1), mel.amax(-1))  # each frame's loudest band keeps its level
    torch.testing.assert_close(sharp.amax(-1, keepdim=True) - sharp, 1.5 * (mel.amax(-1, keepdim=True) - mel))
    batch = torch.stack([mel, mel + 1])
    torch.testing.assert_close(MelPostFilter(1.2, 1.2)(batch)[1], MelPostFilter(1.2, 1.2)(mel + 1))
    with pytest.raises(ValueError, match="post-filter"):
        MelPostFilter(contrast=0)


def test_the_bases_postfilter_is_applied_by_the_library_and_the_server_alike(tiny_base, tmp_path):
    from chorus.audio.postfilter import MelPostFilter
    from chorus.serving.batcher import Batcher

    config = json.loads((tiny_base / "config.json").read_text())
    config["info"]["postfilter"] = {"global_variance": 1.3, "contrast": 1.2}
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").write_bytes((tiny_base / "model.safetensors").read_bytes())
    tts = load_base(model, "griffin-lim")
    assert tts.postfilter == MelPostFilter(1.3, 1.2)
    filtered = tts.synthesize("A short test.", "f2").audio
    with Batcher(tts.engine) as batcher:
        served = batcher.synthesize("A short test.", "f2").audio
    np.testing.assert_allclose(served, filtered, atol=1e-5)
    tts.postfilter = MelPostFilter()
    assert not np.allclose(tts.synthesize("A short test.", "f2").audio, filtered, atol=1e-3)
