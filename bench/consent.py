"""The two checks of OpenAI-style custom voices, measured on voices nobody trained on.

The issue's targets: the right phrase from the right speaker accepted in >= 95% of trials; another
speaker's sample refused in >= 95%. Both checks run as the server runs them
(:class:`chorus.serving.custom_voices.CustomVoiceChecks` with the default ``ConsentSettings``): Whisper
tiny.en's word error rate against the phrase at most ``max_word_error_rate``, and the shipped speaker
encoder's cosine of consent and sample at least its calibrated threshold. Neither threshold is tuned here;
the report says, as information only, which thresholds would have met both targets on these trials.

Speakers: the three held-out voices (piper-joe, flite-slt, festival-ked: no clip of them, nor anything
derived from them, trained the base or the encoder) and, from each, the sox-derived speakers of
``CHAINS`` (pitch alone moved +/-300 cents; pitch and formants moved together by ``speed``). A derived
speaker counts as another speaker, as in ``bench/speaker.py``: its *sox siblings* share the source
voice's engine, text and timing, the hardest pairs to tell apart.

* Consent recordings: each speaker reads the phrase with the engine that made its dataset (Piper joe,
  ``flite -voice slt``, festival ``ked_diphone``; then its sox chain), through the corpus's own recording
  path (:func:`chorus.corpus.build.record_sentences`), in ``VARIANTS`` (as read; faster and 15 dB quieter;
  white noise at 30 and at 15 dB SNR, a quiet room and a noisy one). Wrong phrases (``WRONG``: another sentence, the phrase negated, half of it)
  must be refused; a reworded phrase (``REWORDED``) is reported without a verdict.
* Samples: ``--windows`` windows of consecutive dataset recordings, 12-28 s long, disjoint, per source
  voice; a derived speaker's samples are its source's windows through its sox chain.
* Trials: every right-phrase consent recording against every sample (a confusion table of consent
  speaker x sample speaker).

    python bench/consent.py --threads 1      # ~5 minutes on one core

Writes ``consent.md``, ``consent.json`` and ``consent.png`` under ``--out``; the recordings and samples
go to ``--work`` for listening.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.corpus.build import record_sentences
from chorus.corpus.speakers import SOX_COMMAND, SpeakerSpec, get_speaker
from chorus.data.formats import discover
from chorus.evaluation.asr import WhisperJudge, word_error_rate
from chorus.serving.custom_voices import CustomVoiceChecks
from chorus.serving.errors import ApiError
from chorus.serving.settings import ConsentSettings
from chorus.speaker.verification import verification_scores

SOURCES = ("piper-joe", "flite-slt", "festival-ked")
SHORT = {"piper-joe": "joe", "flite-slt": "slt", "festival-ked": "ked"}
# Derived speakers: F0 alone (WSOLA, formants kept: the hardest case), and F0 with formants (a shorter
# vocal tract; tempo restores the speaking rate), as the corpus's virtual speakers are made.
CHAINS = {
    "+300c": ("pitch", "300"),
    "-300c": ("pitch", "-300"),
    "spd115": ("speed", "1.15", "tempo", "0.87"),
}
VARIANTS = ("as read", "fast, -15 dB", "noise 30 dB SNR", "noise 15 dB SNR")
WRONG = {
    "other sentence": "The weather will be cloudy tomorrow, with a chance of rain in the afternoon.",
    "do not consent": (
        "I am the owner of this voice and I do not consent to Chorus using this voice to create a synthetic "
        "voice model."
    ),
    "not the owner": (
        "I am not the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model."
    ),
    "half the phrase": "I am the owner of this voice and I consent.",
}
REWORDED = "I'm the owner of this voice, and I agree to Chorus using my voice to make a synthetic voice model."
TARGET = 0.95


def speakers() -> dict[str, SpeakerSpec]:
    """Every speaker by its short name (``joe``, ``joe+300c`` ...): the held-out voices and their sox chains."""
    found = {}
    for source in SOURCES:
        spec = get_speaker(source)
        found[SHORT[source]] = spec
        for label, chain in CHAINS.items():
            name = f"{SHORT[source]}{label}"
            found[name] = SpeakerSpec(
                name, spec.engine, spec.engine_voice, spec.gender, 0, sox=chain, derived_from=source
            )
    return found


def source_of(name: str) -> str:
    return name[:3]


def relation(consent: str, sample: str) -> str:
    """``same``, ``sox sibling`` (one source voice, different chains) or ``other voice``."""
    if consent == sample:
        return "same"
    return "sox sibling" if source_of(consent) == source_of(sample) else "other voice"


def sox(audio: np.ndarray, *effects: str) -> np.ndarray:
    """``audio`` (mono, at SAMPLE_RATE) through a sox effect chain."""
    with tempfile.TemporaryDirectory(prefix="chorus-consent-") as temp:
        source, target = Path(temp) / "in.wav", Path(temp) / "out.wav"
        sf.write(source, audio, SAMPLE_RATE, subtype="FLOAT")
        subprocess.run([*SOX_COMMAND, str(source), str(target), *effects], check=True, capture_output=True)
        return load_audio(target)


def with_noise(audio: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``audio`` plus white noise ``snr_db`` below its mean power."""
    noise = rng.standard_normal(audio.size).astype(np.float32)
    return audio + noise * np.sqrt(np.mean(audio**2) / np.mean(noise**2) / 10 ** (snr_db / 10))


def variants(audio: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``VARIANTS`` of one consent recording: as read, faster and quieter, with noise at 30 and 15 dB SNR."""
    quieter = sox(audio, "tempo", "1.1") * 10 ** (-15 / 20)  # not sox's gain: -G refuses to cut it
    takes = (audio, quieter, with_noise(audio, 30, rng), with_noise(audio, 15, rng))
    return dict(zip(VARIANTS, takes, strict=True))


def sample_windows(source: str, heldout: Path, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` disjoint windows of consecutive recordings of ``source``, 12-28 s long: one from each of
    ``count`` equal stretches of its dataset, at a random start in it."""
    paths = [u.audio_path for u in discover(heldout / source)[0]]
    block = len(paths) // count
    windows = []
    for index, seconds in enumerate(np.linspace(12, 28, count)):
        start = index * block + int(rng.integers(0, block // 2))
        clips: list[np.ndarray] = []
        for path in paths[start : (index + 1) * block]:
            clips.append(load_audio(path))
            if sum(c.size for c in clips) >= seconds * SAMPLE_RATE:
                break
        windows.append(np.concatenate(clips))
    return windows


class Heard:
    """The transcriber the checks call, keeping the whole of what it heard (a refusal quotes 300 characters)."""

    def __init__(self, judge: WhisperJudge):
        self.judge = judge
        self.last = ""

    def __call__(self, audio: np.ndarray, rate: int) -> str:
        self.last = self.judge.transcribe(audio, rate)
        return self.last


def phrase_check(checks: CustomVoiceChecks, heard: Heard, audio: np.ndarray) -> dict:
    """What Whisper heard, its WER against the phrase and whether the server accepts it."""
    try:
        text, error_rate = checks.heard(audio, SAMPLE_RATE, "en")
        return {"heard": text, "wer": error_rate, "accepted": True}
    except ApiError:
        return {"heard": heard.last, "wer": word_error_rate(checks.phrase("en"), heard.last), "accepted": False}


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    settings = ConsentSettings()
    heard = Heard(WhisperJudge(beam_size=5, cpu_threads=args.threads))
    # No engine: the instant voice is not measured here, only the two checks.
    checks = CustomVoiceChecks(None, settings, transcriber=heard)  # type: ignore[arg-type]
    phrase = checks.phrase("en")
    audio_dir = args.work / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)

    recordings, consent_embeddings = [], {}
    voices = speakers()
    for name, spec in voices.items():
        texts = [phrase, *WRONG.values(), REWORDED]
        spoken = dict(zip(["right", *WRONG, "reworded"], record_sentences(spec, texts), strict=True))
        takes = [(f"right: {v}", a) for v, a in variants(spoken.pop("right"), rng).items()]
        takes += [(f"wrong: {k}", a) if k != "reworded" else ("reworded", a) for k, a in spoken.items()]
        for take, audio in takes:
            row = {"speaker": name, "take": take, "seconds": round(audio.size / SAMPLE_RATE, 2)}
            row |= phrase_check(checks, heard, audio)
            recordings.append(row)
            sf.write(audio_dir / f"consent_{name}_{take.replace(': ', '_').replace(' ', '-')}.wav", audio, SAMPLE_RATE)
            if take.startswith("right"):
                consent_embeddings[(name, take)] = checks.embed(audio, SAMPLE_RATE)
            print(
                f"{name:12s} {take:28s} WER {row['wer']:.2f} {'accepted' if row['accepted'] else 'refused'}: "
                f"{row['heard']}",
                flush=True,
            )

    samples = {}
    for source in SOURCES:
        for window, audio in enumerate(sample_windows(source, args.heldout, args.windows, rng)):
            for name, spec in voices.items():
                if (spec.derived_from or spec.name) != source:
                    continue
                shifted = sox(audio, *spec.sox) if spec.sox else audio
                sf.write(audio_dir / f"sample_{name}_{window}.wav", shifted, SAMPLE_RATE)
                samples[(name, window)] = (round(shifted.size / SAMPLE_RATE, 1), checks.embed(shifted, SAMPLE_RATE))
        print(f"samples of {source} embedded", flush=True)

    accepted_phrase = {(r["speaker"], r["take"]): r["accepted"] for r in recordings}
    trials = []
    for (consent, take), a in consent_embeddings.items():
        for (sample, window), (seconds, b) in samples.items():
            score, same = checks.encoder.verify(a, b)
            trials.append(
                {
                    "consent": consent,
                    "take": take,
                    "sample": sample,
                    "window": window,
                    "sample_seconds": seconds,
                    "relation": relation(consent, sample),
                    "score": round(score, 4),
                    "speaker_accepted": bool(same),
                    "accepted": bool(same) and accepted_phrase[(consent, take)],
                }
            )
    return {
        "phrase": phrase,
        "max_word_error_rate": settings.max_word_error_rate,
        "threshold": checks.encoder.threshold,
        "encoder_sha256": checks.encoder.weights_sha256,
        "speakers": {
            name: {"source": spec.derived_from or spec.name, "sox": list(spec.sox)} for name, spec in voices.items()
        },
        "recordings": recordings,
        "trials": trials,
    }


def rate(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else float("nan")


def threshold_range(same: list[float], different: list[float]) -> tuple[float, float]:
    """The thresholds that would meet both targets: at most the lowest score that still accepts 95% of the
    same-speaker trials, above the score that 95% of the different-speaker trials stay at or below."""
    highest = float(np.sort(same)[int(np.floor((1 - TARGET) * len(same)))])
    lowest = float(np.sort(different)[int(np.ceil(TARGET * len(different))) - 1])
    return lowest, highest


def summarize(result: dict) -> dict:
    recordings, trials = result["recordings"], result["trials"]
    right = [r for r in recordings if r["take"].startswith("right")]
    wrong = [r for r in recordings if r["take"].startswith("wrong")]
    same = [t for t in trials if t["relation"] == "same"]
    different = [t for t in trials if t["relation"] != "same"]
    names = list(result["speakers"])
    confusion = {
        c: {s: rate(t["speaker_accepted"] for t in trials if t["consent"] == c and t["sample"] == s) for s in names}
        for c in names
    }
    mean_score = {
        c: {s: float(np.mean([t["score"] for t in trials if t["consent"] == c and t["sample"] == s])) for s in names}
        for c in names
    }
    scores = verification_scores([t["score"] for t in trials], [t["relation"] == "same" for t in trials])
    outsiders = [t for t in trials if t["relation"] != "sox sibling"]
    without_siblings = verification_scores(
        [t["score"] for t in outsiders], [t["relation"] == "same" for t in outsiders]
    )
    by_take = {
        take: {
            "same_speaker_accept": rate(t["speaker_accepted"] for t in same if t["take"] == f"right: {take}"),
            "same_mean_score": float(np.mean([t["score"] for t in same if t["take"] == f"right: {take}"])),
            **{
                f"{kind} refuse": rate(
                    not t["speaker_accepted"]
                    for t in different
                    if t["take"] == f"right: {take}" and t["relation"] == kind
                )
                for kind in ("sox sibling", "other voice")
            },
            "phrase_wer_max": max(r["wer"] for r in right if r["take"] == f"right: {take}"),
        }
        for take in VARIANTS
    }
    return {
        "by_take": by_take,
        "right_phrase_accept": rate(r["accepted"] for r in right),
        "right_phrase_wer_max": max(r["wer"] for r in right),
        "wrong_phrase_refuse": rate(not r["accepted"] for r in wrong),
        "wrong_refuse_by_kind": {
            k: rate(not r["accepted"] for r in wrong if r["take"] == f"wrong: {k}") for k in WRONG
        },
        "wrong_wer_by_kind": {k: [r["wer"] for r in wrong if r["take"] == f"wrong: {k}"] for k in WRONG},
        "reworded_wer": [r["wer"] for r in recordings if r["take"] == "reworded"],
        "same_speaker_accept": rate(t["speaker_accepted"] for t in same),
        "same_speaker_accept_end_to_end": rate(t["accepted"] for t in same),
        "different_speaker_refuse": rate(not t["speaker_accepted"] for t in different),
        "refuse_by_relation": {
            k: rate(not t["speaker_accepted"] for t in different if t["relation"] == k)
            for k in ("sox sibling", "other voice")
        },
        "trials": {k: sum(t["relation"] == k for t in trials) for k in ("same", "sox sibling", "other voice")},
        "eer": scores.eer,
        "eer_threshold": scores.eer_threshold,
        "eer_without_siblings": without_siblings.eer,
        "meeting_both": threshold_range([t["score"] for t in same], [t["score"] for t in different]),
        "meeting_both_without_siblings": threshold_range(
            [t["score"] for t in same], [t["score"] for t in different if t["relation"] == "other voice"]
        ),
        "confusion": confusion,
        "mean_score": mean_score,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    bins = np.linspace(-0.5, 1, 61)
    for kind, color in (("same", "tab:green"), ("sox sibling", "tab:orange"), ("other voice", "tab:blue")):
        scores = [t["score"] for t in result["trials"] if t["relation"] == kind]
        left.hist(scores, bins=bins, alpha=0.6, color=color, density=True, label=f"{kind} ({len(scores)})")
    left.axvline(
        result["threshold"], color="k", linestyle="--", label=f"calibrated threshold {result['threshold']:.3f}"
    )
    left.set(
        xlabel="cosine of consent and sample (shipped speaker encoder)",
        ylabel="density",
        title="speaker check: consent x sample trials",
    )
    left.legend(fontsize=8)
    kinds = ["right", *(f"wrong: {k}" for k in WRONG), "reworded"]
    for index, kind in enumerate(kinds):
        wers = [r["wer"] for r in result["recordings"] if r["take"].startswith(kind)]
        jitter = np.random.default_rng(index).uniform(-0.15, 0.15, len(wers))
        right.scatter(np.full(len(wers), index) + jitter, wers, s=14, alpha=0.7)
    right.axhline(
        result["max_word_error_rate"], color="k", linestyle="--", label=f"max WER {result['max_word_error_rate']:g}"
    )
    right.set_xticks(range(len(kinds)), [k.replace("wrong: ", "") for k in kinds], rotation=30, ha="right", fontsize=8)
    right.set(ylabel="WER of what Whisper tiny.en heard vs the phrase", title="phrase check")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def met(value: float) -> str:
    return "**met**" if value >= TARGET else "**not met**"


def markdown(result: dict, summary: dict) -> str:
    names = list(result["speakers"])
    recordings = result["recordings"]
    lines = [
        "# Custom voices: the consent phrase and speaker checks",
        "",
        f"Phrase: {result['phrase']!r}; accepted at WER <= {result['max_word_error_rate']:g} (Whisper tiny.en, beam "
        f"5). Speaker: the shipped encoder (sha256 `{result['encoder_sha256'][:12]}`) at its calibrated threshold "
        f"{result['threshold']:.4f}. Neither tuned on these trials. `python bench/consent.py --threads 1`.",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| right phrase from the right speaker accepted >= 95% (phrase and speaker checks) | "
        f"{100 * summary['same_speaker_accept_end_to_end']:.1f}% of {summary['trials']['same']} trials | "
        f"{met(summary['same_speaker_accept_end_to_end'])} |",
        f"| another speaker's sample refused >= 95% | {100 * summary['different_speaker_refuse']:.1f}% of "
        f"{summary['trials']['sox sibling'] + summary['trials']['other voice']} trials | "
        f"{met(summary['different_speaker_refuse'])} |",
        f"| (of them: another held-out voice) | {100 * summary['refuse_by_relation']['other voice']:.1f}% of "
        f"{summary['trials']['other voice']} | {met(summary['refuse_by_relation']['other voice'])} |",
        f"| (of them: a sox sibling, same source voice) | {100 * summary['refuse_by_relation']['sox sibling']:.1f}% of "
        f"{summary['trials']['sox sibling']} | {met(summary['refuse_by_relation']['sox sibling'])} |",
        f"| the right phrase accepted (phrase check alone) | {100 * summary['right_phrase_accept']:.1f}% of "
        f"{sum(r['take'].startswith('right') for r in recordings)} recordings | {met(summary['right_phrase_accept'])} |",
        f"| a wrong phrase refused | {100 * summary['wrong_phrase_refuse']:.1f}% of "
        f"{sum(r['take'].startswith('wrong') for r in recordings)} recordings | {met(summary['wrong_phrase_refuse'])} |",
        f"| same speaker accepted (speaker check alone) | {100 * summary['same_speaker_accept']:.1f}% | "
        f"{met(summary['same_speaker_accept'])} |",
        "",
        f"EER of these trials {100 * summary['eer']:.1f}% (at threshold {summary['eer_threshold']:.3f}); without the "
        f"sox siblings {100 * summary['eer_without_siblings']:.1f}%. " + threshold_sentence(summary),
        "",
        "Per consent take (every speaker, every sample window):",
        "",
        "| consent take | same speaker accepted % | mean same-speaker cosine | sox sibling refused % | "
        "other voice refused % | highest phrase WER |",
        "|---|---|---|---|---|---|",
        *(
            f"| {take} | {100 * row['same_speaker_accept']:.1f} | {row['same_mean_score']:.3f} | "
            f"{100 * row['sox sibling refuse']:.1f} | {100 * row['other voice refuse']:.1f} | {row['phrase_wer_max']:.2f} |"
            for take, row in summary["by_take"].items()
        ),
        "",
        "Who is the same speaker here: a consent recording is the source voice's engine reading the phrase "
        "(through the corpus's recording path and the speaker's sox chain), a sample is that voice's own dataset "
        "recordings of other sentences (through the same chain). The three source voices come from three "
        "engines (Piper, flite, festival), so no two of them share an engine; every *sox sibling* pair does: one "
        "engine voice under different sox chains (or none). Whether a sibling is another speaker "
        "is a definition (bench/speaker.py's): acoustically it is another voice, but it is the consenting voice "
        "itself, edited, not somebody else's, so the 'other voice' row is the check's real target and the "
        "sibling row its hardest case.",
        "",
        "## Phrase check",
        "",
        "WER of what Whisper heard, per speaker and take (x: refused).",
        "",
        "| speaker | " + " | ".join(t for t in dict.fromkeys(r["take"] for r in recordings)) + " |",
        "|---|" + "---|" * len(dict.fromkeys(r["take"] for r in recordings)),
    ]
    for name in names:
        cells = [f"{r['wer']:.2f}{'' if r['accepted'] else ' x'}" for r in recordings if r["speaker"] == name]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Refused, per wrong phrase:", ""]
    lines += [
        f"* {kind} ({WRONG[kind]!r}): {100 * summary['wrong_refuse_by_kind'][kind]:.0f}% refused, WER "
        f"{min(summary['wrong_wer_by_kind'][kind]):.2f}-{max(summary['wrong_wer_by_kind'][kind]):.2f}"
        for kind in WRONG
    ]
    reworded = summary["reworded_wer"]
    lines += [
        f"* reworded, no verdict ({REWORDED!r}): WER {min(reworded):.2f}-{max(reworded):.2f}, "
        f"{sum(w <= result['max_word_error_rate'] for w in reworded)} of {len(reworded)} accepted",
        "",
        wer_sentence(summary),
        "",
        "What Whisper heard in the refused right-phrase recordings:",
        "",
    ]
    lines += [
        f"* {r['speaker']}, {r['take']}: {r['heard']!r} (WER {r['wer']:.2f})"
        for r in recordings
        if r["take"].startswith("right") and not r["accepted"]
    ] or ["* none"]
    lines += [
        "",
        "## Speaker check",
        "",
        "Accept rate (%) of consent speaker (rows; every right-phrase take) x sample speaker (columns; every "
        "window), mean cosine beneath. Same source voice: the 4x4 blocks on the diagonal.",
        "",
        "| consent \\ sample | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in names:
        cells = [
            f"{'**' if c == s else ''}{100 * summary['confusion'][c][s]:.0f}{'**' if c == s else ''} "
            f"({summary['mean_score'][c][s]:.2f})"
            for s in names
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "![scores](consent.png)", ""]
    return "\n".join(lines) + "\n"


def wer_sentence(summary: dict) -> str:
    """Which WER thresholds would accept every right take and refuse each kind of wrong phrase."""
    highest = summary["right_phrase_wer_max"]
    lowest = {kind: min(wers) for kind, wers in summary["wrong_wer_by_kind"].items()}
    apart = [kind for kind in WRONG if lowest[kind] > highest]
    mixed = [kind for kind in WRONG if lowest[kind] <= highest]
    sentence = f"The right phrase was heard at WER {highest:.2f} at worst"
    if apart:
        sentence += (
            f": any WER threshold in [{highest:.2f}, {min(lowest[k] for k in apart):.2f}) accepts every right take "
            f"and refuses every {' and '.join(map(repr, apart))}"
        )
    if mixed:
        sentence += (
            f"; none refuses every {' or '.join(map(repr, mixed))} (heard at WER as low as {min(lowest[k] for k in mixed):.2f}: "
            "a word or two that turn the meaning around are a small word error rate)"
        )
    return sentence + "."


def threshold_sentence(summary: dict) -> str:
    """Which thresholds would have met both targets (information: the shipped one is not moved)."""
    parts = []
    for label, (low, high) in (
        ("all trials", summary["meeting_both"]),
        ("without the sox siblings", summary["meeting_both_without_siblings"]),
    ):
        parts.append(
            f"{label}: any threshold in ({low:.3f}, {high:.3f}]"
            if low < high
            else f"{label}: none (a 95%-refusing threshold is above {low:.3f}, a 95%-accepting one at most {high:.3f})"
        )
    return (
        "Thresholds that would meet both speaker targets on these trials (information only): " + "; ".join(parts) + "."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--windows", type=int, default=4, help="sample windows per speaker")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--work", type=Path, default=Path("runs/consent"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/consent"))
    parser.add_argument("--report", action="store_true", help="rebuild md and png from --out's consent.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        result = json.loads((args.out / "consent.json").read_text())
    else:
        result = measure(args)
    result["summary"] = summary = summarize(result)
    (args.out / "consent.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "consent.png")
    (args.out / "consent.md").write_text(markdown(result, summary))
    print(markdown(result, summary))


if __name__ == "__main__":
    main()
