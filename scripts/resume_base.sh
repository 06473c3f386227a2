#!/usr/bin/env bash
# Continue pretraining the shipped base from the committed training state (checkpoints/base/):
# rebuilds the corpus (deterministic, ~12 min on 2 cores), restores the run folder, resumes in the
# background. Usage: bash scripts/resume_base.sh [TOTAL_STEPS] [PROCESSES] [ANNEAL_FROM]
# ANNEAL_FROM: the step from which the learning rate falls linearly to 0 at TOTAL_STEPS (optional).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40000}
processes=${2:-1}
anneal=()
[ -n "${3:-}" ] && anneal=(--anneal-from "$3")
# Built every time: finished clips are skipped, so a complete corpus costs a check. (Its voices.json alone said
# nothing: the held-out build the benchmarks use writes one, and pretraining then found no corpus_out/train.)
# Only the pretraining speakers: the other splits (vocoder/, encoder/, natural/) are Piper's, ~30 minutes more.
speakers=$(.venv/bin/python -c "
from chorus.corpus.speakers import pretraining_speakers
print(','.join(speaker.name for speaker in pretraining_speakers()))")
.venv/bin/chorus corpus build corpus_out --speakers "$speakers"
mkdir -p runs/base
if [ ! -f runs/base/checkpoint/training_state.json ]; then
  mkdir -p runs/base/checkpoint
  cp checkpoints/base/model.safetensors checkpoints/base/config.json checkpoints/base/training_state.* runs/base/checkpoint/
  cp checkpoints/base/log.csv runs/base/log.csv
fi
if [ "$processes" -gt 1 ]; then
  launcher=(.venv/bin/torchrun --nproc_per_node "$processes" -m chorus)
else
  launcher=(.venv/bin/chorus)
fi
nohup "${launcher[@]}" pretrain corpus_out/train --out runs/base --steps "$steps" "${anneal[@]}" \
  --threads 1 --default-speaker flite-rms >> runs/base.log 2>&1 &
echo "pretraining in the background (pid $!); follow runs/base.log and runs/base/log.csv"
