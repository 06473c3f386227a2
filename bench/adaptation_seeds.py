"""How much the adaptation benchmark's similarity moves with the seed: one table from several runs.

Each run is a ``bench/adaptation.py`` results folder made with its own ``--seed`` (held-out split,
batch order, initialization); the cells they share are lined up, with the mean and spread per cell
and the best adapter's ratio to full fine-tuning per seed and on the means.

    python bench/adaptation.py --voices piper-joe --minutes 3 --methods residual,full --seed 1 \\
        --out bench/results/adaptation_seeds/seed-1
    python bench/adaptation_seeds.py bench/results/adaptation bench/results/adaptation_seeds/seed-* \\
        --out bench/results/adaptation_seeds/seeds.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from chorus.recipe import AdaptConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="results folders of bench/adaptation.py")
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write")
    args = parser.parse_args()
    cells: dict[tuple, dict[int, float]] = {}
    for run in args.runs:
        for row in json.loads((run / "adaptation.json").read_text()):
            key = (row["voice"], row["minutes"], row["method"])
            cells.setdefault(key, {})[row.get("seed", AdaptConfig.seed)] = row["similarity"]
    shared = {key: by_seed for key, by_seed in sorted(cells.items()) if len(by_seed) > 1}
    lines = [
        "# Adaptation: similarity across seeds",
        "",
        f"Runs: {', '.join(str(run) for run in args.runs)}. Cells run with more than one seed:",
        "",
        "| voice | min | method | similarity per seed | mean | standard deviation |",
        "|---|---|---|---|---|---|",
    ]
    for (voice, minutes, method), by_seed in shared.items():
        values = list(by_seed.values())
        per_seed = ", ".join(f"{value:.3f} (seed {seed})" for seed, value in sorted(by_seed.items()))
        lines.append(
            f"| {voice} | {minutes:g} | {method} | {per_seed} | {statistics.mean(values):.3f} | "
            f"{statistics.stdev(values):.3f} |"
        )
    lines += ["", "Adapter against full fine-tuning (target 0.95x), per seed and on the means:", ""]
    for (voice, minutes, method), by_seed in shared.items():
        full = shared.get((voice, minutes, "full"))
        if method == "full" or full is None:
            continue
        seeds = sorted(set(by_seed) & set(full))
        ratios = ", ".join(f"{by_seed[seed] / full[seed]:.3f}" for seed in seeds)
        mean_ratio = statistics.mean(by_seed[s] for s in seeds) / statistics.mean(full[s] for s in seeds)
        lines.append(
            f"- {voice}, {minutes:g} min, {method}: {ratios} (seeds {', '.join(map(str, seeds))}); "
            f"means {mean_ratio:.3f}x"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
