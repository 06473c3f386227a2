"""Where naturalness is lost: predicted MOS (with WER and similarity beside it) at each stage from the
recordings to the voices Chorus speaks, for the base's default-table speakers and the held-out datasets.

For each voice, on the same sentences, side by side in one run:

* ``recordings``: its own engine reading them (base speakers: the 20 benchmark sentences, read now by
  the engine the corpus came from; held-out datasets: their last 20 corpus clips, never trained on);
* ``copy <vocoder>``: the recordings -> log-mel -> each vocoder (what the vocoder alone costs);
* ``timed <vocoder>``: the model (a base speaker, or the voice adapted from 3 minutes of the held-out
  dataset) with the recordings' own durations (alignment search against the recording), each vocoder;
* ``free <vocoder>``: the model with its own durations, as ``chorus synthesize`` speaks, each vocoder;
* with ``--postfilter GV:CONTRAST``, ``free <vocoder> pf<GV>/<CONTRAST>`` for each vocoder: the free mel
  through :class:`~chorus.audio.postfilter.MelPostFilter` first (the remedy for the acoustic model's share);
* ``Piper joe`` on the 20 benchmark sentences.

Judges: distillmos (predicted MOS), Whisper tiny.en (WER), resemblyzer (similarity to other real clips
of the voice). MOS is shown as mean ± sample standard deviation over the clips (n per row).

    python bench/naturalness.py --vocoders griffin-lim,neural,gan=runs/vocoder-gan --out bench/results/naturalness

Adapted voices are made once (``chorus adapt``'s defaults, residual adapters) and kept under ``--work``.
Writes ``naturalness.md``, ``naturalness.json`` and ``naturalness.png`` under ``--out``. Each run leaves its
record under ``--out``'s ``runs/`` (commit, ``src/`` clean or not, the sampled load, the command, and
which voices it adapted or whether it judged the cells; ``run_record.RunLog``; give an ``--adapt-only`` run
the same ``--out``), listed at the end of the report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.audio.mel import log_mel
from chorus.audio.postfilter import MelPostFilter
from chorus.audio.vocoders import load_vocoder
from chorus.corpus.build import record_sentences
from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.data.subsets import first_minutes, write_subset
from chorus.evaluation.report import Judges
from chorus.evaluation.similarity import SpeakerJudge
from chorus.evaluation.voices import VoiceClip, judge_clips
from chorus.models.bundle import load_bundle
from chorus.peers.piper import load_joe
from chorus.recipe import AdaptConfig
from chorus.synthesis import DEFAULT_VOCODER, Synthesizer
from chorus.training.adapt import adapt
from chorus.yardsticks import start_speaker_of
from run_record import RunLog, run_records, runs_section  # bench/, beside this script

BASE_VOICES = "flite-rms,flite-awb,festival-kal,flite-kal16"
HELDOUT_VOICES = "piper-joe,flite-slt,festival-ked"
CELLS = "every cell synthesized and judged"  # how a run record names the judging; "adapt <voice>" each voice
# Which held-out datasets share a source with the neural vocoders' training data (corpus splits vocoder/, natural/).
SHARES_SOURCE = {
    "piper-joe": "the neural vocoders trained on Piper joe through sox (resampled; the shipped one also pitch, formant and"
    " tempo chains), other sentences"
}


def parse_vocoders(spec: str) -> dict[str, str]:
    """``griffin-lim,neural,gan=runs/vocoder-gan`` -> {label: name or folder}."""
    vocoders = {}
    for item in spec.split(","):
        label, _, source = item.partition("=")
        vocoders[label] = source or (str(DEFAULT_VOCODER) if label == "neural" else label)
    return vocoders


def heldout_split(folder: Path, sentences: int, references: int):
    """(evaluation clips, reference paths, training pool), as bench/adaptation.py splits a dataset."""
    utterances, _ = discover(folder)
    return (
        utterances[-sentences:],
        [u.audio_path for u in utterances[-sentences - references : -sentences]],
        utterances[: -sentences - references],
    )


def adapted_voice(voice: str, pool, minutes: float, work: Path, threads: int, log: RunLog) -> Path:
    """The voice adapted from the first ``minutes`` of ``pool`` (made once, kept in ``work``; the run that
    makes it names it in ``log``)."""
    out = work / "voices" / f"{voice}-{minutes:g}min"
    if (out / "adapter_config.json").is_file():
        return out
    data = work / "data" / f"{voice}-{minutes:g}min"
    write_subset(first_minutes(pool, minutes), data)
    bundle = load_bundle(DEFAULT_BASE_PATH)
    adapt(data, bundle, out, AdaptConfig(threads=threads), progress=False)
    log.measured(f"adapt {voice}")
    return out


DEFAULT_BASE_PATH = Path(__file__).resolve().parents[1] / "src" / "chorus" / "assets" / "base"


def postfilter_label(post: MelPostFilter) -> str:
    return f"pf{post.global_variance:g}/{post.contrast:g}"


def mos_spread(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def plot(summary: dict, voices: list[str], systems: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(max(7, 0.9 * len(systems)), 4.8))
    for voice in voices:
        xs = [i for i, s in enumerate(systems) if f"{voice}|{s}" in summary]
        ys = [summary[f"{voice}|{systems[i]}"]["mos"] for i in xs]
        axis.plot(xs, ys, marker="o", label=voice)
    if "piper-joe|Piper" in summary:
        axis.axhline(summary["piper-joe|Piper"]["mos"], color="k", linestyle="--", label="Piper joe")
    axis.set_xticks(range(len(systems)), systems, rotation=40, ha="right")
    axis.set_ylabel("predicted MOS (distillmos)")
    axis.set_title("Where naturalness is lost")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocoders", default="griffin-lim,neural", help="labels, or label=folder, comma-separated")
    parser.add_argument("--voices", default=BASE_VOICES, help="base speakers")
    parser.add_argument("--heldout-voices", default=HELDOUT_VOICES)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"), help="real clips of base speakers")
    parser.add_argument("--minutes", type=float, default=3.0, help="adaptation data per held-out voice")
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--references", type=int, default=10)
    parser.add_argument("--postfilter", default="", help="post-filters to try, GV:CONTRAST, e.g. 1.2:1.2,1.3:1.3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/naturalness"))
    parser.add_argument("--adapt-only", action="store_true", help="make the adapted voices and stop")
    parser.add_argument("--out", type=Path, default=Path("bench/results/naturalness"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base_voices = [v for v in args.voices.split(",") if v]
    heldout_voices = [v for v in args.heldout_voices.split(",") if v]
    args.out.mkdir(parents=True, exist_ok=True)
    with RunLog(args.out, args.threads, " ".join(sys.argv)) as log:
        heldout = {
            voice: heldout_split(args.heldout / voice, args.sentences, args.references) for voice in heldout_voices
        }
        voice_dirs = {
            voice: adapted_voice(voice, pool, args.minutes, args.work, args.threads, log)
            for voice, (_, _, pool) in heldout.items()
        }
        if args.adapt_only:
            return
        sentences = benchmark_sentences()[: args.sentences]
        vocoders = parse_vocoders(args.vocoders)
        postfilters = [
            MelPostFilter(*(float(x) for x in spec.split(":"))) for spec in args.postfilter.split(",") if spec
        ]

        # What each voice says and its recordings of it; the references its similarity is judged against.
        texts = {voice: sentences for voice in base_voices}
        recordings = {voice: record_sentences(voice, sentences) for voice in base_voices}
        references = {}
        for voice in base_voices:
            utterances, _ = discover(args.corpus / voice)
            references[voice] = [u.audio_path for u in utterances[: args.references]]
        for voice, (evaluation, refs, _) in heldout.items():
            texts[voice] = [u.text for u in evaluation]
            recordings[voice] = [load_audio(u.audio_path) for u in evaluation]
            references[voice] = refs

        bundle = load_bundle(DEFAULT_BASE_PATH)
        tts = Synthesizer(bundle, load_vocoder("griffin-lim", mel_config=bundle.mel_config))
        names = {voice: tts.load_voice(folder, voice) for voice, folder in voice_dirs.items()}
        models = {label: load_vocoder(source, mel_config=bundle.mel_config) for label, source in vocoders.items()}
        for model in models.values():  # first-call allocations are not part of the RTF
            model.vocode(torch.full((50, bundle.mel_config.n_mels), -5.0))
        tts.mel(["Warm up."], base_voices[0] if base_voices else None)

        clips: list[VoiceClip] = []

        def add(voice: str, system: str, audios: list[np.ndarray], seconds: list[float] | None = None) -> None:
            for index, (text, audio) in enumerate(zip(texts[voice], audios)):
                spent = seconds[index] if seconds else float("nan")
                clips.append(VoiceClip(f"{voice}|{system}", index, text, audio, SAMPLE_RATE, spent))

        def vocode(label: str, mel: torch.Tensor | Callable[[], torch.Tensor]) -> tuple[np.ndarray, float]:
            started = time.perf_counter()
            audio = models[label].vocode(mel() if callable(mel) else mel)
            peak = float(np.abs(audio).max()) if audio.size else 0.0
            return (audio * (0.99 / peak) if peak > 0.99 else audio), time.perf_counter() - started

        def speak_freely(voice: str, prefix: str, speaker: str | None, adapted: str | None) -> None:
            """Rows ``<prefix> <vocoder>`` (and with each post-filter): the model with its own durations. Their RTF
            is the acoustic model's forward plus the post-filter and the vocoder, per clip."""
            free, model_seconds = [], []
            for text in texts[voice]:
                started = time.perf_counter()
                free.append(tts.mel([text], speaker, voice=adapted)[0])
                model_seconds.append(time.perf_counter() - started)
            for label in vocoders:
                for post in [None, *postfilters]:
                    spoken = [vocode(label, mel if post is None else partial(post, mel)) for mel in free]
                    system = f"{prefix} {label}" + ("" if post is None else f" {postfilter_label(post)}")
                    add(voice, system, [a for a, _ in spoken], [s + m for (_, s), m in zip(spoken, model_seconds)])

        for voice in [*base_voices, *heldout_voices]:
            adapted = names.get(voice)
            speaker = None if adapted else voice
            add(voice, "recordings", recordings[voice])
            recorded = [torch.from_numpy(log_mel(audio, bundle.mel_config)) for audio in recordings[voice]]
            timed = [tts.teacher_forced(text, mel, speaker, adapted) for text, mel in zip(texts[voice], recorded)]
            for label in vocoders:
                add(voice, f"copy {label}", [vocode(label, mel)[0] for mel in recorded])
                add(voice, f"timed {label}", [vocode(label, mel)[0] for mel in timed])
            speak_freely(voice, "free", speaker, adapted)
            if adapted:  # the base speaker the voice started from, on the same sentences
                speak_freely(voice, "start", start_speaker_of(voice_dirs[voice]), None)
            print(f"{voice}: synthesized", flush=True)

        joe = load_joe(threads=args.threads)
        joe.synthesize("Warm up.")
        for index, text in enumerate(sentences):
            started = time.perf_counter()
            audio, rate = joe.synthesize(text)
            clips.append(VoiceClip("piper-joe|Piper", index, text, audio, rate, time.perf_counter() - started))

        judges = Judges(speaker=SpeakerJudge(), reference=False)
        refs = {clip.voice: references.get(clip.voice.split("|")[0], ()) for clip in clips}
        refs["piper-joe|Piper"] = references.get("piper-joe", ())
        report = judge_clips(clips, judges, refs)
        rows = {row.id: row for row in report.rows}
        summary: dict[str, dict] = {}
        for group in dict.fromkeys(clip.voice for clip in clips):
            mine = [rows[clip.id] for clip in clips if clip.voice == group]
            mos = [r.mos for r in mine if r.mos is not None]
            similarity = [r.speaker_similarity for r in mine if r.speaker_similarity is not None]
            seconds = [c.seconds for c in clips if c.voice == group]
            audio_seconds = sum(r.audio_seconds for r in mine)
            summary[group] = {
                "mos": mos_spread(mos)[0],
                "mos_sd": mos_spread(mos)[1],
                "n": len(mos),
                "wer": sum(r.word_edits for r in mine) / sum(r.reference_words for r in mine),
                "similarity": float(np.mean(similarity)) if similarity else None,
                "rtf": float(np.sum(seconds) / audio_seconds) if not np.isnan(seconds).any() else None,
            }

        systems = ["recordings"]
        for label in vocoders:
            systems += [f"copy {label}", f"timed {label}", f"free {label}"]
        systems += [f"free {label} {postfilter_label(post)}" for label in vocoders for post in postfilters]
        systems += [s.replace("free", "start", 1) for s in systems if s.startswith("free ")] if heldout_voices else []
        log.measured(CELLS)
    write_results(args, summary, base_voices, heldout_voices, systems, vocoders, report)


def write_results(args, summary, base_voices, heldout_voices, systems, vocoders, report) -> None:
    first = next(iter(vocoders))
    lines = [
        "# Where naturalness is lost",
        "",
        f"Base speakers: {len(benchmark_sentences()[: args.sentences])} benchmark sentences (in no training text), "
        f"their recordings read now by each speaker's own engine. Held-out datasets: their last {args.sentences} "
        f"corpus clips; the model is the voice adapted from their first {args.minutes:g} minutes (residual "
        f"adapters, `chorus adapt` defaults). {args.threads} CPU thread(s). MOS: distillmos, mean ± sample sd "
        "over the clips (n per cell); WER: Whisper tiny.en over the row; similarity: resemblyzer against "
        f"{args.references} other real clips of the voice. Vocoders: "
        + ", ".join(f"`{label}` ({source})" for label, source in vocoders.items())
        + ".",
        "",
    ]
    if any(v in SHARES_SOURCE for v in heldout_voices):
        lines += [
            "Shared sources: "
            + "; ".join(f"**{v}**: {why}" for v, why in SHARES_SOURCE.items() if v in heldout_voices)
            + ". Its evaluation and adaptation clips were never in any training data.",
            "",
        ]
    lines += ["| voice | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for voice in [*base_voices, *heldout_voices]:
        cells = []
        for system in systems:
            value = summary.get(f"{voice}|{system}")
            cells.append("" if value is None else f"{value['mos']:.2f} ± {value['mos_sd']:.2f}")
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    lines += ["", "WER % / similarity of the same cells:", ""]
    lines += ["| voice | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for voice in [*base_voices, *heldout_voices]:
        cells = []
        for system in systems:
            value = summary.get(f"{voice}|{system}")
            sim = "" if value is None or value["similarity"] is None else f" / {value['similarity']:.3f}"
            cells.append("" if value is None else f"{100 * value['wer']:.1f}{sim}")
        lines.append(f"| {voice} | " + " | ".join(cells) + " |")
    piper = summary["piper-joe|Piper"]
    lines += [
        "",
        f"Piper joe (VITS, onnxruntime) on the benchmark sentences: MOS {piper['mos']:.2f} ± {piper['mos_sd']:.2f} "
        f"(n {piper['n']}), WER {100 * piper['wer']:.1f}%, RTF {piper['rtf']:.4f}.",
        "",
        "Means over voices (MOS; the step from one stage to the next is what that stage loses):",
        "",
        "| voices | " + " | ".join(systems) + " |",
        "|---|" + "---|" * len(systems),
    ]
    losses = []
    for name, group in (("base speakers", base_voices), ("held-out (adapted)", heldout_voices)):
        if not group:
            continue
        present = [s for s in systems if all(f"{v}|{s}" in summary for v in group)]
        means = {s: float(np.mean([summary[f"{v}|{s}"]["mos"] for v in group])) for s in present}
        wers = {s: float(np.mean([summary[f"{v}|{s}"]["wer"] for v in group])) for s in present}
        cells = [f"{means[s]:.2f} ({100 * wers[s]:.1f}%)" if s in means else "" for s in systems]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for label in vocoders:
            losses += [
                (means["recordings"] - means[f"copy {label}"], f"{name}: the vocoder `{label}` (recordings -> copy)"),
                (
                    means[f"copy {label}"] - means[f"timed {label}"],
                    f"{name}: the acoustic model's spectra through `{label}` (copy -> timed)",
                ),
                (
                    means[f"timed {label}"] - means[f"free {label}"],
                    f"{name}: its own durations through `{label}` (timed -> free)",
                ),
            ]
    losses.sort(reverse=True)
    lines += ["", "(in brackets: mean WER). Losses, largest first:", ""]
    lines += [f"- {value:+.2f} MOS: {what}" for value, what in losses[:6]]

    # The choice of the default: the best mean MOS over the base speakers among the ways of speaking freely
    # whose mean WER is within 1 point of today's (the first vocoder, no post-filter).
    free = [s for s in systems if s.startswith("free ")]
    today = f"free {first}"

    def base_mean(system: str, key: str) -> float:
        return float(np.mean([summary[f"{v}|{system}"][key] for v in base_voices]))

    allowed = [s for s in free if base_mean(s, "wer") <= base_mean(today, "wer") + 0.01]
    chosen = max(allowed, key=lambda s: base_mean(s, "mos"))
    lines += [
        "",
        f"Speaking freely, base speakers (mean MOS, mean WER, RTF of the whole synthesis on {base_voices[0]}; "
        f"Piper joe RTF {piper['rtf']:.4f} in the same run):",
        "",
        "| system | MOS | WER % | RTF | x Piper's speed |",
        "|---|---|---|---|---|",
    ]
    for system in free:
        rtf = summary[f"{base_voices[0]}|{system}"]["rtf"]
        speed = "" if rtf is None else f"{piper['rtf'] / rtf:.1f}x"
        lines.append(
            f"| {system} | {base_mean(system, 'mos'):.2f} | {100 * base_mean(system, 'wer'):.1f} | "
            f"{'' if rtf is None else f'{rtf:.4f}'} | {speed} |"
        )
    lines += [
        "",
        f"Best MOS with WER within 1 point of `{today}`'s: **`{chosen}`** ({base_mean(chosen, 'mos'):.2f}, "
        f"WER {100 * base_mean(chosen, 'wer'):.1f}% against {100 * base_mean(today, 'wer'):.1f}%).",
        "",
    ]
    if heldout_voices:
        lines += [
            f"Adapted voices ({args.minutes:g} min) against their start speakers on the base, same sentences "
            "(MOS, WER %):",
            "",
            "| voice | system | adapted | start speaker |",
            "|---|---|---|---|",
        ]
        for voice in heldout_voices:
            for system in dict.fromkeys([today, chosen]):
                mine, start = summary[f"{voice}|{system}"], summary[f"{voice}|{system.replace('free', 'start', 1)}"]
                lines.append(
                    f"| {voice} | {system} | {mine['mos']:.2f} ({100 * mine['wer']:.1f}) | "
                    f"{start['mos']:.2f} ({100 * start['wer']:.1f}) |"
                )
        lines.append("")
    args.out.mkdir(parents=True, exist_ok=True)
    names = [*(f"adapt {voice}" for voice in heldout_voices), CELLS]
    runs = run_records(args.out, rows=names)
    (args.out / "naturalness.md").write_text("\n".join(lines) + "\n" + runs_section(runs, names))
    (args.out / "naturalness.json").write_text(
        json.dumps({"summary": summary, "rows": report.to_dict()}, indent=1, default=str)
    )
    plot(summary, [*base_voices, *heldout_voices], systems, args.out / "naturalness.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
