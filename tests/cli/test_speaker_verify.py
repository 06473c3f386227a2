"""`chorus speaker verify` judges two clips as the server's consent check does (issue 39: it called a
Chorus-made flite-rms clip the same speaker as piper-joe)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
from typer.testing import CliRunner

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.cli import app
from chorus.synthesis.synthesizer import load_base

SAMPLES = Path(__file__).resolve().parents[2] / "src" / "chorus" / "assets" / "samples"


def joined(paths: list[Path], out: Path) -> Path:
    sf.write(out, np.concatenate([load_audio(p) for p in paths]), SAMPLE_RATE)
    return out


def verify(a: Path, b: Path) -> str:
    """The verdict's line; the exit status says the same (0 same speaker, 1 different), as cmp's does."""
    result = CliRunner().invoke(app, ["speaker", "verify", str(a), str(b)])
    said = " ".join(result.output.split())
    assert result.exit_code == (0 if "same speaker" in said else 1), result.output
    return said


def test_verify_tells_joe_from_others_as_the_server_would(tmp_path):
    joe = sorted((SAMPLES / "piper-joe" / "wavs").glob("*.flac"))
    slt = sorted((SAMPLES / "flite-slt" / "wavs").glob("*.flac"))
    first, second = joined(joe[0:3], tmp_path / "joe-a.wav"), joined(joe[3:6], tmp_path / "joe-b.wav")
    tts = load_base()
    texts = [
        "The quick brown fox jumps over the lazy dog while the band plays on.",
        "Please call Stella and ask her to bring these things with her from the store.",
    ]
    made = np.concatenate([tts.synthesize(text, speaker="flite-rms").audio for text in texts])
    rms = tmp_path / "flite-rms.wav"
    sf.write(rms, made, tts.sample_rate)

    assert "same speaker" in verify(first, second)
    assert "different speakers" in verify(first, rms)
    assert "different speakers" in verify(first, joined(slt[0:3], tmp_path / "slt.wav"))
    # The old judge (the speaker encoder's plain cosine) is still there on request.
    result = CliRunner().invoke(app, ["speaker", "verify", str(first), str(second), "--encoder", str(_shipped())])
    assert result.exit_code == 0 and "same speaker" in result.output
    slt_clip = tmp_path / "slt.wav"  # the plain cosine cannot tell flite-rms from joe: the reason it is no default
    result = CliRunner().invoke(app, ["speaker", "verify", str(first), str(slt_clip), "--encoder", str(_shipped())])
    assert result.exit_code == 1 and "different speakers" in result.output


def test_verify_cannot_tell_when_the_clips_match_but_a_part_is_too_short_to_judge():
    """A new user's probe: two 4 s clips of joe scored above their threshold, yet the answer was "different
    speakers" (exit 1) for a part too short to judge, in the consent check's words. It is "cannot tell" (exit
    2), in a pair of clips' words."""
    joe = SAMPLES / "piper-joe" / "wavs"
    result = CliRunner().invoke(
        app, ["speaker", "verify", str(joe / "piper-joe_LJ002-0200.flac"), str(joe / "piper-joe_LJ009-0283.flac")]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "cannot tell: the clips score as one speaker" in said, result.output
    assert "consent" not in said.split("encoder")[-1] and "the whole band" in said


def _shipped() -> Path:
    from chorus.speaker_recognition.bundle import SHIPPED_ENCODER

    return SHIPPED_ENCODER


def test_verify_without_an_encoder_says_it_runs_on_the_cpu(tmp_path, capsys):
    """A researcher's probe: --device cuda was taken and dropped (the fused check's embedders run on the CPU).
    Called directly: on a machine without a GPU the option's own check refuses cuda first."""
    import pytest
    import typer

    from chorus.cli.speaker import verify as verify_command

    with pytest.raises(typer.Exit) as ended:
        verify_command(tmp_path / "a.wav", tmp_path / "b.wav", encoder=None, device="cuda")
    assert ended.value.exit_code == 2
    assert "the server's check runs on the CPU; --device applies with --encoder" in capsys.readouterr().err
