"""Transcripts a clip does not say: the threshold of ``chorus data check --listen``, set and measured.

For each voice, clips spread over its folder are scored twice by
:func:`chorus.evaluation.transcripts_heard.transcript_score` (Whisper tiny.en fed the transcript): with their
own transcript, and with the transcript of another of the voice's clips whose word count is closest (a
wrong line of about the right length, which the length check cannot catch).

* **Calibration**: the training corpus's voices (``--corpus``). The threshold is the lowest score of a right
  transcript there, rounded down to the next half nat; the shipped ``NOT_HEARD_BELOW`` is compared with it.
  (A wrong transcript of another clip scores about 0: the clip adds nothing to it.)
* **Figures**: the held-out voices (``--heldout``; nothing here learns from them, and nothing is chosen on
  them), clean and through a phone line (300-3,400 Hz, 8 kHz, mu-law): right transcripts wrongly flagged and
  wrong ones caught, at the calibration's threshold.

``--report`` writes the report again from the results file (with the threshold Chorus ships now).

    python bench/transcripts_heard.py --corpus corpus_out/train --heldout corpus_out/heldout \\
        --out bench/results/transcripts_heard
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import numpy as np

from chorus.audio.augment import phone_line
from chorus.audio.io import load_audio
from chorus.data.formats import Utterance, discover
from chorus.evaluation.asr import WHISPER_SAMPLE_RATE, WhisperJudge
from chorus.evaluation.transcripts_heard import NOT_HEARD_BELOW, transcript_score
from run_record import LoadSampler, describe, provenance


def wrong_for(utterance: Utterance, others: list[Utterance]) -> str:
    """The transcript of another clip (other words) whose word count is closest to ``utterance``'s."""
    words = len(utterance.text.split())
    candidates = [o for o in others if o.text.strip().lower() != utterance.text.strip().lower()]
    return min(candidates, key=lambda o: (abs(len(o.text.split()) - words), o.key)).text


def score_voice(judge: WhisperJudge, folder: Path, clips: int, channel: str, rng: random.Random) -> list[dict]:
    """``clips`` clips of the voice, each scored with its own transcript and with a wrong one."""
    utterances = discover(folder)[0]
    rows = []
    for utterance in rng.sample(utterances, min(clips, len(utterances))):
        audio = load_audio(utterance.audio_path, WHISPER_SAMPLE_RATE)
        if channel == "phone line":
            audio = phone_line(audio, WHISPER_SAMPLE_RATE)
        wrong = wrong_for(utterance, utterances)
        rows.append(
            {
                "voice": folder.name,
                "channel": channel,
                "clip": utterance.key,
                "right": transcript_score(judge, audio, WHISPER_SAMPLE_RATE, utterance.text),
                "wrong": transcript_score(judge, audio, WHISPER_SAMPLE_RATE, wrong),
                "wrong_text": wrong,
            }
        )
    return rows


def threshold_from(rows: list[dict]) -> float:
    """The lowest right-transcript score, rounded down to the next half nat."""
    return math.floor(2 * min(r["right"] for r in rows)) / 2


def tally(rows: list[dict], threshold: float) -> dict:
    """Right transcripts flagged and wrong ones caught at ``threshold``, with the scores' ranges."""
    right, wrong = np.array([r["right"] for r in rows]), np.array([r["wrong"] for r in rows])
    return {
        "n": len(rows),
        "right_flagged": int((right < threshold).sum()),
        "wrong_caught": int((wrong < threshold).sum()),
        "right_range": [round(float(right.min()), 2), round(float(np.median(right)), 2), round(float(right.max()), 2)],
        "wrong_range": [round(float(wrong.min()), 2), round(float(np.median(wrong)), 2), round(float(wrong.max()), 2)],
    }


def measure(args: argparse.Namespace) -> dict:
    rng = random.Random(0)
    judge = WhisperJudge(beam_size=1, cpu_threads=args.threads)
    calibration = []
    for folder in sorted(p for p in args.corpus.iterdir() if (p / "metadata.csv").is_file()):
        calibration += score_voice(judge, folder, args.calibration_clips, "clean", rng)
        print(folder.name, calibration[-1]["right"], calibration[-1]["wrong"], flush=True)
    figures = []
    for folder in sorted(p for p in args.heldout.iterdir() if (p / "metadata.csv").is_file()):
        for channel in ("clean", "phone line"):
            figures += score_voice(judge, folder, args.clips, channel, random.Random(folder.name))
    return {"calibration": calibration, "figures": figures, "threshold": threshold_from(calibration)}


def report(result: dict) -> str:
    shipped, found = NOT_HEARD_BELOW, result["threshold"]
    calibration = tally(result["calibration"], found)
    lines = [
        "# Transcripts a clip does not say (`chorus data check --listen`)",
        "",
        describe(result["provenance"]) + ".",
        "",
        "Each clip is scored with its own transcript (right) and with the transcript of another of the voice's clips "
        "of the closest word count (wrong): how many nats each word's probability gains, on the mean, when Whisper "
        "tiny.en is fed the transcript against the clip rather than against silence.",
        "",
        f"Calibration, the training corpus's voices ({calibration['n']} clips): right transcripts score "
        f"{calibration['right_range'][0]} to {calibration['right_range'][2]} (median {calibration['right_range'][1]}), "
        f"wrong ones {calibration['wrong_range'][0]} to {calibration['wrong_range'][2]} "
        f"(median {calibration['wrong_range'][1]}). The rule (the lowest right score, rounded down to the next half "
        f"nat) gives {found}; Chorus ships {shipped} "
        + ("(the same)." if found == shipped else "(not the same).")
        + f" At {found} the calibration's wrong transcripts are caught {calibration['wrong_caught']} of "
        f"{calibration['n']}.",
        "",
        f"Figures, held-out voices (nothing chosen on them), at {found}:",
        "",
        "| voice | channel | clips | right transcripts flagged | wrong ones caught | right: low / median / high | "
        "wrong: low / median / high |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in result["figures"]:
        groups.setdefault((row["voice"], row["channel"]), []).append(row)
    for (voice, channel), rows in sorted(groups.items()):
        t = tally(rows, found)
        lines.append(
            f"| {voice} | {channel} | {t['n']} | {t['right_flagged']} | {t['wrong_caught']} | "
            f"{' / '.join(map(str, t['right_range']))} | {' / '.join(map(str, t['wrong_range']))} |"
        )
    total = tally(result["figures"], found)
    lines += [
        f"| all | both | {total['n']} | {total['right_flagged']} | {total['wrong_caught']} | | |",
        "",
        "![scores](scores.png)",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharex=True)
    scores = [r[k] for name in ("calibration", "figures") for r in result[name] for k in ("right", "wrong")]
    bins = np.linspace(min(scores), max(scores), 44)
    for axis, name in zip(axes, ("calibration", "figures"), strict=True):
        axis.hist([r["right"] for r in result[name]], bins, alpha=0.6, label="right transcript")
        axis.hist([r["wrong"] for r in result[name]], bins, alpha=0.6, label="wrong transcript")
        axis.axvline(result["threshold"], color="black", linestyle="--", label=f"threshold {result['threshold']}")
        axis.set_title("calibration: training corpus" if name == "calibration" else "figures: held-out, clean + phone")
        axis.set_xlabel("mean ln P(word | clip) - ln P(word | silence)")
    axes[0].set_ylabel("clips")
    axes[0].legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("corpus_out/train"))
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--calibration-clips", type=int, default=8, help="clips per training voice")
    parser.add_argument("--clips", type=int, default=20, help="clips per held-out voice and channel")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/transcripts_heard"))
    parser.add_argument("--report", action="store_true", help="only write the report again from the results")
    args = parser.parse_args()
    if args.report:
        (args.out / "transcripts_heard.md").write_text(
            report(json.loads((args.out / "transcripts_heard.json").read_text()))
        )
        return
    record = provenance(args.threads, "evaluation.transcripts_heard.transcript_score (Whisper tiny.en, beam 1)")
    with LoadSampler() as load:
        result = {"provenance": record, **measure(args)}
    result["provenance"]["load"] = load.summary()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transcripts_heard.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "scores.png")
    (args.out / "transcripts_heard.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
