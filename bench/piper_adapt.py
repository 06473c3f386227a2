"""A Piper voice adapted to a held-out speaker (issue 38, items 3-4): the recipes and their settings.

The base is the installed Piper joe generator in PyTorch (``PiperGenerator``); the recipes are
``chorus.training.piper_adapt``'s: ``posterior`` (a distilled posterior encoder reads each recording's
latent, VITS's way; the default) and ``aligned`` (the first cut: durations by aligning each recording to
the base's own rendering, then mel + multi-resolution STFT loss on decoded windows). Clips are chosen as
``bench/adaptation.py`` chooses them: of a held-out voice's utterances, the last ``--sentences`` are judged,
the ``--references`` before them are the similarity references, and training takes the first ``--minutes``
of the rest; with ``--judge dev`` the ``--sentences`` before the references are judged instead (where
settings are chosen) and training takes its minutes before those.

Judges (as the adaptation benchmark): Whisper tiny.en WER, resemblyzer similarity to the reference clips,
distillmos MOS; each adapted voice beside the unadapted joe generator and the target's own recordings of
the same sentences. Speech is sampled at the voice's default scales with a fixed seed.

    python bench/piper_adapt.py --voice flite-slt --placement all --steps 300 --out runs/piper_adapt
    python bench/piper_adapt.py --voice flite-slt --recipe aligned --placement decoder --steps 400 --out runs/piper_adapt
    python bench/piper_adapt.py --voice flite-slt --placement reference --out runs/piper_adapt   # joe, recordings
    python bench/piper_adapt.py --voice flite-slt --judge dev --voice-dir runs/piper_adapt/V --noise-scales 0.667,0.333,0

Each run writes ``<out>/<voice>-<recipe>-<placement>.json`` (figures, settings, loss log), the voice folder
and, for the posterior recipe, the posterior encoder as adaptation left it (``.posterior``, for diagnosis).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
import warnings
from pathlib import Path

import librosa
import numpy as np
import soundfile as sf
import torch

with warnings.catch_warnings():  # pyworld imports pkg_resources: its deprecation notice is noise here
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    import pyworld

from chorus.adapters.voice import read_voice
from chorus.audio.io import load_audio
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge
from chorus.models.piper_vits import PiperGenerator
from chorus.peers.piper import joe_paths
from chorus.synthesis.bases.piper import load_piper_voice, piper_sha256
from chorus.training.piper_adapt import PiperAdaptConfig, adapt_piper
from run_record import LoadSampler, kept_on_failure, provenance  # bench/, beside this script

REFERENCE = "reference"  # --placement value: judge the unadapted generator and the recordings instead


def speak(
    generator: PiperGenerator, texts: list[str], seed: int, pace: float = 1.0, noise_scale: float | None = None
) -> list:
    """Each text at the voice's default scales (its length scale times the adapted voice's ``pace``; the
    adapted voice's ``noise_scale`` when it has one), noise seeded per sentence -> numpy audio ``[samples]``."""
    spoken = []
    length_scale = generator.voice.length_scale * pace
    with torch.inference_mode():
        for index, text in enumerate(texts):
            ids = torch.tensor([generator.voice.text_ids(text)])
            seed_of = torch.Generator().manual_seed(seed + index)
            out = generator(
                ids, torch.tensor([ids.shape[1]]), noise_scale=noise_scale, length_scale=length_scale, generator=seed_of
            )
            spoken.append(out.audio[0].numpy())
    return spoken


def judge(items: list[EvalItem]) -> dict:
    report = evaluate_pairs(items, judges=Judges(speaker=SpeakerJudge(), reference=False), progress=False)
    means = report.means()
    return {
        "wer": report.corpus_wer,
        "similarity": means.get("speaker_similarity"),
        "mos": means.get("mos"),
        **pitch(items),
    }


def pitch(items: list[EvalItem]) -> dict:
    """Where the voice's pitch sits: pYIN's F0 (60-400 Hz) over every voiced frame of the judged clips, its median
    and 10th / 90th percentiles in Hz (an adapted voice can sound like its speaker in timbre and keep the base's
    pitch: ``bench/README.md``, "Why the Piper base stops short"); None where no frame is voiced. pYIN, not
    WORLD's harvest: on joe harvest jumps octaves (its median 116-139 Hz on the same clips)."""
    summary = f0_summary(np.concatenate([voiced_f0(*clip_audio(item)) for item in items]))
    return {f"f0_{name}_hz": value for name, value in summary.items()}


def f0_summary(f0: np.ndarray) -> dict[str, float | None]:
    """Median and 10th / 90th percentiles of voiced F0 values ``[frames]`` in Hz; None where none is voiced (said
    as such, not an IndexError that loses the judges' figures)."""
    if not f0.size:
        return {"median": None, "p10": None, "p90": None}
    return {"median": float(np.median(f0)), "p10": float(np.percentile(f0, 10)), "p90": float(np.percentile(f0, 90))}


def clip_audio(item: EvalItem) -> tuple[np.ndarray, int]:
    """An item's audio ``[samples]`` and its rate (a file read at the item's rate)."""
    audio = load_audio(item.audio, item.sample_rate) if isinstance(item.audio, str | Path) else item.audio
    return np.asarray(audio, np.float32), item.sample_rate


def voiced_f0(audio: np.ndarray, rate: int) -> np.ndarray:
    """pYIN's F0 ``[voiced frames]`` in Hz of mono ``audio`` ``[samples]``."""
    f0 = librosa.pyin(np.asarray(audio, np.float32), fmin=60, fmax=400, sr=rate, frame_length=2048)[0]
    return f0[~np.isnan(f0)]


def scale_f0(audio: np.ndarray, rate: int, ratio: float) -> np.ndarray:
    """``audio`` ``[samples]`` with its F0 times ``ratio``, its spectral envelope and aperiodicity kept (WORLD:
    DIO from 60 Hz, as pYIN reads, + StoneMask, CheapTrick, D4C, resynthesis). Its peak may pass 1 (WORLD's
    phases): write it as float, not 16-bit, or it is clipped."""
    x = np.asarray(audio, np.float64)
    f0, times = pyworld.dio(x, rate, f0_floor=60.0, frame_period=5.0)
    f0 = pyworld.stonemask(x, f0, times, rate)
    envelope, aperiodicity = pyworld.cheaptrick(x, f0, times, rate), pyworld.d4c(x, f0, times, rate)
    return pyworld.synthesize(f0 * ratio, envelope, aperiodicity, rate, frame_period=5.0).astype(np.float32)


def transposition_ratio(asked: str) -> str | float:
    """``--transpose``: ``auto`` or a positive number."""
    if asked == "auto":
        return asked
    try:
        ratio = float(asked)
    except ValueError:
        ratio = math.nan
    if not (math.isfinite(ratio) and ratio > 0):
        raise argparse.ArgumentTypeError(f"--transpose: 'auto' or a positive ratio, not {asked!r}")
    return ratio


def transposed(subset, generator, ratio: str | float, folder: Path, seed: int) -> tuple[list, float]:
    """The training clips with their F0 scaled into the base voice's range (written under ``folder`` as float WAV:
    16-bit had clipped WORLD's peaks) and the ratio: given, or ``auto``, the base's median F0 over the clips', each
    read on the first 10 clips' texts (the base speaking them, seeded by ``seed``)."""
    audio = [load_audio(u.audio_path, generator.sample_rate) for u in subset]
    if ratio == "auto":
        base = speak(generator, [u.text for u in subset[:10]], seed)
        own = [voiced_f0(a, generator.sample_rate) for a in audio[:10]]
        ratio = float(np.median(np.concatenate([voiced_f0(a, generator.sample_rate) for a in base])) / np.median(
            np.concatenate(own)))  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    moved = []
    for utterance, clip in zip(subset, audio):
        path = folder / f"{utterance.id}.wav"
        sf.write(path, scale_f0(clip, generator.sample_rate, ratio), generator.sample_rate, subtype="FLOAT")
        moved.append(dataclasses.replace(utterance, audio_path=path))
    return moved, float(ratio)


def voice_placement(folder: Path) -> str | None:
    """The placement a saved Piper voice records in its card."""
    return json.loads((folder / "voice_card.json").read_text()).get("notes", {}).get("placement")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--voice", default="flite-slt")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--placement", default="decoder", help="a PLACEMENTS name, full, or 'reference'")
    parser.add_argument("--recipe", default=PiperAdaptConfig.recipe, help="posterior or aligned")
    parser.add_argument("--posterior", default=None, help="posterior encoder folder (default: the shipped one)")
    parser.add_argument("--steps", type=int, default=PiperAdaptConfig.steps)
    parser.add_argument("--max-minutes", type=float, default=math.inf, help="training time cap")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--noise-scale", type=float, default=0.0, help="prior noise of the training latents")
    parser.add_argument(
        "--discriminators", default=None, help="a vocoder training checkpoint whose discriminators join the loss"
    )
    parser.add_argument("--tag", default="", help="suffix of this run's file names (several runs of one placement)")
    parser.add_argument(
        "--transpose",
        type=transposition_ratio,
        default=None,
        help="RATIO or auto: adapt on the recordings with their F0 times RATIO (WORLD; auto: into the base voice's "
        "range, by the medians), and speak with the output's F0 divided by it again (a probe of why a voice far "
        "from joe's pitch is not reached; not what chorus adapt does)",
    )
    parser.add_argument("--sentences", type=int, default=10, help="held-out sentences judged")
    parser.add_argument(
        "--judge",
        choices=["figures", "dev"],
        default="figures",
        help="figures: the voice's last --sentences clips; dev: the --sentences before its references, where "
        "recipe settings are chosen (training takes its first minutes before either)",
    )
    parser.add_argument("--references", type=int, default=10, help="real clips for speaker similarity")
    parser.add_argument(
        "--noise-scales",
        default=None,
        help="with --voice-dir: judge that saved voice at each of these prior noises (comma-separated) instead "
        "of adapting; how the voice's speaking noise was chosen (on --judge dev)",
    )
    parser.add_argument("--voice-dir", type=Path, default=None, help="a saved voice folder, for --noise-scales")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=Path("runs/piper_adapt"))
    args = parser.parse_args()
    if args.transpose and (args.noise_scales or args.placement == REFERENCE):
        parser.error("--transpose applies to an adaptation (not to --noise-scales or the reference)")
    if args.transpose and not args.tag:  # its own files: it had written over the plain run's
        args.tag = "-transposed"
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    utterances, _ = discover(args.heldout / args.voice)
    evaluation = utterances[-args.sentences :]
    references = [u.audio_path for u in utterances[-args.sentences - args.references : -args.sentences]]
    pool = utterances[: -args.sentences - args.references]
    if args.judge == "dev":
        evaluation, pool = pool[-args.sentences :], pool[: -args.sentences]
    onnx, json_path = joe_paths()
    generator = PiperGenerator.from_piper(onnx, json_path)
    texts = [u.text for u in evaluation]
    row: dict = {
        "voice": args.voice,
        # A saved voice judged again (--voice-dir) is the placement it was made with, not --placement's.
        "placement": args.placement if args.voice_dir is None else voice_placement(args.voice_dir),
        "sentences": len(evaluation),
        "judged_split": args.judge,
        "references": len(references),
        "threads": args.threads,
        "seed": args.seed,
        "provenance": provenance(
            args.threads,
            "chorus.training.piper_adapt.adapt_piper, then the adapted PiperGenerator at the voice's scales",
        ),
        "scales": "voice defaults (noise_scale, length_scale, noise_w) = "
        f"{generator.voice.noise_scale}, {generator.voice.length_scale}, {generator.voice.noise_w}",
    }
    path = result_path(args)
    with kept_on_failure(path, row), LoadSampler() as load:
        measure(args, row, generator, evaluation, references, pool, texts, onnx)
    row["provenance"]["load"] = load.summary()  # the 1-minute load average: what else shared the CPU
    path.write_text(json.dumps(row, indent=1, default=str))
    print(json.dumps({k: v for k, v in row.items() if k != "loss_log"}, indent=1, default=str))


def result_path(args) -> Path:
    """Where this variant's row goes: named by voice, recipe and placement (or the voice's noise scales)."""
    name = args.placement if args.placement == REFERENCE else f"{args.recipe}-{args.placement}"
    if args.noise_scales:
        name = f"{args.voice_dir.name}-noise-scales"
    return args.out / f"{args.voice}-{name}{args.tag}{'-dev' if args.judge == 'dev' else ''}.json"


def measure(args, row: dict, generator, evaluation, references, pool, texts, onnx) -> None:
    """The variant asked for into ``row``: the voice at other noise scales, the references, or an adaptation
    and the adapted voice judged."""
    generator_parameters = sum(p.numel() for p in generator.parameters())
    if args.noise_scales:
        load_piper_voice(generator, args.voice_dir, "voice", piper_sha256(onnx))
        pace = read_voice(args.voice_dir).card.length_scale
        row["voice_dir"], row["noise_w"] = str(args.voice_dir), generator.voice.noise_w
        for noise_scale in (float(n) for n in args.noise_scales.split(",")):
            spoken = speak(generator, texts, args.seed, pace, noise_scale)
            row[f"noise {noise_scale:g}"] = judge(
                [
                    EvalItem(u.key, a, u.text, speaker_references=references, sample_rate=generator.sample_rate)
                    for u, a in zip(evaluation, spoken)
                ]
            )
    elif args.placement == REFERENCE:
        spoken = speak(generator, texts, args.seed)
        row["joe_generator"] = judge(
            [
                EvalItem(u.key, a, u.text, speaker_references=references, sample_rate=generator.sample_rate)
                for u, a in zip(evaluation, spoken)
            ]
        )
        row["recordings"] = judge(
            [EvalItem(u.key, u.audio_path, u.text, speaker_references=references) for u in evaluation]
        )
    else:
        subset = first_minutes(pool, args.minutes)
        config = PiperAdaptConfig(
            placement=args.placement,
            recipe=args.recipe,
            posterior=args.posterior,
            steps=args.steps,
            threads=args.threads,
            seed=args.seed,
            learning_rate=args.learning_rate,
            max_minutes=args.max_minutes,
            noise_scale=args.noise_scale,
            discriminators=args.discriminators,
        )
        ratio, notes = 1.0, None
        if args.transpose:
            where = args.out / f"{args.voice}-{args.recipe}-{args.placement}{args.tag}.transposed"
            subset, ratio = transposed(subset, generator, args.transpose, where, args.seed)
            row["transpose"] = {"asked": args.transpose, "ratio": ratio}
            # Recorded in the voice: spoken without moving its output back, it speaks at joe's pitch.
            notes = {"transpose_ratio": f"{ratio:.4f}: trained on its recordings' F0 times this; speak it divided"}
        started = time.perf_counter()
        result = adapt_piper(
            subset,
            generator,
            args.out / f"{args.voice}-{args.recipe}-{args.placement}{args.tag}",
            config,
            piper_sha256(onnx),
            progress=True,
            notes=notes,
        )
        if result.posterior is not None:  # kept for diagnosis (copy synthesis), beside the voice
            result.posterior.save(args.out / f"{args.voice}-{args.recipe}-{args.placement}{args.tag}.posterior", {})
        row["adapt_seconds_with_alignment"] = round(time.perf_counter() - started, 1)
        spoken = speak(result.model, texts, args.seed, result.card.length_scale, result.card.noise_scale)
        if ratio != 1.0:  # back to the speaker's own pitch
            spoken = [scale_f0(audio, generator.sample_rate, 1 / ratio) for audio in spoken]
        row["adapted"] = judge(
            [
                EvalItem(u.key, a, u.text, speaker_references=references, sample_rate=generator.sample_rate)
                for u, a in zip(evaluation, spoken)
            ]
        )
        row.update(
            {
                "config": {k: v for k, v in vars(config).items() if k != "max_minutes"},
                "data_minutes": result.card.data_minutes,
                "train_seconds": result.card.train_seconds,
                "steps": result.card.steps,
                "trainable_parameters": result.card.trainable_parameters,
                "length_scale": result.card.length_scale,
                "share_of_generator": result.card.trainable_parameters / generator_parameters,
                "voice_bytes": (result.voice_dir / "adapter_model.safetensors").stat().st_size
                if result.voice_dir
                else None,
                "loss_log": result.log,
            }
        )


if __name__ == "__main__":
    main()
