"""The Chorus base: its acoustic model (text -> log-mel, with speakers and blends) and a vocoder.

Its forward is :func:`~chorus.synthesis.forward.infer_batch` (under the engine's lock); the post-filter and
the vocoder (:func:`~chorus.synthesis.forward.vocode_batch`) run outside it, since they do not read the
acoustic model. Timestamps come from the durations the acoustic model predicted, one per symbol.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from chorus.audio.postfilter import MelPostFilter
from chorus.audio.vocoders import Vocoder, VocoderError, load_vocoder
from chorus.models.bundle import CheckpointError, ModelBundle, load_bundle
from chorus.synthesis.bases.base import Base
from chorus.synthesis.forward import Sentence, SentenceResult, infer_batch, vocode_batch
from chorus.synthesis.voices import Blend, Speaker, SpeakerSpec, base_voice

ASSETS = Path(__file__).parent.parent.parent / "assets"
DEFAULT_BASE = ASSETS / "base"
DEFAULT_VOCODER = ASSETS / "vocoder"
NAME = "chorus"


class ChorusBase(Base):
    """A loaded Chorus model ``bundle`` and its ``vocoder`` (their mel settings must agree).

    ``postfilter``: what the base's spectra pass through on their way to the vocoder (default: the one
    shipped in the bundle; ``MelPostFilter()`` to hear them raw).
    """

    kind = "chorus"

    def __init__(self, bundle: ModelBundle, vocoder: Vocoder, postfilter: MelPostFilter | None = None):
        if vocoder.mel_config != bundle.mel_config:
            raise ValueError(f"vocoder mel settings {vocoder.mel_config} differ from the model's {bundle.mel_config}")
        self.bundle = bundle
        self.vocoder = vocoder.eval()
        self.postfilter = bundle.postfilter if postfilter is None else postfilter
        self.name, self.sha256 = NAME, bundle.weights_sha256
        self.model = bundle.model
        self.front_end = bundle.front_end
        self.sample_rate = bundle.mel_config.sample_rate
        self.seconds_per_frame = bundle.mel_config.hop_length / self.sample_rate

    @property
    def speakers(self) -> list[str]:
        return list(self.bundle.speakers)

    @property
    def default_speaker(self) -> str:
        return self.bundle.default_speaker

    def speaker(self, spec: SpeakerSpec) -> Speaker | Blend:
        return base_voice(self.bundle, spec)

    def infer(self, sentences: Sequence[Sentence], merge: bool | str = "auto") -> list[SentenceResult | Exception]:
        """Log-mels and durations (``mel``, ``frames``; no audio yet) per sentence: one forward of the acoustic model."""
        return infer_batch(self.model, self.front_end, sentences, merge)

    def finish(self, results: list[SentenceResult | Exception]) -> list[SentenceResult | Exception]:
        """Each result's audio from its log-mel: post-filter, then vocoder."""
        return vocode_batch(self.vocoder, self.postfilter, self.sample_rate, results)

    def with_model(self, model: nn.Module) -> ChorusBase:
        return ChorusBase(dataclasses.replace(self.bundle, model=model), self.vocoder, self.postfilter)


def claims(spec: str | None) -> bool:
    """The Chorus base takes whatever no other base claims: None or ``"chorus"`` (the shipped base) or a
    model folder."""
    return True


def model_folder(spec: str | Path | None) -> Path:
    """The model folder a Chorus base ``spec`` names: the shipped one for None or ``"chorus"``, else ``spec``;
    ``CheckpointError`` for a name or path that is none (a typo of a base's name is not a missing config.json)."""
    if spec in (None, NAME):
        return Path(DEFAULT_BASE)
    spec = str(spec)
    if not Path(spec).exists():
        # Whatever no other base claims lands here: a typo or another Piper name is not a missing config.json.
        if "/" in spec or os.sep in spec:  # a path (a new user's probe: "--model /nonexistent" was an "unknown base")
            raise CheckpointError(f"no such model folder: {spec!r}")
        near = difflib.get_close_matches(spec.lower(), [NAME, "piper-joe"], n=1, cutoff=0.6)
        raise CheckpointError(
            f"unknown base {spec!r}" + (f" (did you mean {near[0]!r}?)" if near else "") + f": give {NAME!r} "
            "(the shipped one), piper-joe, a Piper voice file (voice.onnx) or a Chorus model folder"
        )
    return Path(spec)


def open_base(
    spec: str | None, vocoder: str | Path | None = None, device: str = "cpu", config: Path | None = None
) -> ChorusBase:
    """The shipped base (``spec`` None or ``"chorus"``) or the model folder ``spec``, with ``vocoder``: a saved
    vocoder folder, a registered name (``"griffin-lim"``), ``"neural"`` for the shipped neural vocoder, or
    None for the model's ``default_vocoder`` (chosen on the judges when it was shipped; Griffin-Lim when
    the model names none). ``config`` must be None: a Chorus model folder holds its own config.json."""
    if config is not None:
        raise ValueError(
            f"{config}: a voice config (--config) goes with a Piper voice file; a Chorus model "
            "folder holds its own config.json"
        )
    bundle = load_bundle(model_folder(spec), device)
    vocoder = vocoder or bundle.info.get("default_vocoder", "griffin-lim")
    if str(vocoder) == "neural":
        vocoder = DEFAULT_VOCODER
    try:
        return ChorusBase(bundle, load_vocoder(vocoder, mel_config=bundle.mel_config, device=device))
    except VocoderError as error:  # the registry knows no "neural": it is this base's name for its own
        raise VocoderError(f"{error}; or 'neural', the shipped neural vocoder") from None


def speakers(spec: str | None) -> tuple[list[str], str]:
    """The Chorus model's speakers and its default (:func:`chorus.synthesis.bases.base_speakers`): opened with
    Griffin-Lim, which loads nothing, as naming them needs no vocoder."""
    base = open_base(spec, "griffin-lim")
    return base.speakers, base.default_speaker
