"""`chorus adapt`: a voice from a few clips, on the tiny base; refusals before training; the CLI."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from chorus.adapters import active_adapter, adapter_names, parse_methods
from chorus.adapters.voice import read_voice
from chorus.cli import app
from chorus.models.bundle import load_bundle
from chorus.recipe import TEXT_SIDE_PATTERN, AdaptConfig
from chorus.synthesis import load_base
from chorus.training.adapt import VOICE, adapt, check_adaptation_data

runner = CliRunner()
QUICK = dict(steps=4, eval_every=2, threads=1)


def test_lora_voice_leaves_speakers_bit_identical(tiny_base, new_voice_data, tmp_path):
    tts = load_base(tiny_base, "griffin-lim")
    weights = {k: v.clone() for k, v in tts.bundle.model.state_dict().items()}
    before = {speaker: tts.mel(["Hello there."], speaker)[0] for speaker in tts.speakers}
    result = adapt(
        new_voice_data,
        tts.bundle,
        tmp_path / "voices" / "f4",
        AdaptConfig(methods=parse_methods("lora"), **QUICK),
        progress=False,
        in_place=True,  # as the command line and a server's job adapt: the voice added to the model given
    )
    card = result.card
    # What the voice holds, as its folder says (an operator's probe: the card had left out its speaker vector)
    assert card.methods == read_voice(result.voice_dir).methods == ["lora", "speaker"]
    assert card.steps == 4 and card.trainable_parameters > 0
    assert card.base_model_sha256 == tts.bundle.weights_sha256
    assert 0.4 < card.data_minutes < 1.0
    assert 0.75 * card.data_minutes < card.speech_minutes < card.data_minutes  # espeak-ng pads each clip
    assert card.metrics["held_out_clips"] >= 1
    assert {p.name for p in result.voice_dir.iterdir()} >= {
        "adapter_config.json",
        "chorus_voice.json",
        "adapter_model.safetensors",
        "voice_card.json",
        "README.md",
    }
    # The model that was trained (LoRA trains in place: the voice's adapter is in the base's own model) speaks
    # every base speaker as before, its base weights untouched; the voice itself speaks otherwise.
    assert result.model is tts.bundle.model and VOICE in adapter_names(result.model)
    adapted = {k.replace(".base_layer", ""): v for k, v in result.model.state_dict().items()}
    assert all(torch.equal(adapted[k], v) for k, v in weights.items())
    for speaker, mel in before.items():
        assert torch.equal(tts.mel(["Hello there."], speaker)[0], mel), speaker
    phonemes = torch.tensor([tts.bundle.front_end.encode(["Hello there."])[0]])
    lengths, m3 = torch.tensor([phonemes.shape[1]]), torch.tensor([tts.speakers.index("m3")])
    with active_adapter(result.model, VOICE):
        voice = result.model.infer(phonemes, lengths, speaker_ids=m3).mel
    with active_adapter(result.model, None):
        base = result.model.infer(phonemes, lengths, speaker_ids=m3).mel
    assert not torch.equal(voice, base)  # the adapter trained is not a no-op: the equalities above say something
    # And a fresh base with the saved voice loaded.
    fresh = load_base(tiny_base, "griffin-lim")
    name = fresh.load_voice(result.voice_dir)
    for speaker, mel in before.items():
        assert torch.equal(fresh.mel(["Hello there."], speaker)[0], mel), speaker
    speech = fresh.synthesize("Hello there.", voice=name)
    assert speech.speaker == "f4" and np.isfinite(speech.audio).all()


def test_the_library_adapts_again_and_again_on_one_base(tiny_base, new_voice_data, tmp_path):
    """adapt() trains on a copy of the base it is given: the Synthesizer's model stays bare, so a second method
    adapts on the same base (it had found the first voice's adapter there and refused), the base speakers speak
    as before, and torch's thread count is set back."""
    tts = load_base(tiny_base, "griffin-lim")
    weights = {k: v.clone() for k, v in tts.bundle.model.state_dict().items()}
    before = tts.mel(["Hello there."], "m3")[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = [
            adapt(
                new_voice_data,
                tts.bundle,
                tmp_path / name,
                AdaptConfig(methods=parse_methods(name), **QUICK | {"threads": 2}),
                progress=False,
            )
            for name in ("residual", "lora+speaker")
        ]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert not adapter_names(tts.bundle.model) and all(r.model is not tts.bundle.model for r in results)
    after = tts.bundle.model.state_dict()
    assert after.keys() == weights.keys() and all(torch.equal(after[k], v) for k, v in weights.items())
    assert torch.equal(tts.mel(["Hello there."], "m3")[0], before)
    assert "AcousticModel" not in repr(results[0]) and "voice_dir=" in repr(results[0])  # the model is not printed
    for result in results:
        assert tts.synthesize("Hello there.", voice=tts.load_voice(result.voice_dir)).duration > 0


def test_the_library_never_writes_a_voice_over_what_is_not_one(tiny_base, new_voice_data, tmp_path):
    """A library user's probe: adapt(data, bundle, out=data) deleted the recordings, and out=a folder of voices
    deleted them all (the command line alone checked); a Synthesizer given for the bundle, "lora" for the methods
    and "5" for the steps failed from deep inside. Refused before any work; a voice at out is replaced."""
    from chorus.adapters.lora import LoraConfig
    from conftest import random_voice

    tts = load_base(tiny_base, "griffin-lim")
    copy = shutil.copytree(new_voice_data, tmp_path / "data")
    voices = tmp_path / "voices"
    random_voice(tts.bundle, "me", [LoraConfig(r=2)], voices / "me", 1)
    held = {p: p.stat().st_size for p in (*copy.rglob("*"), *voices.rglob("*"))}
    config = AdaptConfig(methods=parse_methods("lora"), **QUICK)
    for out, message in (
        (copy, "holds the recordings"),
        (voices, r"holds 1 folder\(s\) of a voice \(me\): give `out` "),
    ):
        with pytest.raises(ValueError, match=message):
            adapt(copy, tts.bundle, out, config, progress=False)
    assert {p: p.stat().st_size for p in (*copy.rglob("*"), *voices.rglob("*"))} == held  # nothing touched
    with pytest.raises(TypeError, match=r"a Chorus ModelBundle \(a Synthesizer's: tts.bundle\), got Synthesizer"):
        adapt(copy, tts, tmp_path / "v", config, progress=False)
    with pytest.raises(TypeError, match=r"methods: parse_methods\('lora'\) makes them"):
        AdaptConfig(methods="lora")
    with pytest.raises(TypeError, match="steps must be a whole number, got '5'"):
        AdaptConfig(steps="5")
    replaced = adapt(copy, tts.bundle, voices / "me", config, progress=False)  # a voice: replaced, as a file is
    assert read_voice(replaced.voice_dir).card.data_minutes > 0


def test_full_fine_tuning_trains_a_copy(tiny_base, new_voice_data, tmp_path):
    bundle = load_bundle(tiny_base)
    weights = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    config = AdaptConfig(methods=parse_methods("full"), keep_text_side=False, **QUICK)  # every weight
    result = adapt(new_voice_data, bundle, tmp_path / "full", config, progress=False)
    assert all(torch.equal(bundle.model.state_dict()[k], v) for k, v in weights.items())
    voice = read_voice(result.voice_dir)
    assert voice.full and result.card.trainable_parameters > sum(v.numel() for v in weights.values()) * 0.9
    tts = load_base(tiny_base, "griffin-lim")
    name = tts.load_voice(result.voice_dir)
    assert tts.synthesize("A test.", voice=name).audio.size > 0
    assert torch.equal(tts.bundle.model.symbol_embedding.weight, weights["symbol_embedding.weight"])


@pytest.mark.parametrize("method", ["residual", "lora", "full"])
def test_keep_text_side_leaves_the_text_side_as_the_base_has_it(tiny_base, new_voice_data, tmp_path, method):
    bundle = load_bundle(tiny_base)
    before = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    seen = []
    config = AdaptConfig(methods=parse_methods(method), keep_text_side=True, learning_rate=1e-2, **QUICK)
    result = adapt(
        new_voice_data, bundle, tmp_path / "v", config, progress=False, on_evaluate=lambda s, m: seen.append(s)
    )
    assert seen == [0, 2, 4]  # before training, then every eval_every steps
    # Wrapped layers keep their weights under ``base_layer``; adapter tensors are new keys.
    adapted = {k.replace(".base_layer", ""): v for k, v in result.model.state_dict().items()}
    text_side = [k for k in before if re.fullmatch(TEXT_SIDE_PATTERN, k)]
    assert text_side and all(torch.equal(adapted[k], before[k]) for k in text_side)
    added = [k for k in adapted if k not in before]
    assert all(k.startswith(("decoder.", "speaker_embedding.speaker_vector.")) for k in added)
    changed = [k for k in before if not torch.equal(adapted[k], before[k])]
    assert all(k.startswith(("decoder.", "mel_proj.")) for k in changed)
    assert any(k.startswith("decoder.") for k in added + changed)
    # Same timing as the start speaker on the base: the text side and the speaker vector stay.
    phonemes = torch.tensor([bundle.front_end.encode(["Keep every word."])[0]])
    lengths = torch.tensor([phonemes.shape[1]])
    start = bundle.speakers.index(result.card.notes["speaker_vector_start"])
    with active_adapter(result.model, None):
        base_timing = result.model.infer(phonemes, lengths, speaker_ids=torch.tensor([start])).durations
    voice_timing = result.model.infer(phonemes, lengths, speaker_ids=torch.tensor([0])).durations
    assert torch.equal(base_timing, voice_timing)


def test_early_stopping_keeps_the_best_adapter(tiny_base, new_voice_data, tmp_path):
    config = AdaptConfig(
        methods=parse_methods("speaker"), steps=40, eval_every=1, patience=2, learning_rate=50.0, threads=1
    )
    result = adapt(new_voice_data, load_bundle(tiny_base), tmp_path / "v", config, progress=False)
    assert result.card.steps < 40
    best = min(h["val_mel"] for h in result.history)
    assert result.card.metrics["validation_mel_l1_best"] == pytest.approx(best, abs=1e-4)


@pytest.mark.parametrize(
    "method, options, fields, message",
    [
        ("dora", None, {}, "unknown adapter method 'dora'"),
        ("lroa", None, {}, "unknown adapter method 'lroa'; did you mean 'lora'\\? choose from"),
        ("lora", None, {"steps": -1}, "steps must be at least 0 \\(0: a zero-shot voice\\), got -1"),
        ("lora", None, {"threads": 0}, "threads must be at least 1, got 0"),
        ("lora", None, {"max_minutes": 0}, "max_minutes must be more than 0"),
        ("lora", None, {"learning_rate": -1.0}, "learning_rate must be more than 0"),
        ("lora+full", None, {}, "not combined"),
        ("lora", {"lora": {"targets": ["no_such_layer"]}}, {}, "match no module"),
        ("lora", {"lora": {"rank": 4}}, {}, "bad options for lora"),
        ("lora", {"speaker": {"train_projection": True}}, {}, "options given for methods not chosen"),
        ("lora", None, {"min_minutes": 5.0}, "a voice needs at least 300 s"),
    ],
)
def test_bad_requests_fail_before_training(tiny_base, new_voice_data, tmp_path, method, options, fields, message):
    with pytest.raises(ValueError, match=message):
        config = AdaptConfig(methods=parse_methods(method, options), **fields)
        adapt(new_voice_data, load_bundle(tiny_base), tmp_path / "v", config, progress=False)


def test_a_target_that_matches_nothing_is_said_before_any_audio_is_read(
    tiny_base, new_voice_data, tmp_path, monkeypatch
):
    """It had come after Whisper's transcripts, the data check, the features and the choice of a start speaker
    (30 s and more). Recordings without transcripts: nothing is transcribed first."""
    import chorus.training.adapt as adapting

    untranscribed = shutil.copytree(new_voice_data / "wavs", tmp_path / "untranscribed")
    monkeypatch.setattr(adapting, "auto_transcribe", lambda *a, **k: pytest.fail("transcribed before the check"))
    config = AdaptConfig(methods=parse_methods("lora", {"lora": {"targets": ["foo_proj"]}}))
    with pytest.raises(ValueError, match="targets \\['foo_proj'\\].* match no module"):
        adapt(untranscribed, load_bundle(tiny_base), tmp_path / "v", config, progress=False)
    assert not (tmp_path / "v").exists()


def test_the_minimum_is_speech_not_the_silence_around_it(tiny_base, new_voice_data, tmp_path):
    """Clips padded with 4 s of silence: more than the minimum of audio, under it of speech: refused, naming both."""
    from chorus.audio.io import load_audio

    padded = tmp_path / "padded"
    (padded / "wavs").mkdir(parents=True)
    lines = (new_voice_data / "metadata.csv").read_text().splitlines()[:6]  # about 15 s of speech
    silence = np.zeros(2 * 22050, dtype=np.float32)
    for line in lines:
        audio = load_audio(new_voice_data / "wavs" / f"{line.split('|')[0]}.wav", 22050)
        sf.write(padded / "wavs" / f"{line.split('|')[0]}.wav", np.concatenate([silence, audio, silence]), 22050)
    (padded / "metadata.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ValueError, match=r"s of speech in the usable clips \([\d.]+ s of audio, with the silence"
    ) as refused:
        adapt(padded, load_bundle(tiny_base), tmp_path / "v", AdaptConfig(**QUICK), progress=False)
    speech, audio = (float(n) for n in re.findall(r"([\d.]+) s", str(refused.value))[:2])
    assert speech < 25 < audio


def test_mismatched_transcripts_and_several_speakers_are_refused(tiny_base, new_voice_data, two_voice_corpus, tmp_path):
    swapped = shutil.copytree(new_voice_data, tmp_path / "swapped")
    lines = (swapped / "metadata.csv").read_text().splitlines()
    long_text = " ".join(["This transcript belongs to a far longer recording than this one"] * 3)
    (swapped / "metadata.csv").write_text("".join(f"{line.split('|')[0]}|{long_text}\n" for line in lines))
    with pytest.raises(ValueError, match="transcripts do not fit"):
        adapt(swapped, load_bundle(tiny_base), tmp_path / "v", AdaptConfig(**QUICK), progress=False)
    with pytest.raises(ValueError, match="2 speakers"):
        adapt(two_voice_corpus, load_bundle(tiny_base), tmp_path / "v", AdaptConfig(**QUICK), progress=False)


def test_one_folder_of_two_voices_is_refused_before_training(tiny_base, new_voice_data, two_voice_corpus, tmp_path):
    """Two people's clips in one LJSpeech folder (espeak-ng f4 and m3, alternating) had trained a blend without a
    word: the shipped speaker encoder hears two voices and the folder is refused, naming clips of each;
    --no-one-speaker-check trains anyway. One person's folder passes."""
    mixed = tmp_path / "mixed"
    (mixed / "wavs").mkdir(parents=True)
    lines = []
    for folder in (new_voice_data, two_voice_corpus / "m3"):
        for line in (folder / "metadata.csv").read_text().splitlines():
            utt_id = line.split("|")[0]
            shutil.copy(folder / "wavs" / f"{utt_id}.wav", mixed / "wavs" / f"{folder.name}-{utt_id}.wav")
            lines.append(f"{folder.name}-{line}")
    (mixed / "metadata.csv").write_text("\n".join(lines[::2] + lines[1::2]) + "\n")
    config = AdaptConfig(**QUICK)
    with pytest.raises(ValueError, match="sound like two people") as refused:
        adapt(mixed, load_bundle(tiny_base), tmp_path / "v", config, progress=False)
    assert "f4-" in str(refused.value) and "m3-" in str(refused.value) and not (tmp_path / "v").exists()
    check_adaptation_data(new_voice_data, config, progress=False)  # one person: no refusal
    check_adaptation_data(mixed, AdaptConfig(**QUICK, one_speaker_check=False), progress=False)
    # `chorus data check` says so before anyone trains, and exits 1; it had passed the folder.
    checked = runner.invoke(app, ["data", "check", str(mixed)])
    output = " ".join(checked.output.split())
    assert checked.exit_code == 1 and "`chorus adapt` refuses them: " in output and "sound like two people" in output
    assert runner.invoke(app, ["data", "check", str(mixed), "--no-one-speaker-check"]).exit_code == 0
    assert runner.invoke(app, ["data", "check", str(new_voice_data)]).exit_code == 0
    # One more clip on a line left for Whisper (`id|`, which adapt transcribes) had turned the check off.
    shutil.copy(next((mixed / "wavs").iterdir()), mixed / "wavs" / "untold.wav")
    (mixed / "metadata.csv").write_text((mixed / "metadata.csv").read_text() + "untold|\n")
    checked = runner.invoke(app, ["data", "check", str(mixed)])
    assert checked.exit_code == 1 and "sound like two people" in " ".join(checked.output.split())


def test_a_few_clips_of_another_voice_are_found(new_voice_data, two_voice_corpus, tmp_path):
    """3 clips of another voice among 26 (a new user's probe): up to 48 clips are checked, so the 3 form their
    own group; the 16 checked before held one of them, a stray, and the folder passed."""
    folder = tmp_path / "intruded"
    (folder / "wavs").mkdir(parents=True)
    own = (new_voice_data / "metadata.csv").read_text().splitlines()
    other = (two_voice_corpus / "m3" / "metadata.csv").read_text().splitlines()[:3]
    lines = []
    for copy, gain in enumerate((1.0, 0.7)):  # 16 clips and 7 of them again, quieter: 23 of one person
        for line in own[: 16 if copy == 0 else 7]:
            utt_id, text = line.split("|", 1)
            audio, rate = sf.read(new_voice_data / "wavs" / f"{utt_id}.wav", dtype="float32")
            sf.write(folder / "wavs" / f"f4-{copy}-{utt_id}.wav", gain * audio, rate, subtype="PCM_16")
            lines.append(f"f4-{copy}-{utt_id}|{text}")
    for number, line in enumerate(other):
        utt_id, text = line.split("|", 1)
        shutil.copy(two_voice_corpus / "m3" / "wavs" / f"{utt_id}.wav", folder / "wavs" / f"m3-{utt_id}.wav")
        lines.insert((4, 13, 21)[number], f"m3-{utt_id}|{text}")  # spread as bench/one_speaker.py spreads them
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="sound like two people") as refused:
        check_adaptation_data(folder, AdaptConfig(**QUICK), progress=False)
    assert "3 like another (e.g. m3-" in str(refused.value), refused.value


def test_one_person_on_two_channels_is_told_so(new_voice_data, tmp_path):
    """One person's clips, half of them through 8 kHz and back (a phone recording exported at 16 kHz), sound like
    two people to the encoder: the refusal says that one voice's clips are the narrow ones (a new user had been
    told only "two people", with no hint of the phone line)."""
    import soxr

    data = shutil.copytree(new_voice_data, tmp_path / "two_channels")
    for wav in sorted((data / "wavs").glob("*.wav"))[1::2]:
        audio, rate = sf.read(wav, dtype="float32")
        sf.write(wav, soxr.resample(soxr.resample(audio, rate, 8000), 8000, 16000), 16000, subtype="PCM_16")
    with pytest.raises(ValueError, match="sound like two people") as refused:
        check_adaptation_data(data, AdaptConfig(**QUICK), progress=False)
    assert "voice's clips hold nothing above 4.2 kHz and the other's do: one person recorded directly" in str(
        refused.value
    )


def test_cli_adapt_then_synthesize_with_the_voice(tiny_base, new_voice_data, tmp_path):
    voice = tmp_path / "voices" / "f4"
    result = runner.invoke(
        app,
        [
            "adapt",
            str(new_voice_data),
            "--out",
            str(voice),
            "--method",
            "lora+speaker",
            "--rank",
            "2",
            "--steps",
            "2",
            "--threads",
            "1",
            "--model",
            str(tiny_base),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "voice:" in result.output and "chorus synthesize --voice" in result.output
    assert "stopped by its step cap at step 2" in " ".join(result.output.split())  # why it ended (a new user's probe)
    card = json.loads((voice / "voice_card.json").read_text())
    assert card["base_model"] == "chorus" and "stopped by its step cap" in card["notes"]["stopped"]  # it was ""
    # The command it prints names the model the voice was made on (it had left --model out, and that failed).
    assert f'speak with it: chorus synthesize --voice {voice} --model {tiny_base} --text "Hello."' in result.output
    elsewhere = runner.invoke(app, ["synthesize", "--text", "Hi.", "--voice", str(voice), "--vocoder", "griffin-lim"])
    said = " ".join(elsewhere.output.split())
    assert elsewhere.exit_code != 0 and "voice 'f4' was made on base chorus" in said, said
    assert "speak it on the Chorus model it was made on (the shipped base: no --model; another: --model DIR" in said
    assert "--base chorus" not in said, said
    out = tmp_path / "hello.wav"
    spoken = runner.invoke(
        app,
        [
            "synthesize",
            "--text",
            "Hello.",
            "--voice",
            str(voice),
            "--model",
            str(tiny_base),
            "--vocoder",
            "griffin-lim",
            "--out",
            str(out),
        ],
    )
    assert spoken.exit_code == 0, spoken.output
    assert out.stat().st_size > 1000 and "f4" in spoken.output


def test_cli_adapt_errors_are_clear(tiny_base, new_voice_data, tmp_path):
    bad_method = runner.invoke(
        app,
        ["adapt", str(new_voice_data), "--out", str(tmp_path / "v"), "--method", "magic", "--model", str(tiny_base)],
    )
    assert bad_method.exit_code == 2 and "unknown adapter method 'magic'" in bad_method.output
    wrong_flag = runner.invoke(
        app,
        [
            "adapt",
            str(new_voice_data),
            "--out",
            str(tmp_path / "v"),
            "--method",
            "bitfit",
            "--rank",
            "4",
            "--model",
            str(tiny_base),
        ],
    )
    assert wrong_flag.exit_code == 2 and "applies to lora" in wrong_flag.output
    missing = runner.invoke(
        app, ["synthesize", "--text", "Hi.", "--voice", str(tmp_path / "nope"), "--model", str(tiny_base)]
    )
    assert missing.exit_code == 2 and "no such voice folder" in missing.output and "--speaker" not in missing.output
    empty = tmp_path / "empty"
    empty.mkdir()
    not_one = runner.invoke(app, ["synthesize", "--text", "Hi.", "--voice", str(empty), "--model", str(tiny_base)])
    assert not_one.exit_code == 2 and "not a voice folder" in not_one.output


def test_cli_adapt_never_overwrites_a_voice_or_the_recordings_unasked(tiny_base, new_voice_data, tmp_path, monkeypatch):
    """A voice is written whole (the old folder swapped out): a folder that holds anything is refused before
    any work, --overwrite replaces it, and no flag writes a voice over the recordings it learns from."""
    voice = tmp_path / "voices" / "anna"
    command = ["adapt", str(new_voice_data), "--steps", "1", "--threads", "1", "--model", str(tiny_base)]
    voice.mkdir(parents=True)  # an empty folder is no voice: taken
    made = runner.invoke(app, [*command, "--out", str(voice)])
    assert made.exit_code == 0, made.output
    (voice / "LICENSE.md").write_text("Anna's terms: not for advertising.")  # what the owner wrote
    (voice / ".DS_Store").write_bytes(b"\0")  # a desktop's leftover: no reason to refuse
    again = runner.invoke(app, [*command, "--out", str(voice)])
    assert again.exit_code == 2 and "already holds a voice" in again.output and "--overwrite" in again.output
    assert (voice / "LICENSE.md").read_text() == "Anna's terms: not for advertising."
    replaced = runner.invoke(app, [*command, "--out", str(voice), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert "Anna's terms" not in (voice / "LICENSE.md").read_text() and (voice / "voice_card.json").is_file()
    (voice / "notes.txt").write_text("how I recorded it")  # more than a voice: never swapped out, even asked
    more = runner.invoke(app, [*command, "--out", str(voice), "--overwrite"])
    assert more.exit_code == 2 and "holds a voice and more (notes.txt)" in " ".join(more.output.split())
    assert (voice / "notes.txt").is_file()
    parent = runner.invoke(app, [*command, "--out", str(voice.parent), "--overwrite"])  # voices/ for voices/NAME
    assert parent.exit_code == 2 and "holds 1 folder(s) of a voice (anna)" in " ".join(parent.output.split())
    (voice / "notes.txt").unlink()
    (voice / "README.md").unlink()
    (voice / "README.md").mkdir()  # a folder under a voice file's name is more than a voice
    assert "holds a voice and more (README.md)" in " ".join(
        runner.invoke(app, [*command, "--out", str(voice), "--overwrite"]).output.split()
    )
    link = tmp_path / "link-to-anna"
    link.symlink_to(voice)  # the swap would replace the link, not the voice it points to
    assert "is a link" in runner.invoke(app, [*command, "--out", str(link), "--overwrite"]).output
    peft = tmp_path / "llm-lora"  # a language model's PEFT adapter: an adapter_config.json, and no voice
    peft.mkdir()
    (peft / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    assert "files that are not a voice" in runner.invoke(app, [*command, "--out", str(peft), "--overwrite"]).output

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    # A folder of anything but a voice is never replaced (voices/ given for voices/NAME would lose them all).
    for overwrite in ([], ["--overwrite"]):
        other = runner.invoke(app, [*command, "--out", str(notes), *overwrite])
        assert other.exit_code == 2 and "holds files that are not a voice" in other.output
    assert (notes / "todo.txt").read_text() == "keep me"
    (tmp_path / "a-file").write_text("x")
    a_file = runner.invoke(app, [*command, "--out", str(tmp_path / "a-file")])
    assert a_file.exit_code == 2 and "is a file" in a_file.output

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # --out . : the current folder, which the swap would move away under the shell
    assert "is the current folder" in runner.invoke(app, [*command, "--out", "."]).output

    before = sorted(p.name for p in new_voice_data.rglob("*"))
    # the recordings' folder, one holding it, or one inside it (its wavs/)
    for out in (new_voice_data, new_voice_data.parent, new_voice_data / "wavs"):
        over_data = runner.invoke(app, [*command, "--out", str(out), "--overwrite"])
        assert over_data.exit_code == 2 and "the recordings" in over_data.output
    assert sorted(p.name for p in new_voice_data.rglob("*")) == before


def test_split_at_silences_cuts_long_recordings_into_clips():
    from chorus.audio.silences import split_at_silences

    rate = 16_000
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(int(2.0 * rate)) / rate).astype(np.float32)
    pause = np.zeros(rate, dtype=np.float32)
    clips = split_at_silences(np.concatenate([tone, pause, tone, pause, tone]), rate, max_seconds=3.0)
    assert len(clips) == 3 and all(1.9 < len(c) / rate < 2.5 for c in clips)
    long = np.concatenate([tone] * 5)  # 10 s without a pause: cut at most every 3 s
    assert all(len(c) / rate <= 3.0 + 0.2 for c in split_at_silences(long, rate, max_seconds=3.0))


def test_adapt_transcribes_recordings_without_transcripts(tiny_base, new_voice_data, tmp_path):
    """Two long recordings (an mp3 and an m4a-like aac, no metadata.csv): cut at silences, transcribed by
    Whisper, adapted; the card says the transcripts were automatic."""
    from chorus.audio.encode import encode_whole
    from chorus.audio.io import load_audio

    recordings = tmp_path / "recordings"
    recordings.mkdir()
    wavs = sorted((new_voice_data / "wavs").glob("*.wav"))  # about 35 s
    gap = np.zeros(11025, dtype=np.float32)
    half = len(wavs) // 2
    for name, chunk in [("one.mp3", wavs[:half]), ("two.aac", wavs[half:])]:
        audio = np.concatenate([np.concatenate([load_audio(w), gap]) for w in chunk])
        (recordings / name).write_bytes(encode_whole(audio, 22050, name.split(".")[1]))
    voice = tmp_path / "voices" / "auto"
    result = runner.invoke(
        app,
        ["adapt", str(recordings), "--out", str(voice), "--steps", "2", "--threads", "1", "--model", str(tiny_base),
         "--keep-transcribed", str(tmp_path / "transcribed")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "transcribed by Whisper" in result.output
    # Kept to read and mend: the clips Whisper heard and its transcripts, an LJSpeech-style folder.
    kept = (tmp_path / "transcribed" / "metadata.csv").read_text().splitlines()
    assert kept and all((tmp_path / "transcribed" / "wavs" / f"{line.split('|')[0]}.wav").is_file() for line in kept)
    assert "Whisper's transcripts:" in " ".join(result.output.split())
    card = json.loads((voice / "voice_card.json").read_text())
    automatic, _, clips = card["notes"]["automatic_transcripts"].partition(" of ")
    assert int(automatic) == int(clips.split()[0]) >= 4  # every clip, cut from two recordings
    assert int(automatic) == len(kept)
    assert "automatic_transcripts" in (voice / "README.md").read_text()  # in the model-card metadata too


def test_lines_left_out_of_a_partly_transcribed_folder_are_named_by_the_users_own_lines(
    tiny_base, new_voice_data, tmp_path
):
    """One line without text sends the folder through Whisper into a temporary copy: a clip left out was named by
    the copy's metadata.csv, gone once the run ended, and by its line there (":12" for the user's line 14). An id
    that names a file outside wavs/ is read no more here than by the data check."""
    data = shutil.copytree(new_voice_data, tmp_path / "partly")
    lines = (data / "metadata.csv").read_text().splitlines()
    first_id = lines[0].split("|")[0]
    long_id, long_text = lines[2].split("|", 1)
    lines[0] = f"{first_id}|"  # Whisper writes this one
    lines[2] = f"{long_id}|{long_text} " + "and so on and so forth " * 12  # far longer than its clip
    (tmp_path / "outside.wav").write_bytes((data / "wavs" / f"{first_id}.wav").read_bytes())
    lines.insert(1, "a line without a separator")
    lines.insert(1, "../../outside|Read from outside.")
    (data / "metadata.csv").write_text("\n".join(lines) + "\n")
    result = runner.invoke(
        app,
        ["adapt", str(data), "--out", str(tmp_path / "v"), "--steps", "2", "--threads", "1", "--model", str(tiny_base)],
    )
    output = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    long_line = output.split(f"skipped {data / 'metadata.csv'}:5: ")  # the long transcript, on the user's line 5
    assert len(long_line) == 2 and "phonemes" in long_line[1][:120], output
    assert f"skipped {data / 'metadata.csv'}:2: id '../../outside' names a file outside wavs/" in output
    assert f"skipped {data / 'metadata.csv'}:3: expected 2 or 3 '|'-separated fields" in output  # was dropped unsaid
    assert "chorus-transcribed" not in output


def test_recordings_below_the_data_checks_rate_are_not_trained_on_when_transcribed(tiny_base, new_voice_data, tmp_path):
    """Whisper's clips are written at the model's rate, where the data check could no longer see that a
    recording was made at 8 kHz: such a recording is skipped before, and a folder of nothing else refused."""
    import soxr

    from chorus.audio.io import load_audio

    recordings = tmp_path / "phone"
    recordings.mkdir()
    audio = np.concatenate([load_audio(w) for w in sorted((new_voice_data / "wavs").glob("*.wav"))])
    sf.write(recordings / "call.wav", soxr.resample(audio, 22050, 8000), 8000)
    voice = tmp_path / "voices" / "phone"
    result = runner.invoke(
        app,
        ["adapt", str(recordings), "--out", str(voice), "--steps", "2", "--threads", "1", "--model", str(tiny_base)],
    )
    output = " ".join(result.output.split())
    assert result.exit_code != 0 and "call.wav: recorded at 8000 Hz (minimum 16000 Hz)" in output, output
    assert "no usable recording" in output and not voice.exists()


def test_the_card_says_which_clips_were_left_out_and_what_the_rest_are_warned_of(tiny_base, new_voice_data, tmp_path):
    """What `chorus adapt` prints as it goes is on the card too, where a server's job reads it: the clips the data
    check left out (here one recorded far too loud, and a tone), and the warnings of the rest: through a narrow
    channel, in noise 10 dB under the speech."""
    import soxr

    data = shutil.copytree(new_voice_data, tmp_path / "phone")
    wavs = sorted((data / "wavs").glob("*.wav"))
    rng = np.random.default_rng(0)
    for wav in wavs:
        audio, rate = sf.read(wav, dtype="float32")
        noisy = np.pad(audio, rate // 2) + rng.standard_normal(len(audio) + rate) * np.sqrt(np.mean(audio**2) / 10)
        sf.write(wav, soxr.resample(soxr.resample(noisy, rate, 8000), 8000, 16000), 16000, subtype="PCM_16")
    audio, rate = sf.read(wavs[0], dtype="float32")
    sf.write(wavs[0], np.clip(audio * 40, -1, 1), rate)
    sf.write(wavs[1], 0.3 * np.sin(2 * np.pi * 220 * np.arange(2 * rate) / rate), rate)
    voice = tmp_path / "voices" / "phone"
    result = runner.invoke(
        app, ["adapt", str(data), "--out", str(voice), "--steps", "2", "--threads", "1", "--model", str(tiny_base)]
    )
    output = " ".join(result.output.split())
    assert result.exit_code == 0 and "warning: 14 of the 14 usable clips hold nothing above 4.2 kHz" in output, output
    assert "warning: the speech stands" in output and "a tone, music, noise, or a whisper?" in output, output
    notes = json.loads((voice / "voice_card.json").read_text())["notes"]
    assert notes["skipped_clips"] == "2 (1 clipped, 1 no_speech)" and notes["narrow_band"].startswith("14 of the 14")
    assert notes["noisy"].startswith("the speech stands "), notes


def test_an_interrupted_adapt_keeps_its_best_voice_and_exits_as_interrupted(
    tiny_base, new_voice_data, tmp_path, monkeypatch
):
    """A new user's probe: Ctrl-C at step 99 threw every step away, without a word. The command keeps the best
    evaluation so far, says so, and still exits 130 (a review: exit 0 let a script's loop go on)."""
    from chorus.training import adapt as adapting

    real, calls = adapting.compute_losses, []

    def interrupted_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(adapting, "compute_losses", interrupted_on_the_third)
    voice = tmp_path / "cut"
    args = ["adapt", str(new_voice_data), "--out", str(voice), "--steps", "6", "--threads", "1"]
    result = runner.invoke(app, [*args, "--model", str(tiny_base)])
    said = " ".join(result.output.split())
    assert result.exit_code == 130, said
    assert "stopped by an interrupt (Ctrl-C)" in said and "interrupted: the voice above is the best" in said
    assert (voice / "voice_card.json").is_file()
