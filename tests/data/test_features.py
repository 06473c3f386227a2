"""The feature cache: what is saved is what was computed, and bad items are reported."""

from __future__ import annotations

import numpy as np

from chorus.audio.io import load_audio
from chorus.audio.mel import log_mel
from chorus.data.features import FeatureCache, build_feature_cache
from chorus.data.formats import discover
from chorus.text import TextFrontEnd


def test_cache_round_trip_keeps_every_mel_exactly(two_voice_corpus, tmp_path):
    utterances, _ = discover(two_voice_corpus)
    cache, skipped = build_feature_cache(utterances, TextFrontEnd(), progress=False)
    assert not skipped
    cache.save(tmp_path / "features.safetensors")
    loaded = FeatureCache.load(tmp_path / "features.safetensors")
    assert loaded.keys == cache.keys and loaded.speaker_names == ["f2", "m3"]
    for index, utterance in enumerate(utterances):
        phonemes, mel, speaker, pitch = loaded.item(index)
        expected = log_mel(load_audio(utterance.audio_path)).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(mel, expected)
        assert phonemes.tolist() == TextFrontEnd().encode([utterance.text])[0]
        assert loaded.speaker_names[speaker] == utterance.speaker and pitch is None


def test_unusable_items_are_skipped_with_reasons(two_voice_corpus, tmp_path):
    utterances, _ = discover(two_voice_corpus)
    broken = [
        utterances[0].__class__("x", "m3", "!!!", utterances[0].audio_path, "metadata.csv:9"),
        utterances[1].__class__("y", "m3", "Fine text.", tmp_path / "gone.wav", "metadata.csv:10"),
    ]
    cache, skipped = build_feature_cache(utterances[:2] + broken, TextFrontEnd(), progress=False)
    assert len(cache) == 2
    assert any("metadata.csv:9" in s and "nothing speakable" in s for s in skipped)
    assert any("metadata.csv:10" in s and "not found" in s for s in skipped)
