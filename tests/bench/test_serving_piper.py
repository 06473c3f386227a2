"""bench/serving.py on a Piper base (``--base``): modes, targets, synthetic voices and the report, without
timing anything; and the committed Chorus report rebuilt from its JSON, byte for byte."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from chorus.adapters.lora import LoraConfig
from chorus.adapters.voice import read_voice
from chorus.synthesis.forward import SentenceResult

# Benchmarks run as ``python bench/<name>.py`` and import their helpers as siblings; so does this test.
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import serving  # noqa: E402

COMMITTED = BENCH / "results" / "serving"


def options(**overrides) -> argparse.Namespace:
    base = {
        "base": None,
        "voices": [1, 4],
        "concurrency": 4,
        "requests_per_thread": 2,
        "repeats": 2,
        "batcher": "shipped",
        "max_batch": 16,
        "max_wait_ms": 5.0,
        "swap_voices": [1, 4],
        "per_voice_models": 8,
        "cold_loads": 0,
        "placement": "flow+decoder",
        "adapter_scale": 0.02,
        "method": "lora+speaker",
    }
    return argparse.Namespace(**(base | overrides))


def row(method: str, voices: int, per_repeat: list[float], vocode: bool = True) -> dict:
    rate = float(np.mean(per_repeat))
    return {
        "method": method,
        "vocode": vocode,
        "voices": voices,
        "requests": 16,
        "errors": 0,
        "req_per_s": rate,
        "audio_s_per_s": 2 * rate,
        "audio_s_per_request": 2.28,
        "p50_ms": 700.0,
        "p99_ms": 900.0,
        "per_repeat_req_per_s": per_repeat,
        "cache_misses": 0,
        **({"mean_batch": 1.2, "batches": 13, "paths": {"active": 16}} if method == "batcher" else {}),
    }


def test_the_base_picks_the_modes():
    assert not serving.on_piper(options()) and serving.vocoder_modes(options()) == (False, True)
    assert not serving.on_piper(argparse.Namespace())  # results written before --base: the Chorus base
    for spec in ("piper-joe", "voices/en_US-amy.onnx"):
        piper = options(base=spec)
        assert serving.on_piper(piper) and serving.vocoder_modes(piper) == (True,)
        assert serving.mode_name(True, piper) == "whole synthesis"
    assert [serving.mode_name(v, options()) for v in (False, True)] == ["acoustic", "vocoded"]


def test_targets_on_a_piper_base_are_whole_synthesis_against_0_9():
    rows = [row("batcher", 1, [2.0, 2.0]), row("batcher", 4, [1.9, 1.7])]
    out = serving.targets(rows, options(base="piper-joe"))
    assert list(out) == ["whole synthesis"]
    target = out["whole synthesis"]
    assert target["target"] == serving.PIPER_TARGET == 0.9 and target["headline"]
    assert target["per_repeat_ratios"] == pytest.approx([0.95, 0.85])
    assert target["met"] == (target["ratio"] >= 0.9)
    chorus = serving.targets([*rows, row("batcher", 1, [3.0], False), row("batcher", 4, [3.0], False)], options())
    assert list(chorus) == ["acoustic", "vocoded"] and chorus["vocoded"]["target"] == serving.TARGET


def test_audio_seconds_reads_samples_where_there_is_no_mel():
    piper = SentenceResult(np.zeros(22050, np.float32), 22050, 0.0, "v000")
    assert serving.audio_seconds(piper, 0.01) == pytest.approx(1.0)
    chorus = SentenceResult(np.zeros(0, np.float32), 22050, 0.0, "v000", mel=torch.zeros(50, 80))
    assert serving.audio_seconds(chorus, 0.01) == pytest.approx(0.5)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(4, 4)


def test_random_voices_are_distinct_folders_naming_their_base(tmp_path):
    model = Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folders = serving.random_voices(
        model, [LoraConfig(r=2)], 3, tmp_path, 0.02, 0, base_model_sha256="ab" * 32, base_model="piper-joe"
    )
    assert sorted(folders) == ["v000", "v001", "v002"]
    voices = [read_voice(folders[v]) for v in sorted(folders)]
    assert all(v.card.base_model == "piper-joe" and v.card.base_model_sha256 == "ab" * 32 for v in voices)
    first, second = (v.tensors for v in voices[:2])
    assert first.keys() == second.keys() and any(not torch.equal(first[k], second[k]) for k in first)
    after = model.state_dict()  # every adapter left the model again
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def piper_result() -> dict:
    args = options(base="piper-joe")
    rows = [
        row("batcher", 1, [2.0, 2.0]),
        row("swap", 1, [1.4, 1.5]),
        row("batcher", 4, [1.9, 1.8]),
        row("swap", 4, [1.4, 1.4]),
    ]
    provenance = {"commit": "0123456789abcdef", "src_clean": True, "threads": 1, "timed": "Batcher / swap"}
    config = {
        "cpus": 2,
        "threads": 1,
        "load_average": [1.0, 1.0, 1.0],
        "load_average_end": [1.2, 1.0, 1.0],
        "load_during_throughput": "1.0-1.2 (1-minute, n = 3)",
        "provenance": provenance,
    }
    result = {
        "command": "python bench/serving.py --base piper-joe",
        "config": config,
        "base": {"name": "piper-joe", "sha256": "58afce0321b8" + "0" * 52, "kind": "piper", "methods": "lora r=4"},
        "adapter_bytes_per_voice": 665 * 1024,
        "adapter_tensors_per_voice": 139,
        "summary": rows,
        "targets": serving.targets(rows, args),
        "cold_load": {},
    }
    return result, args


def test_the_piper_report_names_its_mode_verdict_and_skipped_parts(monkeypatch):
    monkeypatch.setattr(serving, "describe", lambda record: f"commit `{record['commit'][:10]}`")
    result, args = piper_result()
    text = "\n".join(serving.piper_report_lines(result, args))
    assert "Piper base `piper-joe`" in text and "whole synthesis (headline" in text
    assert "target >= 0.9x: **met**" in text  # 4 voices / 1 voice = 0.925
    assert "acoustic-only mode" in text and "one-model-per-voice baseline" in text and "memory parts" in text
    assert "nor cold loads (`--cold-loads 0`)" in text and "## Cold load" not in text
    assert "max_batch_ms" in text  # the shipped batcher's time bound, and what it does to a Piper batch
    assert "Griffin-Lim" not in text


def test_the_committed_chorus_report_rebuilds_byte_identical(tmp_path):
    shutil.copy(COMMITTED / "serving.json", tmp_path / "serving.json")
    serving.rereport(tmp_path)
    assert (tmp_path / "serving.md").read_bytes() == (COMMITTED / "serving.md").read_bytes()
