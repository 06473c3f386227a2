"""Vocoders: log-mel ``[batch, frames, n_mels]`` -> audio ``[batch, frames * hop_length]``.

Built in: ``"griffin-lim"`` (no weights, always available) and ``"vocos"`` (trained with
:func:`chorus.training.vocoder.train_vocoder`). Load either with :func:`load_vocoder`::

    vocoder = load_vocoder("griffin-lim")                  # by name: needs no files
    vocoder = load_vocoder("runs/vocos", mel_config=model_mel_config)  # a saved folder
    audio = vocoder.vocode(log_mel)                     # [frames, n_mels] -> [samples]

Your own vocoder: subclass :class:`Vocoder`, give it a dataclass config of JSON-friendly scalars,
and register it; it can then be built, saved (safetensors + JSON) and loaded like the built-ins::

    @dataclass(frozen=True)
    class MyConfig:
        channels: int = 64

    @register_vocoder("my-vocoder")
    class MyVocoder(Vocoder):
        config_class = MyConfig

        def __init__(self, config: MyConfig = MyConfig(), mel_config: MelConfig = MelConfig()):
            super().__init__(config, mel_config)
            self.net = torch.nn.Sequential(torch.nn.Conv1d(mel_config.n_mels, config.channels, 3, padding=1),
                                           torch.nn.Tanh(), torch.nn.Conv1d(config.channels, mel_config.hop_length, 1))

        def forward(self, log_mel):  # [batch, frames, n_mels] -> [batch, frames * hop]
            return self.net(log_mel.transpose(1, 2)).transpose(1, 2).flatten(1)

    build_vocoder("my-vocoder", channels=32).save("runs/mine"); load_vocoder("runs/mine")

Set ``needs_weights = False`` on the class if it works untrained (then ``load_vocoder("my-vocoder")``
builds it). Import your module before loading a folder saved from it.
"""

from chorus.audio.vocoders.base import (
    Vocoder,
    VocoderError,
    build_vocoder,
    load_vocoder,
    register_vocoder,
    registered_vocoders,
    vocoder_class,
)
from chorus.audio.vocoders.griffin_lim import GriffinLim, GriffinLimConfig
from chorus.audio.vocoders.vocos import Vocos, VocosConfig

__all__ = [
    "Vocoder",
    "VocoderError",
    "build_vocoder",
    "load_vocoder",
    "register_vocoder",
    "registered_vocoders",
    "vocoder_class",
    "GriffinLim",
    "GriffinLimConfig",
    "Vocos",
    "VocosConfig",
]
