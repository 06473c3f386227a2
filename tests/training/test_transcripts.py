"""Recordings without (some) transcripts, written as an LJSpeech-style folder for adaptation
(:func:`chorus.training.transcripts.auto_transcribe`), with a stand-in for Whisper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from chorus.training.transcripts import auto_transcribe


class Heard:
    """Whisper's stand-in: every clip says the same words."""

    def transcribe(self, audio, rate) -> str:
        return "hello there"


def tone(path: Path, hz: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(22050 * 2) / 22050
    sf.write(path, 0.3 * np.sin(2 * np.pi * hz * t).astype(np.float32), 22050)


def test_recordings_of_one_name_in_two_folders_stay_two_clips(tmp_path):
    """a/take1.wav and b/take1.wav were both written as wavs/take1.wav: one clip, paired with the other's words."""
    recordings = tmp_path / "recordings"
    tone(recordings / "a" / "take1.wav", 220)
    tone(recordings / "b" / "take1.wav", 330)
    written = auto_transcribe(recordings, tmp_path / "out", judge=Heard(), progress=False)
    lines = (tmp_path / "out" / "metadata.csv").read_text().splitlines()
    assert written.clips == 2 and [line.split("|")[0] for line in lines] == ["take1", "take1-2"]
    clips = [sf.read(tmp_path / "out" / "wavs" / f"{name}.wav")[0] for name in ("take1", "take1-2")]
    assert not np.allclose(clips[0], clips[1])
    assert sorted(written.sources.values()) == [
        str(recordings / "a" / "take1.wav"),
        str(recordings / "b" / "take1.wav"),
    ]


def test_a_folder_given_as_dot_is_read_by_its_own_name(tmp_path, monkeypatch):
    """`chorus adapt . --out V` with a line to transcribe: every line was "empty speaker name" (Path('.').name)."""
    folder = tmp_path / "anna"
    tone(folder / "wavs" / "a1.wav", 220)
    tone(folder / "wavs" / "a2.wav", 330)
    (folder / "metadata.csv").write_text("a1|Hello there.\na2|\n")
    monkeypatch.chdir(folder)
    written = auto_transcribe(Path("."), tmp_path / "out", judge=Heard(), progress=False)
    assert written.clips == 2 and written.automatic == 1
