"""Go on training Chorus's candidate speaker encoder v2 on a lent GPU, with the data packed for the trip.

Three modes (``scripts/device_speaker_train.md`` has the device's command line):

* here, ``--pack CORPUS --data .device_data``: the v2 run's clips (``runs/speaker_corpus/encoder_training``,
  split into training and held-out clips exactly as ``prepare_clips`` splits them with the checkpoint's
  seed) as Ogg/Opus at 16 kHz (the device takes at most ~40 MB of data), a manifest and a README line;
* on the device, ``--data .device_data --init checkpoints/speaker-encoder-v2 --out $OUT --minutes 8
  --workers 14 --device cuda``: checks everything it needs within seconds, decodes the clips into
  :class:`~chorus.training.speaker_encoder.SpeakerClips`, measures v2's EER on the held-out clips,
  trains from v2's encoder and AAM head (fresh Adam, the margin on from the first step, cosine
  learning rate over the steps the minutes allow) with the crops made by ``--workers`` processes,
  checkpoints every 2 minutes, calibrates, and leaves 7 files in ``--out``: the calibrated encoder
  (``encoder.safetensors``, ``config.json``), its training state (``training_state.json`` +
  ``.safetensors``: ``--out`` is a checkpoint folder to resume or ``--init`` from), ``loss.csv``,
  ``loss.png`` and ``log.txt``;
* here, ``--recalibrate FOLDER --corpus CORPUS --out DIR``: the returned encoder with its threshold and
  EER set on the clean held-out clips (the device only had Opus-coded ones), comparable with v2's card.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

STARTED = time.monotonic()
FORMAT = "chorus-speaker-device-data"
MANIFEST = "manifest.json"
# The held-out datasets: nothing of theirs may train the encoder (v2's card, "Shared source").
HELDOUT_DATASETS = ("piper-joe", "flite-slt", "festival-ked")
CODED_RATE = 16_000  # Opus takes 8, 12, 16, 24 or 48 kHz; 16 kHz keeps all the mel's 0-8 kHz
# libsndfile's Opus bitrate falls linearly with the level (0.9: ~32 kbps); 0.98 gives ~13.4 kbps,
# ~36 MB for the 6 h of v2's clips (training and held-out).
COMPRESSION_LEVEL = 0.98
# Kept free of the budget for calibration (1,088 clips, 591,328 trials) and the last saves.
RESERVE_SECONDS = 60.0
OUT_FILES = ("encoder.safetensors", "config.json", "training_state.json", "training_state.safetensors")


def say(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {message}", flush=True)


def fail(message: str, code: int = 2) -> None:
    print(f"FAIL: {message}", flush=True)
    raise SystemExit(code)


class Tee:
    """A stream that also writes to a file: the run's own log comes back in --out even if it is killed."""

    def __init__(self, stream, handle):
        self.stream, self.handle = stream, handle

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.handle.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.handle.flush()

    def isatty(self) -> bool:
        return False


def refuse_heldout_datasets(speakers: list[str], sources: list[str]) -> None:
    """Raise if a speaker is (or a clip comes from) a held-out dataset. The encoder's Piper speakers
    are named ``piper-joe-<chain>``: the name piper-joe itself is the held-out one."""
    for name in speakers:
        if name in HELDOUT_DATASETS or name.startswith(HELDOUT_DATASETS[1:]):
            raise ValueError(f"held-out dataset {name!r} among the training speakers")
    for source in sources:
        parts = Path(source).parts
        if "heldout" in parts or any(p in HELDOUT_DATASETS or p.startswith(HELDOUT_DATASETS[1:]) for p in parts):
            raise ValueError(f"{source}: a clip of a held-out dataset")


def checkpoint_folder(folder: Path) -> Path:
    """A checkpoint folder (v2's, or a returned --out), or the run folder holding one in checkpoint/."""
    return folder / "checkpoint" if (folder / "checkpoint").is_dir() else folder


def saved_run(init: Path) -> dict:
    """A checkpoint's training metadata (its config, speakers, step)."""
    meta = init / "training_state.json"
    if not meta.is_file():
        fail(f"{init}: no training_state.json (give the v2 checkpoint folder, checkpoints/speaker-encoder-v2)")
    return json.loads(meta.read_text())


# --- here: packing -------------------------------------------------------------------------------


def _encode(job: tuple[str, str, float]) -> tuple[int, int, int]:
    """One clip to Ogg/Opus at 16 kHz: (rate, samples, bytes) of the original and the coded file."""
    import soundfile as sf
    import soxr

    source, target, level = job
    audio, rate = sf.read(source, dtype="float32", always_2d=True)
    mono = audio.mean(axis=1)
    coded = soxr.resample(mono, rate, CODED_RATE, quality="HQ")
    with sf.SoundFile(target, "w", CODED_RATE, 1, "OPUS", format="OGG", compression_level=level) as handle:
        handle.write(coded)
    return rate, len(mono), os.path.getsize(target)


def pack(corpus: Path, data: Path, init: Path, level: float, jobs: int) -> None:
    """The clips v2 trained and calibrated on, split as ``prepare_clips`` split them, as Opus files."""
    from multiprocessing import Pool

    import numpy as np

    from chorus.training.speaker_encoder import SpeakerTrainConfig, speaker_folders, split_clips

    run = saved_run(init)
    config = SpeakerTrainConfig(**run["config"])
    # With fixed augmented copies prepare_clips draws from the split's generator between speakers.
    assert config.augment_copies == 0, "the v2 recipe makes no fixed copies"
    folders = speaker_folders(corpus)
    speakers = [f.name for f in folders]
    if speakers != run["speakers"]:
        fail(
            f"{corpus}: its speakers are not the {len(run['speakers'])} of {init} (rebuild the corpus as its card says)"
        )
    rng = np.random.default_rng(config.seed)
    rows, jobs_list = [], []
    temp = data.with_name(data.name + ".packing")
    shutil.rmtree(temp, ignore_errors=True)
    (temp / "audio").mkdir(parents=True)
    for index, folder in enumerate(folders):
        heldout, train = split_clips(folder, config, rng)
        for split, paths in (("heldout", heldout), ("train", train)):
            for path in paths:
                file = f"audio/{len(rows):05d}.ogg"
                source = str(Path(path).resolve())
                rows.append([index, split, file, str(Path(path).relative_to(corpus))])
                jobs_list.append((source, str(temp / file), level))
    refuse_heldout_datasets(speakers, [j[0] for j in jobs_list])
    started = time.monotonic()
    with Pool(jobs) as pool:
        results = pool.map(_encode, jobs_list, chunksize=16)
    clips = [[*row[:3], rate, samples, size, row[3]] for row, (rate, samples, size) in zip(rows, results)]
    manifest = {
        "format": FORMAT,
        "version": 1,
        "corpus": str(corpus),
        "init": str(init),
        "seed": config.seed,
        "heldout": config.heldout,
        "clips_per_speaker": config.clips_per_speaker,
        "codec": f"Ogg/Opus, {CODED_RATE} Hz mono, libsndfile compression_level {level}",
        "coded_rate": CODED_RATE,
        "speakers": speakers,
        "columns": ["speaker", "split", "file", "rate", "samples", "bytes", "source"],
        "clips": clips,
    }
    (temp / MANIFEST).write_text(json.dumps(manifest, separators=(",", ":")))
    seconds = sum(c[4] / c[3] for c in clips)
    size = sum(c[5] for c in clips)
    (temp / "README.md").write_text(
        f"The device saw Opus-coded clips: the speaker encoder v2's {len(clips)} clips ({seconds / 3600:.2f} h; "
        f"training and held-out, split as its run split them) of {corpus}, coded as Ogg/Opus at 16 kHz "
        f"(compression_level {level}, {8 * size / seconds / 1000:.1f} kbps) by "
        f"`python scripts/device_speaker_train.py --pack`; decoded and resampled to 22,050 Hz on the device.\n"
    )
    shutil.rmtree(data, ignore_errors=True)
    temp.rename(data)
    say(
        f"packed {len(clips)} clips of {len(speakers)} speakers ({seconds / 3600:.2f} h) into {data}: "
        f"{size / 1e6:.1f} MB of audio, {8 * size / seconds / 1000:.1f} kbps, {time.monotonic() - started:.0f} s"
    )


# --- the device: checks -----------------------------------------------------------------------------


def check_imports() -> None:
    """Every module the run needs, before anything slow: a missing wheel fails here, in seconds."""
    missing = []
    for name in (
        "numpy",
        "scipy",
        "torch",
        "safetensors",
        "matplotlib",
        "rich",
        "soundfile",
        "soxr",
        "librosa",
        "num2words",
        "chorus.training.speaker_encoder",
        "chorus.speaker_recognition.verification",
    ):
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - any failure to import is the same news
            missing.append(f"{name} ({type(error).__name__}: {error})")
    if missing:
        fail("cannot import " + "; ".join(missing) + " (carry the wheels in .whl; PYTHONPATH=/tmp/site:src)")
    import soundfile as sf

    if "OPUS" not in sf.available_subtypes("OGG"):
        fail(f"libsndfile {sf.__libsndfile_version__} here cannot decode Ogg/Opus (soundfile's wheel bundles 1.1+)")


def check_device(name: str) -> None:
    import torch

    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            fail(f"--device {name}: torch {torch.__version__} sees no CUDA GPU")
        device = torch.device(name)
        x = torch.randn(256, 256, device=device)
        float((x @ x).sum())  # the GPU answers
        props = torch.cuda.get_device_properties(device)
        say(f"GPU {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}")
    else:
        say(f"device {name}, torch {torch.__version__}")


def check_data(data: Path, init: Path) -> dict:
    """The manifest, every file it names (by size), no held-out dataset, and the init's speakers."""
    if not (data / MANIFEST).is_file():
        fail(f"{data}: no {MANIFEST} (pack it here with --pack and carry the folder)")
    manifest = json.loads((data / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        fail(f"{data / MANIFEST}: not a {FORMAT} manifest")
    clips = manifest["clips"]
    bad = [c[2] for c in clips if not (data / c[2]).is_file() or (data / c[2]).stat().st_size != c[5]]
    if bad:
        fail(f"{data}: {len(bad)} of {len(clips)} clips missing or of another size (first: {bad[0]})")
    try:
        refuse_heldout_datasets(manifest["speakers"], [c[6] for c in clips])
    except ValueError as error:
        fail(str(error))
    for name in OUT_FILES:
        if not (init / name).is_file():
            fail(f"--init {init}: no {name}")
    run = saved_run(init)
    if run["speakers"] != manifest["speakers"]:
        fail(f"{data}: its speakers are not the {len(run['speakers'])} of {init}")
    if run["config"]["seed"] != manifest["seed"] or run["config"]["heldout"] != manifest["heldout"]:
        fail(f"{data}: split with another seed or held-out count than {init}'s run")
    say(f"data: {len(clips)} clips, {len(manifest['speakers'])} speakers, {sum(c[5] for c in clips) / 1e6:.1f} MB")
    return manifest


# --- the device: decoding, training ---------------------------------------------------------------


def _decode_init(_=None) -> None:
    import torch

    torch.set_num_threads(1)


def _decode(job: tuple[str, str, int, int]):
    """One Opus clip back at the mel rate and its length: float16 audio (training) or a clean log-mel
    (held-out), as ``prepare_clips`` keeps them."""
    import numpy as np
    import soundfile as sf
    import soxr

    from chorus.audio.mel import MelConfig, log_mel

    path, split, rate, samples = job
    coded, coded_rate = sf.read(path, dtype="float32")
    mel_config = MelConfig()
    audio = soxr.resample(coded, coded_rate, mel_config.sample_rate, quality="HQ")
    # The original's length at the mel rate (the codec's padding and the resampler's rounding off).
    samples = round(samples * mel_config.sample_rate / rate)
    audio = np.pad(audio[:samples], (0, max(0, samples - len(audio))))
    return audio.astype(np.float16) if split == "train" else log_mel(audio, mel_config)


def decode_clips(data: Path, manifest: dict, processes: int):
    """The manifest's clips as :class:`SpeakerClips` (speakers in label order, as the init's head)."""
    from multiprocessing import get_context

    from chorus.training.speaker_encoder import SpeakerClips

    clips = manifest["clips"]
    jobs = [(str(data / c[2]), c[1], c[3], c[4]) for c in clips]
    with get_context("fork").Pool(processes, initializer=_decode_init) as pool:
        decoded = pool.map(_decode, jobs, chunksize=32)
    speakers = manifest["speakers"]
    train = [[] for _ in speakers]
    heldout = [[] for _ in speakers]
    for clip, value in zip(clips, decoded):
        (train if clip[1] == "train" else heldout)[clip[0]].append(value)
    if any(not t for t in train) or any(len(h) != manifest["heldout"] for h in heldout):
        fail(f"{data}: a speaker without training clips or with other than {manifest['heldout']} held-out clips")
    hours = sum(len(a) for s in train for a in s) / 22050 / 3600
    say(f"decoded {len(clips)} clips with {processes} processes: {hours:.2f} h of training audio")
    return SpeakerClips(speakers, train, heldout, 0)


def opus_eer(folder: Path, clips, device: str) -> float:
    """An encoder folder's EER on the (Opus-coded) held-out clips: v2's before the run, to compare."""
    from chorus.speaker_recognition.bundle import load_encoder
    from chorus.speaker_recognition.verification import verification_scores
    from chorus.training.speaker_encoder import calibration_trials

    scores, same = calibration_trials(load_encoder(folder, device), clips)
    return verification_scores(scores, same).eer


def copy_out(run: Path, out: Path) -> None:
    """The run's checkpoint and loss curve into --out (7 files with log.txt), each replaced whole; once
    the calibrated encoder is there its two files replace the checkpoint's (the same weights)."""
    sources = [run / "checkpoint" / name for name in OUT_FILES] + [run / "loss.csv", run / "loss.png"]
    if (run / "config.json").is_file():  # the end: the calibrated encoder
        sources += [run / "encoder.safetensors", run / "config.json"]
    for source in sources:
        if source.is_file():
            temp = out / f".{source.name}.part"
            shutil.copyfile(source, temp)
            os.replace(temp, out / source.name)


def train(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "log.txt").open("a", buffering=1)
    sys.stdout, sys.stderr = Tee(sys.stdout, log), Tee(sys.stderr, log)
    say(f"device_speaker_train: {' '.join(sys.argv[1:])}")
    check_imports()
    check_device(args.device)
    data, init = Path(args.data), Path(args.init)
    manifest = check_data(data, init)
    say("checks passed")

    import torch

    from chorus.training.speaker_encoder import SpeakerTrainConfig, train_speaker_encoder

    # Fixed input shapes: let cuDNN pick its fastest convolutions once. Few CPU threads here: the
    # crop workers have the cores (more threads than cores made a CPU forward 25x slower).
    torch.backends.cudnn.benchmark = True
    torch.set_num_threads(args.threads)
    clips = decode_clips(data, manifest, args.workers or 1)
    before = opus_eer(init, clips, args.device) if args.baseline else None
    if before is not None:
        say(f"v2 ({init}) on the Opus held-out clips: EER {100 * before:.2f}%")
    run = Path(args.run_dir)
    shutil.rmtree(run, ignore_errors=True)
    budget = (60 * args.minutes - (time.monotonic() - STARTED) - args.reserve_seconds) / 60
    if budget <= 0:
        fail(f"--minutes {args.minutes}: no time left for steps after {time.monotonic() - STARTED:.0f} s of set-up")
    saved = saved_run(init)["config"]
    config = SpeakerTrainConfig(
        **{
            **saved,
            "corpus": str(data),
            "out": str(run),
            # Plain Adam: v2's 8-bit state is bitsandbytes', which this machine lacks; a fresh one
            # starts under a short warm-up (see SpeakerTrainConfig.warmup_steps).
            "optimizer": "adam",
            "learning_rate": args.lr,
            "warmup_steps": args.warmup,
            # The crops are the bottleneck, not the GPU: a step's crops cost the same per crop
            # whatever the batch, so a larger batch gives smoother gradients (32 crops over 272
            # classes swung the loss by +-1) at no cost in crops per second.
            "batch_speakers": args.batch_speakers,
            "per_speaker": 2,
            # v2's classes are apart: the margin at full (0.2) from the first step.
            "margin_start": 0.0,
            "margin_full": 0.0,
            "steps": args.max_steps,
            "max_minutes": budget,
            "checkpoint_every": 10**9,  # by the clock instead: a kill still leaves weights in --out
            "checkpoint_minutes": args.checkpoint_minutes,
            "report_seconds": args.report_seconds,
            "log_every": 10,
            "threads": args.threads,
            "device": args.device,
            "workers": args.workers,
        }
    )
    say(
        f"training: {args.batch_speakers} speakers x 2 crops, Adam lr {args.lr:g} (warm-up {args.warmup}), "
        f"margin {config.margin} from step 1, {args.workers} crop workers, {budget:.2f} min of steps"
    )
    folder = train_speaker_encoder(config, clips=clips, init=init, on_save=lambda r: copy_out(r, out))
    # The run's own record of what it trained on, beside the device's calibration.
    config_file = out / "config.json"
    saved_config = json.loads(config_file.read_text())
    info = saved_config["info"]
    info["data"] = (
        f"Opus-coded copies of the v2 corpus clips ({manifest['codec']}); calibrated on Opus-coded held-out "
        "clips: set the threshold on the clean ones with scripts/device_speaker_train.py --recalibrate"
    )
    info["calibration_opus"] = info["calibration"]
    info["baseline_eer_opus"] = None if before is None else round(before, 4)
    temp = out / ".config.json.part"
    temp.write_text(json.dumps(saved_config, indent=2))
    os.replace(temp, config_file)
    eer = info["calibration"]["eer"]
    say(
        f"done: {info['steps']} steps in {info['train_seconds']:.0f} s, final loss {info['final_loss']}; "
        f"EER on the Opus held-out clips {100 * eer:.2f}%"
        + ("" if before is None else f" (v2: {100 * before:.2f}%)")
        + f"; run folder {folder}"
    )
    for path in sorted(out.iterdir()):
        say(f"  {path.name}: {path.stat().st_size / 1e6:.2f} MB")


# --- here: recalibration --------------------------------------------------------------------------


def recalibrate(source: Path, corpus: Path, out: Path) -> None:
    """``source``'s encoder with its threshold and EER from the clean held-out clips of ``corpus``."""
    import numpy as np

    from chorus.audio.io import load_audio
    from chorus.audio.mel import MelConfig, log_mel
    from chorus.speaker_recognition.bundle import load_encoder, save_encoder
    from chorus.speaker_recognition.verification import verification_scores
    from chorus.training.speaker_encoder import (
        SpeakerClips,
        SpeakerTrainConfig,
        calibration_trials,
        speaker_folders,
        split_clips,
    )

    run = saved_run(source)
    config = SpeakerTrainConfig(**run["config"])
    folders = speaker_folders(corpus)
    if [f.name for f in folders] != run["speakers"]:
        fail(f"{corpus}: not the speakers {source} was trained on")
    rng = np.random.default_rng(config.seed)
    mel_config = MelConfig()
    heldout = [
        [log_mel(load_audio(p, mel_config.sample_rate), mel_config) for p in split_clips(f, config, rng)[0]]
        for f in folders
    ]
    bundle = load_encoder(source)
    scores, same = calibration_trials(bundle, SpeakerClips(run["speakers"], [], heldout, 0))
    calibrated = verification_scores(scores, same)
    bundle.threshold = calibrated.eer_threshold
    bundle.info["calibration"] = {
        "trials": calibrated.trials,
        "eer": round(calibrated.eer, 4),
        "min_dcf": round(calibrated.min_dcf, 4),
    }
    shutil.copytree(source, out, dirs_exist_ok=True)
    for name in ("config.json", "encoder.safetensors"):
        (out / name).unlink()
    written = save_encoder(bundle, out.with_name(f".{out.name}.encoder"))
    for name in ("encoder.safetensors", "config.json"):
        os.replace(written / name, out / name)
    written.rmdir()
    say(f"{out}: clean held-out EER {100 * calibrated.eer:.2f}%, threshold {calibrated.eer_threshold:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, help="here: pack this corpus (runs/speaker_corpus/encoder_training)")
    parser.add_argument("--recalibrate", type=Path, help="here: recalibrate this returned encoder folder")
    parser.add_argument("--corpus", type=Path, default=Path("runs/speaker_corpus/encoder_training"))
    parser.add_argument("--data", type=Path, default=Path(".device_data"))
    parser.add_argument("--init", type=Path, default=Path("checkpoints/speaker-encoder-v2"))
    parser.add_argument("--out", type=Path, help="where the 7 files go ($OUT on the device)")
    parser.add_argument("--run-dir", default="/tmp/speaker_run", help="the run's own folder (checkpoint/ and all)")
    parser.add_argument("--minutes", type=float, default=8.0, help="wall clock for the whole script")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=14, help="crop-making processes (and decoders)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the training process (it only feeds the GPU)"
    )
    parser.add_argument("--batch-speakers", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100, help="steps of learning-rate warm-up")
    parser.add_argument("--max-steps", type=int, default=100_000, help="at most; the minutes decide")
    parser.add_argument("--checkpoint-minutes", type=float, default=2.0)
    parser.add_argument(
        "--reserve-seconds", type=float, default=RESERVE_SECONDS, help="of --minutes, kept for calibration and saves"
    )
    parser.add_argument("--report-seconds", type=float, default=30.0)
    parser.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip v2's EER first")
    parser.add_argument("--level", type=float, default=COMPRESSION_LEVEL, help="--pack: Opus compression level")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="--pack: encoding processes")
    args = parser.parse_args()
    args.init = checkpoint_folder(args.init)
    if args.pack:
        pack(args.pack, args.data, args.init, args.level, args.jobs)
    elif args.recalibrate:
        if args.out is None:
            parser.error("--recalibrate needs --out")
        recalibrate(args.recalibrate, args.corpus, args.out)
    else:
        if args.out is None:
            parser.error("--out is needed (the device's $OUT)")
        train(args)


if __name__ == "__main__":
    main()
