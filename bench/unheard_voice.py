"""A voice that no model here has heard, made from a held-out one with sox, for issue 38's third target.

The package index and Debian's ``main`` hold no third English voice that is neither in the training corpus
nor one of the held-out three (``/work/shared/offline-assets.md``: festival's other voices are not English,
``festvox-us-slt-hts`` is flite slt's speaker, and MBROLA and SVOX Pico are not packaged). The closest real
thing: a held-out voice moved by a sox chain (pitch and tempo; pitch moves the formants with it) far enough
that a judge nobody here trained hears another speaker. No model here learned from the source (held out
of the base, the vocoder and the speaker encoder), so none heard the result either.

Writes ``OUT/<name>/`` (``metadata.csv`` and ``wavs/``: every source clip through the chain, ids renamed)
and ``OUT/<name>/derived.json`` (source, chain, sox's version, and resemblyzer's similarity of the new
voice to its source and to every other voice given with ``--compare``, beside the source's first clips
against its next ones), which ``bench/bases.py`` prints beside its rows.

    python bench/unheard_voice.py --source corpus_out/heldout/flite-slt --chain "pitch -400 tempo 1.06" \\
        --name flite-slt-down400 --compare corpus_out/heldout/festival-ked,corpus_out/train/flite-rms --out unheard
    python bench/bases.py --part adapted --heldout unheard --targets flite-slt-down400 --out bench/results/bases

Keep ``--out`` apart from the corpus's ``heldout/``: benchmarks that read every held-out voice would take it
for one of the three.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.corpus.speakers import SOX_COMMAND
from chorus.data.formats import discover
from chorus.evaluation.similarity import SpeakerJudge
from run_record import LoadSampler, provenance

SIMILARITY_CLIPS = 12  # clips averaged into each voice's embedding


def derive(source: Path, chain: list[str], name: str, out: Path) -> Path:
    """``out/name``: every clip of ``source`` through ``sox ... chain``, its transcript kept."""
    utterances, problems = discover(source)
    if problems or not utterances:
        raise SystemExit(f"{source}: {len(utterances)} clips, problems: {problems[:3]}")
    folder = out / name
    if source.resolve().is_relative_to(folder.resolve()) or folder.resolve().is_relative_to(source.resolve()):
        raise SystemExit(f"{folder}: would replace or sit inside the source {source}; give another --out or --name")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "wavs").mkdir(parents=True)
    lines = []
    for utterance in utterances:
        key = f"{name}_{utterance.id.split('_', 1)[-1]}"
        target = folder / "wavs" / f"{key}.wav"
        subprocess.run([*SOX_COMMAND, str(utterance.audio_path), str(target), *chain], check=True)
        lines.append(f"{key}|{utterance.text}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    return folder


def voice_embedding(judge: SpeakerJudge, folder: Path, skip: int = 0) -> np.ndarray:
    """The speaker d-vector ``[256]`` of the folder's clips ``skip`` to ``skip + SIMILARITY_CLIPS``."""
    utterances = discover(folder)[0][skip : skip + SIMILARITY_CLIPS]
    return judge.reference_embedding([load_audio(u.audio_path, SAMPLE_RATE) for u in utterances], SAMPLE_RATE)


def similarities(new: Path, source: Path, others: list[Path]) -> dict[str, float]:
    """resemblyzer's cosine of the new voice to each voice, and, as the same-speaker yardstick, of the
    source's first clips to its next ones."""
    judge = SpeakerJudge()
    made = voice_embedding(judge, new)
    scores = {folder.name: float(made @ voice_embedding(judge, folder)) for folder in [source, *others]}
    yardstick = voice_embedding(judge, source) @ voice_embedding(judge, source, skip=SIMILARITY_CLIPS)
    scores[f"{source.name}, its own other clips (same speaker)"] = float(yardstick)
    return {name: round(score, 3) for name, score in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="a held-out voice's folder")
    parser.add_argument("--chain", required=True, help='sox effects, as one string: "pitch 400 tempo 0.93"')
    parser.add_argument("--name", required=True)
    parser.add_argument("--compare", default="", help="other voices' folders, comma-separated")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    chain = args.chain.split()
    # What measured the similarities: the commit, a clean src/, the load while they ran.
    measured = provenance(1, "evaluation.similarity.SpeakerJudge.reference_embedding of 12 clips a voice")
    with LoadSampler() as load:
        folder = derive(args.source, chain, args.name, args.out)
        others = [Path(p) for p in args.compare.split(",") if p]
        scores = similarities(folder, args.source, others)
    measured["load"] = load.summary()
    record = {
        "provenance": measured,
        "name": args.name,
        "source": args.source.name,
        "sox": " ".join([*SOX_COMMAND, "IN", "OUT", *chain]),
        "sox_version": subprocess.run(["sox", "--version"], capture_output=True, text=True).stdout.strip(),
        "clips": len(discover(folder)[0]),
        "resemblyzer_similarity": scores,
    }
    (folder / "derived.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
