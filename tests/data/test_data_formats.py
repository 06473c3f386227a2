"""Dataset layouts: LJSpeech-style folders (2 or 3 columns), folders of them, and id|speaker|text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chorus.data.formats import DatasetFormatError, discover

Metadata = Callable[[Path, list[str]], Path]


def test_ljspeech_three_columns_uses_normalized_text(lj_dataset: Path) -> None:
    utterances, problems = discover(lj_dataset)
    assert problems == []
    assert [u.id for u in utterances] == ["LJ001-0001", "LJ001-0002", "LJ001-0003"]
    second = utterances[1]
    assert second.speaker == "ljs"  # the folder's name
    assert second.text == "Doctor Smith arrived at five thirty on May third."
    assert second.audio_path == lj_dataset / "wavs" / "LJ001-0002.wav"
    assert second.source == f"{lj_dataset / 'metadata.csv'}:2"
    assert second.key == "ljs/LJ001-0002"


def test_two_columns_and_flac_audio(tmp_path: Path, metadata: Metadata) -> None:
    folder = tmp_path / "anna"
    metadata(folder, ["a1|Hello there.", "", "a2|Second line."])  # blank lines are skipped
    (folder / "wavs").mkdir()
    (folder / "wavs" / "a2.flac").write_bytes(b"")  # parsing never reads audio, only finds it
    utterances, problems = discover(folder)
    assert problems == []
    assert [(u.id, u.speaker, u.text) for u in utterances] == [
        ("a1", "anna", "Hello there."),
        ("a2", "anna", "Second line."),
    ]
    assert utterances[0].audio_path.name == "a1.wav"  # missing: reported later by the checker
    assert utterances[1].audio_path.name == "a2.flac"
    assert utterances[1].source.endswith("metadata.csv:3")


def test_what_users_write_in_their_own_metadata(tmp_path: Path, metadata: Metadata) -> None:
    """Clips in any format Chorus reads (Ogg, MP3 ...: they had been "not found" beside a metadata.csv), ids
    written with their suffix, a header row; a comma-separated line says what it seems to be."""
    folder = tmp_path / "me"
    metadata(folder, ["id|text", "a1|First.", "a2.wav|Second.", "a3|Third.", "a4,Fourth."])
    (folder / "wavs").mkdir()
    for name in ("a1.ogg", "a2.wav", "a3.mp3"):
        (folder / "wavs" / name).write_bytes(b"")
    utterances, problems = discover(folder)
    assert [(u.id, u.audio_path.name) for u in utterances] == [("a1", "a1.ogg"), ("a2", "a2.wav"), ("a3", "a3.mp3")]
    assert len(problems) == 1 and "separated by commas; LJSpeech's separator is '|'" in problems[0].message

    # Not a header: a first column named like one over text ("audio|Hello there."), reported missing as written;
    # one clip written twice, with and without its suffix, is a duplicate; an id alone is told to write 'id|'.
    metadata(folder, ["audio|Hello there.", "a1|First.", "a1.ogg|Again.", "a9.wav|Gone.", "a3"])
    utterances, problems = discover(folder)
    assert [u.id for u in utterances] == ["audio", "a1", "a9"] and utterances[2].audio_path.name == "a9.wav"
    found = [p.message for p in problems]
    assert "duplicate id 'a1'" in found[0] and "write 'id|' for Whisper" in found[1]


def test_single_word_normalized_line_is_not_a_speaker(tmp_path: Path, metadata: Metadata) -> None:
    # "1990" looks like a speaker name in isolation; the rest of the file says it is LJSpeech.
    metadata(
        tmp_path / "lj",
        [
            "LJ1|1990|nineteen ninety",
            "LJ2|It was a dark night.|It was a dark night.",
            "LJ3|He paid $5.|He paid five dollars.",
        ],
    )
    utterances, problems = discover(tmp_path / "lj")
    assert problems == []
    assert {u.speaker for u in utterances} == {"lj"}
    assert utterances[0].text == "nineteen ninety"


def test_byte_order_mark_is_not_part_of_the_id(tmp_path: Path) -> None:
    folder = tmp_path / "bom"
    folder.mkdir()
    (folder / "metadata.csv").write_text("\ufeffb1|Hello.\n", encoding="utf-8")
    utterances, _ = discover(folder)
    assert utterances[0].id == "b1"


def test_folder_of_folders(tmp_path: Path, metadata: Metadata) -> None:
    metadata(tmp_path / "bob", ["b1|Hi from Bob."])
    metadata(tmp_path / "alice", ["a1|Hi from Alice.", "a2|Bye from Alice."])
    (tmp_path / "notes").mkdir()  # a folder without metadata is not a speaker
    utterances, problems = discover(tmp_path)
    assert problems == []
    assert [u.key for u in utterances] == ["alice/a1", "alice/a2", "bob/b1"]
    assert utterances[2].audio_path == tmp_path / "bob" / "wavs" / "b1.wav"


def test_one_broken_speaker_does_not_hide_the_others(tmp_path: Path, metadata: Metadata) -> None:
    metadata(tmp_path / "good", ["g1|Fine."])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metadata.csv").write_bytes(b"x1|caf\xe9\n")  # Latin-1, not UTF-8
    utterances, problems = discover(tmp_path)
    assert [u.key for u in utterances] == ["good/g1"]
    assert len(problems) == 1 and problems[0].source == str(tmp_path / "bad" / "metadata.csv")
    assert "UTF-8" in problems[0].message


def test_id_speaker_text(tmp_path: Path, metadata: Metadata) -> None:
    metadata(tmp_path, ["u1|anna|Hello there, friend.", "u2|bob|Good morning.", "u1|bob|Same id, other voice."])
    utterances, problems = discover(tmp_path)
    assert problems == []
    assert [u.key for u in utterances] == ["anna/u1", "bob/u2", "bob/u1"]
    assert utterances[1].text == "Good morning."
    assert utterances[1].audio_path == tmp_path / "wavs" / "u2.wav"


def test_bad_lines_reported_with_file_and_line(tmp_path: Path, metadata: Metadata) -> None:
    path = metadata(
        tmp_path,
        [
            "u1|anna|Hello there.",  # 1 fine
            "u2|anna|too|many|fields",  # 2
            "just one field",  # 3
            "|anna|No id here.",  # 4
            "u1|anna|Duplicate id.",  # 5
            "u5|A line without a speaker.",  # 6: two fields in an id|speaker|text file
            "u6|bob|Fine again.",  # 7
        ],
    )
    utterances, problems = discover(tmp_path)
    assert [u.key for u in utterances] == ["anna/u1", "bob/u6"]
    found = {p.source: p.message for p in problems}
    assert set(found) == {f"{path}:{n}" for n in (2, 3, 4, 5, 6)}
    assert "found 5" in found[f"{path}:2"]
    assert "found 1" in found[f"{path}:3"]
    assert "empty utterance id" in found[f"{path}:4"]
    assert "duplicate id 'u1'" in found[f"{path}:5"]
    assert "speaker" in found[f"{path}:6"]


def test_no_dataset_raises(tmp_path: Path) -> None:
    with pytest.raises(DatasetFormatError, match="missing: no such folder"):
        discover(tmp_path / "missing")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(DatasetFormatError, match="a-file: not a folder"):
        discover(tmp_path / "a-file")
    with pytest.raises(DatasetFormatError, match="no metadata.csv"):
        discover(tmp_path)
    (tmp_path / "speaker" / "wavs").mkdir(parents=True)
    with pytest.raises(DatasetFormatError, match="no metadata.csv"):
        discover(tmp_path)


def test_undecodable_root_metadata_raises(tmp_path: Path) -> None:
    (tmp_path / "metadata.csv").write_bytes(b"x1|caf\xe9\n")
    with pytest.raises(DatasetFormatError, match="UTF-8"):
        discover(tmp_path)


def test_an_id_that_names_a_file_outside_the_dataset_is_a_bad_line(tmp_path: Path, metadata: Metadata) -> None:
    """A dataset from elsewhere made `chorus adapt` train on any audio file the user could read (and carry it in
    the voice) through ids read as paths: they are refused lines, and clips in sub-folders of wavs/ still load."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.wav").write_bytes(b"")
    folder = tmp_path / "anna"
    path = metadata(
        folder, ["../../outside/secret|Up and out.", f"{outside / 'secret'}|Absolute.", "day1/a1|Kept.", "a2|Kept too."]
    )
    (folder / "wavs" / "day1").mkdir(parents=True)
    utterances, problems = discover(folder)
    assert [u.id for u in utterances] == ["day1/a1", "a2"]
    assert all(u.audio_path.is_relative_to(folder / "wavs") for u in utterances)
    assert {p.source: p.message for p in problems} == {
        f"{path}:1": "id '../../outside/secret' names a file outside wavs/ (an id is a clip's name)",
        f"{path}:2": f"id '{outside / 'secret'}' names a file outside wavs/ (an id is a clip's name)",
    }


def test_a_folder_given_as_dot_is_its_own_speaker(tmp_path: Path, metadata: Metadata, monkeypatch) -> None:
    """`chorus data check .` and `chorus adapt .` found no clip: every line was "empty speaker name" (Path('.').name)."""
    metadata(tmp_path / "anna", ["a1|Hello there."])
    monkeypatch.chdir(tmp_path / "anna")
    utterances, problems = discover(".")
    assert problems == [] and [(u.id, u.speaker) for u in utterances] == [("a1", "anna")]
