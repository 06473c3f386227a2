"""bench/soak.py's server command options: start_server also serves bench/first_audio.py, whose arguments
have no --job-niceness (it crashed there once the soak grew that option)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from soak import niceness_options  # noqa: E402


def test_a_given_niceness_is_passed_to_the_server():
    assert niceness_options(argparse.Namespace(job_niceness=7)) == ["--job-niceness", "7"]


def test_none_given_or_no_such_option_leaves_the_servers_default():
    assert niceness_options(argparse.Namespace(job_niceness=None)) == []
    assert niceness_options(argparse.Namespace(threads=1)) == []
