"""The offline corpus recipe: speaker registry, sentence text, and a tiny real build."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from chorus.corpus.build import (
    CorpusSummary,
    Requirement,
    RequirementsError,
    build_corpus,
    check_requirements,
    missing_requirements,
    record_sentences,
    select_sentences,
    trim_and_normalize,
)
from chorus.corpus.speakers import SPEAKERS, get_speaker, heldout_speakers, pretraining_speakers
from chorus.corpus.text import (
    TEXT_DIR,
    benchmark_sentences,
    sentence_key,
    training_sentences,
)
from chorus.data.formats import read_metadata
from chorus.synthesis import ASSETS

HELDOUT = {"piper-joe", "flite-slt", "festival-ked"}


def test_registry_has_enough_distinct_pretraining_speakers() -> None:
    names = [speaker.name for speaker in SPEAKERS]
    assert len(names) == len(set(names))
    assert len(pretraining_speakers()) >= 24
    assert all(speaker.utterances > 0 for speaker in SPEAKERS)
    assert {speaker.engine for speaker in pretraining_speakers()} >= {"espeak", "flite", "festival"}
    assert {speaker.gender for speaker in pretraining_speakers()} == {"male", "female"}
    for speaker in SPEAKERS:
        assert speaker.name.replace("-", "").isalnum(), f"{speaker.name}: not safe as a folder name"


def test_heldout_speakers_are_exactly_joe_slt_ked_and_never_derived_from() -> None:
    assert {speaker.name for speaker in heldout_speakers()} == HELDOUT
    heldout_sources = {(v.engine, v.engine_voice) for v in heldout_speakers()}
    for speaker in pretraining_speakers():
        assert speaker.derived_from not in HELDOUT
        # No pretraining speaker may be a held-out engine voice under another name or a sox chain.
        assert (speaker.engine, speaker.engine_voice) not in heldout_sources, speaker.name
    for speaker in SPEAKERS:
        if speaker.derived_from:
            base = get_speaker(speaker.derived_from)
            assert not base.heldout and speaker.sox
            assert (base.engine, base.engine_voice) == (speaker.engine, speaker.engine_voice)
    assert all(speaker.split == "heldout" for speaker in heldout_speakers())


@pytest.mark.parametrize("split", ["vocoder", "encoder", "natural"])
def test_derived_speakers_never_read_a_heldout_clip_of_their_source(split) -> None:
    from chorus.corpus.speakers import ENCODER_SPEAKERS, NATURAL_SPEAKERS, VOCODER_SPEAKERS

    derived = {"vocoder": VOCODER_SPEAKERS, "encoder": ENCODER_SPEAKERS, "natural": NATURAL_SPEAKERS}[split]
    assert derived and all(speaker.split == split for speaker in derived)
    assert not {speaker.name for speaker in derived} & {speaker.name for speaker in SPEAKERS}
    for speaker in derived:
        source = get_speaker(speaker.derived_from)
        assert source.heldout and speaker.sox and get_speaker(speaker.name) == speaker
        held = {text for _, text in select_sentences(source, source.utterances)}
        assert not held & {text for _, text in select_sentences(speaker, speaker.utterances)}
    # The shipped adaptation sample of piper-joe is among its held-out clips, so out of vocoder training too.
    joe = get_speaker("piper-joe")
    lines = (ASSETS / "samples" / "piper-joe" / "metadata.csv").read_text(encoding="utf-8").splitlines()
    sample = {line.split("|")[0] for line in lines}
    assert sample and sample <= {clip_id for clip_id, _ in select_sentences(joe, joe.utterances)}


def test_clear_speakers_outweigh_espeak() -> None:
    espeak = [v.utterances for v in pretraining_speakers() if v.engine == "espeak"]
    assert get_speaker("flite-rms").utterances > max(espeak)
    assert get_speaker("festival-kal").utterances > max(espeak)


def test_benchmark_sentences_are_excluded_from_all_training_text() -> None:
    benchmark = benchmark_sentences()
    assert len(benchmark) == 20 and len(set(benchmark)) == 20
    harvard = (TEXT_DIR / "harvard_sentences.txt").read_text(encoding="utf-8").splitlines()
    assert set(benchmark) <= set(harvard)
    reserved = {sentence_key(text) for text in benchmark}
    rows = training_sentences()
    assert not reserved & {sentence_key(text) for _, text in rows}
    assert len({utt_id for utt_id, _ in rows}) == len(rows)
    # And so from every speaker's selection, whatever its size.
    for speaker in SPEAKERS:
        assert not reserved & {sentence_key(text) for _, text in select_sentences(speaker, speaker.utterances)}


def test_training_text_is_short_and_large_enough() -> None:
    rows = training_sentences()
    assert len(rows) > 5000
    assert all(len(text) <= 90 and len(text.split()) <= 14 for _, text in rows)
    assert sum(path.stat().st_size for path in TEXT_DIR.iterdir()) < 2_000_000
    assert (TEXT_DIR / "SOURCE.txt").is_file()


def test_selection_is_deterministic_differs_per_speaker_and_extends() -> None:
    rms, awb = get_speaker("flite-rms"), get_speaker("flite-awb")
    assert select_sentences(rms, 50) == select_sentences(rms, 50)
    assert select_sentences(rms, 50) == select_sentences(rms, 100)[:50]
    assert {t for _, t in select_sentences(rms, 50)} != {t for _, t in select_sentences(awb, 50)}


def test_trim_and_normalize_keeps_a_tenth_of_a_second_of_silence() -> None:
    rate = 22_050
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(rate) / rate).astype(np.float32)
    audio = np.concatenate([np.zeros(rate), tone, np.zeros(rate // 2)]).astype(np.float32)
    out = trim_and_normalize(audio, rate)
    assert out is not None
    assert abs(out.size / rate - 1.2) < 0.03
    assert abs(np.abs(out).max() - 0.9) < 1e-3
    assert trim_and_normalize(np.zeros(rate, np.float32), rate) is None


def test_missing_requirements_are_reported_with_the_apt_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("chorus.corpus.build.shutil.which", lambda name: None)
    missing = missing_requirements([get_speaker("flite-rms-up350")])
    assert Requirement("binary flite", "flite", "apt") in missing
    assert Requirement("binary sox", "sox", "apt") in missing
    with pytest.raises(RequirementsError, match="apt-get install -y flite sox"):
        check_requirements([get_speaker("flite-rms-up350")])


def _need(*binaries: str) -> None:
    for binary in binaries:
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} is not installed (apt-get install -y {binary})")


TINY_SPEAKERS = ("espeak-us-m3", "flite-rms-up350", "festival-kal")


@pytest.fixture
def tiny_speakers():
    _need("espeak-ng", "flite", "festival", "sox")
    if missing_requirements([get_speaker(name) for name in TINY_SPEAKERS]):
        pytest.skip(f"missing: {missing_requirements([get_speaker(name) for name in TINY_SPEAKERS])}")
    # utterances 30 at scale 0.1: three clips each.
    return [replace(get_speaker(name), utterances=30) for name in TINY_SPEAKERS]


def _build(out: Path, speakers) -> CorpusSummary:
    return build_corpus(out, utterances_scale=0.1, jobs=1, speakers=speakers, progress=False)


def test_tiny_build_writes_layout_metadata_and_voices_json(tmp_path: Path, tiny_speakers) -> None:
    summary = _build(tmp_path, tiny_speakers)
    assert summary.clips == summary.written == 9 and summary.failed == 0
    document = json.loads((tmp_path / "voices.json").read_text())
    assert set(document["voices"]) == set(TINY_SPEAKERS)
    for speaker in tiny_speakers:
        folder = tmp_path / "train" / speaker.name
        utterances, problems = read_metadata(folder, speaker=speaker.name)
        assert not problems and len(utterances) == 3
        record = document["voices"][speaker.name]
        assert record["clips"] == 3 and record["path"] == f"train/{speaker.name}" and not record["heldout"]
        assert record["sox"] == list(speaker.sox) and record["minutes"] > 0
        for utterance in utterances:
            assert utterance.text and "|" not in utterance.text
            info = sf.info(str(utterance.audio_path))
            assert (info.samplerate, info.channels, info.subtype) == (22_050, 1, "PCM_16")
            audio, _ = sf.read(str(utterance.audio_path), dtype="float32")
            assert 0.8 < np.abs(audio).max() < 0.95
            assert 0.8 < info.duration < 10
            assert np.abs(audio[:2000]).max() < 0.05  # starts with trimmed silence, not speech
    assert not list(tmp_path.glob("heldout/*"))


def test_second_build_writes_nothing_new(tmp_path: Path, tiny_speakers) -> None:
    first = _build(tmp_path, tiny_speakers)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("train/*/wavs/*.wav")}
    second = _build(tmp_path, tiny_speakers)
    assert second.written == 0 and second.clips == first.clips
    assert all(v.skipped == 3 for v in second.speakers)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("train/*/wavs/*.wav")} == stamps


def test_heldout_speaker_goes_to_its_own_folder(tmp_path: Path) -> None:
    _need("flite")
    summary = build_corpus(tmp_path, speakers=[replace(get_speaker("flite-slt"), utterances=2)], jobs=1, progress=False)
    assert summary.speakers[0].split == "heldout" and summary.clips == 2
    assert len(list((tmp_path / "heldout" / "flite-slt" / "wavs").glob("*.wav"))) == 2
    assert not (tmp_path / "train").exists() or not any((tmp_path / "train").iterdir())


def test_recorded_sentences_match_what_the_corpus_build_writes(tmp_path: Path, tiny_speakers) -> None:
    speaker = tiny_speakers[1]  # flite through a sox chain: every step of the recipe
    build_corpus(tmp_path, speakers=[speaker], jobs=1, progress=False)
    utterances, _ = read_metadata(tmp_path / "train" / speaker.name, speaker=speaker.name)
    recorded = record_sentences(speaker, [u.text for u in utterances])
    for utterance, audio in zip(utterances, recorded, strict=True):
        written, _ = sf.read(str(utterance.audio_path), dtype="float32")
        # Sample for sample: sox runs in repeatable mode (a fixed dither seed), so nothing is random.
        np.testing.assert_array_equal(audio, written)
    with pytest.raises(RuntimeError):
        record_sentences(replace(speaker, sox=("no-such-effect",)), ["Hello."])


def test_a_folder_whose_voices_json_is_not_a_corpus_is_refused_before_any_clip(tmp_path: Path) -> None:
    """A researcher's probe: a voices.json not Chorus's was overwritten, and an unreadable one ended the build
    after every clip had been made."""
    _need("flite")
    speaker = [replace(get_speaker("flite-rms"), utterances=1)]
    for contents in ('{"foo": 1}', "not json", '{"voices": {"x": 3}}'):
        (tmp_path / "voices.json").write_text(contents)
        with pytest.raises(ValueError, match="not a corpus's voices.json"):
            build_corpus(tmp_path, speakers=speaker, jobs=1, progress=False)
        assert (tmp_path / "voices.json").read_text() == contents and not list(tmp_path.glob("*/*/wavs/*.wav"))


def test_corpus_build_says_user_errors_in_a_line_and_fails_when_nothing_was_written(tmp_path: Path, monkeypatch):
    """Repeated speakers and an OUT that is a file were tracebacks; a build whose every clip failed (a full disk:
    libsndfile says only 'System error.') exited 0."""
    from typer.testing import CliRunner

    import chorus.corpus.build as build
    from chorus.cli import app

    _need("flite")
    runner = CliRunner()
    repeated = runner.invoke(app, ["corpus", "build", str(tmp_path / "a"), "--speakers", "flite-rms,flite-rms"])
    assert repeated.exit_code == 2 and "speaker names repeat" in repeated.output and "Traceback" not in repeated.output
    (tmp_path / "file").write_text("")
    a_file = runner.invoke(app, ["corpus", "build", str(tmp_path / "file"), "--speakers", "flite-rms"])
    assert a_file.exit_code == 2 and "Traceback" not in a_file.output, a_file.output

    def full_disk(path, audio, *args, **kwargs):
        raise RuntimeError("Error opening 'x.wav': System error.")

    monkeypatch.setattr(build, "save_audio", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=10_000))
    failed = runner.invoke(
        app,
        ["corpus", "build", str(tmp_path / "b"), "--speakers", "flite-rms", "--scale", "0.01", "--jobs", "1"],
        env={"COLUMNS": "200"},
    )
    assert failed.exit_code == 2 and "no clip was written" in failed.output, failed.output
    assert "on a disk with 0.0 MB free" in failed.output
    # A rebuild whose one missing clip fails again is no failure: the rest is there (resume_base.sh goes on)
    monkeypatch.undo()
    built = runner.invoke(app, ["corpus", "build", str(tmp_path / "c"), "--speakers", "flite-rms", "--scale", "0.01"])
    assert built.exit_code == 0, built.output
    next((tmp_path / "c").glob("train/flite-rms/wavs/*.wav")).unlink()
    monkeypatch.setattr(build, "save_audio", full_disk)
    again = runner.invoke(
        app, ["corpus", "build", str(tmp_path / "c"), "--speakers", "flite-rms", "--scale", "0.01", "--jobs", "1"]
    )
    assert again.exit_code == 0 and "System error" in again.output, again.output


def test_natural_speakers_are_voices_no_other_split_trains_on() -> None:
    """A base pretrained on ``natural/`` hears none of the vocoder's or the speaker encoder's own voices."""
    from chorus.corpus.speakers import ENCODER_SPEAKERS, NATURAL_SPEAKERS, VOCODER_SPEAKERS

    chains = [speaker.sox for speaker in NATURAL_SPEAKERS]
    assert len(set(chains)) == len(chains) == 12
    assert not set(chains) & {speaker.sox for speaker in (*VOCODER_SPEAKERS, *ENCODER_SPEAKERS)}
