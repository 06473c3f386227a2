#!/usr/bin/env bash
# Fresh machine -> tests: system packages (and chromium for the web page test), a virtual environment
# with Chorus and its test dependencies, the static checks (the import layers, lint and format), then
# the test suite (tiny models, CPU, a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/browser-packages.sh   # chromium for the web page test
bash scripts/install.sh dev
.venv/bin/lint-imports                                  # every import points down (pyproject.toml)
.venv/bin/ruff check src tests bench scripts
.venv/bin/ruff format --check src tests bench scripts
.venv/bin/python -m pytest "$@"
