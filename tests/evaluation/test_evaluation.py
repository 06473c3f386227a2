"""The judges of chorus.evaluation on hand-computed text examples, synthetic tones and real
synthesizer output (espeak-ng, flite) generated into temporary folders."""

from __future__ import annotations

import importlib.abc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.evaluation.asr import (
    WhisperJudge,
    char_error_rate,
    corpus_word_error_rate,
    normalize_for_scoring,
    word_error_rate,
    word_errors,
)
from chorus.evaluation.features import analyse_pair, dtw_path
from chorus.evaluation.mcd import mel_cepstral_distortion
from chorus.evaluation.naturalness import NaturalnessJudge, _torchaudio_for_import, load_distillmos
from chorus.evaluation.pitch import pitch_errors
from chorus.evaluation.rate import (
    count_phonemes,
    real_time_factor,
    speaking_rate,
    speech_duration,
)
from chorus.evaluation.report import (
    EvalItem,
    EvaluationError,
    Judges,
    evaluate_folder,
    evaluate_pairs,
)
from chorus.evaluation.similarity import SpeakerJudge, cosine_similarity

torch.set_num_threads(1)  # the encoder shares 2 cores with other work; 1 thread is also the fastest here

SENTENCE_A = "She bought 3 apples and a loaf of bread."
SENTENCE_B = "Please call me when you get home tonight."


# --- audio fixtures ---------------------------------------------------------------------------------


def _espeak(voice: str, text: str, path: Path) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
    return path


def _flite(voice: str, text: str, path: Path) -> Path:
    if shutil.which("flite") is None:
        pytest.skip("flite is not installed")
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(path)], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """Two sentences by espeak-ng en-us+m3, sentence A by en-us+f4, sentence A by flite rms."""
    folder = tmp_path_factory.mktemp("clips")
    return {
        "m3_a": _espeak("en-us+m3", SENTENCE_A, folder / "m3_a.wav"),
        "m3_b": _espeak("en-us+m3", SENTENCE_B, folder / "m3_b.wav"),
        "f4_a": _espeak("en-us+f4", SENTENCE_A, folder / "f4_a.wav"),
        "rms_a": _flite("rms", SENTENCE_A, folder / "rms_a.wav"),
    }


@pytest.fixture(scope="module")
def whisper() -> WhisperJudge:
    return WhisperJudge(cpu_threads=1)


@pytest.fixture(scope="module")
def speaker() -> SpeakerJudge:
    return SpeakerJudge()


def _tone(freq: float, seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """A sine at ``freq`` with noise 34 dB below it: harvest calls a mathematically pure tone unvoiced
    (its voicing test needs some aperiodic energy), which real voices always have."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return (0.5 * np.sin(2 * np.pi * freq * t) + 0.01 * noise).astype(np.float32)


# --- word and character error rates ----------------------------------------------------------------


def test_normalize_for_scoring_spells_out_and_strips():
    assert normalize_for_scoring("Dr. Smith's 2 cats, at 5 p.m.!") == "doctor smiths two cats at five p m"
    assert normalize_for_scoring("  Well-known   U.S.A.  ") == "well known usa"
    # the text keeps its accents for the phonemizer; a transcript may drop them
    assert normalize_for_scoring("A café in Zürich.") == normalize_for_scoring("a cafe in zurich") == "a cafe in zurich"


@pytest.mark.parametrize(
    ("reference", "hypothesis", "expected"),
    [
        ("the cat sat on the mat", "the cat sat on the mat", 0.0),
        ("the cat sat on the mat", "the cat sat on mat", 1 / 6),  # one deletion
        ("a b c d", "a x c d e", 2 / 4),  # one substitution, one insertion
        ("Hello, World!", "hello world", 0.0),  # case and punctuation do not count
        ("one two", "", 1.0),  # nothing recognized: every word deleted
        ("I have 3 cats.", "I have three cats", 0.0),  # numbers spelled out on the reference side...
        ("it costs five dollars", "It costs $5.", 0.0),  # ...and on the transcript side
        ("In 1990 we had 21 dogs", "in nineteen ninety we had twenty-one dogs", 0.0),
        ("I have 3 cats", "I have 4 cats", 1 / 4),  # "three" vs "four"
    ],
)
def test_word_error_rate(reference, hypothesis, expected):
    assert word_error_rate(reference, hypothesis) == pytest.approx(expected)


def test_char_error_rate():
    # kitten -> sitting: k->s, e->i, +g = 3 edits over 6 characters.
    assert char_error_rate("kitten", "sitting") == pytest.approx(3 / 6)
    # Spaces are characters: "ab cd" vs "abcd" is one deletion over 5.
    assert char_error_rate("ab cd", "abcd") == pytest.approx(1 / 5)
    assert char_error_rate("2", "two") == 0.0


def test_corpus_wer_weighs_by_reference_words():
    refs, hyps = ["a b", "c d e f"], ["a", "c d e f"]
    assert corpus_word_error_rate(refs, hyps) == pytest.approx(1 / 6)  # the mean of sentences would be 0.25
    assert word_errors("a b", "a").edits == 1


def test_empty_reference_is_an_error():
    with pytest.raises(ValueError, match="no words"):
        word_error_rate("?!", "hello")


# --- MCD and pitch ---------------------------------------------------------------------------------


def test_mcd_is_zero_to_itself_and_larger_to_another_voice(clips):
    m3 = load_audio(clips["m3_a"])
    f4 = load_audio(clips["f4_a"])
    assert mel_cepstral_distortion(m3, m3, SAMPLE_RATE, f0_method="dio") == pytest.approx(0.0, abs=1e-6)
    assert mel_cepstral_distortion(m3, f4, SAMPLE_RATE, f0_method="dio") > 5.0


@pytest.mark.parametrize("f0_method", ["harvest", "dio"])
def test_f0_rmse_of_150_vs_160_hz_tone(f0_method):
    errors = pitch_errors(_tone(150.0), _tone(160.0, seed=1), SAMPLE_RATE, f0_method=f0_method)
    assert errors.f0_rmse_hz == pytest.approx(10.0, abs=1.0)
    assert errors.voicing_error < 0.02
    assert errors.voiced_frames > 150  # most of the 200 frames of 5 ms


def test_alignment_path_spans_both_clips():
    synth, ref, alignment = analyse_pair(_tone(150.0), _tone(150.0, seconds=1.2, seed=1), SAMPLE_RATE, f0_method="dio")
    assert alignment.path[0].tolist() == [0, 0]
    assert alignment.path[-1].tolist() == [synth.frames - 1, ref.frames - 1]
    steps = np.diff(alignment.path, axis=0)
    assert np.all((steps >= 0) & (steps <= 1)) and np.all(steps.sum(axis=1) >= 1)


def test_dtw_path_follows_a_time_stretch():
    # A sequence against itself played at half speed: every frame i aligns with frames 2i and 2i+1.
    x = np.linspace(0.0, 1.0, 20)[:, None]
    stretched = np.repeat(x, 2, axis=0)
    path = dtw_path(np.abs(x - stretched.T))
    assert len(path) == 40
    assert np.all(path[:, 0] == path[:, 1] // 2)


def test_silence_or_too_short_audio_is_an_error():
    with pytest.raises(ValueError, match="too short"):
        mel_cepstral_distortion(np.zeros(SAMPLE_RATE, np.float32), _tone(150.0), SAMPLE_RATE)


# --- speaking rate ---------------------------------------------------------------------------------


def test_speech_duration_ignores_leading_and_trailing_silence():
    silence = np.zeros(SAMPLE_RATE // 2, np.float32)
    audio = np.concatenate([silence, _tone(150.0), silence])
    assert speech_duration(audio, SAMPLE_RATE) == pytest.approx(1.0, abs=0.1)


def test_speaking_rate_counts_spoken_words_and_phonemes():
    assert count_phonemes("Hello world.") == 8  # h ə l oʊ w ɜ l d
    rate = speaking_rate(_tone(150.0, seconds=2.0), "I have 42 cats.", SAMPLE_RATE)
    assert rate.words == 5  # i have forty two cats
    assert rate.words_per_second == pytest.approx(2.5, rel=0.05)
    assert rate.phonemes_per_second == pytest.approx(rate.phonemes / rate.speech_seconds)


def test_real_time_factor():
    assert real_time_factor(0.5, 2.0) == 0.25
    with pytest.raises(ValueError):
        real_time_factor(1.0, 0.0)


# --- model judges ----------------------------------------------------------------------------------


def test_speaker_similarity_separates_espeak_voices(clips, speaker):
    m3_a = speaker.embed(load_audio(clips["m3_a"]))
    m3_b = speaker.embed(load_audio(clips["m3_b"]))
    f4_a = speaker.embed(load_audio(clips["f4_a"]))
    assert m3_a.shape == (256,) and np.linalg.norm(m3_a) == pytest.approx(1.0, abs=1e-4)
    same_voice = speaker.similarity(m3_a, m3_b)  # different sentences
    other_voice = speaker.similarity(m3_a, f4_a)  # same sentence
    print(f"resemblyzer cosine: m3/m3 {same_voice:.3f}, m3/f4 {other_voice:.3f}")
    assert same_voice > other_voice + 0.1
    # Against the mean d-vector of reference clips, the clip's own voice wins as well.
    references = [load_audio(clips["m3_b"])]
    assert speaker.similarity_to_references(load_audio(clips["m3_a"]), references) > speaker.similarity_to_references(
        load_audio(clips["f4_a"]), references
    )
    assert cosine_similarity(m3_a, m3_a) == pytest.approx(1.0)


def test_whisper_transcribes_clean_speech(clips, whisper):
    # Clips at 22.05 (espeak) and 16 kHz (flite, resampled to 22.05 by load_audio) both work.
    for name, text in [("rms_a", SENTENCE_A), ("m3_b", SENTENCE_B)]:
        transcript = whisper.transcribe(load_audio(clips[name]), SAMPLE_RATE)
        wer = word_error_rate(text, transcript)
        print(f"whisper {name}: {transcript!r} WER {wer:.1%}")
        assert wer <= 0.2


# --- report and chorus eval ------------------------------------------------------------------------


def test_evaluate_folder_and_its_markdown_and_json(tmp_path, clips, whisper, speaker):
    audio_dir = tmp_path / "synth"
    audio_dir.mkdir()
    shutil.copy(clips["m3_a"], audio_dir / "a.wav")
    shutil.copy(clips["m3_b"], audio_dir / "b.wav")
    (audio_dir / "metadata.csv").write_text(f"a|{SENTENCE_A}\nb|{SENTENCE_B}\n")
    references = tmp_path / "real" / "wavs"  # LJSpeech layout; only "a" has a same-sentence clip
    references.mkdir(parents=True)
    shutil.copy(clips["f4_a"], references / "a.wav")
    shutil.copy(clips["rms_a"], references / "other.wav")

    judges = Judges(whisper=whisper, speaker=speaker, f0_method="dio")
    report = evaluate_folder(audio_dir, references=tmp_path / "real", judges=judges, progress=False)
    report.write(tmp_path / "out")

    assert [row.id for row in report.rows] == ["a", "b"]
    a, b = report.rows
    assert a.mcd_db is not None and a.mcd_db > 0 and a.voicing_error is not None
    assert b.mcd_db is None  # no reference of sentence b
    assert a.wer is not None and a.speaker_similarity is not None and 1.0 <= a.mos <= 5.0
    assert report.corpus_wer == pytest.approx((a.word_edits + b.word_edits) / (a.reference_words + b.reference_words))
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["summary"]["items"] == 2 and len(saved["rows"]) == 2
    assert saved["rows"][1]["mcd_db"] is None
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| corpus WER |" in markdown and "| mean MCD (dB) |" in markdown and "MCD dB" in markdown
    assert "| mean predicted MOS |" in markdown and saved["rows"][0]["mos"] == pytest.approx(a.mos)


def test_evaluate_pairs_on_arrays_with_rtf(tmp_path):
    items = [EvalItem(id="tone", audio=_tone(150.0), text="ah", reference=_tone(160.0, seed=1), synthesis_seconds=0.1)]
    report = evaluate_pairs(items, judges=Judges(whisper=None, speaker=None, f0_method="dio"), progress=False)
    row = report.rows[0]
    assert row.rtf == pytest.approx(0.1)
    assert row.f0_rmse_hz == pytest.approx(10.0, abs=1.0)
    assert report.corpus_wer is None and row.transcript is None
    assert report.means()["rtf"] == pytest.approx(0.1)
    assert "| tone |" in report.to_markdown()
    assert report.write(tmp_path / "only.json") == [tmp_path / "only.json"]
    assert json.loads((tmp_path / "only.json").read_text())["rows"][0]["id"] == "tone"


def test_missing_and_unreadable_files_are_named(tmp_path):
    audio_dir = tmp_path / "synth"
    audio_dir.mkdir()
    (audio_dir / "metadata.csv").write_text("gone|Hello there.\n")
    with pytest.raises(EvaluationError, match=r"gone\.wav: audio file not found"):
        evaluate_folder(audio_dir, judges=Judges(whisper=None, speaker=None))
    with pytest.raises(EvaluationError, match=r"nothing\.csv: metadata file not found"):
        evaluate_folder(audio_dir, metadata=tmp_path / "nothing.csv")

    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"not a wav file")
    with pytest.raises(EvaluationError, match=r"item 'x': .*broken\.wav: unreadable audio"):
        evaluate_pairs(
            [EvalItem(id="x", audio=broken, text="hi")], judges=Judges(whisper=None, speaker=None), progress=False
        )


def test_array_items_at_other_rates_are_resampled(tmp_path):
    # A 16 kHz array and a 16 kHz file of the same tone measure the same speech duration.
    tone_16k = _tone(150.0)[:16_000]
    path = tmp_path / "tone16k.wav"
    sf.write(path, tone_16k, 16_000)
    judges = Judges(whisper=None, speaker=None, reference=False)
    from_array = evaluate_pairs([EvalItem("a", tone_16k, "ah", sample_rate=16_000)], judges, progress=False)
    from_file = evaluate_pairs([EvalItem("f", path, "ah")], judges, progress=False)
    assert from_array.rows[0].audio_seconds == pytest.approx(1.0, abs=0.01)
    assert from_array.rows[0].speech_seconds == pytest.approx(from_file.rows[0].speech_seconds, abs=0.01)


# --- naturalness (distillmos) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def naturalness() -> NaturalnessJudge:
    return NaturalnessJudge()


def test_naturalness_ranks_a_recording_above_noise_and_hum(naturalness, clips):
    recording = naturalness.score(load_audio(clips["rms_a"]), SAMPLE_RATE)
    rng = np.random.default_rng(0)
    noise = naturalness.score(0.3 * rng.standard_normal(2 * SAMPLE_RATE).astype(np.float32), SAMPLE_RATE)
    hum = naturalness.score(_tone(150.0), SAMPLE_RATE)
    print(f"MOS: flite rms {recording:.2f}, noise {noise:.2f}, 150 Hz tone {hum:.2f}")
    assert 1.0 <= min(noise, hum) and max(noise, hum) < recording <= 5.0
    # 16 kHz in is the model's own rate; the same clip there scores the same up to resampling.
    at_16k = naturalness.score(load_audio(clips["rms_a"], 16_000), 16_000)
    assert at_16k == pytest.approx(recording, abs=0.1)
    with pytest.raises(ValueError, match="empty audio"):
        naturalness.score(np.zeros(0, dtype=np.float32))


def test_distillmos_imports_beside_a_torchaudio_that_cannot_load(monkeypatch):
    # What the pinned torch meets on the package index: a torchaudio whose library fails to load.
    class BrokenTorchaudio(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torchaudio":
                raise OSError("Could not load this library: _torchaudio.so")
            return None

    for name in [n for n in sys.modules if n == "torchaudio" or n.startswith(("torchaudio.", "distillmos"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [BrokenTorchaudio(), *sys.meta_path])
    with _torchaudio_for_import():
        import torchaudio

        with pytest.raises(ImportError, match="never needs it"):
            torchaudio.load("clip.wav")
    assert "torchaudio" not in sys.modules  # nothing after the import sees the placeholder
    model = load_distillmos()
    with torch.no_grad():
        assert 1.0 <= float(model(torch.zeros(1, 16_000) + 0.01 * torch.randn(1, 16_000))) <= 5.0


def test_without_distillmos_the_judges_say_how_to_get_it(monkeypatch):
    import chorus.evaluation.naturalness as naturalness_module
    import chorus.evaluation.report as report_module

    monkeypatch.setattr(report_module, "naturalness_available", lambda: False)
    with pytest.warns(UserWarning, match="no predicted MOS: pip install --no-deps"):
        judges = Judges(whisper=None, speaker=None)
    assert judges.naturalness is None
    report = evaluate_pairs([EvalItem("tone", _tone(150.0), "ah")], judges=judges, progress=False)
    assert report.rows[0].mos is None and "naturalness" not in report.settings
    monkeypatch.setattr(naturalness_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="scripts/install.sh"):
        load_distillmos()


def test_silence_gets_no_naturalness_score():
    """A researcher's probe: 1 s of zeros scored MOS 1.97, and counted in the mean; MOS is judged where speech is."""

    class Naturalness:  # the judge's interface; counts the clips it is asked to score
        scored = 0

        def score(self, audio, rate):
            Naturalness.scored += 1
            return 3.0

    judges = Judges(whisper=None, speaker=None, naturalness=Naturalness(), reference=False)
    items = [EvalItem(id="silent", audio=np.zeros(22_050, np.float32), text="Hello there.")]
    report = evaluate_pairs(items, judges=judges, progress=False)
    assert report.rows[0].speech_seconds == 0 and report.rows[0].mos is None and Naturalness.scored == 0
    assert "mos" not in report.means() and report.summary()["items_without_speech"] == 1
    assert "| items without speech (no MOS) | 1 |" in report.to_markdown()
