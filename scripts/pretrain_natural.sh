#!/usr/bin/env bash
# Issue 38's fallback: the Chorus base goes on learning beside twelve natural-sounding speakers that the Piper
# voice makes (corpus split natural/: joe reading other sentences than its held-out clips', through sox).
# Each session warm-starts from the last committed weights (checkpoints/base-natural/, else the shipped base),
# trains in the background to TOTAL_STEPS with a linear anneal over the last quarter, and logs to
# runs/base-natural.log; a run already in runs/base-natural/ resumes where it stopped instead, with the schedule
# it began with (PEAK_LEARNING_RATE applies to a new run).
# Usage: bash scripts/pretrain_natural.sh [TOTAL_STEPS] [PEAK_LEARNING_RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2600}
learning_rate=${2:-5e-4}
# Built every time: finished clips are skipped, so a complete corpus costs a check.
speakers=$(.venv/bin/python -c "
from chorus.corpus.speakers import NATURAL_SPEAKERS, pretraining_speakers
print(','.join(speaker.name for speaker in [*pretraining_speakers(), *NATURAL_SPEAKERS]))")
.venv/bin/chorus corpus build corpus_out --speakers "$speakers"
start=()
if [ ! -f runs/base-natural/checkpoint/config.json ]; then
  init=src/chorus/assets/base
  [ -f checkpoints/base-natural/model.safetensors ] && init=checkpoints/base-natural
  start=(--init-from "$init" --learning-rate "$learning_rate" --warmup-steps 300)
  echo "warm start from $init"
fi
nohup .venv/bin/chorus pretrain corpus_out/train corpus_out/natural --out runs/base-natural --steps "$steps" \
  --anneal-from $((steps * 3 / 4)) --threads 1 "${start[@]}" >> runs/base-natural.log 2>&1 &
echo "pretraining in the background (pid $!); follow runs/base-natural.log and runs/base-natural/log.csv"
