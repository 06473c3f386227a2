"""`chorus synthesize` streams: each sentence's bytes out as it is made, standard input line by line, a
progress bar on standard error, flat memory, word captions, and Piper's flags as aliases."""

from __future__ import annotations

import io
import json
import struct
import sys
import tracemalloc
import wave

import numpy as np
import pytest
from typer.testing import CliRunner

from chorus.cli import app
from chorus.models.bundle import load_bundle
from chorus.synthesis.engine import Engine
from conftest import TWO_VOICE_SENTENCES

runner = CliRunner()
WIDE = {"COLUMNS": "400"}
SENTENCES = TWO_VOICE_SENTENCES  # six Harvard sentences
TEXT = " ".join(SENTENCES)


def _args(tiny_base, *more: str) -> list[str]:
    return ["synthesize", "--model", str(tiny_base), "--vocoder", "griffin-lim", *more]


def _samples(wav: bytes) -> np.ndarray:
    return np.frombuffer(wav[44:], "<i2")


def _forwards_seeing(monkeypatch, written) -> list[tuple[int, int]]:
    """(rows, ``written()`` when it starts) of every forward the engine runs from now on."""
    seen: list[tuple[int, int]] = []
    speak = Engine.synthesize

    def watched(self, requests, *args, **kwargs):
        seen.append((len(requests), written()))
        return speak(self, requests, *args, **kwargs)

    monkeypatch.setattr(Engine, "synthesize", watched)
    return seen


def test_standard_output_gets_each_sentence_as_it_is_made_and_the_bar_goes_to_stderr(tiny_base, monkeypatch):
    """The first sentence is read alone and its bytes are out before the next forward starts; the WAV says
    "unknown length" (it streams), the progress bar is on standard error, and standard output holds the audio
    alone: the samples of the same text written to a file."""
    seen = _forwards_seeing(monkeypatch, lambda: sys.stdout.buffer.tell())
    result = runner.invoke(app, _args(tiny_base, "--text", TEXT, "--out", "-"))
    assert result.exit_code == 0, result.stderr
    assert [rows for rows, _ in seen] == [1, 5]
    first = seen[1][1]
    assert first > 44 + 22050 // 4, "header and the first sentence were written before the second forward"
    audio = result.stdout_bytes
    assert audio[:4] == b"RIFF" and struct.unpack("<I", audio[40:44])[0] == 0xFFFFFFFF
    assert "6/6 sentences" in result.stderr and "RTF" in result.stderr
    assert len(audio) == 44 + 2 * len(_samples(audio)) and b"sentences" not in audio


def test_a_file_is_written_as_it_is_made_and_states_its_true_length(tiny_base, tmp_path, monkeypatch):
    """Into a temporary file beside the target (renamed over it once complete), sentence by sentence; then
    the header carries the true sizes, so Python's wave reads the right frame count. Standard output and
    the file hold the same samples."""
    out = tmp_path / "long.wav"

    def partial() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob(".long.wav.*"))

    seen = _forwards_seeing(monkeypatch, partial)
    result = runner.invoke(app, _args(tiny_base, "--text", TEXT, "--out", str(out)), env=WIDE)
    assert result.exit_code == 0, result.output
    assert seen[1][1] > 44 + 22050 // 4 and not list(tmp_path.glob(".long.wav.*"))
    data = out.read_bytes()
    with wave.open(str(out)) as read:
        assert read.getnframes() == (len(data) - 44) // 2 and read.getframerate() == 22050
    piped = runner.invoke(app, _args(tiny_base, "--text", TEXT, "--out", "-"))
    assert np.array_equal(_samples(piped.stdout_bytes), _samples(data))
    one = runner.invoke(app, _args(tiny_base, "--text", "Hello there.", "--out", "-"))
    with wave.open(io.BytesIO(one.stdout_bytes)) as read:  # known whole before its first byte: true sizes
        assert read.getnframes() == (len(one.stdout_bytes) - 44) // 2


def test_memory_does_not_grow_with_the_text(tiny_base, tmp_path):
    """Nothing of the audio is kept: the peak of what Python allocates while speaking 48 sentences into a
    file is about that of 12 (one batch of sentences and the encoder's buffers)."""

    def peak(sentences: int) -> int:
        text = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(sentences))
        tracemalloc.start()
        try:
            result = runner.invoke(app, _args(tiny_base, "--text", text, "--out", str(tmp_path / "a.wav")))
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert result.exit_code == 0, result.output

    peak(12)  # first-use allocations (caches, the segmenter) out of the way
    short, long = peak(12), peak(48)
    assert long < 1.25 * short, (short, long)  # keeping 48 sentences' audio would add 8 MB to ~2 MB


class _Arriving(io.RawIOBase):
    """Standard input as a pipe delivers it: one line per read, and before each read after the first, a note
    of how many bytes standard output holds (what was written before the next line arrived)."""

    def __init__(self, lines: list[str]):
        self.lines = [line.encode() for line in lines]
        self.before: list[int] = []

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self.lines:
            return 0
        self.before.append(sys.stdout.buffer.tell())
        line = self.lines.pop(0)
        buffer[: len(line)] = line
        return len(line)


def test_standard_input_line_by_line_speaks_each_line_before_the_next_arrives(tiny_base, tmp_path, monkeypatch):
    """--output-raw (Piper's) reads standard input a line at a time: each line's audio is out before the next
    line is read; raw 16-bit samples, the same as --line-by-line's WAV; timestamps run across the lines."""
    import typer.testing

    given = typer.testing.make_input_stream  # takes str or bytes only: a stream is given as it is
    monkeypatch.setattr(typer.testing, "make_input_stream", lambda i, c: i if hasattr(i, "read") else given(i, c))
    lines = ["Hello there.\n", "\n", "It is easy to tell the depth of a well.\n"]
    stdin = _Arriving(lines)
    raw = runner.invoke(app, _args(tiny_base, "--output-raw"), input=io.BufferedReader(stdin))
    assert raw.exit_code == 0, raw.stderr
    assert stdin.before[0] == 0 and stdin.before[1] > 22050 // 4, stdin.before  # line 1 spoken before line 2 came
    stamps = tmp_path / "stamps.json"
    wav = runner.invoke(
        app, _args(tiny_base, "--line-by-line", "--out", "-", "--timestamps", str(stamps)), input="".join(lines)
    )
    assert wav.exit_code == 0, wav.stderr
    assert np.array_equal(_samples(wav.stdout_bytes), np.frombuffer(raw.stdout_bytes, "<i2"))
    words = json.loads(stamps.read_text())["words"]
    assert [w["text"] for w in words] == "Hello there. It is easy to tell the depth of a well.".split()
    assert words[2]["start"] >= words[1]["end"] + 0.2 - 1e-3  # the second line after the first and a pause
    assert words[-1]["end"] <= len(raw.stdout_bytes) / 2 / 22050 + 1e-3
    whole = runner.invoke(app, _args(tiny_base, "--out", "-"), input="".join(lines))  # read to its end
    assert np.array_equal(_samples(whole.stdout_bytes), _samples(wav.stdout_bytes))


def test_piper_output_flags(tiny_base, tmp_path):
    """--output_file / -f, --output_dir / -d (a clip per line of standard input, each path printed when
    written), --json-input lines with their own output_file and speaker, and -q."""
    spoken = runner.invoke(app, _args(tiny_base, "--text", "Hello there.", "--output_file", str(tmp_path / "a.wav")))
    short = runner.invoke(app, _args(tiny_base, "--text", "Hello there.", "-f", str(tmp_path / "b.wav"), "-q"))
    assert spoken.exit_code == short.exit_code == 0, spoken.output + short.output
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    assert "RTF" in spoken.stdout and short.stdout == ""

    folder = tmp_path / "clips"
    lines = "First line.\n\n!!!\nSecond line.\n"
    result = runner.invoke(app, _args(tiny_base, "--output_dir", str(folder)), input=lines, env=WIDE)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["0001.wav", "0004.wav", "metadata.csv"]
    # Standard output is the files written and nothing else (a program reads it, as Piper's); the report is on stderr.
    assert result.stdout.splitlines() == [str(folder / "0001.wav"), str(folder / "0004.wav")]
    assert "skipped standard input:3" in result.stderr and "RTF" in result.stderr

    json_lines = "\n".join(
        [
            json.dumps({"text": "Hello there.", "output_file": str(tmp_path / "m3.wav")}),
            json.dumps({"text": "Hello there.", "speaker": "f2", "output_file": str(tmp_path / "f2.wav")}),
            json.dumps({"text": "Hello there.", "speaker_id": 1, "output_file": str(tmp_path / "one.wav")}),
            "not json",
            json.dumps({"text": "Hello there.", "speaker": "nobody", "output_file": str(tmp_path / "x.wav")}),
        ]
    )
    result = runner.invoke(app, _args(tiny_base, "--json-input", "-d", str(tmp_path / "rest")), input=json_lines)
    assert result.exit_code == 0, result.output
    assert "skipped standard input:4: not a JSON object" in result.stderr
    assert "skipped standard input:5: unknown speaker 'nobody'" in result.stderr and not (tmp_path / "x.wav").exists()
    m3, f2, one = ((tmp_path / f"{name}.wav").read_bytes() for name in ("m3", "f2", "one"))
    assert m3 != f2 and one in (m3, f2) and one == (f2 if load_bundle(tiny_base).speakers[1] == "f2" else m3)
    # A line's own file in the format its suffix names (a new user's probe: "r7.mp3" got WAV bytes and "r8.xyz"
    # was written); a line with none goes to --out, whose path is printed as the others' are.
    lines = "\n".join(
        [
            json.dumps({"text": "Hello there.", "output_file": str(tmp_path / "r7.mp3")}),
            json.dumps({"text": "Hello there.", "output_file": str(tmp_path / "r8.xyz")}),
            json.dumps({"text": "Hello there."}),
        ]
    )
    result = runner.invoke(app, _args(tiny_base, "--json-input", "-f", str(tmp_path / "rest.wav")), input=lines)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r7.mp3").read_bytes()[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3") and not (
        tmp_path / "r8.xyz"
    ).exists()
    said = " ".join(result.stderr.split())  # rich folds a long temporary path
    assert "skipped standard input:2:" in said and "suffix '.xyz'" in said
    assert result.stdout.split() == [str(tmp_path / "r7.mp3"), str(tmp_path / "rest.wav")]
    # --format, where given, is every file's; a name with no suffix takes the command's format, as Piper writes it.
    lines = "\n".join(
        [
            json.dumps({"text": "Hello there.", "output_file": str(tmp_path / "f.wav")}),
            json.dumps({"text": "Hello there.", "output_file": str(tmp_path / "plain")}),
        ]
    )
    result = runner.invoke(app, _args(tiny_base, "--json-input", "--format", "mp3"), input=lines)
    assert result.exit_code == 0, result.output
    for name in ("f.wav", "plain"):
        assert (tmp_path / name).read_bytes()[:4] != b"RIFF", name  # MP3, as --format says


def test_piper_pace_noise_and_model_flags(tiny_base, tmp_path, monkeypatch):
    """--length_scale is 1 / --speed; --noise_scale / --noise_w set a Piper base's noise, and on the Chorus
    base are ignored with a warning; -m voice.onnx is --base voice.onnx."""
    from chorus.synthesis.bases import piper
    from conftest import tiny_piper_base

    slow = runner.invoke(
        app, _args(tiny_base, "--text", "Hello.", "--length_scale", "2", "-f", str(tmp_path / "l.wav"))
    )
    half = runner.invoke(app, _args(tiny_base, "--text", "Hello.", "--speed", "0.5", "-f", str(tmp_path / "s.wav")))
    assert slow.exit_code == half.exit_code == 0, slow.output
    assert (tmp_path / "l.wav").read_bytes() == (tmp_path / "s.wav").read_bytes()
    both = runner.invoke(app, _args(tiny_base, "--text", "Hi.", "--length-scale", "2", "--speed", "2"))
    assert both.exit_code == 2 and "not both" in both.output
    noisy = runner.invoke(
        app,
        _args(tiny_base, "--text", "Hello.", "--noise_scale", "0.3", "--noise-w", "0", "-f", str(tmp_path / "n.wav")),
    )
    warned = " ".join(noisy.stderr.split())
    assert noisy.exit_code == 0 and "the Chorus base draws none" in warned and warned.endswith("ignored")
    runner.invoke(app, _args(tiny_base, "--text", "Hello.", "-f", str(tmp_path / "d.wav")))
    assert (tmp_path / "n.wav").read_bytes() == (tmp_path / "d.wav").read_bytes()

    opened = []

    def tiny_voice(spec, vocoder=None, device="cpu", config=None):
        opened.append(spec)
        return tiny_piper_base(name="voice.onnx")

    monkeypatch.setattr(piper, "open_base", tiny_voice)
    plain, quiet = tmp_path / "plain.wav", tmp_path / "quiet.wav"
    for out, more in ((plain, []), (quiet, ["--noise_scale", "0", "--noise_w", "0"])):
        result = runner.invoke(app, ["synthesize", "-m", "voice.onnx", "--text", "Hello.", "-f", str(out), *more])
        assert result.exit_code == 0, result.output
    assert opened == ["voice.onnx", "voice.onnx"]
    assert plain.read_bytes() != quiet.read_bytes()  # the generator's noise, turned off
    # Noise no voice speaks with (a new user's probe: --noise-w 5 made 101 s of "Hello there.", 10 ran out of
    # memory, nan made silence) is one line and exit 2, no file.
    for flag, value in (("--noise-w", "5"), ("--noise-scale", "nan"), ("--noise_w", "inf"), ("--noise-scale", "-1")):
        refused = runner.invoke(app, ["synthesize", "-m", "voice.onnx", "--text", "Hi.", "-f", str(tmp_path / "x.wav"),
                                      flag, value])  # fmt: skip
        said = " ".join(refused.output.split())
        assert refused.exit_code == 2 and f"{flag.replace('_', '-')} must be within 0-2" in said, said
        assert not (tmp_path / "x.wav").exists()


def test_piper_config_flag_reads_a_voice_json_kept_elsewhere(tiny_base, tmp_path):
    """Piper's -c/--config: a voice.onnx whose .onnx.json is not beside it speaks as the installed joe does;
    without the flag the missing json is named, and a config beside the Chorus base is refused (no traceback)."""
    from chorus.peers.piper import joe_paths

    onnx, config = joe_paths()
    (tmp_path / "models").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "models" / "voice.onnx").symlink_to(onnx)
    (tmp_path / "configs" / "voice.json").symlink_to(config)
    voice = str(tmp_path / "models" / "voice.onnx")
    moved, installed = tmp_path / "moved.wav", tmp_path / "installed.wav"
    result = runner.invoke(app, ["synthesize", "-m", voice, "-c", str(tmp_path / "configs" / "voice.json"),
                                 "--text", "Hi.", "-f", str(moved)])  # fmt: skip
    assert result.exit_code == 0, result.output
    runner.invoke(app, ["synthesize", "--base", "piper-joe", "--text", "Hi.", "-f", str(installed)])
    assert moved.read_bytes() == installed.read_bytes()  # the same voice, config and seeded noise
    result = runner.invoke(app, ["synthesize", "-m", voice, "--text", "Hi.", "-f", str(tmp_path / "x.wav")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "voice.onnx.json: a Piper voice needs its .onnx.json beside" in said, said
    result = runner.invoke(app, ["synthesize", "-m", voice, "--config", str(tmp_path / "none.json"), "--text", "Hi.",
                                 "-f", str(tmp_path / "x.wav")])  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "none.json: no such voice config" in said and "--config" not in said, said
    result = runner.invoke(app, _args(tiny_base, "-c", str(config), "--text", "Hi.", "-f", str(tmp_path / "x.wav")))
    assert result.exit_code == 2 and "goes with a Piper voice file" in " ".join(result.output.split())
    assert not (tmp_path / "x.wav").exists()


def test_word_captions_from_the_command_line(tiny_base, tmp_path):
    """SRT / VTT "word captions": a cue for each word as written; --caption-words groups them."""
    out, srt, vtt = tmp_path / "a.wav", tmp_path / "a.srt", tmp_path / "a.vtt"
    text = "Meet Dr. Smith at the station."
    result = runner.invoke(app, _args(tiny_base, "--text", text, "--out", str(out), "--timestamps", str(srt)))
    assert result.exit_code == 0, result.output
    cues = srt.read_text().split("\n\n")
    assert [cue.splitlines()[2] for cue in cues if cue.strip()] == text.split()
    result = runner.invoke(
        app, _args(tiny_base, "--text", text, "--out", str(out), "--timestamps", str(vtt), "--caption-words", "3")
    )
    assert result.exit_code == 0, result.output
    assert vtt.read_text().count(" --> ") == 2 and "\nMeet Dr. Smith\n" in vtt.read_text()


@pytest.mark.parametrize(
    "more, message",
    [
        (["--output-raw", "--out", "x.wav"], "--output-raw writes to standard output"),
        (["--output-raw", "--format", "mp3"], "--output-raw writes raw pcm"),
        (["--out", "a.wav", "--output-dir", "d"], "not both"),
        (["--text", "Hi.", "--json-input"], "read standard input"),
        (["--output-dir", "d", "--timestamps", "t.json"], "--timestamps goes with one output"),
    ],
)
def test_contradicting_flags_are_refused(tiny_base, more, message):
    result = runner.invoke(app, _args(tiny_base, *more), input="Hi.\n")
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize(
    "more, option",
    [
        (["--speed", "0.01"], "--speed"),  # 0.01 would make one word minutes long
        (["--length-scale", "100"], "--length-scale"),
        (["--sentence-silence", "99999"], "--sentence-silence"),  # 99,999 s of samples: 8 GB, once killed the machine
        (["--sentence-silence", "-1"], "--sentence-silence"),
        (["--sample-rate", "-5"], "--sample-rate"),  # was a ZeroDivisionError traceback
        (["--sample-rate", "1000000"], "--sample-rate"),
    ],
)
def test_values_out_of_range_are_refused_before_any_work(tiny_base, tmp_path, more, option):
    out = tmp_path / "x.wav"
    result = runner.invoke(app, _args(tiny_base, "--text", "Hi. Ho.", "--out", str(out), *more), env=WIDE)
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_text_that_is_not_utf8_is_named_and_a_byte_order_mark_is_not_text(tiny_base, tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Caf\u00e9 open.\n".encode("latin-1"))
    from_file = runner.invoke(app, _args(tiny_base, "--text-file", str(latin1), "--out", str(tmp_path / "d")))
    assert from_file.exit_code == 2 and "not UTF-8 text (byte 0xe9 at position 3)" in from_file.output
    piped = runner.invoke(app, _args(tiny_base, "--out", str(tmp_path / "x.wav")), input=latin1.read_bytes())
    assert piped.exit_code == 2 and "standard input: not UTF-8 text (byte 0xe9" in piped.output
    lines = runner.invoke(
        app, _args(tiny_base, "--line-by-line", "--out", str(tmp_path / "l.wav")), input=latin1.read_bytes() + b"Hi.\n"
    )
    assert lines.exit_code == 0 and "skipped standard input:1: not UTF-8 text" in lines.output, lines.output
    bom = runner.invoke(app, _args(tiny_base, "--out", str(tmp_path / "bom.wav")), input=b"\xef\xbb\xbfHi.\n")
    assert bom.exit_code == 0 and "dropped" not in bom.output, bom.output
    assert (tmp_path / "bom.wav").read_bytes() == (tmp_path / "l.wav").read_bytes()  # both say "Hi."


def test_h_is_help_for_the_app_and_its_commands():
    assert runner.invoke(app, ["-h"]).output == runner.invoke(app, ["--help"]).output
    short = runner.invoke(app, ["synthesize", "-h"])
    assert short.exit_code == 0 and " synthesize [OPTIONS] [TEXT]" in short.output, short.output


def test_what_a_newcomer_mistypes_gets_a_message_that_says_what_to_give(tiny_base, tmp_path):
    """OpenAI's --voice for a speaker, a base or vocoder that does not exist, a folder as --text-file,
    an upper-case format: each answered with what to give instead, never a missing config.json."""
    out = ["--out", str(tmp_path / "x.wav")]
    voice = runner.invoke(app, _args(tiny_base, "Hi.", "--voice", "alloy", *out), env=WIDE)
    assert voice.exit_code == 2 and "no such voice folder" in voice.output and "--speaker alloy" in voice.output
    base = runner.invoke(app, ["synthesize", "Hi.", "--base", "piper-amy", *out], env=WIDE)
    assert base.exit_code == 2 and "unknown base 'piper-amy'" in base.output and "piper-joe" in base.output
    vocoder = runner.invoke(
        app, ["synthesize", "Hi.", "--model", str(tiny_base), "--vocoder", "hifigan", *out], env=WIDE
    )
    assert vocoder.exit_code == 2 and "'hifigan' is neither" in vocoder.output, vocoder.output
    assert "'neural', the shipped neural vocoder" in vocoder.output
    folder = runner.invoke(app, _args(tiny_base, "--text-file", str(tmp_path), "--out", str(tmp_path / "d")))
    assert folder.exit_code == 2 and "a folder, not a text file" in folder.output
    upper = runner.invoke(app, _args(tiny_base, "Hi.", "--format", "MP3", "--out", str(tmp_path / "x.mp3")))
    assert upper.exit_code == 0 and (tmp_path / "x.mp3").read_bytes()[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3")
    unquoted = runner.invoke(app, _args(tiny_base, "Hi", "there.", "--out", str(tmp_path / "words.wav")))
    quoted = runner.invoke(app, _args(tiny_base, "--text", "Hi there.", "--out", str(tmp_path / "text.wav")))
    assert unquoted.exit_code == 0 and quoted.exit_code == 0
    assert (tmp_path / "words.wav").read_bytes() == (tmp_path / "text.wav").read_bytes()


def test_an_output_that_cannot_be_written_is_named_as_asked_not_by_its_temporary_file(tiny_base):
    target = "/proc/chorus-test.wav"  # a folder that exists and takes no new file (Linux), root or not
    result = runner.invoke(app, _args(tiny_base, "Hi.", "--out", target), env=WIDE)
    assert result.exit_code == 2 and f"cannot write {target}: " in result.output, result.output
    assert ".tmp" not in result.output


def test_ssml_chorus_cannot_follow_is_one_line_and_the_other_lines_are_spoken(tiny_base, tmp_path):
    """A new user's probe: SSML Chorus cannot read (a bad break, an unclosed tag) had printed a 60-line
    traceback; read line by line, one such line had stopped the run and thrown away the audio of the lines
    before it. Now it is skipped with its reason, as any other bad line is. An element Chorus does not follow
    (<emphasis>, <prosody>) is read as its text with a warning (another probe: it had thrown the input away)."""
    refused = runner.invoke(
        app, _args(tiny_base, "--text", '<speak><break time="abc"/>x</speak>', "-f", str(tmp_path / "a.wav"))
    )
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "Traceback" not in said and "file" not in said  # no empty report table
    assert "skipped --text: SSML <break time='abc'>" in said and "nothing was synthesized" in said
    lines = 'Hello there.\n<speak><break time="abc"/>no</speak>\n<speak>Open\nGoodbye now.\n'
    spoken = runner.invoke(app, _args(tiny_base, "--line-by-line", "-f", str(tmp_path / "l.wav")), input=lines)
    said = " ".join(spoken.output.split())
    assert spoken.exit_code == 0, said
    assert "skipped standard input:2: SSML <break time='abc'>" in said and "skipped standard input:3: SSML" in said
    emphasis = runner.invoke(
        app,
        _args(tiny_base, "--text", "<speak><emphasis>Really</emphasis> now.</speak>", "-f", str(tmp_path / "e.wav")),
    )
    said = " ".join(emphasis.output.split())
    assert emphasis.exit_code == 0, said
    assert "warning: read the text of SSML Chorus does not follow, without its effect: <emphasis>" in said
    alone = runner.invoke(app, _args(tiny_base, "-f", str(tmp_path / "g.wav")), input="Hello there.\nGoodbye now.\n")
    assert alone.exit_code == 0 and (tmp_path / "l.wav").read_bytes() == (tmp_path / "g.wav").read_bytes()
