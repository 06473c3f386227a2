"""Dataset validation: each kind of problem is found, with the right file and line, and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from typer.testing import CliRunner

from chorus.cli import app
from chorus.data.check import (
    NARROW_BAND_DB,
    PROBLEM_KINDS,
    CheckConfig,
    DatasetReport,
    check_dataset,
    speech_seconds,
    upper_band_db,
)
from chorus.evaluation.transcripts_heard import not_heard
from chorus.text import TextFrontEnd

runner = CliRunner()
SENTENCE = "Printing, in the only sense with which we are at present concerned, differs from most arts."
RATE = 22_050


@pytest.fixture(scope="module")
def bad_dataset(
    tmp_path_factory: pytest.TempPathFactory,
    speech: Callable[[str, Path], Path],
    metadata: Callable[[Path, list[str]], Path],
) -> tuple[Path, dict[str, str]]:
    """A folder of two speakers: "alice" is clean, "bob" has one utterance per problem kind.

    Returns the root and, for bob, the expected ``{kind: source}``.
    """
    speak, write_metadata = speech, metadata
    root = tmp_path_factory.mktemp("check") / "voices"
    alice, bob = root / "alice", root / "bob"
    write_metadata(alice, [f"a1|{SENTENCE}", "a2|Good morning, how are you today?"])
    speak(SENTENCE, alice / "wavs" / "a1.wav")
    speak("Good morning, how are you today?", alice / "wavs" / "a2.wav")
    speech, _ = sf.read(alice / "wavs" / "a1.wav", dtype="float32")
    wavs = bob / "wavs"
    shutil.copytree(alice / "wavs", wavs)  # b-good below reuses a1.wav under its own name

    def wav(name: str, audio: np.ndarray, rate: int = RATE, subtype: str = "PCM_16") -> None:
        sf.write(wavs / f"{name}.wav", audio, rate, subtype=subtype)

    shutil.copy(wavs / "a1.wav", wavs / "good.wav")
    (wavs / "garbage.wav").write_bytes(b"this is not audio at all" * 50)
    nan = speech.copy()
    nan[1000] = np.nan
    wav("nan", nan, subtype="FLOAT")
    wav("empty", np.zeros(0, dtype=np.float32))
    for name in ("emptytext", "unspeakable", "wrongtext"):
        shutil.copy(wavs / "a1.wav", wavs / f"{name}.wav")
    wav("clipped", np.clip(speech * 4, -1, 1))
    wav("silent", np.zeros(2 * RATE, dtype=np.float32))
    wav("short", speech[: int(0.2 * RATE)])
    wav("long", np.concatenate([speech, np.zeros(20 * RATE, dtype=np.float32)]))
    wav("lowrate", soxr.resample(speech, RATE, 8000), rate=8000)
    lines = [
        f"good|{SENTENCE}",  # 1
        "this line has no separator",  # 2 metadata
        f"missing|{SENTENCE}",  # 3 missing_audio
        f"garbage|{SENTENCE}",  # 4 unreadable_audio
        f"nan|{SENTENCE}",  # 5 unreadable_audio (NaN samples)
        f"empty|{SENTENCE}",  # 6 empty_audio
        "emptytext|",  # 7 empty_text
        "unspeakable|☺ ☺ ☺",  # 8 unspeakable_text
        f"clipped|{SENTENCE}",  # 9 clipped
        f"silent|{SENTENCE}",  # 10 silent
        "short|Printing.",  # 11 too_short
        f"long|{SENTENCE}",  # 12 too_long
        f"lowrate|{SENTENCE}",  # 13 low_sample_rate
        "wrongtext|Hi.",  # 14 text_length: five seconds of speech for one syllable
        f"good|{SENTENCE}",  # 15 metadata: duplicate id
    ]
    meta = write_metadata(bob, lines)
    expected = {
        "metadata": f"{meta}:2",
        "missing_audio": f"{meta}:3",
        "unreadable_audio": str(wavs / "garbage.wav"),
        "empty_audio": str(wavs / "empty.wav"),
        "empty_text": f"{meta}:7",
        "unspeakable_text": f"{meta}:8",
        "clipped": str(wavs / "clipped.wav"),
        "silent": str(wavs / "silent.wav"),
        "too_short": str(wavs / "short.wav"),
        "too_long": str(wavs / "long.wav"),
        "low_sample_rate": str(wavs / "lowrate.wav"),
        "text_length": f"{meta}:14",
    }
    return root, expected


@pytest.fixture(scope="module")
def bad_report(bad_dataset: tuple[Path, dict[str, str]]) -> DatasetReport:
    return check_dataset(bad_dataset[0], progress=False)


def test_clean_dataset_has_no_problems(lj_dataset: Path) -> None:
    report = check_dataset(lj_dataset, progress=False)
    assert report.ok, report.problems
    assert report.valid_utterances() == report.utterances and len(report.utterances) == 3
    speaker = report.speakers["ljs"]
    assert (speaker.clips, speaker.valid_clips) == (3, 3)
    assert 0.1 < speaker.minutes == speaker.valid_minutes < 1
    assert "no problems" in report.summary()


def test_silence_before_and_after_speech_is_not_counted_as_speech(tmp_path: Path, speech) -> None:
    """Speech is what a voice-activity detector hears: a spoken sentence between 2 s of room tone (-70 dBFS) and
    3 s of digital silence, or between a laptop's room noise and the clicks of a recording starting and stopping,
    holds the sentence's speech, in what uploads are held to and in the report's minutes; a tone, a hum or a
    square wave hold none, however loud."""
    rng = np.random.default_rng(0)
    spoken, rate = sf.read(speech("Hello there.", tmp_path / "spoken.wav"), dtype="float32")
    alone = speech_seconds(spoken, rate)
    assert 0.5 < alone <= len(spoken) / rate + 0.05
    padded = np.concatenate([10 ** (-70 / 20) * rng.standard_normal(2 * rate), spoken, np.zeros(3 * rate)])
    assert speech_seconds(padded, rate) == pytest.approx(alone, abs=0.1)
    noise = 10 ** (-50 / 20) * rng.standard_normal(3 * rate)
    click = np.zeros(3 * rate)
    click[rate // 10 : rate // 10 + rate // 50] = 10 ** (-27 / 20) * np.sqrt(2) * np.sin(np.arange(rate // 50))
    assert speech_seconds(np.concatenate([noise + click, spoken, noise + click[::-1]]), rate) == pytest.approx(
        alone, abs=0.1
    )
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(rate) / rate)
    flat = np.full(2 * rate, 0.1) * np.sign(np.sin(np.arange(2 * rate)))
    assert speech_seconds(tone, rate) == speech_seconds(flat, rate) == speech_seconds(np.zeros(rate), rate) == 0.0
    (tmp_path / "wavs").mkdir()
    sf.write(tmp_path / "wavs" / "a.wav", padded.astype(np.float32), rate)
    sf.write(tmp_path / "wavs" / "flat.wav", flat.astype(np.float32), rate)
    (tmp_path / "metadata.csv").write_text("a|Hello there.\nflat|Hello there, hello there.\n")
    report = check_dataset(tmp_path, progress=False)
    assert report.with_problems([]) == report  # nothing found after it: the same report
    assert [(Path(p.source).name, p.kind) for p in report.problems] == [("flat.wav", "no_speech")]
    speaker = next(iter(report.speakers.values()))
    assert speaker.valid_seconds == pytest.approx(5 + len(spoken) / rate, abs=0.01)
    assert speaker.valid_speech_seconds == pytest.approx(alone, abs=0.1)
    assert report.speech_durations[report.utterances[0].key] == speaker.valid_speech_seconds
    assert "0.1 min usable, 0.0 min of it speech" in report.summary()
    assert "| Speech minutes |" in report.to_markdown()


def test_listen_flags_transcripts_of_the_right_length_but_other_words(tmp_path: Path, metadata) -> None:
    """Two lines of metadata.csv swapped: each transcript fits its clip's length, so only listening finds them."""
    if shutil.which("flite") is None:
        pytest.skip("needs Debian flite")
    sentences = [
        "The birch canoe slid on the smooth planks.",
        "Glue the sheet to the dark blue background.",
        "It is easy to tell the depth of a well.",
        "These days a chicken leg is a rare dish.",
    ]
    (tmp_path / "wavs").mkdir()
    for number, text in enumerate(sentences):  # flite's rms: a clear voice, as people's recordings are
        subprocess.run(
            ["flite", "-voice", "rms", "-t", text, "-o", str(tmp_path / "wavs" / f"c{number}.wav")], check=True
        )
    said = [f"c{n}|{text}" for n, text in enumerate(sentences)]
    metadata(tmp_path, [said[0], said[1], f"c2|{sentences[3]}", f"c3|{sentences[2]}"])
    report = check_dataset(tmp_path, progress=False)
    assert report.ok  # the length check passes them all
    flagged = not_heard(report)
    assert sorted(p.utterance.id for p in flagged) == ["c2", "c3"]
    assert all(p.kind == "transcript_not_heard" and "Whisper does not hear" in p.message for p in flagged)
    assert report.with_problems(flagged).speakers[report.utterances[0].speaker].valid_clips == 2
    listened = runner.invoke(app, ["data", "check", str(tmp_path), "--listen"])
    assert listened.exit_code == 1 and "2 transcript_not_heard" in " ".join(listened.output.split())
    metadata(tmp_path, said)
    mended = runner.invoke(app, ["data", "check", str(tmp_path), "--listen"])
    said_back = " ".join(mended.output.split())
    assert mended.exit_code == 0 and "no problems" in said_back
    assert "Whisper heard the transcript of each of the 4 usable clips" in said_back
    assert "Too little for `chorus adapt`" in said_back and "record more clips" in said_back  # 4 clips, ~10 s
    # A clip with no line in the metadata is named, not silently left out (the same probe).
    sf.write(tmp_path / "wavs" / "forgotten.wav", np.zeros(22050, dtype=np.float32), 22050)
    forgotten = " ".join(runner.invoke(app, ["data", "check", str(tmp_path)]).output.split())
    assert "1 audio file(s) beside the clips have no line in the metadata and are not used: forgotten.wav" in forgotten
    (tmp_path / "wavs" / "forgotten.wav").unlink()
    # A subset made of links (data.subsets) is read as its own folder, not the corpus's (a review)
    linked = tmp_path.parent / f"{tmp_path.name}-linked"
    (linked / "wavs").mkdir(parents=True)
    (linked / "wavs" / "c0.wav").symlink_to(tmp_path / "wavs" / "c0.wav")
    metadata(linked, said[:1])
    assert "unlisted" not in check_dataset(linked, progress=False).warning_notes()
    # A line left for Whisper (`id|`) is no fault, and had turned the check for too little speech off; a long
    # clip adapt refuses (recorded at 8 kHz) adds nothing to what it trains on.
    long_call = np.sin(2 * np.pi * 180 * np.arange(60 * 8000) / 8000) * (np.arange(60 * 8000) % 8000 < 6000)
    sf.write(tmp_path / "wavs" / "c9.wav", (0.3 * long_call).astype(np.float32), 8000)
    metadata(tmp_path, [*said[:3], "c3|", f"c9|{sentences[0]}"])
    untranscribed = " ".join(runner.invoke(app, ["data", "check", str(tmp_path)]).output.split())
    assert "Lines with no text (id|)" in untranscribed and "Too little for `chorus adapt`" in untranscribed


def test_each_problem_kind_is_found_where_it_is(
    bad_dataset: tuple[Path, dict[str, str]], bad_report: DatasetReport
) -> None:
    root, expected = bad_dataset
    found = {(p.kind, p.source) for p in bad_report.problems}
    for kind, source in expected.items():
        assert (kind, source) in found, f"{kind} at {source} not reported; got {sorted(found)}"
    meta = root / "bob" / "metadata.csv"
    assert ("metadata", f"{meta}:15") in found  # the duplicate id
    assert ("unreadable_audio", str(root / "bob" / "wavs" / "nan.wav")) in found
    assert all(p.kind in PROBLEM_KINDS and p.message for p in bad_report.problems)
    # The clipped, too short, long and low-rate clips hold the right words: no text_length for them.
    assert sum(p.kind == "text_length" for p in bad_report.problems) == 1


def test_good_clips_stay_valid(bad_report: DatasetReport) -> None:
    assert [u.key for u in bad_report.valid_utterances()] == ["alice/a1", "alice/a2", "bob/good"]
    alice, bob = bad_report.speakers["alice"], bad_report.speakers["bob"]
    assert (alice.clips, alice.valid_clips, alice.problems) == (2, 2, [])
    assert (bob.clips, bob.valid_clips) == (13, 1)  # the two bad lines are no utterances
    assert bob.valid_seconds < bob.seconds
    assert bad_report.durations["bob/good"] == pytest.approx(sf.info(bad_report.utterances[2].audio_path).duration)


def test_threads_give_the_same_report(bad_dataset: tuple[Path, dict[str, str]], bad_report: DatasetReport) -> None:
    again = check_dataset(bad_dataset[0], progress=False, jobs=2)
    assert again.problems == bad_report.problems
    assert again.speakers == bad_report.speakers


def test_thresholds_are_configurable(lj_dataset: Path) -> None:
    report = check_dataset(lj_dataset, progress=False, config=CheckConfig(max_seconds=4.0))
    assert {p.kind for p in report.problems} == {"too_long"}
    assert len(report.valid_utterances()) == 1  # only the three-second clip is short enough


def test_phonemizer_failure_is_a_problem(lj_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = TextFrontEnd.to_phonemes

    def flaky(self: TextFrontEnd, texts: list[str]) -> list[str]:
        if any("Smith" in t for t in texts):
            raise RuntimeError("espeak fell over")
        return original(self, texts)

    monkeypatch.setattr(TextFrontEnd, "to_phonemes", flaky)
    report = check_dataset(lj_dataset, progress=False)
    assert [(p.kind, p.source) for p in report.problems] == [("text_error", f"{lj_dataset / 'metadata.csv'}:2")]
    assert "espeak fell over" in report.problems[0].message
    assert len(report.valid_utterances()) == 2


def test_no_dataset_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    report = check_dataset(tmp_path / "missing", progress=False)
    assert [p.kind for p in report.problems] == ["format"] and report.valid_utterances() == []
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "metadata.csv").write_text("\n\n", encoding="utf-8")
    report = check_dataset(tmp_path / "blank", progress=False)
    assert [p.kind for p in report.problems] == ["empty_dataset"]


@pytest.mark.parametrize(
    ("encoding", "detail"),
    [("utf-16", "UTF-16"), ("latin-1", "byte 0xe9 at 8"), ("utf-16-le", "NUL characters: UTF-16?")],
)
def test_a_metadata_file_not_in_utf8_is_named_not_a_crash(tmp_path: Path, encoding: str, detail: str) -> None:
    """Spreadsheets save UTF-16 or Latin-1: the check names the file and what to do, as adapt does."""
    folder = tmp_path / "voice"
    (folder / "wavs").mkdir(parents=True)
    sf.write(folder / "wavs" / "a.wav", np.zeros(22050, np.float32), 22050)
    text = "a|A coffee.\n" if encoding == "utf-16-le" else "a|Un café au lait.\n"  # utf-16-le: no byte-order mark
    (folder / "metadata.csv").write_text(text, encoding=encoding)
    named = f"{folder / 'metadata.csv'}: not UTF-8 text ({detail}); save it as UTF-8"
    assert [p.message for p in check_dataset(folder, progress=False).problems] == [named]
    checked = runner.invoke(app, ["data", "check", str(folder)])
    assert checked.exit_code == 1 and isinstance(checked.exception, SystemExit), checked.exception  # no crash
    adapted = runner.invoke(app, ["adapt", str(folder), "--out", str(tmp_path / "v")])
    assert adapted.exit_code == 2 and named in " ".join(adapted.output.split()), adapted.output


def test_problems_say_what_to_do_about_them(lj_dataset: Path) -> None:
    """A stereo clip whose channels cancel in the mono mix, a clip recorded far too quietly, clips left beside
    metadata.csv instead of in wavs/, and a clip saved as .WAV (found as it is)."""
    wavs = sorted((lj_dataset / "wavs").glob("*.wav"))
    audio, rate = sf.read(wavs[0], dtype="float32")
    sf.write(wavs[0], np.stack([audio, -audio], axis=1), rate)
    quiet, rate = sf.read(wavs[1], dtype="float32")
    quiet *= 10 ** (-47 / 20) / np.abs(quiet).max()
    sf.write(wavs[1], np.stack([quiet, quiet], axis=1), rate)  # a stereo clip, quiet in both channels alike
    wavs[2].rename(wavs[2].with_suffix(".WAV"))
    messages = {Path(p.source).name: p.message for p in check_dataset(lj_dataset, progress=False).problems}
    assert messages.keys() == {wavs[0].name, wavs[1].name}, messages
    assert messages[wavs[0].name].endswith(
        "mixed to mono: its channels cancel (one is the other inverted?); export one channel"
    )
    assert messages[wavs[1].name].endswith("if it holds speech, raise its level (normalize it)")
    for wav in (lj_dataset / "wavs").iterdir():
        wav.rename(lj_dataset / wav.name)
    missing = [p.message for p in check_dataset(lj_dataset, progress=False).problems]
    assert len(missing) == 3 and all("move the clips into wavs/)" in m for m in missing), missing


def test_a_clip_is_found_under_either_unicode_form_of_its_id(lj_dataset: Path) -> None:
    """A folder copied from macOS names "café.wav" with "e" and an accent (NFD); the metadata, typed in an editor,
    writes "é" as one character (NFC): the clip is found, as it is the other way round."""
    wavs = sorted((lj_dataset / "wavs").glob("*.wav"))
    lines = (lj_dataset / "metadata.csv").read_text().splitlines()
    for wav, written, named in zip(wavs[:2], ("NFC", "NFD"), ("NFD", "NFC"), strict=False):
        wav.rename(wav.with_name(unicodedata.normalize(named, f"café-{written}.wav")))
        lines = [
            unicodedata.normalize(written, f"café-{written}") + line[len(wav.stem) :]
            if line.startswith(wav.stem + "|")
            else line
            for line in lines
        ]
    (lj_dataset / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = check_dataset(lj_dataset, progress=False)
    assert report.ok and len(report.valid_utterances()) == 3, report.problems


def test_clips_with_nothing_above_4_khz_are_warned_of_not_refused(lj_dataset: Path) -> None:
    """Clips resampled to 8 kHz and back (a phone recording exported at 16 kHz) train a muffled voice: said by the
    check, which still takes them (the corpus has an 8 kHz voice of its own); whole-band clips are not."""
    assert check_dataset(lj_dataset, progress=False).narrow_band_note() is None
    for wav in (lj_dataset / "wavs").glob("*.wav"):
        audio, rate = sf.read(wav, dtype="float32")
        sf.write(wav, soxr.resample(soxr.resample(audio, rate, 8000), 8000, 16000), 16000, subtype="PCM_16")
    report = check_dataset(lj_dataset, progress=False)
    assert report.ok and report.narrow_band_note().startswith("3 of the 3 usable clips hold nothing above 4.2 kHz")
    checked = runner.invoke(app, ["data", "check", str(lj_dataset)])
    assert checked.exit_code == 0 and "recorded through a phone line" in " ".join(checked.output.split())


def test_a_tone_music_or_noise_is_no_speech(lj_dataset: Path) -> None:
    """Energy alone counts a tone, a chord or steady noise as speech; the voice-activity detector hears none in
    them, and the check leaves them out, saying what it heard. The spoken clips stay."""
    rng = np.random.default_rng(0)
    t = np.arange(2 * RATE) / RATE
    sounds = {
        "tone": np.sin(2 * np.pi * 220 * t),
        "chord": sum(np.sin(2 * np.pi * f * t) for f in (261.6, 329.6, 392.0)),
        "hiss": rng.standard_normal(len(t)),
        "buzz": sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12)),
    }
    lines = (lj_dataset / "metadata.csv").read_text()
    for name, sound in sounds.items():
        sf.write(lj_dataset / "wavs" / f"{name}.wav", (0.3 * sound / np.abs(sound).max()).astype(np.float32), RATE)
        lines += f"{name}|Hello there, how are you today?\n"
    (lj_dataset / "metadata.csv").write_text(lines)
    report = check_dataset(lj_dataset, progress=False)
    assert {Path(p.source).stem: p.kind for p in report.problems} == dict.fromkeys(sounds, "no_speech")
    assert len(report.valid_utterances()) == 3
    message = report.problems[0].message
    assert message.startswith("a voice-activity detector hears 0.0 s of speech in its 2.0 s of sound"), message
    assert "(it must hear at least 40%): a tone, music, noise, or a whisper?" in message
    checked = runner.invoke(app, ["data", "check", str(lj_dataset)])
    assert checked.exit_code == 1 and "no_speech" in checked.output
    # A clip with a long pause inside (8 s of quiet room tone between two sentences) is judged by its sound, not
    # by its span: speech.
    wav = sorted((lj_dataset / "wavs").glob("LJ*.wav"))[0]
    audio, rate = sf.read(wav, dtype="float32")
    room = 10 ** (-55 / 20) * rng.standard_normal(8 * rate)
    sf.write(wav, np.concatenate([audio, room, audio]).astype(np.float32), rate)
    assert all(Path(p.source) != wav for p in check_dataset(lj_dataset, progress=False).problems)
    # ... and so is one in a noisy room: 2 s of speech twice, 14 s of white noise 20 dB under it between and
    # throughout (its sound had been every frame within 30 dB of the loudest: the noise too, 0.2 heard).
    words = audio[: 2 * rate]
    noise = rng.standard_normal(4 * rate + 14 * rate) * np.sqrt(np.mean(words**2) / 100)
    sf.write(wav, (np.concatenate([words, np.zeros(14 * rate), words]) + noise).astype(np.float32), rate)
    assert all(Path(p.source) != wav for p in check_dataset(lj_dataset, progress=False).problems)


def test_the_phoneme_rate_counts_the_speech_heard(lj_dataset: Path) -> None:
    """A transcript is judged against the speech a voice-activity detector hears, not the span from the first
    word to the last: a hesitant reading (4 s of room tone inside) and a very fast one (espeak-ng at 300 words a
    minute, whose fading last words the energy rule had taken for a floor: "163 phonemes a second") are no wrong
    transcripts; another clip's much longer transcript still is."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    wavs = sorted((lj_dataset / "wavs").glob("*.wav"))
    audio, rate = sf.read(wavs[0], dtype="float32")
    half = len(audio) // 2
    room = 10 ** (-50 / 20) * np.random.default_rng(0).standard_normal(4 * rate)
    sf.write(wavs[0], np.concatenate([audio[:half], room, audio[half:]]).astype(np.float32), rate)
    text = (lj_dataset / "metadata.csv").read_text().splitlines()[1].split("|")[1]
    subprocess.run(["espeak-ng", "-s", "300", "-w", str(wavs[1]), text], check=True, capture_output=True, timeout=30)
    report = check_dataset(lj_dataset, progress=False)
    assert report.ok, report.problems
    lines = (lj_dataset / "metadata.csv").read_text().splitlines()
    lines[2] = lines[2].split("|")[0] + "|" + " ".join([SENTENCE] * 3)
    (lj_dataset / "metadata.csv").write_text("\n".join(lines) + "\n")
    assert [p.kind for p in check_dataset(lj_dataset, progress=False).problems] == ["text_length"]


def test_noisy_recordings_are_warned_of_not_refused(lj_dataset: Path) -> None:
    """Clips whose speech stands 10 dB above white noise (half a second of it before and after, as a room
    recording has) are said to be noisy, with the ratio the detector's pauses measure; 50 dB above it, not."""
    rng = np.random.default_rng(0)
    clean = {wav: sf.read(wav, dtype="float32") for wav in (lj_dataset / "wavs").glob("*.wav")}

    def with_noise(under_db: float) -> DatasetReport:
        for wav, (audio, rate) in clean.items():
            padded = np.pad(audio, rate // 2)
            power = float(np.mean(audio**2))  # the speech's own power: the noise this far under it
            noise = rng.standard_normal(len(padded)) * np.sqrt(power / 10 ** (under_db / 10))
            sf.write(wav, (padded + noise).astype(np.float32), rate)
        return check_dataset(lj_dataset, progress=False)

    quiet_room = with_noise(50)  # a quiet room: measured, and not warned of
    assert len(quiet_room.snr_db) == 3 and quiet_room.warning_notes() == {}, quiet_room.snr_db
    report = with_noise(10)
    assert report.ok and set(report.warning_notes()) == {"noisy"}
    snr = float(report.noisy_note().split(" dB ")[0].rsplit(" ", 1)[1])
    assert 5 <= snr <= 15 and "(noise, hum, music or echo; the median of 3 clips; " in report.noisy_note()
    assert "; the least: LJ" in report.noisy_note() and "dB; clean recordings 31 dB or more)" in report.noisy_note()
    checked = runner.invoke(app, ["data", "check", str(lj_dataset)])
    assert checked.exit_code == 0 and "a voice learns what its recordings hold besides the voice" in " ".join(
        checked.output.split()
    )


def test_the_upper_band_is_read_to_the_clips_end() -> None:
    """Blocks overlap by half and the last one ends with the clip: sound above 4.2 kHz only in a clip's last
    0.7 s (of 2.2 s, a block and a half) is heard; a band-limited clip reads far under the bound; a clip too
    short to tell reads 0 dB."""
    rng = np.random.default_rng(0)
    rate = 22050
    clip = np.zeros(int(2.2 * rate))
    clip[: int(1.5 * rate)] = np.sin(2 * np.pi * 300 * np.arange(int(1.5 * rate)) / rate)
    clip[-int(0.7 * rate) :] = rng.standard_normal(int(0.7 * rate))
    assert upper_band_db(clip, rate) > -10
    assert upper_band_db(clip[: int(1.5 * rate)], rate) < NARROW_BAND_DB
    assert upper_band_db(np.ones(1), rate) == 0.0


def test_recordings_without_transcripts_are_checked_for_their_rate(tmp_path: Path) -> None:
    """`chorus adapt` skips a recording made below 16 kHz before transcribing it: the check says so first."""
    t = np.arange(3 * 8000) / 8000
    sf.write(tmp_path / "call.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 8000)
    sf.write(tmp_path / "studio.wav", np.repeat(0.1, 3 * 22050).astype(np.float32), 22050)
    checked = runner.invoke(app, ["data", "check", str(tmp_path)])
    output = " ".join(checked.output.split())
    assert checked.exit_code == 1 and "2 recording(s) and no metadata.csv" in output, output
    assert f"{tmp_path / 'call.wav'}: recorded at 8000 Hz (minimum 16000 Hz); `chorus adapt` skips it" in output
    assert "studio.wav" not in output


def test_a_compressed_recordings_rate_is_read_from_its_header(tmp_path: Path, monkeypatch) -> None:
    """An AAC recording (what libsndfile does not read) made at 8 kHz is named from its container's header, by the
    check and by `chorus adapt`'s reading, without decoding it (a long one had been decoded whole to learn it)."""
    from chorus.audio import io as audio_io
    from chorus.audio.encode import encode_whole

    t = np.arange(3 * 8000) / 8000
    (tmp_path / "call.aac").write_bytes(
        encode_whole((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 8000, "aac")
    )
    assert audio_io.recorded_rate(tmp_path / "call.aac") == 8000
    assert audio_io.recorded_rate(tmp_path / "nothing.wav") is None

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(audio_io, "decode_with_av", no_decoding)
    checked = runner.invoke(app, ["data", "check", str(tmp_path)])
    output = " ".join(checked.output.split())
    assert checked.exit_code == 1 and f"{tmp_path / 'call.aac'}: recorded at 8000 Hz (minimum 16000 Hz)" in output
    with pytest.raises(audio_io.AudioError, match="recorded at 8000 Hz"):
        audio_io.load_audio(tmp_path / "call.aac", min_rate=16000)


def test_markdown(bad_dataset: tuple[Path, dict[str, str]], bad_report: DatasetReport) -> None:
    markdown = bad_report.to_markdown()
    assert "| alice | 2 | 2 |" in markdown and "| bob | 13 | 1 |" in markdown
    # The speakers' column counts their clips' problems; the summary says which of its total are none of a clip's
    # (a new user's probe: the two had disagreed without a word).
    unclipped = sum(p.utterance is None for p in bad_report.problems)
    assert unclipped and "| Clip problems |" in markdown
    assert f"{len(bad_report.problems)} problem(s) ({unclipped} of the metadata or folder, not of a clip)" in markdown
    for source in bad_dataset[1].values():
        assert f"`{source}`" in markdown


def test_command_exit_codes_and_output(lj_dataset: Path, bad_dataset: tuple[Path, dict[str, str]]) -> None:
    clean = runner.invoke(app, ["data", "check", str(lj_dataset)])
    assert clean.exit_code == 0 and "no problems" in " ".join(clean.output.split())
    bad = runner.invoke(app, ["data", "check", str(bad_dataset[0]), "--max-problems", "3"])
    assert bad.exit_code == 1
    out = bad.output
    assert "alice" in out and "bob" in out and "too_short" in out  # the by-kind table lists every kind
    assert "more" in out  # the list stops at max_problems
