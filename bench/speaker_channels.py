"""EER of an encoder on the calibration trials (every pair of the clips held out of every training
speaker, the same selection as chorus.training.speaker_encoder.prepare_clips), clean and with every
clip through one shared channel (a phone line, 8 kHz, AMR-like, MP3), and with a random channel per clip.

    python bench/speaker_channels.py ENCODER_DIR OUT.json [--corpus runs/speaker_corpus/encoder_training]
"""

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from chorus.audio import augment
from chorus.audio.io import load_audio
from chorus.data.formats import discover
from chorus.speaker_recognition.bundle import load_encoder
from chorus.speaker_recognition.verification import verification_scores
from run_record import provenance  # bench/, beside this script

parser = argparse.ArgumentParser()
parser.add_argument("encoder", type=Path)
parser.add_argument("out", type=Path)
parser.add_argument("--corpus", type=Path, default=Path("runs/speaker_corpus/encoder_training"))
parser.add_argument("--heldout", type=int, default=4)
parser.add_argument("--seed", type=int, default=1234)
args = parser.parse_args()
torch.set_num_threads(1)
load_at_start = os.getloadavg()[0]
# What is measured: read before the run.
measured = provenance(1, "load_encoder(...) embeddings and verification_scores over the augmented clips")
started = time.monotonic()
bundle = load_encoder(args.encoder)
rate = bundle.mel_config.sample_rate
rng = np.random.default_rng(args.seed)  # as prepare_clips draws its held-out clips
clips, owners = [], []
for folder in sorted(p for p in args.corpus.iterdir() if (p / "metadata.csv").is_file()):
    paths = [u.audio_path for u in discover(folder)[0]]
    rng.shuffle(paths)
    for path in paths[: args.heldout]:
        clips.append(load_audio(path, rate))
        owners.append(folder.name)

channels = {
    "clean": lambda a, r: a,
    "phone (all)": lambda a, r: augment.phone_line(a, rate),
    "8 kHz (all)": lambda a, r: augment.narrowband(a, rate),
    "amr-like (all)": lambda a, r: augment.codec_round_trip(a, rate, "amr"),
    "mp3 (all)": lambda a, r: augment.codec_round_trip(a, rate, "mp3"),
    "random channel per clip": lambda a, r: augment.Augmentation(
        speed=0, tempo=0, reverb=0, noise=0, mic=0, channel=1.0
    ).apply(a, rate, r)[0],
}
pairs = list(itertools.combinations(range(len(clips)), 2))
same = [owners[i] == owners[j] for i, j in pairs]
piper = np.array([owners[i].startswith("piper-joe") or owners[j].startswith("piper-joe") for i, j in pairs])
rows = {}
for name, channel in channels.items():
    r = np.random.default_rng(0)
    embeddings = bundle.embed([channel(a, r) for a in clips])
    scores = np.einsum("id,id->i", embeddings[[i for i, _ in pairs]], embeddings[[j for _, j in pairs]])
    everything = verification_scores(scores, same)
    synthetic = verification_scores(scores[~piper], np.array(same)[~piper])
    rows[name] = {
        "eer": round(everything.eer, 4),
        "eer_without_piper_speakers": round(synthetic.eer, 4),
        "false_accepts_at_own_threshold": round(float(np.mean(scores[~np.array(same)] >= bundle.threshold)), 4),
        "misses_at_own_threshold": round(float(np.mean(scores[np.array(same)] < bundle.threshold)), 4),
    }
    print(name, rows[name], flush=True)
args.out.write_text(
    json.dumps(
        {
            "encoder": str(args.encoder),
            "weights_sha256": bundle.weights_sha256,
            "threshold": bundle.threshold,
            "corpus": str(args.corpus),
            "speakers": len(set(owners)),
            "clips": len(clips),
            "trials": len(pairs),
            "targets": int(sum(same)),
            "conditions": rows,
            **measured,
            "load": f"{load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (1-minute)",
            "seconds": round(time.monotonic() - started, 1),
            "command": "python bench/speaker_channels.py " + " ".join(str(a) for a in (args.encoder, args.out)),
        },
        indent=1,
    )
)
