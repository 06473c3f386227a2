"""The import picture of the server: the modules a request passes through, in the layers of the import
contracts (pyproject.toml), with an arrow for every import between them. An arrow that points up would be
drawn red (and `lint-imports` would fail); the picture shows the data flowing one way, from the routes to
the model.

    python scripts/import_picture.py --out docs/serving-imports.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import grimp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Top to bottom: the serving contract's layers, then what the engine runs (the library's synthesis path).
LAYERS = [
    ["chorus.serving.ray_app"],
    ["chorus.serving.api"],
    ["chorus.serving.routes"],
    ["chorus.serving.server"],
    ["chorus.serving.metrics"],
    ["chorus.serving.batcher", "chorus.serving.onboarding"],
    ["chorus.serving.voice_keys"],
    ["chorus.serving.engine", "chorus.serving.store"],
    ["chorus.synthesis", "chorus.training"],
    ["chorus.adapters", "chorus.models"],
]


def imports_between(graph: grimp.ImportGraph, modules: list[str]) -> set[tuple[str, str]]:
    """(importer, imported) pairs among ``modules``, each standing for itself and its submodules."""
    pairs = set()
    for importer in modules:
        for imported in modules:
            if importer != imported and graph.direct_import_exists(
                importer=importer, imported=imported, as_packages=True
            ):
                pairs.add((importer, imported))
    return pairs


def draw(pairs: set[tuple[str, str]], out: Path) -> int:
    """Draw the layers and the arrows; returns how many arrows point up (0 when the contracts hold)."""
    places = {}
    for row, layer in enumerate(LAYERS):
        for column, module in enumerate(layer):
            places[module] = ((column + 1) / (len(layer) + 1), 1 - row / (len(LAYERS) - 1))
    figure, axes = plt.subplots(figsize=(7, 9))
    upward = 0
    for importer, imported in sorted(pairs):
        (x0, y0), (x1, y1) = places[importer], places[imported]
        up = y1 > y0 + 1e-9
        upward += up
        axes.annotate(
            "",
            xy=(x1, y1 + 0.025),
            xytext=(x0, y0 - 0.025),
            arrowprops={"arrowstyle": "->", "color": "red" if up else "0.55", "lw": 1.0, "shrinkA": 8, "shrinkB": 8},
        )
    for module, (x, y) in places.items():
        axes.text(
            x,
            y,
            module.removeprefix("chorus."),
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "#e8f0fe", "edgecolor": "#4a6fa5"},
        )
    axes.set_xlim(0, 1)
    axes.set_ylim(-0.06, 1.06)
    axes.axis("off")
    axes.set_title(f"Who imports whom in the server (arrow: imports; {upward} pointing up)", fontsize=10)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    return upward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/serving-imports.png"))
    args = parser.parse_args()
    graph = grimp.build_graph("chorus")
    pairs = imports_between(graph, [m for layer in LAYERS for m in layer])
    upward = draw(pairs, args.out)
    print(f"{len(pairs)} imports drawn, {upward} pointing up: {args.out}")


if __name__ == "__main__":
    main()
