"""Benchmarks run as ``python bench/<name>.py`` and import their helpers as siblings; so do these tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
