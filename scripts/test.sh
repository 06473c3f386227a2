#!/usr/bin/env bash
# Fresh machine -> tests: system packages (and chromium for the web page test), a virtual environment
# with Chorus and its test dependencies, the static checks (the import layers, lint and format), then
# the test suite (tiny models, CPU, under 10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/browser-packages.sh   # chromium for the web page test
bash scripts/install.sh dev
.venv/bin/lint-imports                                  # every import points down (pyproject.toml)
.venv/bin/ruff check src tests bench scripts
.venv/bin/ruff format --check src tests bench scripts
# One pytest process per core (at most 4), each module's tests in one of them (its module fixtures, a live
# server or a Ray cluster, start once), the longest modules first (LONGEST_MODULES in tests/conftest.py);
# torch runs one thread per test. Every skip is listed, and one fails the run: this machine has what every
# test needs (CHORUS_TEST_NO_SKIPS, tests/conftest.py).
workers="${CHORUS_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
CHORUS_TEST_NO_SKIPS=1 .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder --durations=30 "$@"
