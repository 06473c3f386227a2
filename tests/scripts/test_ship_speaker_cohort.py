"""scripts/ship_speaker_cohort.py's ``--settings``: which calibrated checks reach the shipped cohort."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from chorus.speaker_recognition.voice_match import Cohort, MatchSettings  # noqa: E402
from ship_speaker_cohort import copy_settings  # noqa: E402


def cohort() -> Cohort:
    settings = {"chorus": MatchSettings(threshold=5.5), "fused": MatchSettings(threshold=10.5)}
    return Cohort([], 16_000, [], {}, settings, {"settings_from": {"chorus": "a.json", "fused": "b.json"}})


def test_only_the_named_checks_are_copied_and_their_source_recorded():
    """A default bench/consent.py run calibrates 'chorus' on the consent encoder v3, which the shipped
    'chorus' check does not load: shipping its whole calibration overwrote that check's settings."""
    shipped = cohort()
    run = {"chorus": {"threshold": 3.6}, "fused": {"threshold": 12.8, "thresholds": {"* clean/clean": 4.9}}}
    copy_settings(shipped, run | {"server": {"threshold": 10.5}}, "c.json", only=["fused"])
    assert shipped.settings["chorus"].threshold == 5.5  # kept
    assert shipped.settings["fused"].threshold_for("0-0 clean/clean") == 4.9
    assert "server" not in shipped.settings
    assert shipped.info["settings_from"] == {"chorus": "a.json", "fused": "c.json"}


def test_without_only_every_calibrated_check_but_the_servers_row_is_copied():
    shipped = cohort()
    copy_settings(shipped, {"chorus": {"threshold": 3.6}, "server": {"threshold": 1.0}}, "c.json")
    assert shipped.settings["chorus"].threshold == 3.6 and "server" not in shipped.settings


def test_a_check_the_run_did_not_calibrate_is_an_error_and_nothing_is_copied():
    shipped = cohort()
    with pytest.raises(SystemExit, match="calibrated no fusd"):
        copy_settings(shipped, {"fused": {"threshold": 12.8}}, "c.json", only=["fusd"])
    assert shipped.settings["fused"].threshold == 10.5
