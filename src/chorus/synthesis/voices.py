"""Who speaks: a voice resolved once, from what a caller wrote, into a typed value.

A base :class:`Speaker` (a row of the model's speaker table) or a :class:`Blend` of speakers (one vector,
``"flite-rms(2)+festival-kal(1)"`` parsed once) come from :func:`base_voice`. An adapted voice is known to
the engine that holds it (:class:`~chorus.synthesis.engine.Engine`, by the name a user loaded it under or by
its store record); at the forward every voice becomes a :class:`VoiceHandle`: which adapter of the model is
on, and which speaker row or vector conditions the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from chorus.models.bundle import ModelBundle
from chorus.models.speaker_mix import is_mix


@dataclass(frozen=True)
class Speaker:
    """A speaker of the base: its ``name`` and its ``index`` in the model's speaker table."""

    name: str
    index: int

    @property
    def key(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Blend:
    """A blend of the base's speakers: ``spec`` as written and its ``vector`` ``[speaker_dim]``."""

    spec: str
    vector: torch.Tensor = field(repr=False)

    @property
    def key(self) -> str:
        return self.spec


# What a caller may name a base voice by: typed, a name, an index, a blend as written, or None (the default).
SpeakerSpec = Speaker | Blend | str | int | None

# OpenAI's voice names, so that code with a fixed voice picker works: each speaks as a speaker of the shipped
# base; on another base, a speaker it lacks is its default speaker. The library and the CLI take them as they
# are; the server's /v1/audio/voices shows which speaker each is, `chorus serve --voice-aliases FILE` replaces
# the map there (every speaker it names must exist), and a tenant's own voice of the same id comes first.
OPENAI_VOICE_ALIASES = {
    "alloy": "flite-rms",
    "ash": "flite-rms-down300-slow",
    "ballad": "flite-awb-speed120",
    "coral": "espeak-us-f4",
    "echo": "flite-awb",
    "fable": "festival-kal",
    "onyx": "flite-kal16",
    "nova": "espeak-us-f2",
    "sage": "festival-kal-speed135",
    "shimmer": "espeak-us-f3",
    "verse": "flite-rms-up350",
    "marin": "espeak-us-f5",
    "cedar": "flite-kal16-up500",
}


def openai_voice(speaker: SpeakerSpec, speakers: list[str]) -> SpeakerSpec:
    """``speaker``, or the base speaker an OpenAI voice name ("alloy", "Nova") speaks as: its speaker when
    ``speakers`` (the base's) has it, else None (the default speaker). A speaker of the base named like an
    alias is itself."""
    if not isinstance(speaker, str) or speaker in speakers or speaker.lower() not in OPENAI_VOICE_ALIASES:
        return speaker
    chosen = OPENAI_VOICE_ALIASES[speaker.lower()]
    return chosen if chosen in speakers else None


def check_speaker_type(spec: object) -> None:
    """``TypeError`` for what cannot name a speaker (a float, bytes, a list): not a name, an index or None."""
    if isinstance(spec, bool) or not isinstance(spec, Speaker | Blend | str | int | None):
        raise TypeError(f"speaker must be a name, an index or None, got {type(spec).__name__} {spec!r:.40}")


def base_voice(bundle: ModelBundle, spec: SpeakerSpec) -> Speaker | Blend:
    """``spec`` (a speaker's name or index, a blend, None for the default speaker) as a typed voice;
    ``KeyError`` for a name the model lacks or an index out of range, ``ValueError`` for a bad blend.
    A typed voice is its own answer."""
    if isinstance(spec, Speaker | Blend):
        return spec
    if isinstance(spec, str) and is_mix(spec):
        return Blend(spec, bundle.speaker_mix(spec))
    if spec is None:
        spec = bundle.default_speaker
    if isinstance(spec, int) or (spec.isdigit() and spec not in bundle.speakers):
        index = int(spec)
        if not 0 <= index < len(bundle.speakers):
            raise KeyError(f"speaker index {index} out of range 0..{len(bundle.speakers) - 1}")
        return Speaker(bundle.speakers[index], index)
    index = bundle.speaker_index(spec)
    return Speaker(bundle.speakers[index], index)  # as the model spells it (names are case-insensitive)


@dataclass(frozen=True, eq=False)
class VoiceHandle:
    """How a forward runs one voice: ``adapter`` is the adapter's name inside the model (None: the bare
    base), ``speaker_id`` the row of the speaker table to feed (an adapted voice's own speaker vector,
    when it has one, overrides it), ``speaker_vector`` a blend's vector ``[speaker_dim]`` fed instead,
    ``mergeable`` whether every method of the adapter folds into the base weights, ``length_scale`` the
    voice's own pace as a duration multiplier (a Piper voice adapted to a slower speaker: > 1), ``noise_scale``
    the prior noise an adapted Piper voice speaks at (None: the base's)."""

    key: str
    adapter: str | None
    speaker_id: int
    mergeable: bool = False
    speaker_vector: torch.Tensor | None = None
    length_scale: float = 1.0
    noise_scale: float | None = None

    @classmethod
    def of(cls, voice: Speaker | Blend, default_speaker: int) -> VoiceHandle:
        """The handle of a base speaker or a blend (a blend's row id is unused: its vector is fed)."""
        if isinstance(voice, Blend):
            return cls(voice.key, None, default_speaker, speaker_vector=voice.vector)
        return cls(voice.key, None, voice.index)
