"""The library streams as the server batches: several sentences in one forward, each read as it is alone."""

from __future__ import annotations

import numpy as np
import pytest

from chorus.synthesis import Synthesizer, load_base
from conftest import tiny_piper_base

TEXT = (
    "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
    "It is easy to tell the depth of a well. These days a chicken leg is a rare dish. "
    "Rice is often served in round bowls. The juice of lemons makes fine punch."
)


def _spied(tts: Synthesizer) -> list[int]:
    """The rows of every forward ``tts``'s engine runs from now on."""
    rows: list[int] = []
    speak = tts.engine.synthesize

    def counted(requests, *args, **kwargs):
        rows.append(len(requests))
        return speak(requests, *args, **kwargs)

    tts.engine.synthesize = counted
    return rows


@pytest.mark.parametrize("base", ["chorus", "piper"])
def test_stream_batches_sentences_and_each_sounds_as_read_alone(tiny_base, base):
    """Each row of a batch is read as it is alone: the Piper base's audio (each row's noise seeded alike) to
    1e-4; the Chorus base's spectra to 1e-5 (the batched forward's float rounding, ~2e-6), which Griffin-Lim's
    iterations amplify in the audio (to ~1e-3; a neural vocoder to ~1e-4)."""
    tts = load_base(tiny_base, "griffin-lim") if base == "chorus" else Synthesizer(tiny_piper_base())
    rows = _spied(tts)
    alone = list(tts.stream(TEXT, batch_size=1))
    assert rows == [1] * 6
    rows.clear()
    batched = list(tts.stream(TEXT, batch_size=4))
    assert rows == [1, 4, 1], "the first sentence alone (first audio soonest), then four to a forward"
    assert [r.text for r in batched] == [r.text for r in alone] and len(batched) == 11  # 6 sentences, 5 pauses
    for together, single in zip(batched, alone):
        assert together.audio.shape == single.audio.shape
        if base == "piper":
            np.testing.assert_allclose(together.audio, single.audio, atol=1e-4)
        elif together.text:
            np.testing.assert_allclose(together.mel, single.mel, atol=1e-5)
            assert together.frames == single.frames
            np.testing.assert_allclose(together.audio, single.audio, atol=5e-3)
        assert [w.text for w in together.words] == [w.text for w in single.words]
    assert max(abs(r.seconds) for r in batched if not r.text) == 0.0
    assert sum(r.seconds for r in batched) > 0


def test_a_sentence_that_fails_in_a_batch_fails_after_the_ones_before_it(tiny_base):
    """As reading one by one would: the sentences before the failing one are yielded, then its error."""
    tts = load_base(tiny_base, "griffin-lim")
    speak = tts.engine.synthesize

    def third_fails(requests, *args, **kwargs):
        results = speak(requests, *args, **kwargs)
        return [
            ValueError("cannot read it") if r.text == "It is easy to tell the depth of a well." else r for r in results
        ]

    tts.engine.synthesize = third_fails
    made = []
    with pytest.raises(ValueError, match="cannot read it"):
        for result in tts.stream(TEXT, batch_size=4):
            made.append(result.text)
    assert [t for t in made if t] == [
        "The birch canoe slid on the smooth planks.",
        "Glue the sheet to the dark blue background.",
    ]
    with pytest.raises(ValueError, match="batch_size"):
        list(tts.stream(TEXT, batch_size=0))


@pytest.mark.parametrize("silence", [-0.1, 10.5, 99999.0])
def test_a_sentence_silence_out_of_range_is_refused_before_any_samples(silence):
    from chorus.synthesis.timeline import layout

    with pytest.raises(ValueError, match="sentence_silence must be 0 to 10 seconds"):
        layout("One. Two.", sentence_silence=silence)
    assert layout("One. Two.", sentence_silence=10.0)[1].seconds == 10.0
