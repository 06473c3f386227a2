"""The recipe of an adaptation as plain data: its adapter methods (typed configs), its training knobs and
its memory options, with their defaults and checks.

It sits just above :mod:`chorus.adapters` (whose method configs it holds) and below everything that
reads a recipe: the training loop (:mod:`chorus.training.adapt`) runs it, the server keeps its
onboarding recipe in its settings and the memory accounting takes its :class:`MemoryOptions`, and
neither may import the training code to do so. Nothing here runs a model.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field, fields, replace

from chorus.adapters import MethodChoice, MethodConfig, get_method, parse_methods
from chorus.adapters.speaker import SpeakerConfig
from chorus.data.check import VOICE_MIN_SPEECH_SECONDS

# The adapter method a voice is made with unless one is asked for: it scored best in bench/adaptation.py.
DEFAULT_METHOD = "residual"

# Learning rate of full fine-tuning: small, as for any pretrained network.
FULL_LEARNING_RATE = 2e-4

# The text side of the model: what turns phonemes into per-token states and timing. With
# ``AdaptConfig.keep_text_side`` none of it changes (see there).
TEXT_SIDE = ("symbol_embedding", "encoder", "prior_proj", "duration_predictor", "pitch", "energy")
TEXT_SIDE_PATTERN = rf"({'|'.join(TEXT_SIDE)})(\..+)?"

PRECISIONS: dict[str, str] = {
    "fp32": "float32 everywhere: the reference, most memory",
    "bf16": "autocast matmuls/convs to bfloat16: a third less activation memory at 8 x 300 frames (its bf16 "
    "copies of the weights cost more than it saves at tiny batches: chorus memory shows which), ~3 significant digits; "
    "weights, gradients and optimizer states stay float32 (no loss scaling needed)",
}

# How adaptation stores the frozen base (MemoryOptions.frozen_dtype; chorus.training.frozen_layers).
FROZEN_DTYPES = ("fp32", "bf16", "int8")

OPTIMIZERS: dict[str, str] = {
    "adamw": "torch AdamW: two float32 moments per parameter value (8 bytes/value)",
    "adamw8bit": "bitsandbytes AdamW8bit: block-wise 8-bit moments (2 bytes/value + 8 bytes per block "
    "of 256) for every tensor, adapters' small ones included; needs bitsandbytes",
    "adamw8bit-torchao": "torchao AdamW8bit: block-wise 8-bit moments only for tensors of >= 4096 values "
    "that fill whole blocks of 256 (torchao has no setting for it; smaller ones, every "
    "LoRA tensor here, keep float32 moments); "
    "compiles its step with torch.compile (first step of each shape is slow); "
    "needs torchao",
}


@dataclass
class MemoryOptions:
    """How a training run saves memory. ``MemoryOptions.help()`` gives each field's trade-off
    (:mod:`chorus.training.efficiency` applies them)."""

    optimizer: str = field(
        default="adamw",
        metadata={
            "help": "adamw: 8 bytes of state per trained value; adamw8bit: ~2 bytes per value for every "
            "tensor (8-bit moments, + 8 bytes per block of 256); adamw8bit-torchao: the same for tensors "
            "of >= 4096 values only; same update up to quantization"
        },
    )
    checkpointing: bool = field(
        default=False,
        metadata={
            "help": "rerun each transformer block in backward: stores only block inputs, ~25-35% slower "
            "steps, identical gradients"
        },
    )
    reversible: bool = field(
        default=False,
        metadata={
            "help": "the base has reversible blocks (AcousticConfig.reversible, set before pretraining): "
            "block activations O(1) in depth, ~one extra forward per step"
        },
    )
    precision: str = field(
        default="fp32",
        metadata={
            "help": "fp32, or bf16 autocast: a third less activation memory at 8 x 300 frames (more at tiny "
            "batches: its bf16 weight copies; chorus memory shows which), ~3 significant digits in matmuls; fast "
            "only on CPUs/GPUs with bf16 units"
        },
    )
    frozen_dtype: str = field(
        default="fp32",
        metadata={
            "help": "fp32; bf16: keep the frozen base weights in bfloat16 (half their memory) and let its "
            "convolutions save no input; int8: its linear and convolution weights in 8 bits (a quarter), the "
            "rest in bfloat16. Adapters and their optimizer states stay fp32. Needs precision bf16; trains "
            "on a copy of the base"
        },
    )

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"MemoryOptions.optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"MemoryOptions.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.frozen_dtype not in FROZEN_DTYPES:
            raise ValueError(
                f"MemoryOptions.frozen_dtype must be one of {', '.join(FROZEN_DTYPES)}, got {self.frozen_dtype!r}"
            )
        if self.frozen_dtype != "fp32" and self.precision != "bf16":
            raise ValueError(
                f"MemoryOptions: a {self.frozen_dtype} frozen base needs precision bf16 (autocast), so fp32 "
                "activations never meet bf16 weights outside it"
            )
        if self.checkpointing and self.reversible:
            raise ValueError(
                "MemoryOptions: checkpointing adds nothing to reversible blocks, which "
                "store no block activations already; choose one"
            )

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> one-line trade-off, for a CLI's ``--help``."""
        return {f.name: f.metadata["help"] for f in fields(cls)}


def _with_text_side_excluded(exclude: str | list[str] | None) -> str:
    """``exclude`` (a regular expression, a list of names or suffixes, or None) widened to the text side."""
    patterns = [TEXT_SIDE_PATTERN]
    if isinstance(exclude, str):
        patterns.append(exclude)
    elif exclude:
        patterns += [rf"(.+\.)?{re.escape(item)}" for item in exclude]
    return "|".join(f"(?:{pattern})" for pattern in patterns)


@dataclass
class AdaptConfig:
    """Recipe of one adaptation.

    methods: the adapter methods as typed configs, parsed where a user names them
    (:func:`chorus.adapters.parse_methods`: ``parse_methods("lora+speaker", {"lora": {"r": 4}})``), or
    full fine-tuning (``parse_methods("full")``).
    """

    methods: MethodChoice = field(default_factory=lambda: parse_methods(DEFAULT_METHOD))
    steps: int = 600  # upper bound; early stopping usually ends sooner
    learning_rate: float | None = None  # None: the method's default
    max_frames: int = 3_000  # padded mel frames per batch
    eval_every: int = 25
    patience: int = 4  # evaluations without improvement before stopping
    max_minutes: float = 10.0  # wall-clock budget of the training loop
    validation_fraction: float = 0.1
    min_minutes: float = VOICE_MIN_SPEECH_SECONDS / 60  # less speech in the usable clips is refused
    # Recordings without transcripts are cut at silences into clips of at most this many seconds for
    # Whisper; a short sample needs shorter ones (a voice holds a clip out for validation).
    transcribed_clip_seconds: float = 12.0
    max_bad_transcript_fraction: float = 0.2
    # The text side (TEXT_SIDE: phoneme embedding, encoder, prior, duration and variance predictors)
    # stays the base's: adapters go only where the voice is made (the decoder); full fine-tuning
    # trains only the decoder and output layer, its speaker vector and projection kept as well, so
    # the voice speaks with its start speaker's timing. A few minutes of one voice then cannot
    # unlearn how text is read (bench/intelligibility.py measured what it costs and saves). A
    # speaker vector the user trains (``lora+speaker``) still moves the timing.
    keep_text_side: bool = field(
        default=True,
        metadata={
            "help": "Keep the base's text side (encoder, duration predictor): adapt only the decoder, so "
            "the voice keeps the base's way of reading words."
        },
    )
    # A Chorus speaker encoder folder (chorus speaker train): the voice starts at the base speaker
    # nearest its clips in the encoder's space, its speaker vector where the encoder->speaker map
    # puts them (chorus.speaker_recognition.start). None: the base speaker whose conditioning fits the
    # clips best (lowest teacher-forced mel loss), its vector as it is.
    speaker_encoder: str | None = field(
        default=None,
        metadata={"help": "Speaker encoder folder that picks the start voice and its vector (default: by mel loss)."},
    )
    # Recordings that sound like two people to the shipped speaker encoder are refused before training (a
    # folder of two voices trains a blend of them without a word otherwise): bench/one_speaker.py measures it.
    one_speaker_check: bool = field(
        default=True,
        metadata={
            "help": "Refuse recordings that sound like two people to Chorus's speaker encoder "
            "(--no-one-speaker-check: train on them anyway)."
        },
    )
    memory: MemoryOptions = field(default_factory=MemoryOptions)
    threads: int = 2
    seed: int = 1234

    def __post_init__(self) -> None:
        # Types first: "lora" for methods and "5" for steps had failed as AttributeError and TypeError from within.
        if not isinstance(self.methods, MethodChoice):
            raise TypeError(f"methods: parse_methods({self.methods!r}) makes them, got {type(self.methods).__name__}")
        whole = ("steps", "max_frames", "eval_every", "patience", "threads", "seed")
        numbers_ = ("max_minutes", "validation_fraction", "min_minutes", "transcribed_clip_seconds")
        for name in whole + numbers_:
            value = getattr(self, name)
            kind = numbers.Integral if name in whole else numbers.Real
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"{name} must be a {'whole ' if name in whole else ''}number, got {value!r}")
        if self.methods.configs and not any(config.trains() for config in self.methods.configs):
            # speaker --no-train-vector alone: the optimizer had refused an empty parameter list after the data check
            raise ValueError(
                f"nothing would train: {'+'.join(c.method for c in self.methods.configs)} as configured learns no "
                "tensor (a speaker vector not trained: add --train-vector, --train-projection or another method)"
            )
        # Refused here, before any audio is read (0 threads had ended in a traceback). 0 steps is a zero-shot
        # voice, its start speaker's vector as the clips chose it (bench/adaptation.py --steps 0).
        if self.steps < 0:
            raise ValueError(f"steps must be at least 0 (0: a zero-shot voice), got {self.steps}")
        for name in ("max_frames", "eval_every", "patience", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.max_minutes > 0:
            raise ValueError(f"max_minutes must be more than 0, got {self.max_minutes}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be more than 0, got {self.learning_rate}")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be between 0 and 1, got {self.validation_fraction}")

    def method_configs(self) -> list[MethodConfig]:
        """The configs the voice's adapter is built from: copies of ``methods``' configs, the text side
        excluded from all but the speaker vector's when ``keep_text_side``, and a speaker vector when none
        was chosen (every voice carries one; here it stays at the closest speaker's)."""
        configs = [
            replace(config, exclude=_with_text_side_excluded(config.exclude))
            if self.keep_text_side and not isinstance(config, SpeakerConfig)
            else replace(config)
            for config in self.methods.configs
        ]
        if not any(isinstance(c, SpeakerConfig) for c in configs):
            configs.append(SpeakerConfig(train_vector=self.methods.full and not self.keep_text_side))
        return configs

    def voice_methods(self) -> list[str]:
        """The methods a voice made with this config holds, as its folder, its card and the store list them
        (its speaker vector too; full fine-tuning's voice is the whole model)."""
        return self.methods.names if self.methods.full else [c.method for c in self.method_configs()]

    def learning_rate_for(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        if self.methods.full:
            return FULL_LEARNING_RATE
        return min(get_method(name).learning_rate for name in self.methods.names)

    def recipe(self) -> dict:
        """What a voice card notes of this config (JSON; its memory options are noted apart): the methods as
        written and as saved configs, and every training knob."""
        knobs = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("methods", "memory")}
        configs = [config.to_dict() for config in self.methods.configs]  # none for full fine-tuning
        return {"method": self.methods.spec, "method_configs": configs, **knobs}
