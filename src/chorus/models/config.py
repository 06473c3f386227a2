"""Typed configuration of the acoustic model. Any size is built from one of these."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields

# The layers whose width ``AcousticConfig.layer_sizes`` may set.
LAYER_SIZE_NAME = re.compile(
    r"(encoder|decoder)\.layers\.\d+\.(ff|attn)|(duration_predictor|pitch\.predictor|energy\.predictor)\.conv[12]"
)


@dataclass
class AcousticConfig:
    """Sizes of the non-autoregressive multi-speaker acoustic model.

    The defaults are the shipped CPU base: small enough to pretrain in a few CPU-hours and to run
    far faster than real time on two cores.
    """

    n_symbols: int = 128  # size of the phoneme symbol table (set from the text front end)
    n_speakers: int = 32  # rows of the speaker embedding table
    n_mels: int = 80
    d_model: int = 192  # width of every transformer block
    n_heads: int = 2
    encoder_layers: int = 4
    decoder_layers: int = 4
    ff_hidden: int = 384  # hidden channels of the convolutional feed-forward
    ff_kernel: int = 3  # kernel of the convolutional feed-forward (time axis)
    dropout: float = 0.0  # off for the CPU base: dropout RNG was ~16% of a CPU step, and the
    # corpus is large next to the steps a CPU run affords
    speaker_dim: int = 64  # speaker vectors live here; a projection maps them to d_model
    predictor_hidden: int = 192  # duration / pitch / energy predictors (two conv layers)
    predictor_kernel: int = 3
    use_pitch: bool = False  # optional phoneme-level pitch predictor (needs F0 targets)
    use_energy: bool = False  # optional phoneme-level energy predictor
    max_positions: int = 4096  # longest sequence the sinusoidal positions cover
    reversible: bool = False  # reversible (RevNet) coupling of each stack's blocks: block
    # activations are recomputed in backward instead of stored
    # (O(1) in depth, ~one extra forward per step). A different
    # function from the plain blocks: set it before pretraining; a
    # base trained without it cannot be switched. Needs dropout 0.
    layer_sizes: dict[str, int] = field(default_factory=dict)  # widths of single layers that differ
    # from the sizes above, by stable module name (what structured pruning leaves):
    # "<stack>.layers.<i>.ff": feed-forward hidden channels, "<stack>.layers.<i>.attn": attention
    # heads kept, "<predictor>.conv1" / "<predictor>.conv2": a variance predictor's channels.

    def size(self, name: str, default: int) -> int:
        """The width of layer ``name`` (see ``layer_sizes``), ``default`` when not pruned."""
        return self.layer_sizes.get(name, default)

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and value <= 0 and f.name not in ("encoder_layers", "decoder_layers"):
                raise ValueError(f"AcousticConfig.{f.name} must be positive, got {value}")
        for name in ("ff_kernel", "predictor_kernel"):
            if getattr(self, name) % 2 == 0:
                raise ValueError(
                    f"AcousticConfig.{name} must be odd (same-length convolutions), got {getattr(self, name)}"
                )
        for name, width in self.layer_sizes.items():
            if not LAYER_SIZE_NAME.fullmatch(name) or not isinstance(width, int) or width <= 0:
                raise ValueError(
                    f"AcousticConfig.layer_sizes: {name!r}: {width!r} is not a positive width of a "
                    "'<encoder|decoder>.layers.<i>.<ff|attn>' or '<predictor>.<conv1|conv2>' layer"
                )
            if name.endswith(".attn") and width > self.n_heads:
                raise ValueError(f"AcousticConfig.layer_sizes: {name!r} keeps {width} heads of {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"AcousticConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.reversible and self.dropout > 0:
            # Backward recomputes each block from its outputs; dropout would need its RNG replayed
            # exactly, which the reversible stack does not do.
            raise ValueError(
                f"AcousticConfig.reversible needs dropout 0 (dropout RNG is not replayed "
                f"when blocks are recomputed in backward), got dropout {self.dropout}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AcousticConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown AcousticConfig fields: {sorted(unknown)}")
        return cls(**data)
