#!/usr/bin/env bash
# Fresh machine -> tests: system packages (and chromium for the web page test, optional), a virtual
# environment with Chorus and its test dependencies, then the test suite (tiny models, CPU, a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
bash scripts/browser-packages.sh   # optional: chromium for the web page test
python3 -m venv .venv
.venv/bin/pip install -q "setuptools<81" wheel
.venv/bin/pip install -q -e ".[dev]"
.venv/bin/python -m pytest "$@"
