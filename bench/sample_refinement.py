"""Which refined voice should a 10-14 s sample keep? The server's sample recipe (``ServerSettings().adapt_sample``) on a
sample made as bench/consent.py makes them (consecutive recordings of one voice, 10-14 s, one file, transcribed by
Whisper as the job transcribes it), every held-out evaluation's adapter kept, and three voices compared:

* **instant**: the base speaker the job starts from, what the voice speaks as until it is refined;
* **lowest loss**: the evaluation with the lowest held-out mel loss (what ``adapt`` saves), where the server's word
  check (``RefinementCheck``: 4 sentences through Griffin-Lim, at most +0.05 WER) keeps it; else the instant voice;
* **first that reads well** (a rule tried here, not shipped: bench/README.md says why): the lowest loss, then each
  other evaluation that improved on the start's loss in the order of its loss, the first the word check keeps; else
  the instant voice.

Each voice served is judged on sentences the check never read: the texts of the dataset's last ``--sentences``
recordings (bench/adaptation.py's evaluation clips), Whisper tiny.en WER and resemblyzer similarity to the 10
recordings before them (through the same sox chain), through the base's default vocoder.

Splits: ``calibration`` (development: bench/consent.py's calibration chains of the three held-out voices, +/-220
cents and speed 1.08 / 0.92, a sample from each dataset's second half; the order of the checks was chosen on a probe
of the two pitch chains) and ``figures`` (the voices themselves and their +/-300 cent and speed 1.15 chains, a
sample from the first half).

    python bench/sample_refinement.py --split calibration --out bench/results/sample_refinement/calibration
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from chorus.adapters.inject import adapter_state_dict, load_adapter_state_dict
from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.data.formats import discover
from chorus.evaluation.asr import corpus_word_error_rate
from chorus.evaluation.report import Judges
from chorus.evaluation.similarity import cosine_similarity
from chorus.models.bundle import load_bundle
from chorus.serving.onboarding.refinement import RefinementCheck
from chorus.serving.settings import ServerSettings
from chorus.synthesis import DEFAULT_BASE, Synthesizer, load_base
from chorus.training.adapt import VOICE, AdaptResult, adapt
from consent import CALIBRATION_CHAINS, FIGURE_CHAINS, SHORT, SOURCES, sample_windows, sox  # bench/, beside this script
from run_record import LoadSampler, kept_on_failure, provenance, write_results

REFERENCES = 10


class Snapshots:
    """The voice's adapter tensors at every held-out evaluation of an ``adapt`` run, by step (its ``on_evaluate``)."""

    def __init__(self):
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def __call__(self, step: int, model) -> None:
        self.states[step] = {key: value.detach().clone() for key, value in adapter_state_dict(model, VOICE).items()}

    def improved_steps(self, result: AdaptResult) -> list[tuple[int, float]]:
        """(step, held-out mel loss) of the snapshots that improved on the start's loss, best first (then the
        earlier step, as ``adapt`` keeps the first best)."""
        start = result.history[0]["val_mel"]
        taken = [(entry["step"], entry["val_mel"]) for entry in result.history if entry["step"] in self.states]
        return sorted(((step, loss) for step, loss in taken if loss < start), key=lambda item: (item[1], item[0]))

    def put_back(self, result: AdaptResult, step: int) -> None:
        load_adapter_state_dict(result.model, VOICE, self.states[step])


CHAINS = {"calibration": CALIBRATION_CHAINS, "figures": FIGURE_CHAINS}


def judged(tts: Synthesizer, texts: list[str], reference: np.ndarray, judges: Judges, **voice) -> dict:
    """WER of ``texts`` read by the voice (``speaker=`` or ``voice=``), and its mean cosine similarity to the
    ``reference`` d-vector (resemblyzer)."""
    spoken = tts.synthesize_batch(texts, **voice)
    heard = [judges.whisper.transcribe(r.audio, r.sample_rate) for r in spoken]
    similarity = float(
        np.mean([cosine_similarity(judges.speaker.embed(r.audio, r.sample_rate), reference) for r in spoken])
    )
    return {"wer": corpus_word_error_rate(texts, heard), "similarity": similarity}


def one_voice(args, source: str, label: str, chain: tuple[str, ...], judges: Judges, tts: Synthesizer) -> dict:
    """The three voices of one sample (see the module docstring); ``tts``: the shipped base that judges them."""
    clips = discover(args.heldout / source)[0]
    texts = [u.text for u in clips[-args.sentences :]]
    references = [sox(load_audio(u.audio_path), chain) for u in clips[-args.sentences - REFERENCES : -args.sentences]]
    reference = judges.speaker.reference_embedding(references)
    rng = np.random.default_rng(args.seed)
    sample = sox(sample_windows(source, args.heldout, args.split, 1, rng)[0], chain)
    name = f"{SHORT[source]}{label}-seed{args.seed}"
    data = args.work / name / "data"
    data.mkdir(parents=True, exist_ok=True)
    sf.write(data / "sample.wav", sample, SAMPLE_RATE)
    bundle = load_bundle(DEFAULT_BASE)
    snapshots = Snapshots()
    started = time.perf_counter()
    settings = ServerSettings()
    result = adapt(data, bundle, args.work / name / "voice", settings.adapt_sample, progress=False,
                   on_evaluate=snapshots)  # fmt: skip
    seconds = time.perf_counter() - started
    instant = result.card.notes["speaker_vector_start"]
    check = RefinementCheck(settings.consent.max_refined_wer_increase)
    tts.voices["refined"] = (result.model, VOICE)  # the trained model itself: its snapshots are put back into it
    order = snapshots.improved_steps(result)
    steps = {}
    for step, loss in order:
        snapshots.put_back(result, step)
        words = check(bundle, result.model, VOICE, instant)
        steps[step] = {"val_mel": loss, "check_instant": words.instant, "check_refined": words.refined,
                       "kept": words.kept, **judged(tts, texts, reference, judges, voice="refined")}  # fmt: skip
        print(name, step, json.dumps(steps[step]), flush=True)
    lowest, first = chosen([step for step, _ in order], {step: row["kept"] for step, row in steps.items()})
    return {
        "voice": name,
        "source": source,
        "chain": " ".join(chain),
        "sample_seconds": round(sample.size / SAMPLE_RATE, 1),
        "adapt_seconds": round(seconds, 1),
        "instant_speaker": instant,
        "instant": judged(tts, texts, reference, judges, speaker=instant),
        "steps": {str(step): row for step, row in steps.items()},
        "lowest_loss_step": order[0][0] if order else None,
        "lowest_loss_kept": lowest,
        "first_that_reads_well": first,
    }


def chosen(order: list[int], kept: dict[int, bool]) -> tuple[int | None, int | None]:
    """(the lowest loss's step where the word check keeps it, the first step in ``order`` the check keeps): the
    steps that improved on the start, best loss first, and the check's verdict on each; None where none."""
    lowest = order[0] if order and kept[order[0]] else None
    return lowest, next((step for step in order if kept[step]), None)


def served(row: dict, rule: str) -> dict:
    """The judged figures of the voice ``rule`` serves for ``row``: its step's, or the instant voice's."""
    step = row[rule]
    return row["instant"] if step is None else row["steps"][str(step)]


def report(result: dict) -> str:
    rows = result["rows"]
    prov = result["provenance"]
    lines = [
        "# A sample's refined voice: the lowest loss, or the first that reads well",
        "",
        f"commit `{prov['commit'][:10]}` ({'src/ clean' if prov['src_clean'] else 'src/ changed'}), {prov['threads']} "
        f"thread(s), load {prov.get('load', 'not sampled')}, split **{result['split']}**, seed {result['seed']}, "
        f"{result['sentences']} sentences judged a voice (none the word check reads), {REFERENCES} reference clips.",
        "",
        "| voice | sample s | instant: speaker, WER / similarity | evaluations (step: check WER, kept) "
        "| lowest loss: served WER / similarity | first that reads well: served WER / similarity |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        checks = ", ".join(
            f"{s}: {r['check_refined']:.2f}{' kept' if r['kept'] else ''}" for s, r in row["steps"].items()
        )
        cells = []
        for rule in ("lowest_loss_kept", "first_that_reads_well"):
            judged_row, step = served(row, rule), row[rule]
            where = "instant" if step is None else f"step {step}"
            cells.append(f"{where}: {100 * judged_row['wer']:.1f} % / {judged_row['similarity']:.3f}")
        lines.append(
            f"| {row['voice']} | {row['sample_seconds']} | {row['instant_speaker']}, {100 * row['instant']['wer']:.1f} % / "
            f"{row['instant']['similarity']:.3f} | {checks} | {cells[0]} | {cells[1]} |"
        )
    if rows:
        lines += ["", "Means over the voices (what each rule serves; the instant voice where it keeps none):", ""]
        for rule, title in (("lowest_loss_kept", "lowest loss"), ("first_that_reads_well", "first that reads well")):
            picked = [served(row, rule) for row in rows]
            refined = sum(row[rule] is not None for row in rows)
            lines.append(
                f"- {title}: refined {refined} of {len(rows)}; WER {100 * np.mean([p['wer'] for p in picked]):.1f} %, "
                f"similarity {np.mean([p['similarity'] for p in picked]):.3f}"
            )
        lines.append(
            f"- instant voices: WER {100 * np.mean([r['instant']['wer'] for r in rows]):.1f} %, similarity "
            f"{np.mean([r['instant']['similarity'] for r in rows]):.3f}"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=sorted(CHAINS), default="calibration")
    parser.add_argument("--heldout", type=Path, default=Path("corpus_out/heldout"))
    parser.add_argument("--sentences", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/sample_refinement"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/sample_refinement"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = {
        "provenance": provenance(args.threads, "chorus.training.adapt (the server's sample recipe) + RefinementCheck"),
        "split": args.split,
        "seed": args.seed,
        "sentences": args.sentences,
        "rows": [],
    }
    judges = Judges(naturalness=None, reference=False)
    tts = load_base(None)  # each voice's trained model replaces the last as "refined"
    with LoadSampler() as load, kept_on_failure(args.out / "sample_refinement.json", result):
        for source in SOURCES:
            for label, chain in CHAINS[args.split].items():
                result["rows"].append(one_voice(args, source, label, chain, judges, tts))
    write_results(args.out, "sample_refinement", result, load, report)


if __name__ == "__main__":
    main()
