"""Shared fixtures: short speech clips and a tiny LJSpeech-style dataset made on the fly.

Clips are spoken by the espeak-ng program when it is installed (real speech, so the dataset checks
see realistic levels and speaking rates) and otherwise synthesized as a train of voiced "syllables"
lasting as long as the text would take to say, so the tests never need recorded data.

Also what several test files share, defined once here: the tiny model (its config, weights and a
batch), a live uvicorn server for a module's ``live_app``, decoding audio bytes, and waiting for a
state (tests wait for states, never assert how long something took).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import local_services  # throwaway PostgreSQL and S3 (tests/local_services.py)
import toy_method  # noqa: F401  (registers a toy adapter method: the one line a new method adds to the list)
from chorus.models.acoustic import AcousticModel, build_model, lengths_to_mask
from chorus.models.config import AcousticConfig
from chorus.text import normalize_text

SAMPLE_RATE = 22_050

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80 and LINES=24 set, which Rich's console (the CLI's) fixes as
    # its width when it is made: dropped, so a worker's tests see what a plain pytest run's see.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

# (id, raw text, normalized text), as in LJSpeech's metadata.csv.
LJ_LINES = [
    (
        "LJ001-0001",
        "Printing, in the only sense with which we are at present concerned, differs from most arts.",
        "Printing, in the only sense with which we are at present concerned, differs from most arts.",
    ),
    ("LJ001-0002", "Dr. Smith arrived at 5:30 on May 3rd.", "Doctor Smith arrived at five thirty on May third."),
    (
        "LJ001-0003",
        "The books were printed in 1469, and sold for $12.",
        "The books were printed in fourteen sixty-nine, and sold for twelve dollars.",
    ),
]

# A speaking rate typical of read English, used only by the synthetic fallback.
_CHARACTERS_PER_SECOND = 14.0


@pytest.fixture
def peft():
    """The ``peft`` package: only the tests that compare with PEFT skip where it is not installed."""
    return pytest.importorskip("peft")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster for the session (see ``local_services.py``); its server URL."""
    with local_services.postgres_cluster() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A new empty PostgreSQL database for one test."""
    return local_services.new_database(postgres_server)


@pytest.fixture(scope="session")
def s3_environment() -> Iterator[dict[str, str]]:
    """moto's S3 server for the session; the AWS environment that reaches it, set in this process too
    (s3fs reads ``AWS_ENDPOINT_URL`` and the credentials as every AWS SDK does)."""
    with local_services.s3_server() as environment, pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        yield environment


@pytest.fixture
def s3_bucket(s3_environment) -> str:
    """A new bucket for one test: ``s3://<name>``."""
    return f"s3://{local_services.new_bucket(s3_environment)}"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # One thread for every test, set again before each: commands run in-process (`chorus ... --threads 2`)
    # change torch's thread count, and float sums in another order would make a test's result depend on
    # which tests ran before it.
    torch.set_num_threads(1)


# CI (scripts/test.sh sets CHORUS_TEST_NO_SKIPS=1) has root, chromium, espeak-ng, sox, flite, PostgreSQL,
# Piper's voice and Ray: a test skipped there is a broken machine or test, and fails the run with its reason.
# These reasons say something about the machine that CI may rightly differ in, and stay skips.
SKIPS_CI_MAY_HAVE = ("this machine has a GPU",)


def _skip_fails(report) -> bool:
    if not (report.skipped and os.environ.get("CHORUS_TEST_NO_SKIPS") == "1") or hasattr(report, "wasxfail"):
        return False
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(allowed in reason for allowed in SKIPS_CI_MAY_HAVE):
        return False
    report.outcome = "failed"
    report.longrepr = f"skipped where CI must run it (CHORUS_TEST_NO_SKIPS=1): {reason}"
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _skip_fails(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield  # a module-level importorskip skips the whole file
    _skip_fails(report)
    return report


# The longest modules (a minute or more each on 2 cores: live servers, Ray, jobs, the fuzzer), longest first.
# scripts/test.sh hands whole modules to pytest-xdist's workers in collection order (--dist loadfile
# --no-loadscope-reorder): started first, none of them runs last beside an idle worker. Order within a
# module, and of every other module, stays as collected.
LONGEST_MODULES = [
    "serving/test_serving_api.py",
    "serving/test_serving_ray.py",
    "cli/test_cli.py",
    "serving/test_serving_store.py",
    "pruning/test_pruning.py",
    "serving/test_job_process.py",
    "serving/test_serving_shared.py",
    "serving/test_custom_voices.py",
    "training/test_adapt.py",
    "training/test_speaker_device.py",
    "speaker/test_speaker_encoder.py",
    "serving/test_serving_web.py",
    "serving/test_consent_phrase.py",
    "audio/test_vocoders.py",
    "memory/test_memory_speaker_encoder.py",
    "training/test_pretrain.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests, rank = Path(__file__).parent, {name: i for i, name in enumerate(LONGEST_MODULES)}

    def module_rank(item: pytest.Item) -> int:
        try:
            return rank.get(item.path.relative_to(tests).as_posix(), len(rank))
        except ValueError:  # a test file outside tests/
            return len(rank)

    items.sort(key=module_rank)  # stable: the collected order within each rank


def _synthetic_speech(text: str, rate: int) -> np.ndarray:
    """Voiced 'syllables' (a 140 Hz buzz with formant-like harmonics) for as long as ``text`` takes."""
    seconds = max(0.5, len(normalize_text(text, warn=False)) / _CHARACTERS_PER_SECOND)
    t = np.arange(int(seconds * rate)) / rate
    buzz = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 2  # four syllables a second
    audio = 0.3 * buzz * syllables / np.abs(buzz).max()
    return np.pad(audio, (int(0.1 * rate),) * 2).astype(np.float32)


def speak(text: str, path: Path) -> Path:
    """Write ``text`` spoken at 22,050 Hz mono 16-bit to ``path`` (espeak-ng, else synthetic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    espeak = shutil.which("espeak-ng")
    if espeak:
        subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True, timeout=30)
    else:
        sf.write(path, _synthetic_speech(text, SAMPLE_RATE), SAMPLE_RATE, subtype="PCM_16")
    return path


def write_metadata(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metadata.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def speech() -> Callable[[str, Path], Path]:
    """``speech(text, path)`` writes a clip of ``text`` being spoken and returns its path."""
    return speak


@pytest.fixture(scope="session")
def metadata() -> Callable[[Path, list[str]], Path]:
    """``metadata(folder, lines)`` writes ``folder/metadata.csv`` and returns its path."""
    return write_metadata


@pytest.fixture(scope="session")
def _lj_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "ljs"
    write_metadata(root, ["|".join(line) for line in LJ_LINES])
    for utt_id, text, _ in LJ_LINES:
        speak(text, root / "wavs" / f"{utt_id}.wav")
    return root


@pytest.fixture
def lj_dataset(_lj_template: Path, tmp_path: Path) -> Path:
    """A clean three-clip LJSpeech-style folder (``metadata.csv`` id|text|normalized, ``wavs/``),
    copied fresh for each test so tests may damage it."""
    return Path(shutil.copytree(_lj_template, tmp_path / "ljs"))


# The tests' one tiny model. Its sizes; training tests take symbols and speakers from their data and one
# block a side (a few steps train in a second), tests that build the model directly use tiny_config().
TINY_SIZES = dict(d_model=32, n_heads=2, ff_hidden=48, predictor_hidden=16, speaker_dim=8)
TINY_MODEL = dict(TINY_SIZES, encoder_layers=1, decoder_layers=1)


def tiny_config(**overrides) -> AcousticConfig:
    """The tiny model's config: 40 symbols, 2 speakers, two blocks a side; ``overrides`` replace fields."""
    return AcousticConfig(
        **{"n_symbols": 40, "n_speakers": 2, "encoder_layers": 2, "decoder_layers": 2, **TINY_SIZES, **overrides}
    )


def tiny_model(**overrides) -> AcousticModel:
    """The tiny model (:func:`tiny_config` with ``overrides``), its random weights the same in every test."""
    torch.manual_seed(0)
    return build_model(tiny_config(**overrides))


def tiny_batch(batch: int = 2, text: int = 6, frames: int = 18) -> dict[str, torch.Tensor]:
    """A fixed random batch for the tiny model, the keyword arguments of its forward: the first item is
    ``text`` symbols and ``frames`` frames long, the others 2 symbols and 5 frames shorter (padded with
    zeros); speakers alternate 0, 1. phonemes (B, T_text), text_lengths (B,), mel (B, T_frames, 80),
    frame_lengths (B,), speaker_ids (B,)."""
    generator = torch.Generator().manual_seed(1)
    text_lengths = torch.tensor([text] + [text - 2] * (batch - 1))
    frame_lengths = torch.tensor([frames] + [frames - 5] * (batch - 1))
    phonemes = torch.randint(1, 40, (batch, text), generator=generator) * lengths_to_mask(text_lengths, text)
    mel = torch.randn(batch, frames, 80, generator=generator) * lengths_to_mask(frame_lengths, frames).unsqueeze(-1)
    return {
        "phonemes": phonemes,
        "text_lengths": text_lengths,
        "mel": mel,
        "frame_lengths": frame_lengths,
        "speaker_ids": torch.arange(batch) % 2,
    }


TWO_VOICE_SENTENCES = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
]


def espeak_voice(folder: Path, variant: str, sentences: list[str]) -> Path:
    """An LJSpeech-style folder of ``sentences`` spoken by espeak-ng voice ``en-us+<variant>``."""
    (folder / "wavs").mkdir(parents=True)
    for index, text in enumerate(sentences):
        subprocess.run(
            ["espeak-ng", "-v", f"en-us+{variant}", "-w", str(folder / "wavs" / f"u{index}.wav"), text],
            check=True,
            capture_output=True,
            timeout=30,
        )
    (folder / "metadata.csv").write_text("".join(f"u{i}|{t}\n" for i, t in enumerate(sentences)))
    return folder


CUSTOM_VOICE_SAMPLE = (
    "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
    "It is easy to tell the depth of a well. These days a chicken leg is a rare dish. "
    "Rice is often served in round bowls. The juice of lemons makes fine punch. "
    "The box was thrown beside the parked truck."
)


def heard_as(text: str, audio: np.ndarray, rate: int):
    """A transcript saying ``text`` with its words spread evenly over ``audio`` (a fake Whisper for the
    custom-voice checks: every stretch of the recording belongs to a word, so none is speech beside the
    phrase)."""
    from chorus.evaluation.asr import Transcript, Word

    words, seconds = text.split(), len(audio) / rate
    step = seconds / max(len(words), 1)
    return Transcript(text, tuple(Word(w, i * step, (i + 1) * step, 0.99) for i, w in enumerate(words)))


@pytest.fixture(scope="session")
def custom_voice_recordings(tmp_path_factory) -> dict[str, Path]:
    """For OpenAI-style custom voices, by espeak-ng: michel reads the consent phrase ("consent") and a 16 s
    sample ("sample": 13 s of speech as the detector hears it); m8, another speaker, the same sample ("other"). Neither is in the speaker check's
    cohort (which has the base's training voices, f4 and m3 among them): a cohort speaker's own recordings
    are normalized against themselves, which no real owner meets."""
    from chorus.serving.settings import CONSENT_PHRASES

    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    folder = tmp_path_factory.mktemp("custom_voice_recordings")
    texts = {
        "consent": ("michel", CONSENT_PHRASES["en"]),
        "sample": ("michel", CUSTOM_VOICE_SAMPLE),
        "other": ("m8", CUSTOM_VOICE_SAMPLE),
    }
    for name, (variant, text) in texts.items():
        subprocess.run(
            ["espeak-ng", "-v", f"en-us+{variant}", "-w", str(folder / f"{name}.wav"), text], check=True, timeout=60
        )
    return {name: folder / f"{name}.wav" for name in texts}


@pytest.fixture(scope="session")
def two_voice_corpus(tmp_path_factory) -> Path:
    """Two espeak-ng voices (m3, f2) x six sentences, as a folder of LJSpeech-style folders."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    root = tmp_path_factory.mktemp("two_voices")
    for voice in ("m3", "f2"):
        espeak_voice(root / voice, voice, TWO_VOICE_SENTENCES)
    return root


@pytest.fixture(scope="session")
def tiny_base(two_voice_corpus, tmp_path_factory) -> Path:
    """A tiny base model pretrained for a few steps on :func:`two_voice_corpus` (its checkpoint folder)."""
    from chorus.training.pretrain import PretrainConfig, pretrain

    out = tmp_path_factory.mktemp("tiny_base")
    config = PretrainConfig(
        data=str(two_voice_corpus),
        out=str(out),
        model=AcousticConfig(**TINY_MODEL),
        steps=3,
        max_frames=2000,
        eval_every=3,
        save_every=3,
        threads=1,
        val_per_speaker=1,
        default_speaker="m3",
    )
    return pretrain(config, progress=False)


NEW_VOICE_SENTENCES = TWO_VOICE_SENTENCES + [
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
]


@pytest.fixture(scope="session")
def new_voice_data(tmp_path_factory) -> Path:
    """About 35 s of a voice the tiny base never heard (espeak-ng en-us+f4): a voice to adapt."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    return espeak_voice(tmp_path_factory.mktemp("new_voice") / "f4", "f4", NEW_VOICE_SENTENCES)


def clip_files(folder: Path) -> tuple[list, str]:
    """An LJSpeech-style folder as an upload's ``clips`` files (for requests or TestClient) and its
    ``transcripts`` JSON."""
    lines = (folder / "metadata.csv").read_text().splitlines()
    transcripts = {f"{line.split('|')[0]}.wav": line.split("|", 1)[1] for line in lines}
    files = [("clips", (name, (folder / "wavs" / name).read_bytes(), "audio/wav")) for name in transcripts]
    return files, json.dumps(transcripts)


def random_voice(bundle, name: str, configs: list, folder: Path, seed: int, base_sha256: str | None = None) -> Path:
    """A voice folder for ``bundle``'s base (a Chorus model bundle, or a base of :mod:`chorus.synthesis.bases`)
    with random adapter values (so each voice sounds its own); ``base_sha256`` overrides the base hash it
    claims (a voice "made for another base")."""
    from chorus.adapters import adapter_state_dict, add_adapter, remove_adapter
    from chorus.adapters.voice import VoiceCard, save_voice
    from chorus.synthesis.bases import Base

    own_sha256, base_name = (bundle.sha256, bundle.name) if isinstance(bundle, Base) else (bundle.weights_sha256, "")
    add_adapter(bundle.model, name, configs)
    torch.manual_seed(seed)
    with torch.no_grad():
        for value in adapter_state_dict(bundle.model, name).values():
            value.add_(torch.randn_like(value) * 0.1)
    card = VoiceCard(
        name=name,
        methods=[c.method for c in configs],
        base_model_sha256=own_sha256 if base_sha256 is None else base_sha256,
        base_model=base_name,
    )
    path = save_voice(folder, bundle.model, name, configs, card)
    remove_adapter(bundle.model, name)
    return path


def decode(content: bytes) -> tuple[np.ndarray, int]:
    """The samples (float32) and sample rate of an audio file's bytes (WAV, FLAC: what soundfile reads)."""
    audio, rate = sf.read(io.BytesIO(content), dtype="float32")
    return audio, rate


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    """Poll ``condition()`` until it is true and return its value. ``timeout`` only bounds a wait for a
    state that never comes (a hung test fails, saying ``what`` it waited for, instead of running forever):
    callers give one far above how long the state takes on a busy machine; no test asserts how long it took."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)
    return value


@pytest.fixture(scope="module")
def live_server(live_app) -> Iterator[tuple[str, object]]:
    """The module's ``live_app`` fixture (a FastAPI app) served by uvicorn on a free loopback port in a
    thread: (its base URL, the app)."""
    uvicorn = pytest.importorskip("uvicorn")
    port = local_services.free_port()
    server = uvicorn.Server(uvicorn.Config(live_app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 60, "uvicorn starts")
    assert server.started, "uvicorn stopped before it started serving"
    try:
        yield f"http://127.0.0.1:{port}", live_app
    finally:
        server.should_exit = True
        thread.join(60)


def saved_bytes(fn) -> tuple[int, object]:
    """Bytes autograd keeps for backward while ``fn()`` runs, and what ``fn`` returned."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    return total, result


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def tiny_piper_config(**changes):
    """A Piper VITS generator's layout at toy widths (joe's: type-2 residual blocks, upsampling 8 x 8 x 4);
    ``changes`` override fields (another decoder layout, more symbols)."""
    from chorus.models.piper_vits import PiperVitsConfig

    layout = dict(
        n_symbols=48, hidden_channels=16, filter_channels=32, n_heads=2, n_layers=2, kernel_size=3, window_size=4,
        inter_channels=8, flow_couplings=2, flow_wn_layers=2, flow_kernel_size=5, flow_dilation_rate=1,
        dp_filter_channels=16, dp_kernel_size=3, dp_layers=3, dp_flows=4, dp_bins=10, resblock="2",
        resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 2), (2, 6)), upsample_rates=(8, 8, 4),
        upsample_kernel_sizes=(16, 16, 8), upsample_initial_channel=32, sample_rate=22_050,
    )  # fmt: skip
    return PiperVitsConfig(**{**layout, **changes})


# Pad, start and end as Piper's maps have them; then the IPA symbols espeak-ng gives English test sentences.
TINY_PIPER_SYMBOLS = "abcdefhijklmnoprstuvwzæðŋɐɑɔəɚɛɜɡɪɹɾʃʊʌʒˈˌː ,.!?"
TINY_PIPER_ID_MAP = {"_": [0], "^": [1], "$": [2], **{s: [3 + i] for i, s in enumerate(TINY_PIPER_SYMBOLS)}}


def tiny_piper_generator(seed: int = 0, **changes):
    """A toy-size Piper generator (:func:`tiny_piper_config`, random weights drawn from ``seed``) with a voice
    json of Piper's layout for English (:data:`TINY_PIPER_ID_MAP`) and Piper's default scales."""
    from chorus.models.piper_vits import PiperGenerator
    from chorus.peers.piper import PiperVoiceConfig

    torch.manual_seed(seed)
    voice = PiperVoiceConfig(sample_rate=22_050, language="en-us", id_map=TINY_PIPER_ID_MAP)
    return PiperGenerator(tiny_piper_config(**{"n_symbols": len(TINY_PIPER_ID_MAP), **changes}), voice).eval()


def tiny_piper_base(seed: int = 0, name: str = "tiny-piper", settings=None):
    """A Piper base around :func:`tiny_piper_generator`, its sha256 made up from ``seed``."""
    from chorus.synthesis.bases.piper import PiperBase

    return PiperBase(tiny_piper_generator(seed), name, f"{seed:064x}", settings)


# A speaker encoder small enough to train in a test.
SMALL_SPEAKER_ENCODER = dict(channels=(8, 8, 16, 16), embedding_dim=16, n_mels=16, groups=2, pooling_hidden=8)


def tiny_speaker_train_config(corpus, out, **changes):
    """A few steps of speaker encoder training on ``corpus`` (80 mel bins), saved under ``out``."""
    from chorus.speaker_recognition.encoder import SpeakerEncoderConfig
    from chorus.training.speaker_encoder import SpeakerTrainConfig

    settings = dict(
        corpus=str(corpus),
        out=str(out),
        encoder=SpeakerEncoderConfig(**{**SMALL_SPEAKER_ENCODER, "n_mels": 80}),
        steps=4,
        batch_speakers=2,
        per_speaker=2,
        heldout=2,
        segment_frames=48,
        checkpoint_every=2,
        log_every=1,
    )
    return SpeakerTrainConfig(**{**settings, **changes})


@pytest.fixture
def tone_clips(tmp_path):
    """A dataset folder of two clips of a harmonic tone gliding in pitch (0.7 and 0.9 s), with transcripts."""
    folder = tmp_path / "data"
    (folder / "wavs").mkdir(parents=True)
    rows = []
    for index, (text, seconds) in enumerate(zip(["Hello there.", "It is a fine day."], (0.7, 0.9))):
        t = np.arange(int(22_050 * seconds)) / 22_050
        phase = 2 * np.pi * np.cumsum(110 + 60 * t) / 22_050
        audio = 0.2 * sum(np.sin(k * phase) / k for k in range(1, 6)) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
        sf.write(folder / "wavs" / f"clip{index}.wav", audio.astype(np.float32), 22_050)
        rows.append(f"clip{index}|{text}\n")
    (folder / "metadata.csv").write_text("".join(rows))
    return folder


@pytest.fixture
def tiny_posterior(tmp_path) -> str:
    """The folder of a random posterior encoder for :func:`tiny_piper_generator`'s latent (8 channels)."""
    from chorus.models.piper_posterior import PosteriorConfig, PosteriorEncoder

    torch.manual_seed(1)
    return str(PosteriorEncoder(PosteriorConfig(8, 256, n_layers=2)).save(tmp_path / "posterior", {}))
