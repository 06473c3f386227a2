"""Voice space: learned over several voices; a new voice fits only its vector and is a normal voice folder."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from chorus.adapters.bank import pack_bank
from chorus.adapters.hypernetwork import VoiceSpace, generated
from chorus.adapters.voice import read_voice
from chorus.cli import app
from chorus.models.bundle import load_bundle
from chorus.speaker_recognition.bundle import load_encoder, shipped_encoder_dir
from chorus.synthesis import load_base
from chorus.training.voice_space_training import (
    VoiceSpaceConfig,
    embedder_of,
    fit_voice,
    starting_z,
    train_voice_space,
)

runner = CliRunner()


@pytest.fixture(scope="module")
def space_dir(tiny_base, two_voice_corpus, tmp_path_factory):
    """A dim-4 space learned on the tiny base's two corpus voices (a few steps)."""
    out = tmp_path_factory.mktemp("space") / "space"
    config = VoiceSpaceConfig(dim=4, steps=4, eval_every=2, threads=1)
    root = tmp_path_factory.mktemp("space_voices")
    for voice in ("m3", "f2"):
        shutil.copytree(two_voice_corpus / voice, root / voice)
    train_voice_space(root, load_bundle(tiny_base), out, config, progress=False)
    return out


def test_space_generates_adapter_tensors_linear_in_z(space_dir):
    space, z, names = VoiceSpace.load(space_dir)
    assert names == ["f2", "m3"] and z.shape == (2, 4)
    # the embedder's vector (+ bias) -> z, fitted after training: the shipped encoder's, else resemblyzer's 256
    encoder = shipped_encoder_dir()
    dim = load_encoder(encoder).encoder.config.embedding_dim if encoder else 256
    assert space.embedding_to_z.shape == (dim + 1, 4)
    a, b = torch.randn(4), torch.randn(4)
    ta, tb, tab = space.voice_tensors(a), space.voice_tensors(b), space.voice_tensors(a + b)
    center = space.voice_tensors(torch.zeros(4))
    for key in ta:
        torch.testing.assert_close(tab[key] - center[key], (ta[key] - center[key]) + (tb[key] - center[key]))


def test_training_improved_the_voices_and_generated_bank_matches_unpacked_adapters(tiny_base, space_dir):
    space, z, _ = VoiceSpace.load(space_dir)
    bundle = load_bundle(tiny_base)
    model = bundle.model
    from chorus.adapters import add_adapter, load_adapter_state_dict, routed

    for index, name in enumerate(("a", "b")):
        add_adapter(model, name, space.configs)
        load_adapter_state_dict(model, name, space.voice_tensors(z[index]))
    bank = pack_bank(model, ["a", "b"])
    phonemes, lengths = torch.randint(1, 20, (3, 6)), torch.tensor([6, 4, 5])
    speakers = torch.zeros(3, dtype=torch.long)
    from chorus.adapters.bank import banked

    with generated(bank, space.generate(z)), banked(model, bank, torch.tensor([1, 0, -1])):
        together = model.infer(phonemes, lengths, speaker_ids=speakers).mel
    bank.remove()
    with routed(model, ["b", "a", "__base__"]):
        reference = model.infer(phonemes, lengths, speaker_ids=speakers).mel
    torch.testing.assert_close(together, reference, rtol=1e-4, atol=1e-5)


def test_space_keeps_its_voices_and_starts_a_new_voice_where_asked(space_dir, tmp_path):
    space, z, names = VoiceSpace.load(space_dir)
    # The shipped speaker encoder's embeddings where it ships ([2, 128]), else resemblyzer's ([2, 256]).
    encoder = shipped_encoder_dir()
    dim = load_encoder(encoder).encoder.config.embedding_dim if encoder else 256
    assert space.voice_names == names and space.voice_embeddings.shape == (2, dim)
    assert space.embedder.startswith("chorus-speaker-encoder:" if encoder else "resemblyzer")
    for index, name in enumerate(names):
        # A voice's own d-vector is nearest to itself: the start is exactly its z.
        start, voice = starting_z(space, space.voice_embeddings[index], "nearest")
        assert voice == name and torch.equal(start, z[index])
    # Halfway between the two d-vectors but nearer the second: the second voice.
    between = 0.4 * space.voice_embeddings[0] + 0.6 * space.voice_embeddings[1]
    assert starting_z(space, between, "nearest")[1] == names[1]
    start, voice = starting_z(space, between, "embedding")
    assert voice is None and torch.allclose(start, space.z_from_embedding(between))
    start, voice = starting_z(space, between, "mean")
    assert voice is None and torch.equal(start, torch.zeros(4))
    # Saved and loaded again, the space keeps names, z and d-vectors.
    space.save(tmp_path / "again")
    again, z_again, names_again = VoiceSpace.load(tmp_path / "again")
    assert names_again == names and torch.equal(z_again, z)
    assert torch.equal(again.voice_embeddings, space.voice_embeddings) and again.embedder == space.embedder
    # A space that kept no d-vectors (older, or trained without the judges) starts at its center.
    space.voice_embeddings = torch.zeros(0)
    start, voice = starting_z(space, between, "nearest")
    assert voice is None and torch.equal(start, torch.zeros(4))
    with pytest.raises(ValueError, match="init"):
        starting_z(space, between, "random")


@pytest.mark.parametrize("init", ["nearest", "embedding", "mean"])
def test_new_voice_fits_only_its_vector(tiny_base, space_dir, new_voice_data, tmp_path, init):
    space, _, _ = VoiceSpace.load(space_dir)
    before = {k: v.clone() for k, v in space.state_dict().items()}
    bundle = load_bundle(tiny_base)
    result = fit_voice(
        new_voice_data, bundle, space, tmp_path / "f4", steps=4, eval_every=2, init=init, threads=1, progress=False
    )
    assert all(torch.equal(space.state_dict()[k], v) for k, v in before.items())
    assert result.card.trainable_parameters == 4 and len(result.card.notes["voice_space_z"]) == 4
    assert 0.75 * result.card.data_minutes < result.card.speech_minutes < result.card.data_minutes
    assert result.card.notes["init"] == init
    assert result.card.notes["start_voice"] == result.start_voice
    assert (result.start_voice in space.voice_names) == (init == "nearest")
    assert result.card.metrics["validation_mel_l1_best"] <= result.card.metrics["validation_mel_l1_start"]
    voice = read_voice(result.voice_dir)
    expected = space.voice_tensors(result.z)
    assert all(torch.equal(voice.tensors[k], expected[k]) for k in expected)
    tts = load_base(tiny_base, "griffin-lim")
    assert tts.synthesize("Hello.", voice=tts.load_voice(result.voice_dir)).audio.size > 0


def test_refusals_and_cli(tiny_base, space_dir, new_voice_data, tmp_path):
    space, _, _ = VoiceSpace.load(space_dir)
    with pytest.raises(ValueError, match="init"):
        fit_voice(new_voice_data, load_bundle(tiny_base), space, tmp_path / "x", init="random", progress=False)
    with pytest.raises(ValueError, match="not a readable voice space"):
        VoiceSpace.load(tmp_path)
    result = runner.invoke(
        app,
        [
            "voice-space",
            "fit",
            str(new_voice_data),
            "--space",
            str(space_dir),
            "--out",
            str(tmp_path / "v"),
            "--steps",
            "2",
            "--threads",
            "1",
            "--model",
            str(tiny_base),
        ],
    )
    assert result.exit_code == 0, result.output
    # rich wraps the line at the console width, wherever the temporary path's length puts the break
    output = " ".join(result.output.split())
    assert "4 numbers" in output and "started from the nearest training voice" in output


def test_cli_train_never_writes_over_the_recordings_or_other_files(two_voice_corpus, tmp_path):
    """A voice space is written whole: --out may not be, hold or lie inside the recordings' folder, nor hold other
    files (it had replaced any folder silently, recordings included); nothing is read or trained before."""
    before = sorted(p.name for p in two_voice_corpus.rglob("*"))
    for out in (two_voice_corpus, two_voice_corpus.parent, two_voice_corpus / "m3"):
        refused = runner.invoke(app, ["voice-space", "train", str(two_voice_corpus), "--out", str(out), "--overwrite"])
        assert refused.exit_code == 2 and "the recordings" in refused.output
    assert sorted(p.name for p in two_voice_corpus.rglob("*")) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    refused = runner.invoke(app, ["voice-space", "train", str(two_voice_corpus), "--out", str(other), "--overwrite"])
    assert refused.exit_code == 2 and "not a voice space" in refused.output and (other / "notes.txt").is_file()


def test_cli_without_options_runs_the_library_defaults(monkeypatch, tmp_path):
    """`voice-space train` without options trains with ``VoiceSpaceConfig()``; `voice-space fit` without
    them calls ``fit_voice`` with its own defaults (the calls are recorded, not run)."""
    from chorus.cli import voice_space as cli

    class Recorded(Exception):
        pass

    calls = {}

    def record(name):
        def call(*args, **kwargs):
            calls[name] = args, kwargs
            raise Recorded

        return call

    monkeypatch.setattr(cli, "load_bundle", lambda path: "the base")
    monkeypatch.setattr(cli, "VoiceSpace", SimpleNamespace(load=lambda path: ("the space", {}, {})))
    monkeypatch.setattr(cli, "train_voice_space", record("train"))
    monkeypatch.setattr(cli, "fit_voice", record("fit"))
    voices = tmp_path / "voices"
    trained = runner.invoke(app, ["voice-space", "train", str(voices), "--out", str(tmp_path / "space")])
    assert isinstance(trained.exception, Recorded), trained.output
    assert calls["train"] == ((voices, "the base", tmp_path / "space", VoiceSpaceConfig()), {})
    data = tmp_path / "recordings"
    fitted = runner.invoke(
        app, ["voice-space", "fit", str(data), "--space", str(tmp_path / "space"), "--out", str(tmp_path / "v")]
    )
    assert isinstance(fitted.exception, Recorded), fitted.output
    args, kwargs = calls["fit"]
    assert args == (data, "the base", "the space", tmp_path / "v")
    defaults = inspect.signature(fit_voice).parameters
    assert kwargs and kwargs == {name: defaults[name].default for name in kwargs}


def copied_voices(two_voice_corpus: Path, tmp_path: Path) -> Path:
    """A writable copy of the two-speaker corpus for virtual speakers to be added to (skips without sox)."""
    if shutil.which("sox") is None:
        pytest.skip("needs Debian sox")
    root = tmp_path / "voices"
    for voice in ("m3", "f2"):
        shutil.copytree(two_voice_corpus / voice, root / voice)
    return root


def test_virtual_voices_are_new_voices_with_the_same_text_and_rate(two_voice_corpus, tmp_path):
    import soundfile as sf

    from chorus.corpus.virtual import VIRTUAL_CHAINS, add_virtual_speakers

    root = copied_voices(two_voice_corpus, tmp_path)
    made = add_virtual_speakers(root, 3, minutes=0.05)
    assert [p.name for p in made] == ["f2~speed-086-tempo-1163", "m3~speed-112-tempo-0893", "f2~pitch--220"]
    assert len(VIRTUAL_CHAINS) >= 3 and all("." not in p.name for p in made)
    for folder in made:
        source = root / folder.name.split("~")[0]
        lines = (folder / "metadata.csv").read_text().splitlines()
        assert lines and (source / "metadata.csv").read_text().startswith(lines[0])
        for line in lines:
            name = line.split("|")[0] + ".wav"
            new, rate = sf.read(str(folder / "wavs" / name))
            old, _ = sf.read(str(source / "wavs" / name))
            assert rate == 22_050 and abs(len(new) - len(old)) < 0.05 * len(old)  # the speaking rate is kept
            assert not np.allclose(new[: len(old)], old[: len(new)], atol=1e-3)
    # Derived voices are never sources: a second call adds the same three, not voices of voices.
    assert add_virtual_speakers(root, 3, minutes=0.05) == made


def test_virtual_voices_never_repeat_a_voice_and_chain(two_voice_corpus, tmp_path):
    """2 voices x 6 chains: the plain turn would repeat (voice, chain) after 6; all 12 pairs come first."""
    from chorus.corpus.virtual import VIRTUAL_CHAINS, add_virtual_speakers

    root = copied_voices(two_voice_corpus, tmp_path)
    pairs = 2 * len(VIRTUAL_CHAINS)
    made = add_virtual_speakers(root, pairs, minutes=0.01)
    assert len({p.name for p in made}) == pairs
    with pytest.raises(ValueError, match=f"at most {pairs} virtual speakers"):
        add_virtual_speakers(root, pairs + 1, minutes=0.01)


def test_cli_trains_over_virtual_voices_beside_the_given_ones(tiny_base, two_voice_corpus, tmp_path):
    if shutil.which("sox") is None:
        pytest.skip("needs Debian sox")
    result = runner.invoke(
        app,
        [
            "voice-space",
            "train",
            str(two_voice_corpus),
            "--out",
            str(tmp_path / "space"),
            "--dim",
            "4",
            "--steps",
            "2",
            "--virtual",
            "2",
            "--virtual-minutes",
            "1",
            "--model",
            str(tiny_base),
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    _, _, names = VoiceSpace.load(tmp_path / "space")
    assert sorted(names) == sorted(["f2", "m3", "f2~speed-086-tempo-1163", "m3~speed-112-tempo-0893"])
    assert (tmp_path / "space-voices" / "m3").is_symlink()


def test_a_new_voice_is_embedded_by_the_encoder_that_made_the_space(space_dir):
    space, _, _ = VoiceSpace.load(space_dir)
    judge = embedder_of(space)
    assert type(judge).__name__ == ("EncoderJudge" if shipped_encoder_dir() else "SpeakerJudge")
    space.embedder = "chorus-speaker-encoder:" + "0" * 64  # another encoder's embeddings
    with pytest.raises(ValueError, match="not the installed speaker encoder"):
        embedder_of(space)


def test_a_voice_space_refuses_full_fine_tuning_and_no_numbers():
    """A researcher's probe: --method full had trained a speaker vector alone under full's name; --dim 0 was a space."""
    from chorus.training.voice_space_training import VoiceSpaceConfig

    with pytest.raises(ValueError, match="a voice space generates adapters"):
        VoiceSpaceConfig(method="full")
    with pytest.raises(ValueError, match="dim must be at least 1, got 0"):
        VoiceSpaceConfig(dim=0)
