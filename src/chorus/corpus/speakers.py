"""The registry of offline speakers the synthetic corpus is read by.

Every speaker is a Debian-packaged synthesizer (espeak-ng, flite, festival) or the CC0 Piper voice
"joe", optionally followed by a sox effect chain that turns it into a new virtual speaker.

Utterance counts follow intelligibility (Whisper tiny.en WER of the sources, see
``/work/shared/offline-assets.md``): flite rms 2.6 %, festival kal 11.6 %, espeak m3 19 %, f3 30 %. A model
trained on a speaker is hardly more intelligible than the speaker, so the clear flite/festival voices and
their derivatives get ~600 clips and the formant-synth espeak variants ~250.

Three speakers are held out of pretraining, with no derivative of them in anything the base or the
speaker encoder learns from: Piper joe, flite slt and festival ked. They get ~12 minutes each, enough
for 1/3/10-minute adaptation subsets plus evaluation clips.

The one exception is the neural vocoder's own data (``VOCODER_SPEAKERS``, corpus split ``vocoder/``):
the package index has no other natural-sounding English voice, so Piper joe reads *other* sentences
(never one of its held-out clips') resampled by sox into speakers with other pitch and formants.
Benchmarks say so wherever piper-joe is judged through that vocoder.

The speaker encoder's natural-sounding speakers (``ENCODER_SPEAKERS``, corpus split ``encoder/``) are
made the same way, under the same rule: Piper joe reads other sentences than its held-out clips',
through sox chains that move its pitch, its formants and its speaking rate. Neither the base nor the
vocoder reads this split; an encoder that learns from it says so in its model card.

A base may also be pretrained on natural-sounding speakers (``NATURAL_SPEAKERS``, corpus split ``natural/``),
made the same way with chains of their own; a base that reads them says so in its model card, and piper-joe
judged on it is then judged on a base that heard its relatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Engine = Literal["espeak", "flite", "festival", "piper"]
Gender = Literal["male", "female"]
# What a speaker is made for, which is also its corpus folder: the base's pretraining corpus, the neural
# vocoder's natural-sounding speakers, the speaker encoder's, or the natural-sounding speakers a base is
# pretrained on beside ``train`` (issue 38's fallback: ``chorus pretrain corpus_out/train corpus_out/natural``).
Purpose = Literal["train", "vocoder", "encoder", "natural"]

CLEAR_CLIPS = 600  # flite / festival voices and their sox derivatives
ESPEAK_CLIPS = 250  # espeak-ng formant variants, much less intelligible
HELDOUT_CLIPS = 220  # ~12.5 minutes: clips average ~3.4 s (joe 3.5, slt 3.4, ked 3.4) with their 0.2 s of silence
VOCODER_CLIPS = 160  # per vocoder-only speaker: ~9 minutes each
ENCODER_CLIPS = 250  # per encoder-only speaker; 45 at the encoder corpus' scale 0.18 (the encoder uses 44)

# How every sox effect chain is run. -R: repeatable mode, a fixed dither seed, so the same input
# gives the same samples (sox dithers its 16-bit output at random otherwise, and after trimming and
# peak normalization that noise can move a frame across the silence threshold). -G: sox lowers the
# gain where an effect would clip; the peak is normalized afterwards anyway.
SOX_COMMAND = ("sox", "-R", "-G")


@dataclass(frozen=True)
class SpeakerSpec:
    """One corpus speaker.

    ``engine_voice`` is what the engine calls it (espeak ``-v`` value, flite ``-voice`` name,
    festival voice such as ``kal_diphone``, ``joe`` for Piper); ``engine_args`` are extra command-line
    arguments for the engine. ``sox`` is an effect chain (``("pitch", "-250", "speed", "1.05")``)
    applied to the engine's output, making a virtual speaker; ``derived_from`` then names the speaker
    it was made from. ``utterances`` is the clip count at corpus scale 1.0.
    """

    name: str
    engine: Engine
    engine_voice: str
    gender: Gender
    utterances: int
    heldout: bool = False
    engine_args: tuple[str, ...] = ()
    sox: tuple[str, ...] = ()
    derived_from: str | None = None
    purpose: Purpose = "train"

    @property
    def split(self) -> str:
        """Corpus sub-folder: ``heldout``, ``vocoder``, ``encoder`` and ``natural`` speakers never mix with the
        ``train`` ones unless a training names their folder."""
        return "heldout" if self.heldout else self.purpose


def _espeak(name: str, engine_voice: str, gender: Gender) -> SpeakerSpec:
    return SpeakerSpec(name, "espeak", engine_voice, gender, ESPEAK_CLIPS)


def _virtual(name: str, base: SpeakerSpec, gender: Gender, *effects: str) -> SpeakerSpec:
    return SpeakerSpec(
        name,
        base.engine,
        base.engine_voice,
        gender,
        CLEAR_CLIPS,
        engine_args=base.engine_args,
        sox=effects,
        derived_from=base.name,
    )


_FLITE_RMS = SpeakerSpec("flite-rms", "flite", "rms", "male", CLEAR_CLIPS)
_FLITE_AWB = SpeakerSpec("flite-awb", "flite", "awb", "male", CLEAR_CLIPS)
_FLITE_KAL16 = SpeakerSpec("flite-kal16", "flite", "kal16", "male", CLEAR_CLIPS)
# flite's plain "kal" is 8 kHz (nothing above 4 kHz): useful variety, but fewer clips.
_FLITE_KAL = SpeakerSpec("flite-kal", "flite", "kal", "male", ESPEAK_CLIPS)
_FESTIVAL_KAL = SpeakerSpec("festival-kal", "festival", "kal_diphone", "male", CLEAR_CLIPS)

SPEAKERS: tuple[SpeakerSpec, ...] = (
    *(_espeak(f"espeak-us-m{i}", f"en-us+m{i}", "male") for i in range(1, 8)),
    *(_espeak(f"espeak-us-f{i}", f"en-us+f{i}", "female") for i in range(1, 6)),
    _espeak("espeak-us-annie", "en-us+Annie", "female"),
    _espeak("espeak-us-belinda", "en-us+belinda", "female"),
    _espeak("espeak-us-steph", "en-us+steph", "female"),
    _espeak("espeak-us-mike", "en-us+Mike", "male"),
    _espeak("espeak-us-andy", "en-us+Andy", "male"),
    _espeak("espeak-us-grandpa", "en-us+grandpa", "male"),
    # Accents, each with its own variant so they differ in timbre as well as pronunciation.
    _espeak("espeak-gb-m2", "en-gb+m2", "male"),
    _espeak("espeak-rp-f4", "en-gb-x-rp+f4", "female"),
    _espeak("espeak-scotland-m5", "en-gb-scotland+m5", "male"),
    _espeak("espeak-caribbean-m4", "en-029+m4", "male"),
    _espeak("espeak-nyc-f2", "en-us-nyc+f2", "female"),
    _FLITE_RMS,
    _FLITE_AWB,
    _FLITE_KAL16,
    _FLITE_KAL,
    _FESTIVAL_KAL,
    # Virtual speakers. `pitch` moves F0 only (WSOLA); `speed` resamples, moving F0 and formants
    # together like a smaller or larger vocal tract, with `tempo` restoring the speaking rate. Large
    # `pitch` shifts of the diphone speakers hurt intelligibility (Whisper tiny.en WER of festival kal
    # 17 % -> 41 % at +650 cents), so the big shifts use speed+tempo instead (20 %).
    _virtual("flite-rms-up350", _FLITE_RMS, "male", "pitch", "350"),
    _virtual("flite-rms-down300-slow", _FLITE_RMS, "male", "pitch", "-300", "tempo", "0.92"),
    _virtual("flite-awb-down250-fast", _FLITE_AWB, "male", "pitch", "-250", "speed", "1.05"),
    _virtual("flite-awb-speed120", _FLITE_AWB, "male", "speed", "1.2", "tempo", "0.88"),
    _virtual("flite-kal16-up500", _FLITE_KAL16, "male", "pitch", "500"),
    _virtual("flite-kal16-speed135", _FLITE_KAL16, "female", "speed", "1.35", "tempo", "0.8"),
    _virtual("festival-kal-speed088", _FESTIVAL_KAL, "male", "speed", "0.88", "tempo", "1.1"),
    _virtual("festival-kal-speed135", _FESTIVAL_KAL, "female", "speed", "1.35", "tempo", "0.8"),
    # Held out of pretraining (adaptation and evaluation only); nothing above derives from them.
    SpeakerSpec("piper-joe", "piper", "joe", "male", HELDOUT_CLIPS, heldout=True),
    SpeakerSpec("flite-slt", "flite", "slt", "female", HELDOUT_CLIPS, heldout=True),
    SpeakerSpec("festival-ked", "festival", "ked_diphone", "male", HELDOUT_CLIPS, heldout=True),
)


_PIPER_JOE = next(speaker for speaker in SPEAKERS if speaker.name == "piper-joe")

# Natural-sounding audio for the neural vocoder alone. Plain `speed` (resampling: F0 and formants move
# together, the rate changes) rather than `pitch` or `tempo`, whose WSOLA adds the very phasiness a
# vocoder must not learn; a vocoder does not care about the speaking rate.
VOCODER_SPEAKERS: tuple[SpeakerSpec, ...] = tuple(
    SpeakerSpec(
        f"piper-joe-speed{round(100 * factor):03d}",
        "piper",
        "joe",
        gender,
        VOCODER_CLIPS,
        sox=("speed", f"{factor:g}"),
        derived_from="piper-joe",
        purpose="vocoder",
    )
    for factor, gender in ((0.9, "male"), (1.1, "male"), (1.25, "female"), (1.4, "female"))
)


def _joe_through_sox(
    prefix: str, chains: tuple[tuple[tuple[str, ...], Gender], ...], clips: int, purpose: Purpose
) -> tuple[SpeakerSpec, ...]:
    """Piper joe through each sox chain, one speaker each, named by the chain (``pitch -600`` -> ``pitch-m600``);
    ``derived_from`` keeps joe's held-out sentences out of what they read."""
    return tuple(
        SpeakerSpec(
            f"{prefix}-{'-'.join(part.replace('-', 'm').replace('.', '') for part in chain)}",
            "piper",
            "joe",
            gender,
            clips,
            sox=chain,
            derived_from="piper-joe",
            purpose=purpose,
        )
        for chain, gender in chains
    )


# Natural-sounding speakers for the speaker encoder alone: Piper joe through sox. sox moves F0 and the
# formants together (it has no formant-preserving shift): `pitch` keeps the speaking rate (WSOLA), `speed`
# resamples (a shorter or longer vocal tract, the rate with it) and `tempo` sets the rate alone (1 / speed
# restores it); the chains differ in how far they move the voice and in speaking rate. Unlike the vocoder's,
# WSOLA's phasiness does no harm here: the encoder is trained on noisier channels than that.
_ENCODER_CHAINS: tuple[tuple[tuple[str, ...], Gender], ...] = (
    (("pitch", "-600"), "male"),
    (("pitch", "-400"), "male"),
    (("pitch", "-200"), "male"),
    (("pitch", "-100"), "male"),
    (("pitch", "150"), "male"),
    (("pitch", "300"), "male"),
    (("pitch", "450"), "female"),
    (("pitch", "600"), "female"),
    (("speed", "0.85", "tempo", "1.176"), "male"),
    (("speed", "0.92", "tempo", "1.087"), "male"),
    (("speed", "1.08", "tempo", "0.926"), "male"),
    (("speed", "1.16", "tempo", "0.862"), "male"),
    (("speed", "1.25", "tempo", "0.8"), "female"),
    (("speed", "1.4", "tempo", "0.714"), "female"),
    (("speed", "0.9", "pitch", "300", "tempo", "1.111"), "male"),
    (("speed", "1.12", "pitch", "-350", "tempo", "0.893"), "male"),
    (("speed", "1.3", "pitch", "-500", "tempo", "0.769"), "female"),
    (("pitch", "-250", "tempo", "0.9"), "male"),
    (("pitch", "250", "tempo", "1.12"), "male"),
    (("speed", "1.2", "tempo", "0.95"), "female"),
)
ENCODER_SPEAKERS = _joe_through_sox("piper-joe", _ENCODER_CHAINS, ENCODER_CLIPS, "encoder")  # piper-joe-pitch-m600


# Natural-sounding speakers for a base pretrained on them beside ``train/`` (issue 38's fallback, corpus split
# ``natural/``). sox moves F0 and formants together (it has no formant-preserving shift): `speed` by
# resampling, which changes the speaking rate too (speakers differ in rate as well), `pitch` keeping the rate
# (WSOLA), `tempo` the rate alone. F0 spans joe's ~90 Hz x 0.82 to x 2 (about 74 to 180 Hz), so that a
# voice up there (flite-slt reads at ~170 Hz) has neighbours. Every chain differs from the vocoder's and
# the encoder's, so no voice here is one the vocoder or the speaker encoder trained on.
_NATURAL_CHAINS: tuple[tuple[tuple[str, ...], Gender], ...] = (
    (("speed", "0.82"), "male"),
    (("speed", "0.88"), "male"),
    (("speed", "0.95"), "male"),
    (("speed", "1.06"), "male"),
    (("speed", "1.16"), "male"),
    (("speed", "1.30"), "female"),
    (("speed", "1.45"), "female"),
    (("pitch", "-300"), "male"),
    (("pitch", "300", "speed", "1.10"), "male"),
    (("pitch", "500", "tempo", "0.90"), "female"),
    (("pitch", "600", "speed", "1.20"), "female"),
    (("pitch", "800", "speed", "1.25"), "female"),
)
NATURAL_SPEAKERS = _joe_through_sox("natural-joe", _NATURAL_CHAINS, CLEAR_CLIPS, "natural")  # natural-joe-speed-082
DERIVED_SPLITS: tuple[tuple[SpeakerSpec, ...], ...] = (VOCODER_SPEAKERS, ENCODER_SPEAKERS, NATURAL_SPEAKERS)


def pretraining_speakers() -> list[SpeakerSpec]:
    """Speakers of the base model's training corpus (``train/``)."""
    return [speaker for speaker in SPEAKERS if not speaker.heldout]


def heldout_speakers() -> list[SpeakerSpec]:
    """Speakers kept out of pretraining (``heldout/``): Piper joe, flite slt, festival ked."""
    return [speaker for speaker in SPEAKERS if speaker.heldout]


def all_speakers() -> list[SpeakerSpec]:
    """Every registered speaker: the pretraining and held-out ones, then each derived split's."""
    return [*SPEAKERS, *(speaker for split in DERIVED_SPLITS for speaker in split)]


def get_speaker(name: str) -> SpeakerSpec:
    """The registered speaker called ``name``; ``KeyError`` lists the known names otherwise."""
    for speaker in all_speakers():
        if speaker.name == name:
            return speaker
    known = ", ".join(v.name for v in all_speakers())
    raise KeyError(f"unknown corpus speaker {name!r}; known: {known}")
