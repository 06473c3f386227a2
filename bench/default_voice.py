"""Does the default voice keep its words? The base's vocoder and mel post-filter chosen on development
sentences and judged on the benchmark sentences they were not chosen on (issue 39, item 5).

Every vocoder in ``--vocoders`` with every post-filter in ``--postfilters`` (``GV:CONTRAST``; 1:1 is none)
and, where ``--speeds`` asks, every speaking rate (``chorus synthesize --speed``: 0.9 is 10 % slower)
speaks as the base's showcase speakers, reading two sets of sentences the base never heard:

* **development**: ``DEVELOPMENT`` below, 30 everyday sentences and 40 short ones dense in plosives and
  clusters as the Harvard sentences are, all written for this benchmark (checked to be in no speaker's
  text and not among the benchmark sentences); the setting is chosen here and only here (the everyday
  sentences alone left every setting within one word of the others);
* **figures**: the 20 benchmark sentences (``chorus.corpus.text.benchmark_sentences``).

Beside them, each speaker's own engine (espeak-ng, flite, festival through the corpus' sox chain) reads both
sets: the recordings the base learned the speaker from, which no setting can beat by much.

The rule: among the settings whose development MOS keeps every showcase speaker at >= 2.0 and their mean
at >= 2.3, the one with the lowest development WER of the default speaker; within one word of it, the
higher mean MOS. Where no setting keeps those MOS bounds, the same choice among all settings. Judges: Whisper tiny.en (corpus WER), distillmos (MOS). Targets on
the figures' sentences: default speaker WER <= 7 %; showcase MOS mean >= 2.3, every speaker >= 2.0.

    python bench/default_voice.py --out bench/results/default_voice
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from chorus.audio.io import SAMPLE_RATE
from chorus.audio.postfilter import MelPostFilter
from chorus.corpus.build import record_sentences
from chorus.corpus.text import benchmark_sentences, sentence_key, training_sentences
from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
from chorus.synthesis import load_base
from run_record import LoadSampler, describe, kept_on_failure, provenance

DEVELOPMENT = (
    "The bus to the airport leaves every twenty minutes from the corner.",
    "Could you send me the report before lunch tomorrow?",
    "My sister bought a small red car last spring.",
    "The kitchen light flickers whenever the fridge starts up.",
    "We walked along the river until the sun went down.",
    "Please remember to water the plants while I am away.",
    "The meeting has been moved to Thursday afternoon.",
    "He left his umbrella on the train this morning.",
    "The library closes early on public holidays.",
    "She plays the violin in a quartet on weekends.",
    "Turn left at the bakery and the school is on your right.",
    "The soup needs a little more salt and some pepper.",
    "Our neighbours are painting their fence bright blue.",
    "The printer on the second floor is out of paper again.",
    "I would like a window seat if one is still free.",
    "The children built a snowman in the front garden.",
    "Their flight was delayed by almost three hours.",
    "You can pay with a card at the front desk.",
    "The old bridge was repaired after the winter storms.",
    "Let me know when you have finished with the ladder.",
    "The museum opens a new exhibition about ancient maps next week.",
    "A cold wind blew across the empty parking lot.",
    "The doctor asked him to rest for a few days.",
    "Most of the shops in town close at six.",
    "We need two more chairs for the dinner tonight.",
    "The cat sleeps on the warm windowsill every afternoon.",
    "He answered the phone on the third ring.",
    "The road to the village is narrow and winding.",
    "Please keep the receipt in case you want to return it.",
    "The team celebrated their first win of the season.",
    # Harder: short, with the plosives, clusters and rarer nouns of the Harvard sentences the figures use.
    "The brass lamp glowed on the oak desk.",
    "A thin crust of ice formed on the pond.",
    "The mule pulled the cart up the steep hill.",
    "Fresh bread smells best at dawn.",
    "The clerk stamped the form with a loud thud.",
    "Pack the quilts in the cedar chest.",
    "A gust of wind bent the tall reeds.",
    "The goat chewed the edge of the rope.",
    "Dip the brush in the jar of green paint.",
    "The plum tree blooms late in the spring.",
    "A drop of oil will stop the hinge from squeaking.",
    "The chef sliced the leeks with a sharp knife.",
    "Five crows sat still on the fence post.",
    "The sled slid fast down the icy slope.",
    "Her scarf was knit from soft grey wool.",
    "The barn door creaked in the cold draft.",
    "We stacked the logs beside the stove.",
    "A faint hum came from the old radio.",
    "The judge frowned and tapped his pen.",
    "Tie the boat to the dock with a thick cord.",
    "The moth flew in circles round the candle.",
    "Scrub the pan until the grease is gone.",
    "A loud clap of thunder woke the baby.",
    "The pearl slipped from the broken clasp.",
    "Spread the jam thinly on the toast.",
    "The fox crept past the sleeping hens.",
    "The nurse wrapped the wound in clean gauze.",
    "A shy deer stepped out of the pines.",
    "Grind the beans just before you brew.",
    "The twins shared a bunk in the attic.",
    "The kettle whistled and steam filled the room.",
    "A stiff breeze flapped the flags on the pier.",
    "Stir the stew and add a pinch of thyme.",
    "The drum beat kept the dancers in step.",
    "The vase tipped over and the lilies spilled.",
    "A crisp apple is a fine snack in autumn.",
    "The hawk circled high above the barley.",
    "Shut the gate so the sheep stay in.",
    "The glue dried before the frame was square.",
    "He hummed a tune while he fixed the wheel.",
)
MOS_MEAN_TARGET, MOS_EACH_TARGET, WER_TARGET = 2.3, 2.0, 0.07


def unheard(sentences: tuple[str, ...]) -> list[str]:
    """``sentences``, refusing any a speaker read in the corpus or a benchmark sentence."""
    heard = {sentence_key(text) for _, text in training_sentences()} | {
        sentence_key(text) for text in benchmark_sentences()
    }
    clash = [text for text in sentences if sentence_key(text) in heard]
    if clash:
        raise ValueError(f"development sentences the base heard or the figures use: {clash}")
    return list(sentences)


def judged(audio: list[np.ndarray], sentences: list[str], judges: Judges) -> dict:
    """WER (corpus), MOS (mean, sd, n) of ``audio`` (22,050 Hz, one clip per sentence) reading ``sentences``."""
    items = [EvalItem(f"{index:02d}", clip, text, sample_rate=SAMPLE_RATE) for index, (clip, text) in
             enumerate(zip(audio, sentences, strict=True))]  # fmt: skip
    report = evaluate_pairs(items, judges=judges, progress=False)
    mos = [row.mos for row in report.rows if row.mos is not None]
    return {"wer": report.corpus_wer, "mos": float(np.mean(mos)), "mos_sd": float(np.std(mos, ddof=1)), "n": len(mos)}


def choose(dev: dict[str, dict[str, dict]], default: str, words: int) -> str:
    """The rule in the module docstring, on the development rows ``{setting: {speaker: row}}``."""
    allowed = {
        setting: rows
        for setting, rows in dev.items()
        if min(r["mos"] for r in rows.values()) >= MOS_EACH_TARGET
        and np.mean([r["mos"] for r in rows.values()]) >= MOS_MEAN_TARGET
    }
    allowed = allowed or dev
    lowest = min(rows[default]["wer"] for rows in allowed.values())
    near = [setting for setting, rows in allowed.items() if rows[default]["wer"] <= lowest + 1 / words]
    return max(near, key=lambda setting: np.mean([r["mos"] for r in allowed[setting].values()]))


def measure(args, result: dict) -> None:
    """Fill ``result`` as the rows come (a run that dies keeps them)."""
    torch.set_num_threads(args.threads)
    tts = load_base(args.model)
    speakers = args.speakers or tts.bundle.info["showcase_speakers"]
    default = tts.bundle.default_speaker
    shipped = tts.postfilter
    vocoder = tts.bundle.info.get("default_vocoder", "griffin-lim")
    splits = {"development": unheard(DEVELOPMENT), "figures": benchmark_sentences()}
    judges = Judges(speaker=None, reference=False)
    result |= {
        "speakers": list(speakers),
        "default_speaker": default,
        "model": str(args.model or "the shipped base"),
        "shipped": f"{vocoder} {shipped.global_variance:g}:{shipped.contrast:g}",
        "sentences": {split: len(texts) for split, texts in splits.items()},
        "rows": {},
        "engine": {},
    }
    for split, sentences in splits.items():
        for speaker in speakers:
            row = judged(record_sentences(speaker, sentences), sentences, judges)
            result["engine"].setdefault(split, {})[speaker] = row
            print(f"engine {split} {speaker}: WER {row['wer']:.3f} MOS {row['mos']:.2f}", flush=True)
    rows = result["rows"]
    settings = itertools.product(args.vocoders.split(","), args.postfilters.split(","), args.speeds.split(","))
    bases = {}  # one per vocoder: the post-filter and the speed are set per setting on the same base
    for vocoder, postfilter, speed in settings:
        spec = f"{vocoder} {postfilter}" + ("" if float(speed) == 1 else f" speed {speed}")
        if vocoder not in bases:
            bases[vocoder] = load_base(args.model, vocoder=vocoder)
        tts = bases[vocoder]
        tts.postfilter = MelPostFilter(*(float(x) for x in postfilter.split(":")))
        for split, sentences in splits.items():
            for speaker in speakers:
                audio = [tts.synthesize(text, speaker=speaker, speed=float(speed)).audio for text in sentences]
                rows.setdefault(split, {}).setdefault(spec, {})[speaker] = judged(audio, sentences, judges)
                row = rows[split][spec][speaker]
                print(f"{spec} {split} {speaker}: WER {row['wer']:.3f} MOS {row['mos']:.2f}", flush=True)
    result["development_words"] = sum(len(text.split()) for text in splits["development"])


def report(result: dict) -> str:
    default = result["default_speaker"]
    chosen = choose(result["rows"]["development"], default, result["development_words"])
    lines = [
        "# The default voice's words: the vocoder and post-filter chosen on development sentences",
        "",
        describe(result["provenance"]),
        "",
        f"Base: {result.get('model', 'the shipped base')}. "
        f"Showcase speakers {', '.join(result['speakers'])}; default speaker **{default}**; the base's own "
        f"setting {result['shipped']} (vocoder, post-filter GV:contrast). Development: {result['sentences']['development']} "
        f"sentences written for this benchmark; figures: the {result['sentences']['figures']} benchmark "
        f"sentences. Chosen on development by the rule in `bench/default_voice.py`: **{chosen}**.",
        "",
    ]
    for split in ("development", "figures"):
        lines += [f"## {split}", "", "| setting (vocoder, post-filter GV:contrast, speed) | " + " | ".join(
            f"{s} WER / MOS" for s in result["speakers"]) + " | MOS mean |",  # fmt: skip
            "|---|" + "---|" * (len(result["speakers"]) + 1)]  # fmt: skip
        for setting, by_speaker in result["rows"][split].items():
            cells = [f"{100 * r['wer']:.1f} % / {r['mos']:.2f}" for r in by_speaker.values()]
            mean = np.mean([r["mos"] for r in by_speaker.values()])
            mark = " (chosen)" if setting == chosen else ""
            lines.append(f"| {setting}{mark} | " + " | ".join(cells) + f" | {mean:.2f} |")
        if split in result.get("engine", {}):  # runs before the engine rows had none
            engine = result["engine"][split]
            cells = [f"{100 * r['wer']:.1f} % / {r['mos']:.2f}" for r in engine.values()]
            mean = np.mean([r["mos"] for r in engine.values()])
            lines.append("| the speaker's own engine (not a setting) | " + " | ".join(cells) + f" | {mean:.2f} |")
        lines.append("")
    figures = result["rows"]["figures"][chosen]
    wer, mos = figures[default]["wer"], [r["mos"] for r in figures.values()]
    lines += [
        "## Targets, figures' sentences, the chosen setting",
        "",
        f"- Default speaker WER <= 7 %: {100 * wer:.1f} %: {'met' if wer <= WER_TARGET else '**not met**'}.",
        f"- MOS mean >= 2.3: {np.mean(mos):.2f}: {'met' if np.mean(mos) >= MOS_MEAN_TARGET else '**not met**'}; "
        f"every speaker >= 2.0 (lowest {min(mos):.2f}): {'met' if min(mos) >= MOS_EACH_TARGET else '**not met**'}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a Chorus model folder (default: the shipped base)")
    parser.add_argument("--vocoders", default="neural,griffin-lim", help="as `chorus synthesize --vocoder` takes")
    parser.add_argument("--postfilters", default="1:1,1:1.3,1:1.6,1.3:1,1.3:1.3,1.5:1.3")
    parser.add_argument("--speeds", default="1", help="speaking rates, comma-separated (1: the model's own)")
    parser.add_argument("--speakers", default="", help="comma-separated (default: the base's showcase speakers)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/default_voice"))
    parser.add_argument("--report", action="store_true", help="rewrite the Markdown from --out's JSON")
    args = parser.parse_args()
    args.speakers = [name for name in args.speakers.split(",") if name]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "default_voice.json"
    if not args.report:
        result = {"provenance": provenance(args.threads, "Synthesizer.synthesize + judges")}
        with kept_on_failure(path, result), LoadSampler() as load:
            measure(args, result)
            result["provenance"]["load"] = load.summary()
        path.write_text(json.dumps(result, indent=1))
    result = json.loads(path.read_text())
    (args.out / "default_voice.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
