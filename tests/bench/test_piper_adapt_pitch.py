"""bench/piper_adapt.py's pitch judge (where a voice's F0 sits, over every voiced frame of its judged clips) and its
F0 transposition (the pitch moved, the envelope kept)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chorus.evaluation.report import EvalItem  # noqa: E402
from piper_adapt import pitch, scale_f0, voiced_f0  # noqa: E402


def voiced(f0_hz: float, seconds: float = 1.0, rate: int = 22_050) -> np.ndarray:
    """A buzz at ``f0_hz``: ten harmonics falling 6 dB an octave, with a little noise."""
    t = np.arange(int(seconds * rate)) / rate
    wave = sum(np.sin(2 * np.pi * k * f0_hz * t) / k for k in range(1, 11))
    return (0.1 * wave + 0.001 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)


def test_pitch_reads_the_median_and_spread_of_every_voiced_frame(tmp_path):
    import soundfile as sf

    sf.write(tmp_path / "high.wav", voiced(200.0), 22_050)  # a file, as recordings are judged
    items = [
        EvalItem("low", voiced(100.0), "x", sample_rate=22_050),
        EvalItem("high", str(tmp_path / "high.wav"), "x", sample_rate=22_050),
    ]
    found = pitch(items)
    assert found["f0_p10_hz"] == pytest.approx(100.0, rel=0.03) and found["f0_p90_hz"] == pytest.approx(200.0, rel=0.03)
    assert 100.0 * 0.97 <= found["f0_median_hz"] <= 200.0 * 1.03
    assert pitch([items[0]])["f0_median_hz"] == pytest.approx(100.0, rel=0.03)


def test_scaling_f0_moves_the_pitch_and_keeps_the_length():
    buzz = voiced(120.0)
    moved = scale_f0(buzz, 22_050, 1.5)
    assert abs(len(moved) - len(buzz)) <= 22_050 * 0.01
    assert np.median(voiced_f0(moved, 22_050)) == pytest.approx(180.0, rel=0.03)


def test_transposition_moves_the_clips_into_the_base_voices_range_unclipped(monkeypatch, tmp_path):
    """``auto`` is the base's median F0 over the clips': clips at 200 Hz, a base at 100 Hz, 0.5. The clips are
    written as float (16-bit had clipped WORLD's peaks on every clip of a run)."""
    import soundfile as sf

    import piper_adapt
    from chorus.data.formats import Utterance

    rate = 22_050
    loud = voiced(200.0) * 9.0  # peaks near 1: WORLD's resynthesis passes it
    sf.write(tmp_path / "a.wav", loud, rate, subtype="FLOAT")
    clips = [Utterance("a", "s", "Hello.", tmp_path / "a.wav", "metadata.csv:1")]
    generator = type("G", (), {"sample_rate": rate})()
    monkeypatch.setattr(piper_adapt, "speak", lambda generator, texts, seed: [voiced(100.0) for _ in texts])
    moved, ratio = piper_adapt.transposed(clips, generator, "auto", tmp_path / "moved", seed=0)
    assert ratio == pytest.approx(0.5, rel=0.03) and moved[0].audio_path == tmp_path / "moved" / "a.wav"
    written, _ = sf.read(moved[0].audio_path, dtype="float32")
    assert sf.info(moved[0].audio_path).subtype == "FLOAT" and np.abs(written).max() > 1.0  # kept, not clipped
    assert np.median(voiced_f0(written, rate)) == pytest.approx(100.0, rel=0.03)
    moved, ratio = piper_adapt.transposed(clips, generator, 1.5, tmp_path / "up", seed=0)
    assert ratio == 1.5 and np.median(voiced_f0(sf.read(moved[0].audio_path)[0], rate)) == pytest.approx(300, rel=0.03)
