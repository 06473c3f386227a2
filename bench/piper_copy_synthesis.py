"""Where a Piper voice's pitch comes from: a speaker's recordings read by the posterior encoder and decoded by
joe's decoder and by an adapted voice's, each judged by its pitch (issue 38: why the adapters stop short on a
voice far from joe's pitch).

The posterior recipe (``chorus.training.piper_adapt``) trains the decoder on what the posterior encoder reads
from each recording; if that latent carries the recording's pitch, the decoder given it speaks at that pitch
(copy synthesis). This measures it: pYIN's F0 (``bench/piper_adapt.py``'s judge) of the recordings, of joe's
own decoder and of the adapted decoder fed the posterior's mean latent of each recording.

    python bench/piper_copy_synthesis.py --heldout unheard --voice flite-slt-down400 \
        --voice-dir runs/piper_adapt/flite-slt-down400-posterior-flow+decoder --out bench/results/piper_adapt/pitch

``--posterior`` (default: the one shipped for piper-joe) reads the recordings; the posterior a run left beside
its voice (``<voice>.posterior``) is the one adaptation trained.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from chorus.adapters import adapter_names, set_active
from chorus.audio.io import load_audio
from chorus.data.formats import discover
from chorus.models.piper_posterior import PosteriorEncoder
from chorus.models.piper_vits import PiperGenerator
from chorus.peers.piper import joe_paths
from chorus.synthesis.bases.piper import load_piper_voice, piper_sha256
from chorus.training.piper_adapt import SHIPPED_POSTERIOR, PiperAdaptConfig, load_posterior
from piper_adapt import f0_summary, voiced_f0  # bench/, beside this script
from run_record import LoadSampler, provenance, write_results

ROWS = ("recordings", "posterior -> joe's decoder", "posterior -> adapted decoder")


@torch.inference_mode()
def copy_synthesis(generator: PiperGenerator, posterior: PosteriorEncoder, audio: np.ndarray) -> dict[str, np.ndarray]:
    """One recording ``[samples]`` through the posterior's mean latent and each decoder -> audio ``[samples]``
    by row name (the generator carries one adapter, the voice)."""
    hop = generator.hop_length
    clip = torch.from_numpy(audio[: len(audio) // hop * hop])[None]
    z = posterior(clip, sample=False)[0]
    spoken = {ROWS[0]: clip[0].numpy()}
    for row, adapter in ((ROWS[1], None), (ROWS[2], next(iter(adapter_names(generator))))):
        set_active(generator, adapter)
        spoken[row] = generator.dec(z)[0].numpy()
    return spoken


def report(result: dict) -> str:
    lines = [
        f"# Copy synthesis of {result['voice']}: where the pitch comes from",
        "",
        f"{result['clips']} recordings (the voice's last, those `bench/piper_adapt.py` judges), read by the posterior "
        f"encoder `{result['posterior']}`, decoded by joe's decoder and by `{result['voice_dir']}`'s. pYIN F0 (Hz) "
        "over every voiced frame.",
        "",
        "| audio | F0 median | 10th-90th percentile |",
        "|---|---|---|",
        *(f"| {row} | {v['median']:.0f} | {v['p10']:.0f}-{v['p90']:.0f} |" for row, v in result["pitch"].items()),
        "",
        f"Provenance: commit `{result['provenance']['commit'][:10]}`, src/ clean: {result['provenance']['src_clean']}, "
        f"load {result['provenance']['load']}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--voice", required=True)
    parser.add_argument("--voice-dir", type=Path, required=True, help="a voice adapted on piper-joe")
    parser.add_argument("--posterior", default=None, help="posterior encoder folder (default: the shipped one)")
    parser.add_argument("--clips", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    onnx, config = joe_paths()
    generator = PiperGenerator.from_piper(onnx, config)
    load_piper_voice(generator, args.voice_dir, "voice", piper_sha256(onnx))
    posterior = load_posterior(PiperAdaptConfig(posterior=args.posterior)).eval()  # as adaptation loads it
    utterances = discover(args.heldout / args.voice)[0][-args.clips :]
    result = {
        "voice": args.voice,
        "voice_dir": str(args.voice_dir),
        "posterior": args.posterior or SHIPPED_POSTERIOR,
        "clips": len(utterances),
        "provenance": provenance(args.threads, "PosteriorEncoder (mean) -> PiperGenerator.dec, joe's and adapted"),
    }
    with LoadSampler() as load:
        spoken = [
            copy_synthesis(generator, posterior, load_audio(u.audio_path, generator.sample_rate)) for u in utterances
        ]
        rate = generator.sample_rate
        result["pitch"] = {row: f0_summary(np.concatenate([voiced_f0(s[row], rate) for s in spoken])) for row in ROWS}
    write_results(args.out, f"copy-synthesis-{args.voice}", result, load, report)


if __name__ == "__main__":
    main()
