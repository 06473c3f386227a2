"""``chorus synthesize`` bounds oneDNN's primitive cache before torch loads (its peak memory would otherwise
grow with the text: a primitive per new sentence length, see chorus.cli.ONEDNN_CACHE_CAPACITY)."""

from __future__ import annotations

import os
import subprocess
import sys

# Records the variable at the moment anything first imports torch, then loads the command as `chorus` does.
SPY = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"))
sys.meta_path.insert(0, Spy())
import chorus.cli
chorus.cli.load_command("synthesize")
print(seen)
"""


def _seen_when_torch_loads(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", SPY], env=env, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_synthesize_sets_the_capacity_before_torch_is_imported():
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    assert _seen_when_torch_loads(env) == "['32']"


def test_a_capacity_already_set_wins():
    env = os.environ | {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}
    assert _seen_when_torch_loads(env) == "['256']"
