"""Training memory of the speaker encoder: prediction against one measured step, per category; the
reversible trunk's activations flat in depth; 8-bit states 8-bit for every tensor; `chorus memory`."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from chorus.cli import app
from chorus.memory.speaker_encoder import (
    encoder_config_by_name,
    measure_speaker_step,
    predict_speaker_memory,
    speaker_memory_report,
)
from chorus.speaker_recognition.encoder import SpeakerClassifier, SpeakerEncoder, SpeakerEncoderConfig
from chorus.training.speaker_encoder import speaker_optimizer

SMALL = {"channels": (8, 16, 16, 32), "embedding_dim": 16, "n_mels": 16, "groups": 2, "pooling_hidden": 8}
STEP = {"speakers": 7, "batch": 3, "frames": 24}


def small(arch: str, depth: int, reversible: bool) -> SpeakerEncoderConfig:
    return SpeakerEncoderConfig(arch=arch, depth=depth, reversible=reversible, **SMALL)


@pytest.mark.parametrize("optimizer", ["adam", "adam8bit", "sgd", "sgd8bit"])
@pytest.mark.parametrize("reversible", [False, True], ids=["plain", "reversible"])
@pytest.mark.parametrize("arch,depth", [("resnet", 18), ("df-resnet", 56)])
def test_prediction_matches_measurement_to_the_byte(arch, depth, reversible, optimizer):
    config = small(arch, depth, reversible)
    measured = measure_speaker_step(config, optimizer=optimizer, warmup=False, **STEP)
    predicted = predict_speaker_memory(config, optimizer=optimizer, **STEP)
    assert predicted.categories() == measured.categories()
    assert (measured.recompute > 0) == reversible


def test_reversible_activations_do_not_grow_with_depth_measured():
    plain = [measure_speaker_step(small("resnet", d, False), warmup=False, **STEP).activations for d in (10, 34)]
    rev = [measure_speaker_step(small("resnet", d, True), warmup=False, **STEP) for d in (10, 34)]
    assert rev[0].activations == rev[1].activations
    assert rev[0].recompute == rev[1].recompute  # one branch, whatever the depth
    assert plain[1] > 1.5 * plain[0]


def test_eight_bit_runs_keep_every_state_in_eight_bits():
    """bitsandbytes keeps tensors under 4,096 values in 32 bits by default; the speaker encoder's
    optimizers do not: every per-parameter state tensor is uint8 (its absmax per block float32)."""
    model = SpeakerClassifier(SpeakerEncoder(small("resnet", 10, False)), 7)
    for name in ("adam8bit", "sgd8bit"):
        optimizer = speaker_optimizer(list(model.parameters()), name, lr=1e-3, weight_decay=0.0)
        model(torch.randn(2, 16, 16), torch.tensor([0, 1])).backward()
        optimizer.step()
        small_tensors = [p for p in model.parameters() if p.numel() < 4096]
        assert small_tensors  # the check means something: GroupNorm weights, biases ...
        for parameter in model.parameters():
            state = optimizer.state[parameter]
            moments = [state[k] for k in ("state1", "state2") if k in state]
            assert moments and all(m.dtype == torch.uint8 for m in moments), name


def test_reversible_plus_8bit_saves_at_depth_on_the_meta_device():
    """Any depth is predicted without allocating: the deepest DF-ResNet at the training batch."""
    settings = {"speakers": 252, "batch": 32, "frames": 200}
    plain = predict_speaker_memory(encoder_config_by_name("df-resnet179"), optimizer="adam", **settings)
    rev = predict_speaker_memory(encoder_config_by_name("df-resnet179-rev"), optimizer="adam8bit", **settings)
    assert plain.total > 10 * rev.total
    assert rev.optimizer_states < 0.3 * plain.optimizer_states


def test_encoder_names_are_checked():
    assert encoder_config_by_name("resnet34-rev").reversible
    with pytest.raises(ValueError, match="resnet18-rev"):
        encoder_config_by_name("resnet-18")


def test_memory_command_reports_a_speaker_encoder(tmp_path):
    out = tmp_path / "speaker.png"
    result = CliRunner().invoke(
        app,
        [
            "memory",
            "--model",
            "speaker-resnet10-rev",
            "--optimizer",
            "adam8bit",
            "--batch",
            "2",
            "--frames",
            "32",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "activations" in result.output and "recompute" in result.output
    assert out.is_file() and "resnet10-rev" in out.with_suffix(".md").read_text()
    bad = CliRunner().invoke(app, ["memory", "--model", "speaker-resnet10", "--optimizer", "adamw"])
    assert bad.exit_code != 0 and "adam, adam8bit, sgd, sgd8bit" in bad.output


def test_report_measures_in_a_fresh_process():
    report = speaker_memory_report(
        small("resnet", 10, True), measure=True, fresh_process=True, speakers=4, batch=2, frames=16
    )
    assert report.predicted.categories() == report.measured.categories()
    assert report.measured.peak > 0


def test_the_rebuilds_of_one_kind_are_rerun_once():
    """The largest rebuild is measured on one block or branch of each kind and input: the blocks of a stage save
    alike, and rerunning every one (120 branches of DF-ResNet-179) had raised the measuring process's RSS to 8 GB
    after its step."""
    from chorus.memory.measure import NO_MASK, _largest_rebuild, _made_of, _Rebuild

    branches = [torch.nn.Conv2d(2, 2, 3, padding=1) for _ in range(5)] + [torch.nn.Conv2d(2, 2, 5, padding=2)]
    calls = []

    def rebuild(branch):
        def run(x, _mask):
            calls.append(branch)
            return torch.relu(branch(x))

        return _Rebuild(run, (1, 2, 4, 4), torch.float32, True, NO_MASK, _made_of(branch))

    largest = _largest_rebuild([rebuild(b) for b in branches], set(), "fp32", torch.device("cpu"))
    assert largest > 0 and len(calls) == 2 and calls[-1] is branches[-1]  # one of the five alike, and the other
