"""Training memory of one step of Piper voice adaptation (the posterior recipe): prediction against one
measured step, per category, to the byte, on a toy-size generator."""

from __future__ import annotations

import pytest

from chorus.memory.piper import measure_piper_step, piper_memory_report, predict_piper_memory
from chorus.models.piper_posterior import PosteriorConfig
from chorus.models.piper_vits import PiperGenerator
from chorus.training.piper_adapt import PLACEMENTS, PiperAdaptConfig
from conftest import tiny_piper_config

POSTERIOR = PosteriorConfig(8, 256, hidden_channels=16, n_layers=2)
STEP = {"batch": 3, "text_length": 6, "frames": 24}
SMALL_WINDOW = {"segment_frames": 8, "context_frames": 2}


@pytest.mark.parametrize("placement", [*PLACEMENTS, "full"])
def test_prediction_matches_measurement_to_the_byte(placement):
    config = tiny_piper_config()
    adapt = PiperAdaptConfig(placement=placement, **SMALL_WINDOW)
    measured = measure_piper_step(config, adapt=adapt, posterior=POSTERIOR, warmup=False, **STEP)
    predicted = predict_piper_memory(config, adapt=adapt, posterior=POSTERIOR, **STEP)
    assert predicted.categories() == measured.categories()
    assert measured.activations > 0 and measured.optimizer_states > 0


def test_type_1_residual_blocks_are_predicted_too():
    config = tiny_piper_config(resblock="1", resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 3), (1, 3)))
    adapt = PiperAdaptConfig(**SMALL_WINDOW)
    measured = measure_piper_step(config, adapt=adapt, posterior=POSTERIOR, warmup=False, **STEP)
    assert predicted_categories(config, adapt) == measured.categories()


def predicted_categories(config, adapt) -> dict[str, int]:
    return predict_piper_memory(config, adapt=adapt, posterior=POSTERIOR, **STEP).categories()


def test_longer_clips_change_only_the_activations():
    """The recipe's own window (32 + 2 x 4 frames) on clips twice as long: weights, gradients and states are
    the model's; only the activations grow, and the prediction follows them."""
    config = tiny_piper_config()
    short, long = ({**STEP, "frames": frames} for frames in (40, 80))
    predicted = [predict_piper_memory(config, posterior=POSTERIOR, **shape) for shape in (short, long)]
    measured = measure_piper_step(config, posterior=POSTERIOR, warmup=False, **long)
    assert predicted[1].categories() == measured.categories()
    assert predicted[1].activations > predicted[0].activations
    assert (predicted[0].weights, predicted[0].gradients) == (predicted[1].weights, predicted[1].gradients)


def test_full_fine_tuning_trains_what_the_step_reads():
    """Full fine-tuning makes every weight trainable, but the step never runs the duration predictor: its
    weights get no gradient and no optimizer state (the measured step agrees: test above)."""
    config = tiny_piper_config()
    adapt = PiperAdaptConfig(placement="full", **SMALL_WINDOW)
    report = piper_memory_report(config, adapt=adapt, posterior=POSTERIOR, **STEP)
    predictor = sum(p.numel() for p in PiperGenerator(config).dp.parameters())
    assert predictor > 0 and report.parameters - report.trainable_parameters == predictor
    assert report.predicted.gradients == 4 * report.trainable_parameters


def test_report_measures_in_a_fresh_process():
    report = piper_memory_report(tiny_piper_config(), posterior=POSTERIOR, measure=True, fresh_process=True, **STEP)
    assert report.predicted.categories() == report.measured.categories()
    assert report.measured.peak > 0 and report.trainable_parameters < report.parameters
    assert "flow+decoder" in report.markdown()


def test_a_step_with_discriminators_is_refused_not_under_counted():
    adapt = PiperAdaptConfig(discriminators="checkpoints/vocoder-gta/checkpoint")
    with pytest.raises(ValueError, match="discriminators"):
        predict_piper_memory(tiny_piper_config(), adapt=adapt, posterior=POSTERIOR, **STEP)
