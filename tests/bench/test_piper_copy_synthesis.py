"""bench/piper_copy_synthesis.py: a recording through the posterior's latent to joe's decoder and the voice's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chorus.adapters import set_active  # noqa: E402
from chorus.models.piper_posterior import PosteriorEncoder  # noqa: E402
from chorus.synthesis.bases.piper import load_piper_voice  # noqa: E402
from chorus.training.piper_adapt import PLACEMENTS  # noqa: E402
from conftest import random_voice, tiny_piper_base  # noqa: E402
from piper_copy_synthesis import ROWS, copy_synthesis  # noqa: E402


def test_each_decoder_reads_the_same_latent_and_the_adapter_is_on_only_for_its_row(tiny_posterior, tmp_path):
    base = tiny_piper_base()
    folder = random_voice(base, "v", PLACEMENTS["flow+decoder"](), tmp_path / "v", seed=3)
    load_piper_voice(base.model, folder, "voice", base.sha256)
    recording = np.random.default_rng(0).standard_normal(base.model.hop_length * 40 + 17).astype(np.float32) * 0.1
    spoken = copy_synthesis(base.model, PosteriorEncoder.load(tiny_posterior).eval(), recording)
    assert list(spoken) == list(ROWS)
    hop_whole = base.model.hop_length * 40  # the recording cut to whole latent frames
    assert {len(audio) for audio in spoken.values()} == {hop_whole}
    np.testing.assert_array_equal(spoken[ROWS[0]], recording[:hop_whole])
    # Joe's decoder with no adapter on, then the voice's, each on the posterior's mean latent.
    posterior = PosteriorEncoder.load(tiny_posterior).eval()
    with torch.inference_mode():
        z = posterior(torch.from_numpy(recording[:hop_whole])[None], sample=False)[0]
        set_active(base.model, None)
        bare = base.model.dec(z)[0].numpy()
        set_active(base.model, "voice")
        adapted = base.model.dec(z)[0].numpy()
    np.testing.assert_array_equal(spoken[ROWS[1]], bare)
    np.testing.assert_array_equal(spoken[ROWS[2]], adapted)
    assert not np.allclose(bare, adapted)
