"""A voice on disk: a folder that carries everything needed to speak with it on its base model.

    voices/NAME/
      adapter_config.json        a LoRA voice: PEFT's LoraConfig fields alone, so `peft` reads it
                                 without a warning; any other voice: a peft_type that says it is a
                                 Chorus format (PEFT refuses it with that message, never half-loads it)
      chorus_voice.json          methods and their configs, base model hash, weights checksums
      adapter_model.safetensors  tensors keyed as PEFT keys them: base_model.model.<layer>.<tensor>
      speaker_vector.safetensors a LoRA voice: its speaker vector, apart, as PEFT loads only the LoRA
      voice_card.json            how it was made: data minutes, training time, metrics
      README.md                  the same card for people, with Hugging Face model-card metadata
      LICENSE.md                 whose terms govern the voice (its owner's; Chorus grants nothing over it)

A LoRA voice is what ``chorus adapt --method lora`` makes: a LoRA and the speaker vector every voice
carries, left at its starting value (not trained). PEFT loads the LoRA (``PeftModel.from_pretrained``);
the model then speaks the voice given the vector (``infer(..., speaker_vectors=...)``).

Loading refuses a voice made for another base model, a file whose checksum does not match, and
anything that is not safetensors. A PEFT LoRA folder (no Chorus section) loads too, and so do
voices of the earlier layout (the Chorus section inside adapter_config.json).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load, save_file
from torch import nn

from chorus.adapters.inject import (
    adapter_layers,
    adapter_names,
    adapter_state_dict,
    add_adapter,
    base_state_dict,
    load_adapter_state_dict,
    planned_shapes,
    remove_adapter,
)
from chorus.adapters.lora import LoraConfig
from chorus.adapters.registry import FULL_FINE_TUNING, MethodConfig, config_from_dict
from chorus.adapters.speaker import SpeakerConfig, SpeakerVector
from chorus.atomic import atomic_write_folder
from chorus.models.bundle import file_sha256
from chorus.output_folders import OutputKind
from chorus.typed_fields import wrong_fields

VOICE_FORMAT = "chorus-voice"
VOICE_FORMAT_VERSION = 1
PEFT_PREFIX = "base_model.model."
CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "adapter_config.json", "adapter_model.safetensors", "voice_card.json"
CHORUS_FILE, SPEAKER_FILE, LICENSE_FILE = "chorus_voice.json", "speaker_vector.safetensors", "LICENSE.md"
README_FILE = "README.md"
# Everything save_voice writes: a folder holding anything else is more than a voice (--overwrite would lose it).
VOICE_FILES = (CONFIG_FILE, WEIGHTS_FILE, SPEAKER_FILE, CHORUS_FILE, CARD_FILE, README_FILE, LICENSE_FILE)
# A voice as a folder written whole: what a voice folder holds, and what marks one.
VOICE_FOLDER = OutputKind("a voice", (CARD_FILE, CHORUS_FILE), VOICE_FILES)
# Voices are made from one person's recordings: the terms are theirs to give (LICENSE.md says so).
LICENSE_NAME = "voice-owner-terms"
LICENSE_TEXT = """# Terms of this voice

These weights were adapted from recordings of one person's voice. Chorus (Apache-2.0) grants nothing
over that voice: whether and how it may be used or shared is for that person to say. Write their terms
here before sharing this folder.
"""


class VoiceError(ValueError):
    """A voice folder that is missing, corrupted, or made for another base model."""


class BaseMismatch(VoiceError):
    """A voice made on another base model: ``made_on`` and ``this`` name the two (no paths)."""

    def __init__(self, message: str, made_on: str, this: str):
        super().__init__(message)
        self.made_on, self.this = made_on, this


@dataclass
class VoiceCard:
    """Provenance and measurements of a voice (``voice_card.json``)."""

    name: str
    methods: list[str]
    base_model_sha256: str
    data_minutes: float = 0.0  # of audio trained on
    # Of it, speech (each clip from its first to its last frame of speech), as the data check's minimum
    # counts it; None in voices made before it was counted.
    speech_minutes: float | None = None
    train_seconds: float = 0.0
    steps: int = 0
    trainable_parameters: int = 0
    metrics: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    # The base by name, as `--base` takes it ("chorus", "piper-joe", a Piper voice file's name); its
    # sha256 above says which weights. Empty in voices made before bases had names: a Chorus base's (a new
    # user's probe found new Chorus voices recording "" too, where the docs say the folder names its base).
    base_model: str = "chorus"
    # The voice's own pace as a duration multiplier (Piper's length_scale): a Piper voice's recordings
    # aligned to its text over the frames the base's duration predictor (which no adapter changes) gives.
    length_scale: float = 1.0
    # The prior noise a Piper voice speaks at (Piper's noise_scale); None: the base voice's own.
    noise_scale: float | None = None

    def to_markdown(self, peft: bool = False) -> str:
        """The card for people, after Hugging Face model-card metadata (YAML front matter); ``peft``: the
        folder is a PEFT LoRA adapter (its vector apart, in ``speaker_vector.safetensors``)."""
        lines = [
            model_card_metadata(self, peft),
            "",
            f"# Voice `{self.name}`",
            "",
            f"- methods: {', '.join(self.methods)}",
            f"- base model: {self.base_model or 'chorus'}, sha256 `{self.base_model_sha256}`",
            f"- data: {trained_on(self)}; training: {self.steps} steps in {self.train_seconds:.0f} s",
            f"- trainable parameters: {self.trainable_parameters:,}",
        ]
        lines += [
            f"- {key}: {value}" + (f" ({METRIC_NOTES[key]})" if key in METRIC_NOTES else "")
            for key, value in {**self.metrics, **self.notes}.items()
        ]
        if peft:
            lines += ["", _PEFT_USE]
        return "\n".join(lines) + "\n"


def trained_on(card: VoiceCard, digits: int = 2) -> str:
    """What a voice was trained on, for people: "2.71 min of audio, 2.40 of speech"."""
    text = f"{card.data_minutes:.{digits}f} min of audio"
    return text if card.speech_minutes is None else text + f", {card.speech_minutes:.{digits}f} of speech"


# What a card's bare number is on, where a reader could not tell (a card had shown -0.21 with no scale beside it).
METRIC_NOTES = {
    "encoder_similarity_to_clips": "cosine, -1 to 1, by Chorus's speaker encoder, of the voice's speech through "
    "Griffin-Lim to its own clips; the encoder hears the vocoder, so compare voices with each other, not with "
    "what real clips of one person score (the encoder's threshold)",
}

_PEFT_USE = """## In PEFT

`PeftModel.from_pretrained(base, folder)` loads the LoRA onto the Chorus base model (the one whose
weights have the sha256 above). The voice also needs its speaker vector, `speaker_vector.safetensors`
(one tensor `[speaker_dim]`): pass it as `infer(..., speaker_vectors=vector[None])`. Chorus loads the
folder whole: `chorus synthesize --voice FOLDER`."""


def model_card_metadata(card: VoiceCard, peft: bool = False) -> str:
    """``---`` YAML ``---`` as the Hugging Face Hub reads it (``huggingface_hub.ModelCardData``). The base
    model is named by its sha256 alone: it is on no Hub repository, which ``base_model`` would name."""
    from huggingface_hub import ModelCardData

    data = ModelCardData(
        library_name="peft" if peft else "chorus-tts",
        pipeline_tag="text-to-speech",
        license="other",
        license_name=LICENSE_NAME,
        license_link=LICENSE_FILE,
        tags=["chorus-tts", "text-to-speech", "voice", *card.methods],
        chorus_methods=card.methods,
        chorus_base_model_sha256=card.base_model_sha256,
        data_minutes=round(card.data_minutes, 2),
        speech_minutes=card.speech_minutes,
        trainable_parameters=card.trainable_parameters,
        automatic_transcripts=card.notes.get("automatic_transcripts"),
    )
    return f"---\n{data.to_yaml()}\n---"


@dataclass
class Voice:
    """A voice read from disk: method configs, tensors (canonical keys), card."""

    configs: list[MethodConfig]
    tensors: dict[str, torch.Tensor]
    card: VoiceCard | None
    base_model_sha256: str | None
    full: bool = False  # full fine-tuning: ``tensors`` are a whole model's weights
    base_model: str | None = None  # the base's name (VoiceCard.base_model); None: not recorded

    @property
    def methods(self) -> list[str]:
        return [FULL_FINE_TUNING] if self.full else [c.method for c in self.configs]


def _peft_lora_fields(config: LoraConfig) -> dict:
    """The LoraConfig fields PEFT needs to rebuild the same LoRA on the same module names."""
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": None,
        "inference_mode": True,
        "r": config.r,
        "lora_alpha": config.alpha,
        "target_modules": config.targets,
        "exclude_modules": config.exclude,
        "layers_to_transform": config.layers,
        "layers_pattern": "layers" if config.layers is not None else None,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": config.use_rslora,
        "modules_to_save": None,
        "init_lora_weights": True,
        "use_dora": False,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def peft_lora(configs: list[MethodConfig], full: bool) -> LoraConfig | None:
    """The LoRA of a voice PEFT can load: one LoRA, and at most the speaker vector every voice carries,
    untrained (:meth:`chorus.recipe.AdaptConfig.method_configs`), which is saved apart from it."""
    loras = [c for c in configs if isinstance(c, LoraConfig)]
    rest = [c for c in configs if not isinstance(c, LoraConfig)]
    fixed_vector = all(isinstance(c, SpeakerConfig) and not c.trains() for c in rest) and len(rest) <= 1
    return loras[0] if not full and len(loras) == 1 and fixed_vector else None


def _not_peft(configs: list[MethodConfig], full: bool) -> str:
    """A peft_type PEFT cannot load, whose text (PEFT's KeyError shows it) says why."""
    methods = FULL_FINE_TUNING if full else "+".join(c.method for c in configs)
    return (
        f"CHORUS ({methods}): a Chorus voice format, not a PEFT adapter; only LoRA voices load in peft. "
        "Load this one with Chorus: chorus synthesize --voice DIR, or Synthesizer.load_voice(DIR)"
    )


def save_voice(
    folder: str | Path, model: nn.Module, name: str, configs: list[MethodConfig], card: VoiceCard, *, full: bool = False
) -> Path:
    """Write adapter ``name`` of ``model`` (or, with ``full``, all of the model's weights and the adapter
    ``name`` it may also carry: none when ``configs`` is empty) atomically."""
    tensors = adapter_state_dict(model, name) if configs else {}
    if full:
        tensors = {**base_state_dict(model), **tensors}
    tensors = {PEFT_PREFIX + key: value.detach().contiguous().cpu() for key, value in tensors.items()}
    # Only a LoRA voice is a PEFT adapter (PEFT would drop anything else silently): its speaker vector
    # goes to a file of its own, which PEFT does not read.
    lora, vector = peft_lora(configs, full), {}
    if lora is not None:
        for path, layer in adapter_layers(model):
            if isinstance(layer, SpeakerVector):
                for key in layer.adapter_state(name):
                    vector[f"{PEFT_PREFIX}{path}.{key}"] = tensors.pop(f"{PEFT_PREFIX}{path}.{key}")
    chorus_section = {
        "format": VOICE_FORMAT,
        "version": VOICE_FORMAT_VERSION,
        "full": full,
        "methods": [c.to_dict() for c in configs],
        "base_model_sha256": card.base_model_sha256,
        "base_model": card.base_model,
    }

    def write(temp: Path) -> None:
        save_file(tensors, str(temp / WEIGHTS_FILE), metadata={"format": "pt"})
        chorus_section["weights_sha256"] = file_sha256(temp / WEIGHTS_FILE)
        if vector:
            save_file(vector, str(temp / SPEAKER_FILE), metadata={"format": "pt"})
            chorus_section["speaker_vector_sha256"] = file_sha256(temp / SPEAKER_FILE)
        config = _peft_lora_fields(lora) if lora else {"peft_type": _not_peft(configs, full)}
        (temp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        (temp / CHORUS_FILE).write_text(json.dumps(chorus_section, indent=2))
        (temp / CARD_FILE).write_text(json.dumps(asdict(card), indent=2))
        (temp / README_FILE).write_text(card.to_markdown(peft=lora is not None))
        (temp / LICENSE_FILE).write_text(LICENSE_TEXT)
        for weights in (temp / WEIGHTS_FILE, temp / SPEAKER_FILE):  # safetensors writes 0600: readable as the rest
            if weights.is_file():
                weights.chmod((temp / LICENSE_FILE).stat().st_mode)

    return atomic_write_folder(folder, write)


def is_voice_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a voice's ``adapter_config.json`` (checked no further)."""
    return (Path(path) / CONFIG_FILE).is_file()


def read_voice(folder: str | Path) -> Voice:
    """Read and verify a voice folder (Chorus or PEFT LoRA) without touching any model."""
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise VoiceError(f"{folder}: missing {path.name} (not a voice folder)")
    config = _json_file(config_path)
    # One read serves the checksum and the tensors. Parsed from bytes, not with safetensors'
    # load_file/safe_open, which keep about 55 bytes of Python heap per tensor name for good on every
    # open (safetensors 0.8, tracemalloc; safetensors issue #369): a server reading voices on demand
    # would grow without bound.
    data = weights_path.read_bytes()
    section = _chorus_section(folder, config)
    if section is None:
        parts, configs = [(weights_path, data)], [_lora_from_peft(config, config_path)]
        base_hash, full, base_name = None, False, None
        parts += _peft_speaker_vector(folder, configs)
    else:
        section_path = folder / CHORUS_FILE if (folder / CHORUS_FILE).is_file() else config_path  # the earlier layout
        _check_format(section, section_path)
        parts = _checked_files(folder, section, weights_path, data)
        configs = _method_configs(section, section_path)
        base_hash, full = section.get("base_model_sha256", ""), bool(section.get("full"))
        if not isinstance(base_hash, str):
            raise VoiceError(f"{section_path}: base_model_sha256 {base_hash!r} is not a sha256")
        base_name = section.get("base_model")
        if base_name is not None and not isinstance(base_name, str):  # it names the base the command line opens
            raise VoiceError(f"{section_path}: base_model {base_name!r} is not a base's name")
    return Voice(configs, _tensors(parts), _voice_card(folder), base_hash, full, base_name)


def _peft_speaker_vector(folder: Path, configs: list[MethodConfig]) -> list[tuple[Path, bytes]]:
    """A PEFT LoRA folder's speaker vector, where ``speaker_vector.safetensors`` lies beside it (a Chorus LoRA voice
    saved again by PEFT's ``save_pretrained``, which leaves the file behind, and the file copied back), its
    config appended to ``configs``; else a warning: the voice would speak from the default speaker's vector, not
    its own (a voice saved again by PEFT had changed so without a word)."""
    path = folder / SPEAKER_FILE
    if not path.is_file():
        warnings.warn(
            f"{folder}: a PEFT LoRA folder without {SPEAKER_FILE}: it speaks from the speaker asked for (the base's "
            f"default unless one is named); a Chorus LoRA voice saved again by PEFT leaves its vector behind in that "
            "file: copy it beside",
            stacklevel=3,
        )
        return []
    configs.append(SpeakerConfig(train_vector=False))
    return [(path, path.read_bytes())]


def _json_file(path: Path) -> dict:
    """The JSON object in ``path``, refused as a corrupted voice when it does not parse or is not an object."""
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise VoiceError(f"{path}: corrupted JSON ({error})") from error
    if not isinstance(found, dict):
        raise VoiceError(f"{path}: corrupted JSON (a {type(found).__name__} where an object belongs)")
    return found


def _chorus_section(folder: Path, config: dict) -> dict | None:
    """The voice's Chorus section: ``chorus_voice.json``, or in the earlier layout the ``chorus`` entry of
    adapter_config.json; None for a PEFT LoRA folder."""
    section = config.get("chorus")
    if (folder / CHORUS_FILE).is_file():
        section = _json_file(folder / CHORUS_FILE)
    return section


def _check_format(section: dict, config_path: Path) -> None:
    """Refuse a section of another format, or of a later version than this Chorus reads."""
    version = section.get("version", 0)
    if section.get("format") != VOICE_FORMAT or not isinstance(version, int) or version > VOICE_FORMAT_VERSION:
        raise VoiceError(
            f"{config_path}: not a voice format this Chorus reads ({section.get('format')!r} "
            f"version {section.get('version')})"
        )


def _checked_files(folder: Path, section: dict, weights_path: Path, data: bytes) -> list[tuple[Path, bytes]]:
    """The voice's safetensors files and their bytes (the weights ``data``, then a LoRA voice's speaker vector,
    kept apart), each checked against its checksum in ``section``."""
    if hashlib.sha256(data).hexdigest() != section.get("weights_sha256"):
        raise VoiceError(f"{weights_path}: checksum mismatch (the file is corrupted or was changed)")
    parts = [(weights_path, data)]
    if section.get("speaker_vector_sha256") is not None:
        vector_path = folder / SPEAKER_FILE
        if not vector_path.is_file():
            raise VoiceError(f"{folder}: missing {SPEAKER_FILE} (a LoRA voice's speaker vector)")
        parts.append((vector_path, vector_path.read_bytes()))
        if hashlib.sha256(parts[-1][1]).hexdigest() != section["speaker_vector_sha256"]:
            raise VoiceError(f"{vector_path}: checksum mismatch (the file is corrupted or was changed)")
    return parts


def _method_configs(section: dict, config_path: Path) -> list[MethodConfig]:
    """The section's method configs; full fine-tuning is a flag of the voice (``Voice.full``), not a method."""
    try:
        return [config_from_dict(c) for c in section["methods"] if c.get("method") != FULL_FINE_TUNING]
    except (KeyError, TypeError, ValueError, AttributeError) as error:  # AttributeError: an entry not an object
        raise VoiceError(f"{config_path}: invalid method config ({error})") from error


def _tensors(parts: list[tuple[Path, bytes]]) -> dict[str, torch.Tensor]:
    """The tensors of safetensors files given as their bytes, keyed without PEFT's prefix."""
    tensors = {}
    for path, content in parts:
        try:
            tensors.update(load(content))
        except Exception as error:  # safetensors raises its own types for truncated or foreign files
            raise VoiceError(f"{path}: cannot read tensors ({error})") from error
    not_finite = sorted(
        key for key, value in tensors.items() if value.is_floating_point() and not value.isfinite().all()
    )
    if not_finite:
        raise VoiceError(
            f"{parts[0][0].parent}: tensors holding NaN or infinity: {not_finite[:3]} (the voice is broken)"
        )
    return {key.removeprefix(PEFT_PREFIX): value for key, value in tensors.items()}


def _voice_card(folder: Path) -> VoiceCard | None:
    """The voice's card, or None when it has none."""
    path = folder / CARD_FILE
    if not path.is_file():
        return None
    try:
        card = VoiceCard(**_json_file(path))
    except TypeError as error:
        raise VoiceError(f"{path}: corrupted voice card ({error})") from error
    wrong = wrong_fields(card)
    if wrong:
        raise VoiceError(f"{path}: corrupted voice card ({'; '.join(wrong)})")
    return card


def _lora_from_peft(config: dict, path: Path) -> LoraConfig:
    if config.get("peft_type") != "LORA":
        raise VoiceError(f"{path}: peft_type {config.get('peft_type')!r} is not supported (only LORA)")
    unsupported = [
        key for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save") if config.get(key)
    ] + (["bias"] if config.get("bias", "none") != "none" else [])
    if unsupported:
        raise VoiceError(f"{path}: PEFT LoRA options not supported by Chorus: {', '.join(unsupported)}")
    targets, layers = config.get("target_modules"), config.get("layers_to_transform")
    try:
        return LoraConfig(
            targets=sorted(targets) if isinstance(targets, list) else targets,
            r=config["r"],
            alpha=config["lora_alpha"],
            exclude=config.get("exclude_modules"),
            layers=[layers] if isinstance(layers, int) else layers,  # PEFT takes one block's index alone too
            use_rslora=bool(config.get("use_rslora")),
        )
    except KeyError as error:
        raise VoiceError(f"{path}: a PEFT LoRA config without {error}") from error
    except (TypeError, ValueError) as error:
        raise VoiceError(f"{path}: invalid PEFT LoRA config ({error})") from error


def _check_fit(model: nn.Module, configs: list[MethodConfig], tensors: dict[str, torch.Tensor]) -> None:
    """``ValueError`` unless ``tensors`` are exactly the adapter tensors ``configs`` make on ``model``, by name and
    shape: checked before the adapter is built, as the sizes a config declares are allocated when it is."""
    planned = planned_shapes(model, configs)
    missing, unexpected = sorted(set(planned) - set(tensors)), sorted(set(tensors) - set(planned))
    if missing or unexpected:
        raise ValueError(f"adapter tensors do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    wrong = [
        f"{key} {tuple(tensors[key].shape)}" for key, shape in planned.items() if tuple(tensors[key].shape) != shape
    ]
    if wrong:
        example = next(key for key in planned if tuple(tensors[key].shape) != planned[key])
        raise ValueError(
            f"{len(wrong)} tensor(s) of another shape than the voice's config makes: {', '.join(wrong[:3])} "
            f"(the config makes {example} {planned[example]})"
        )


def apply_voice(
    model: nn.Module,
    voice: Voice,
    name: str,
    base_model_sha256: str | None = None,
    base_model: str = "",
    label: str | None = None,
) -> None:
    """Add ``voice`` to ``model`` as adapter ``name``. For a full fine-tuning voice, ``model`` is
    overwritten with its weights (pass a copy of the base), and adapter ``name`` is added only if the
    voice carries adapters too (a Chorus full fine-tune's speaker vector; a Piper one has none). Refuses
    a voice of another base model (``base_model_sha256``, named ``base_model`` in the message, where the
    voice is called ``label``: default ``name``)."""
    if base_model_sha256 and voice.base_model_sha256 == "":
        # A Chorus voice always records its base; one that records none could be from any (a PEFT folder, which
        # has no place for it, is read as it is: documented).
        raise VoiceError(
            f"voice {label or name!r} records no base model (base_model_sha256 is empty): which base it was made "
            "on cannot be told; adapt it again on this base"
        )
    if base_model_sha256 and voice.base_model_sha256 and voice.base_model_sha256 != base_model_sha256:
        made_on = f"{voice.base_model or 'chorus'} (sha256 {voice.base_model_sha256[:12]}...)"
        this = f"{base_model or 'this base'} (sha256 {base_model_sha256[:12]}...)"
        if voice.base_model in (None, "", "chorus"):  # another Chorus model: its folder, which no voice records
            where = (
                "speak it on the Chorus model it was made on (the shipped base: no --model; another: --model DIR, "
                f"the folder `chorus adapt --model` was given), whose weights' sha256 begins {voice.base_model_sha256[:12]}"
            )
        else:
            where = f"speak it with --base {voice.base_model}"
        raise BaseMismatch(
            f"voice {label or name!r} was made on base {made_on}, not on {this}; {where}, or adapt it again on "
            "this base",
            made_on,
            this,
        )
    tensors = dict(voice.tensors)
    if voice.full:
        base_keys = set(base_state_dict(model))
        weights = {k: tensors.pop(k) for k in list(tensors) if k in base_keys}
        if set(weights) != base_keys:
            raise VoiceError(f"voice {name!r}: its weights do not match this model's layers")
        with torch.no_grad():
            for key, value in base_state_dict(model).items():
                if value.shape != weights[key].shape:
                    raise VoiceError(
                        f"voice {name!r}: {key} has shape {tuple(weights[key].shape)}, the model {tuple(value.shape)}"
                    )
                value.copy_(weights[key])
    if not voice.configs:  # a full fine-tune and nothing more: no adapter to add
        return
    if name in adapter_names(model):  # another's voice: never replaced, nor removed on failure
        raise VoiceError(f"voice {label or name!r}: the model already has an adapter named {name!r}")
    try:
        _check_fit(model, voice.configs, tensors)
        add_adapter(model, name, voice.configs)
        load_adapter_state_dict(model, name, tensors)
    except (TypeError, ValueError, RuntimeError) as error:  # RuntimeError: torch's own, on a size it cannot build
        if name in adapter_names(model):  # what this call added, half-built
            remove_adapter(model, name)
        raise VoiceError(f"voice {label or name!r} does not fit this base model: {error}") from error
