#!/usr/bin/env bash
# Python side of a fresh machine: a virtual environment in .venv with Chorus and the extra given
# (default "judges"; scripts/test.sh passes "dev"), then the naturalness judge.
#
# The naturalness judge is distillmos, installed without its declared dependencies: it and its
# xls-r-sqa declare torchaudio, which only their command-line file reading uses. The only torchaudio
# on the package index for the pinned torch is a CUDA build that fails to load beside the CPU torch
# ("libc10_cuda.so: cannot open shared object file") and, once installed, breaks transformers (and so
# peft), which import torchaudio whenever it is present. Everything distillmos does use (torch, numpy,
# soundfile) comes with Chorus; chorus.evaluation.naturalness imports it without torchaudio.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-judges}"
python3 -m venv .venv
.venv/bin/pip install -q "setuptools<81" wheel
.venv/bin/pip install -q -e ".[$extra]"
.venv/bin/pip install -q --no-deps "distillmos==0.9.1" "xls-r-sqa==0.1.0"
