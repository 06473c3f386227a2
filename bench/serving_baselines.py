"""The serving benchmark's baselines, on the library's one synthesis path (same front end, forward,
post-filter and vocoder as the engine's batches):
:func:`swap_one_at_a_time` (requests in order, one adapter activated per request, as PEFT's
``set_adapter``) and :class:`ModelPerVoice` (a full copy of the base per voice, the voice merged into it).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from chorus.adapters.inject import active_adapter, adapter_names, merge_adapter, remove_adapter
from chorus.adapters.voice import apply_voice, read_voice
from chorus.serving.engine import Engine, SentenceRequest, UnknownVoice, is_mergeable
from chorus.synthesis.forward import SentenceResult, check_speed, infer_mels, vocode_batch


def swap_one_at_a_time(
    engine: Engine, requests: Sequence[SentenceRequest], vocode: bool = True
) -> list[SentenceResult | Exception]:
    """Baseline: requests one after another, each a forward of one row with its voice's adapter
    activated for it (PEFT's ``set_adapter`` per request); the same engine and cache."""
    return [engine.synthesize([request], merge=False, vocode=vocode)[0] for request in requests]


class ModelPerVoice:
    """Baseline: one full copy of the base model per voice, the voice merged into it where all its
    methods merge (else kept active); memory grows by a whole model per voice (:attr:`resident_bytes`).
    Base voices share one clean copy. Fully fine-tuned voice folders work too (their own weights)."""

    def __init__(self, engine: Engine, voices: dict[str, str | Path], merge: bool = True):
        self.engine = engine
        with engine.lock:
            base = copy.deepcopy(engine.model)
        for name in adapter_names(base):  # the copy holds the engine's resident adapters: drop them
            remove_adapter(base, name)
        self.base = base
        self.models: dict[str, tuple[torch.nn.Module, bool]] = {}  # voice id -> (model, merged)
        for voice_id, folder in voices.items():
            model = copy.deepcopy(base)
            apply_voice(model, read_voice(folder), "voice", engine.bundle.weights_sha256)
            merged = merge and is_mergeable(model, "voice")
            if merged:
                merge_adapter(model, "voice")
            self.models[voice_id] = (model, merged)

    @property
    def resident_bytes(self) -> int:
        """Bytes of every model copy held (weights, buffers, adapters, saved base tensors of merges)."""
        total = 0
        for model in [self.base, *(m for m, _ in self.models.values())]:
            total += sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        return total

    def synthesize(self, request: SentenceRequest, vocode: bool = True) -> SentenceResult:
        started = time.perf_counter()
        voice = request.voice if isinstance(request.voice, str) else request.voice.key
        check_speed(request.speed)
        ids = self.engine.bundle.front_end.encode([request.text])
        if voice in self.models:
            model, merged = self.models[voice]
            speaker = self.engine.bundle.speaker_index(self.engine.bundle.default_speaker)
            # A merged voice is in the weights, and a fully fine-tuned one is its weights alone: nothing
            # to activate (the library's forward would insist on the bare base for them).
            context = (
                active_adapter(model, "voice") if not merged and "voice" in adapter_names(model) else nullcontext()
            )
        elif self.engine.is_speaker(voice):
            model, speaker, context = self.base, self.engine.handle(voice).speaker_id, nullcontext()
        else:
            raise UnknownVoice(voice, "no model for it in this baseline")
        with context:
            row = infer_mels(model, ids, [speaker], [float(request.speed)])[0]
        result = SentenceResult(
            np.zeros(0, np.float32), self.engine.sample_rate, 0.0, voice, mel=row.mel, frames=row.frames
        )
        if vocode:
            engine = self.engine
            (result,) = vocode_batch(engine.base.vocoder, engine.base.postfilter, engine.sample_rate, [result])
            if isinstance(result, Exception):
                raise result
        result.seconds, result.path = time.perf_counter() - started, "model-per-voice"
        return result

    def run(self, requests: Sequence[SentenceRequest], vocode: bool = True) -> list[SentenceResult | Exception]:
        """Requests one after another, each on its voice's own model."""
        out: list[SentenceResult | Exception] = []
        for request in requests:
            try:
                out.append(self.synthesize(request, vocode))
            except Exception as error:  # noqa: BLE001 - reported per request
                out.append(error)
        return out
