"""The one-speaker check of adaptation data: two-means on the clips' embeddings, the groups compared."""

from __future__ import annotations

import numpy as np

from chorus.speaker_recognition.one_speaker import MIN_CLIPS, SAME_PERSON, split, split_score, two_voices


def clips(center: np.ndarray, count: int, spread: float, rng: np.random.Generator) -> np.ndarray:
    rows = center + spread * rng.standard_normal((count, len(center)))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_one_voice_does_not_split_and_two_do():
    rng = np.random.default_rng(0)
    a, b = np.eye(64)[0], np.eye(64)[1]  # two voices at right angles
    one = clips(a, 16, 0.05, rng)
    assert two_voices(one) is None and split_score(one) > SAME_PERSON
    mixed = np.concatenate([clips(a, 10, 0.05, rng), clips(b, 6, 0.05, rng)])
    found = two_voices(mixed)
    assert found is not None and found.similarity < SAME_PERSON
    assert sorted(found.groups[0]) == list(range(10)) and sorted(found.groups[1]) == list(range(10, 16))


def test_a_stray_clip_or_too_few_clips_are_no_second_voice():
    rng = np.random.default_rng(1)
    a, b = np.eye(64)[0], np.eye(64)[1]
    stray = np.concatenate([clips(a, 15, 0.05, rng), clips(b, 1, 0.05, rng)])  # under MIN_SHARE and two
    assert two_voices(stray) is None and split_score(stray) > SAME_PERSON  # the rest, one voice, split again
    few = np.concatenate([clips(a, 2, 0.05, rng), clips(b, MIN_CLIPS - 3, 0.05, rng)])
    assert split(few) is None


def test_one_odd_clip_cannot_hide_two_voices():
    """Two-means starts from the two least alike clips: a stray one (noise, a cough) would take a group of its
    own and the two voices one group together. The stray is set aside and the rest split again."""
    rng = np.random.default_rng(2)
    a, b, odd = np.eye(64)[0], np.eye(64)[1], -(np.eye(64)[0] + np.eye(64)[1]) / np.sqrt(2)
    mixed = np.concatenate([clips(a, 8, 0.05, rng), clips(b, 8, 0.05, rng), odd[None]])
    found = two_voices(mixed)
    assert found is not None and {len(found.groups[0]), len(found.groups[1])} == {8}
    assert 16 not in found.groups[0] + found.groups[1]  # the odd clip in neither
