"""Would a fusion of two speaker encoders keep strangers out and let more owners in?

Reads a finished ``bench/consent.py`` run that scored every trial with both encoders (resemblyzer and a
Chorus encoder: ``consent.json``, or its ``.gz``), adds a third check whose scores are the sum of the two
s-normalized scores (equal weights, nothing tuned: each score is already in cohort standard deviations),
calibrates it exactly as the two are calibrated (``consent.calibrate``: calibration split only), and writes
one table of the three on the figures' split.

    python bench/consent_fusion.py bench/results/consent-v3/consent.json.gz --out bench/results/consent-v3
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from chorus.speaker_recognition.voice_match import MatchSettings
from consent import calibrate, decide, phrase_passes
from run_record import describe, provenance

ENCODERS = ("resemblyzer", "chorus")
FUSED = "fused"
# The targets bench/consent.py states (owners in its mismatched and noisy cells, strangers everywhere).
STRANGER_BOUND = 0.01


def read(path: Path) -> dict:
    opened = gzip.open(path, "rt") if path.suffix == ".gz" else path.open()
    with opened as handle:
        return json.load(handle)


def fuse(row: dict) -> dict:
    """The fused check's entry for a trial or attack: each field the sum of the two encoders'."""
    a, b = row[ENCODERS[0]], row[ENCODERS[1]]
    return {
        "score": a["score"] + b["score"],
        "worst_window": a.get("worst_window", np.inf) + b.get("worst_window", np.inf),
        "worst_stretch": a.get("worst_stretch", np.inf) + b.get("worst_stretch", np.inf),
        # Classes by the Chorus encoder's band (resemblyzer hears every channel at 16 kHz, so its bands are
        # coarser): the fused thresholds are set per class as each encoder's are.
        "threshold_key": b.get("threshold_key", ""),
    }


def settings_of(saved: dict) -> MatchSettings:
    known = {f.name for f in fields(MatchSettings)}
    return MatchSettings(**{k: v for k, v in saved.items() if k in known})


def rates(trials: list[dict], name: str) -> list[dict]:
    """Per condition and kind, on the figures' split: owners, other voices and sox siblings accepted."""
    table = []
    for condition in dict.fromkeys(t["condition"] for t in trials):
        for kind in ("shared", "mismatched"):
            rows = [t for t in trials if t["condition"] == condition and t["kind"] == kind]
            if not rows:
                continue

            def share(relation: str, rows=rows) -> tuple[float, int, int]:
                chosen = [t[name]["accepted"] for t in rows if t["relation"] == relation]
                return (float(np.mean(chosen)) if chosen else float("nan"), sum(chosen), len(chosen))

            table.append(
                {"cell": f"{condition} / {kind}", "owners": share("owner"), "others": share("other voice"),
                 "siblings": share("sox sibling")}
            )  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="consent.json (or .json.gz) of a bench/consent.py run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chorus-name", default="chorus-v3", help="the name the run's Chorus encoder is shipped under")
    args = parser.parse_args()
    result = read(args.run)
    for row in [*result["trials"], *result["attacks"]]:
        row[FUSED] = fuse(row)
    chosen = {name: settings_of(result["calibration"]["settings"][name]) for name in ENCODERS}
    chosen[FUSED] = calibrate(result["trials"], FUSED, MatchSettings())
    least = result["calibration"]["forced_probability"]
    decide(result, chosen, least)
    figures = [t for t in result["trials"] if t["split"] == "figures"]
    tables = {name: rates(figures, name) for name in chosen}
    attacks = {
        name: sum(a[name]["accepted"] for a in result["attacks"] if a["split"] == "figures")
        if "split" in result["attacks"][0]
        else sum(a[name]["accepted"] for a in result["attacks"])
        for name in chosen
    }
    lines = [
        "# Two speaker encoders fused: the sum of their s-normalized scores",
        "",
        f"`python bench/consent_fusion.py {args.run}` on the run described in that folder's consent.md "
        f"(its trials and calibration; the fused check calibrated by `consent.calibrate` on the calibration "
        f"split): {describe(provenance(1, 'no timing: the run per-trial scores recombined, summed as FusedMatch sums them'))}. "
        f"Phrase check as in that run (forced listen bound {least}); figures' split.",
        "",
        f"Fused settings: {json.dumps(asdict(chosen[FUSED]))}",
        "",
        "| cell | " + " | ".join(f"{n}: owners / strangers / siblings" for n in chosen) + " |",
        "|---|" + "---|" * len(chosen),
    ]
    for k, cell in enumerate(tables[ENCODERS[0]]):
        parts = []
        for name in chosen:
            row = tables[name][k]
            parts.append(" / ".join(f"{100 * row[key][0]:.1f} %" for key in ("owners", "others", "siblings")))
        lines.append(f"| {cell['cell']} | " + " | ".join(parts) + " |")
    lines.append("")
    for name in chosen:
        owners = [t[name]["accepted"] for t in figures if t["relation"] == "owner"]
        _, most, n = max((row["others"] for row in tables[name]), key=lambda share: share[0])
        over = [row["cell"] for row in tables[name] if row["others"][0] > STRANGER_BOUND]
        siblings = [t[name]["accepted"] for t in figures if t["relation"] == "sox sibling"]
        lines.append(
            f"- **{name}**: owners {100 * np.mean(owners):.1f} % of {len(owners)}; strangers at most {most} of {n} "
            f"in a cell ({', '.join(over) or 'none'} over {100 * STRANGER_BOUND:.0f} %); "
            f"sox siblings {100 * np.mean(siblings):.1f} % of {len(siblings)}; attacks (laundering, splices) "
            f"accepted {attacks[name]} of {len(result['attacks'])}"
        )
    phrase_ok = [
        phrase_passes(t["phrase_accepted"], t.get("phrase_forced"), least) for t in figures if t["relation"] == "owner"
    ]
    lines.append(
        f"- owners whose consent passed the phrase check (the ceiling for every encoder): {100 * np.mean(phrase_ok):.1f} %"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fusion.md").write_text("\n".join(lines) + "\n")
    # For scripts/ship_speaker_cohort.py --settings: the fused check's settings, and the Chorus encoder's of
    # this run under the name the server keys that encoder by (it is a candidate beside the shipped one).
    shipped = {FUSED: asdict(chosen[FUSED]), args.chorus_name: result["calibration"]["settings"]["chorus"]}
    (args.out / "fusion.json").write_text(json.dumps({"calibration": {"settings": shipped}}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
