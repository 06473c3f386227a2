"""`chorus adapt-many`: K voices in one job, each exported like `chorus adapt`; isolation between voices."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from chorus.adapters import parse_methods
from chorus.adapters.voice import read_voice
from chorus.cli import app
from chorus.models.bundle import load_bundle
from chorus.recipe import AdaptConfig
from chorus.synthesis import load_base
from chorus.training.adapt_many import ManyVoicesConfig, adapt_many, length_groups
from conftest import espeak_voice

runner = CliRunner()


def many_config(**adapt) -> ManyVoicesConfig:
    return ManyVoicesConfig(
        adapt=AdaptConfig(methods=parse_methods("lora+speaker"), threads=1, **adapt),
        steps=4,
        clips_per_voice=2,
        eval_every=2,
    )


@pytest.fixture(scope="module")
def voices_root(new_voice_data, tmp_path_factory):
    """Two usable voices (f4 and a second espeak voice) and one broken folder."""
    root = tmp_path_factory.mktemp("many")
    shutil.copytree(new_voice_data, root / "f4")
    sentences = [line.split("|", 1)[1] for line in (new_voice_data / "metadata.csv").read_text().splitlines()]
    espeak_voice(root / "m7", "m7", sentences)
    (root / "broken").mkdir()
    (root / "broken" / "metadata.csv").write_text("x|There is no audio for this line.\n")
    return root


def test_voices_train_together_and_export_like_adapt(tiny_base, voices_root, tmp_path):
    result = adapt_many(voices_root, load_bundle(tiny_base), tmp_path / "voices", many_config(), progress=False)
    status = {o.name: o.status for o in result.outcomes}
    assert status == {"broken": "failed", "f4": "ok", "m7": "ok"}
    assert "broken" in next(o.message for o in result.outcomes if o.name == "broken")
    for name in ("f4", "m7"):
        folder = tmp_path / "voices" / name
        assert {p.name for p in folder.iterdir()} == {
            "adapter_config.json",
            "chorus_voice.json",
            "adapter_model.safetensors",
            "voice_card.json",
            "README.md",
            "LICENSE.md",
        }
        voice = read_voice(folder)
        assert [c.method for c in voice.configs] == ["lora", "speaker"] and voice.card.steps == 4
        assert voice.card.methods == voice.methods  # what the folder holds (a review: the card had said ["lora"])
        assert 0.75 * voice.card.data_minutes < voice.card.speech_minutes < voice.card.data_minutes
    summary = json.loads((tmp_path / "voices" / "adapt-many.json").read_text())
    assert [v["status"] for v in summary["voices"]] == ["failed", "ok", "ok"]
    tts = load_base(tiny_base, "griffin-lim")
    before = tts.mel(["A short test."], "m3")[0]
    first, second = tts.load_voice(tmp_path / "voices" / "f4"), tts.load_voice(tmp_path / "voices" / "m7")
    assert not torch.equal(tts.mel(["A short test."], voice=first)[0], tts.mel(["A short test."], voice=second)[0])
    assert torch.equal(tts.mel(["A short test."], "m3")[0], before)


def test_each_voice_learns_only_from_its_own_samples(tiny_base, voices_root, new_voice_data, tmp_path):
    """Voice f4 ends the same whether the other voice in the job is m7 or a different speaker."""
    other = tmp_path / "other"
    shutil.copytree(voices_root / "f4", other / "f4")
    sentences = [line.split("|", 1)[1] for line in (new_voice_data / "metadata.csv").read_text().splitlines()][:9]
    espeak_voice(other / "m7", "f1", sentences)  # same name, different speaker and clip count
    results = []
    for root in (voices_root, other):
        out = tmp_path / f"out-{root.name}"
        adapt_many(root, load_bundle(tiny_base), out, many_config(), progress=False)
        results.append(read_voice(out / "f4").tensors)
    assert results[0].keys() == results[1].keys()
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], rtol=1e-4, atol=1e-5)


def test_length_groups_keep_voices_whole_and_pad_like_lengths_together():
    frames = np.array([100, 400, 120, 390, 110, 50])
    voices = np.array([0, 1, 0, 2, 3, 3])  # voice 0: rows 0, 2 (longest 120); 3: rows 4, 5 (110)
    groups = length_groups(frames, voices, max_frames=500)
    # By longest clip: voice 3 (110), 0 (120), 2 (390), 1 (400); 4 rows x 120 fit, a fifth x 390 does not.
    assert [g.tolist() for g in groups] == [[4, 5, 0, 2], [3], [1]]
    assert [g.tolist() for g in length_groups(frames, voices, None)] == [[0, 1, 2, 3, 4, 5]]
    assert [g.tolist() for g in length_groups(frames, voices, max_frames=1)] == [[4, 5], [0, 2], [3], [1]]


def test_forwards_of_one_voice_each_train_as_one_forward(tiny_base, voices_root, tmp_path):
    """Cutting each step into forwards of similar length (here one voice each) sums the same gradient."""
    results = []
    for max_frames in (1, 1_000_000):
        out = tmp_path / f"out-{max_frames}"
        adapt_many(voices_root, load_bundle(tiny_base), out, many_config(max_frames=max_frames), progress=False)
        results.append(read_voice(out / "f4").tensors)
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], rtol=1e-4, atol=1e-5)


def test_refusals(tiny_base, voices_root, tmp_path):
    with pytest.raises(ValueError, match="full fine-tuning makes one model per voice"):
        ManyVoicesConfig(adapt=AdaptConfig(methods=parse_methods("full")))
    only_broken = tmp_path / "only_broken"
    shutil.copytree(voices_root / "broken", only_broken / "broken")
    with pytest.raises(ValueError, match="no voice has usable data"):
        adapt_many(only_broken, load_bundle(tiny_base), tmp_path / "v", many_config(), progress=False)
    with pytest.raises(ValueError, match="no speaker folders"):
        adapt_many(tmp_path, load_bundle(tiny_base), tmp_path / "v", many_config(), progress=False)


def test_folder_names_an_adapter_name_may_not_hold_make_voices_too(tiny_base, voices_root, tmp_path):
    """A folder "dot.name" ended a whole job after its data work ("invalid adapter name"), nothing saved; the
    voices' adapters are named apart from their folders now, and each voice keeps its folder's name."""
    root = tmp_path / "root"
    shutil.copytree(voices_root / "f4", root / "dot.name")
    shutil.copytree(voices_root / "m7", root / "__dunder")
    result = adapt_many(root, load_bundle(tiny_base), tmp_path / "voices", many_config(), progress=False)
    assert {o.name: o.status for o in result.outcomes} == {"__dunder": "ok", "dot.name": "ok"}
    tts = load_base(tiny_base, vocoder="griffin-lim")
    for name in ("dot.name", "__dunder"):
        assert read_voice(tmp_path / "voices" / name).card.name == name
        tts.load_voice(tmp_path / "voices" / name)
        assert tts.synthesize("Hello there.", voice=name).audio.size > 0


def test_a_folder_of_recordings_without_transcripts_is_named_as_failed(tiny_base, voices_root, tmp_path):
    """A new user's probe: a speaker folder without a metadata.csv (recordings `chorus adapt` would transcribe)
    got no row, no warning and no entry in the summary."""
    root = tmp_path / "with-untranscribed"
    shutil.copytree(voices_root / "f4", root / "f4")
    shutil.copytree(voices_root / "m7" / "wavs", root / "notext")
    shutil.copytree(voices_root / "m7" / "wavs", root / "__MACOSX")  # a zip's, and a hidden one: no speakers
    shutil.copytree(voices_root / "m7" / "wavs", root / ".ipynb_checkpoints")
    result = adapt_many(root, load_bundle(tiny_base), tmp_path / "voices", many_config(), progress=False)
    status = {o.name: (o.status, o.message) for o in result.outcomes}
    assert status["f4"][0] == "ok" and status["notext"][0] == "failed"
    assert "recordings without a metadata.csv: transcribe them first" in status["notext"][1]
    assert "--out VOICE --keep-transcribed DIR" in status["notext"][1] and set(status) == {"f4", "notext"}


def test_cli(tiny_base, voices_root, tmp_path):
    result = runner.invoke(
        app,
        [
            "adapt-many",
            str(voices_root),
            "--out",
            str(tmp_path / "v"),
            "--steps",
            "2",
            "--threads",
            "1",
            "--model",
            str(tiny_base),
            "--rank",
            "2",
        ],
    )
    # The broken voice fails and the others are written; the exit status says not every voice was made.
    assert result.exit_code == 1, result.output
    assert "2 voice(s)" in result.output and "1 voice(s) failed (above): exit status 1" in result.output
    assert (tmp_path / "v" / "f4" / "voice_card.json").is_file()


def test_cli_refuses_voice_folders_in_the_way_before_any_work(tiny_base, voices_root, tmp_path):
    out = tmp_path / "v"
    (out / "f4").mkdir(parents=True)
    (out / "f4" / "voice_card.json").write_text("{}")  # a voice made before
    command = ["adapt-many", str(voices_root), "--out", str(out), "--steps", "1", "--model", str(tiny_base)]
    refused = runner.invoke(app, command)
    assert refused.exit_code == 2 and "1 voice folder(s) in the way" in refused.output
    assert "f4 already holds a voice" in " ".join(refused.output.split())
    assert (out / "f4" / "voice_card.json").read_text() == "{}" and not (out / "m7").exists()
    onto_data = runner.invoke(app, [*command[:2], "--out", str(voices_root), *command[4:], "--overwrite"])
    assert onto_data.exit_code == 2 and "the recordings' folder" in onto_data.output


def test_more_voices_than_the_base_has_speakers(tiny_base, voices_root, tmp_path):
    """Voices are told apart by their own speaker vectors, never by rows of the base's speaker table:
    a job may hold more voices than the base knows (the tiny base has 2)."""
    root = tmp_path / "three"
    for name in ("f4", "m7", "f4-again"):
        shutil.copytree(voices_root / name.removesuffix("-again"), root / name)
    assert load_bundle(tiny_base).model.config.n_speakers == 2
    result = adapt_many(root, load_bundle(tiny_base), tmp_path / "voices", many_config(), progress=False)
    assert [o.status for o in result.outcomes] == ["ok"] * 3
    assert all(
        (tmp_path / "voices" / name / "adapter_model.safetensors").is_file() for name in ("f4", "m7", "f4-again")
    )


def test_the_library_refuses_an_out_that_would_swap_the_recordings_out_before_any_work(tiny_base, voices_root):
    """As the command line does, per voice folder: out = ROOT makes each voice's folder its recordings' (the
    library had written voices over them)."""
    with pytest.raises(ValueError, match="holds the recordings"):
        adapt_many(voices_root, load_bundle(tiny_base), voices_root, many_config(), progress=False)
