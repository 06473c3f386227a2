"""Audio I/O (any file in, mono float32 at 22,050 Hz out; atomic saves) and the log-mel features."""

from __future__ import annotations

import os
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf
import torch

from chorus.audio.io import SAMPLE_RATE, AudioError, load_audio, save_audio
from chorus.audio.mel import MelConfig, MelSpectrogram, log_mel


def _tone(seconds: float, rate: int, frequency: float = 440.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def test_load_44k_stereo_wav(tmp_path: Path) -> None:
    left = _tone(1.5, 44_100)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, np.zeros_like(left)], axis=1), 44_100, subtype="PCM_16")
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 1.5 * SAMPLE_RATE) <= 1
    # A silent channel is left out of the mono mix: the left channel at its own level, not half of it.
    assert np.abs(audio[1000:-1000]).max() == pytest.approx(0.5, abs=0.01)
    # Two live channels are averaged (the right one 6 dB under the left).
    sf.write(path, np.stack([left, left / 2], axis=1), 44_100, subtype="PCM_16")
    assert np.abs(load_audio(path)[1000:-1000]).max() == pytest.approx(0.375, abs=0.01)


def test_a_stereo_aac_keeps_its_channels_until_mixed(tmp_path: Path) -> None:
    """FFmpeg's decoding (what libsndfile does not read) gives every channel, mixed as a WAV's are: one live
    channel at its own level (FFmpeg's own mix to mono had halved it)."""
    import av

    from chorus.audio.io import decode_with_av

    left = _tone(1.0, 44_100)
    path = tmp_path / "stereo.m4a"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=44_100, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.stack([left, np.zeros_like(left)]), format="fltp", layout="stereo")
        frame.rate = 44_100
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    decoded, rate = decode_with_av(path)
    assert rate == 44_100 and decoded.shape[1] == 2 and np.abs(decoded[:, 1]).max() < 1e-3
    assert np.abs(load_audio(path)[2000:-2000]).max() == pytest.approx(0.5, abs=0.05)


def test_load_16k_flac(tmp_path: Path) -> None:
    path = tmp_path / "clip.flac"
    sf.write(path, _tone(0.8, 16_000, frequency=300), 16_000, format="FLAC", subtype="PCM_16")
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 0.8 * SAMPLE_RATE) <= 1
    assert np.abs(audio).max() <= 1.0


def test_missing_file_raises_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.wav"
    with pytest.raises(AudioError, match="nope.wav"):
        load_audio(path)
    with pytest.raises(AudioError, match="nope.wav: audio file not found"):
        load_audio(path)
    with pytest.raises(AudioError, match="a folder, not an audio file"):
        load_audio(tmp_path)


@pytest.mark.parametrize("content", [b"", b"RIFF\x00\x00garbage" * 20, os.urandom(4096)])
def test_garbage_file_raises_naming_it(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.wav"
    path.write_bytes(content)
    with pytest.raises(AudioError, match="garbage.wav"):
        load_audio(path)


def test_non_finite_samples_raise(tmp_path: Path) -> None:
    path = tmp_path / "nan.wav"
    audio = _tone(0.2, SAMPLE_RATE)
    audio[100] = np.nan
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    with pytest.raises(AudioError, match="nan.wav"):
        load_audio(path)


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_save_round_trips_atomically(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "out" / f"clip{suffix}"
    audio = _tone(0.5, SAMPLE_RATE)
    save_audio(path, audio)
    save_audio(path, audio * 0.5)  # overwriting goes through the same temp + rename
    assert os.listdir(path.parent) == [path.name]  # no temporary files left behind
    back = load_audio(path)
    np.testing.assert_allclose(back, audio * 0.5, atol=1.5 / 32768)
    assert sf.info(path).samplerate == SAMPLE_RATE and sf.info(path).subtype == "PCM_16"


def test_failed_save_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "clip.wav"
    save_audio(path, _tone(0.1, SAMPLE_RATE))
    before = path.read_bytes()
    with pytest.raises(AudioError):
        save_audio(path, np.full(100, np.nan, dtype=np.float32))
    with pytest.raises(sf.LibsndfileError):
        save_audio(path, _tone(0.1, SAMPLE_RATE), sample_rate=0)  # libsndfile refuses this rate
    assert os.listdir(tmp_path) == ["clip.wav"]
    assert path.read_bytes() == before  # the old file is untouched


def test_mel_configuration_is_the_hifigan_one() -> None:
    config = MelConfig()
    assert (
        config.sample_rate,
        config.n_fft,
        config.hop_length,
        config.win_length,
        config.n_mels,
        config.fmin,
        config.fmax,
    ) == (22_050, 1024, 256, 1024, 80, 0.0, 8000.0)


@pytest.mark.parametrize("samples", [1, 300, 512, 513, 1024, 22_050, 22_050 + 77])
def test_mel_shape(samples: int) -> None:
    mel = log_mel(np.random.default_rng(0).normal(0, 0.1, samples).astype(np.float32))
    assert mel.shape == (samples // 256 + 1, 80)
    assert mel.dtype == np.float32 and np.isfinite(mel).all()


def test_mel_batch_matches_single() -> None:
    audio = np.random.default_rng(1).normal(0, 0.1, (2, 5000)).astype(np.float32)
    module = MelSpectrogram()
    with torch.no_grad():
        batch = module(torch.from_numpy(audio)).numpy()
    assert batch.shape == (2, 5000 // 256 + 1, 80)
    np.testing.assert_allclose(batch[1], log_mel(audio[1]), atol=1e-5)


def test_mel_matches_librosa() -> None:
    rng = np.random.default_rng(2)
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.normal(size=t.size)).astype(np.float32)
    config = MelConfig()
    # pad_mode spelled out: librosa >= 0.10 pads with zeros by default, the mel module reflects.
    reference = librosa.feature.melspectrogram(
        y=audio,
        sr=config.sample_rate,
        n_fft=config.n_fft,
        hop_length=config.hop_length,
        win_length=config.win_length,
        window="hann",
        center=True,
        pad_mode="reflect",
        power=1.0,
        n_mels=config.n_mels,
        fmin=config.fmin,
        fmax=config.fmax,
        htk=False,
        norm="slaney",
    )
    reference = np.log(np.maximum(reference, config.log_floor)).T
    ours = log_mel(audio, config)
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=1e-4)


class _ReadCounter:
    """A binary file, seekable or a pipe, that remembers how far it was read."""

    def __init__(self, data: bytes, seekable: bool = True):
        import io

        self.file, self.furthest = io.BytesIO(data), 0
        if seekable:
            self.seek, self.tell = self.file.seek, self.file.tell

    def read(self, size: int = -1) -> bytes:
        chunk = self.file.read(size)
        self.furthest = max(self.furthest, self.file.tell())
        return chunk


def test_decoding_stops_at_the_bound_whatever_the_container_declares() -> None:
    """Ten minutes of quiet AAC is a few hundred kilobytes. Bounded to 30 s, it is refused from its declared
    duration when the file can be measured (before decoding any of it), and after decoding a little over 30 s
    when it streams from a pipe (no duration anywhere), having read a small part of it."""
    from chorus.audio.encode import encode_whole
    from chorus.audio.io import AudioTooLong, decode_with_av

    rate = 16_000
    quiet = 0.01 * np.random.default_rng(0).standard_normal(600 * rate).astype(np.float32)
    data = encode_whole(quiet, rate, "aac")
    whole = decode_with_av(_ReadCounter(data, seekable=False))
    assert whole is not None and len(whole[0]) / whole[1] > 590
    for seekable, seconds in ((True, (590, 700)), (False, (30, 40))):
        counter = _ReadCounter(data, seekable)
        with pytest.raises(AudioTooLong) as refused:
            decode_with_av(counter, max_seconds=30)
        assert seconds[0] < refused.value.seconds < seconds[1] and refused.value.bound == 30, seekable
        if not seekable:  # a measurable file may be read through for its duration, but is not decoded
            assert counter.furthest < 0.2 * len(data)
    short = decode_with_av(_ReadCounter(encode_whole(quiet[: 5 * rate], rate, "aac")), max_seconds=30)
    assert short is not None and 4.5 < len(short[0]) / short[1] < 5.5


def test_audio_writer_writes_each_chunk_as_it_comes_and_the_true_length_where_it_can(tmp_path: Path) -> None:
    """A WAV in a file this process opened gets its true sizes at close (Python's wave reads its frames);
    into a pipe it says "unknown length", unless its first write was also its last; FLAC goes whole into a
    pipe (through a temporary file) and as it comes into a file; each write is in the file when it returns."""
    import io
    import struct
    import wave

    from chorus.audio.encode import AudioStream, AudioWriter, encode_whole

    rate = 22_050
    chunks = [np.sin(np.linspace(0, 300 * k, rate // 2)).astype(np.float32) * 0.5 for k in (1, 2, 3)]
    path = tmp_path / "a.wav"
    with path.open("w+b") as file:
        writer = AudioWriter(file, "wav", rate, seekable=True)
        sizes = []
        for chunk in chunks:
            writer.write(chunk)
            sizes.append(path.stat().st_size)
        writer.close()
    assert sizes == [44 + rate, 44 + 2 * rate, 44 + 3 * rate]  # flushed as written, nothing held back
    with wave.open(str(path)) as read:
        assert read.getnframes() == 3 * (rate // 2)
    piped = io.BytesIO()
    writer = AudioWriter(piped, "wav", rate)
    for chunk in chunks:
        writer.write(chunk)
    writer.close()
    assert struct.unpack("<I", piped.getvalue()[40:44])[0] == 0xFFFFFFFF
    assert piped.getvalue()[44:] == path.read_bytes()[44:]
    assert encode_whole(chunks[0], rate, "wav") == AudioStream("wav", rate).write(chunks[0], last=True)
    one = io.BytesIO()
    writer = AudioWriter(one, "wav", rate)
    writer.write(chunks[0], last=True)
    writer.close()
    with wave.open(io.BytesIO(one.getvalue())) as read:
        assert read.getnframes() == rate // 2

    flac_pipe, flac_file = io.BytesIO(), tmp_path / "a.flac"
    writer = AudioWriter(flac_pipe, "flac", rate)
    with flac_file.open("w+b") as file:
        into_file = AudioWriter(file, "flac", rate, seekable=True)
        for chunk in chunks:
            writer.write(chunk)
            into_file.write(chunk)
        assert not flac_pipe.getvalue()  # a pipe gets FLAC whole, at close
        into_file.close()
    writer.close()
    expected = np.round(np.concatenate(chunks) * 32767) / 32767
    for data in (flac_pipe.getvalue(), flac_file.read_bytes()):
        audio, read_rate = sf.read(io.BytesIO(data), dtype="float32")
        assert read_rate == rate and np.allclose(audio, expected, atol=1e-4)
