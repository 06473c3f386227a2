"""The engine: one resident base (:class:`~chorus.synthesis.bases.Base`), its speakers, and a byte-bounded
cache of adapted voices. The library's :class:`~chorus.synthesis.Synthesizer` is its face for one user; the
server batches many users' requests into it.

A speaker (a row of the base's speaker table) is always available by name. An adapted voice is a voice
folder (``chorus adapt`` output) that the engine finds through ``resolve(voice_id) -> folder`` (the
voice store provides it) or through :meth:`Engine.add_voice`, and loads on first use as a named
adapter inside the one resident model; a voice already in memory joins with :meth:`Engine.add_loaded`.
Adapters live in a cache bounded in bytes (the adapter tensors' bytes): least recently used voices are
removed from the model (``remove_adapter``) when the cache is over budget; pinned voices and voices in use
by a running batch are never evicted. An unknown voice raises :class:`UnknownVoice`, never a fallback to
another voice. A voice made on another base is refused, naming both bases.

A fully fine-tuned voice is a model of its own, not an adapter: the engine keeps it as a base of its own
beside the resident one (:meth:`~chorus.synthesis.bases.Base.with_model`), counted in the cache at its
whole size, and a batch that mixes it with other voices runs one forward per model.

The model is shared by every request, so whatever runs it or changes its adapters holds
:attr:`Engine.lock` (the batcher holds it for a whole batch through :meth:`Engine.using`).

Typical use::

    engine = Engine.load("runs/base", "griffin-lim", resolve=lambda voice: folders[voice.key])
    engine.add_voice("ann", "voices/ann", pin=True)
    ann, rms = engine.resolve_voice("ann"), engine.resolve_voice("flite-rms")
    results = engine.synthesize([SentenceRequest("Hello.", ann), SentenceRequest("Hi.", rms)])

A voice reaches the engine typed, resolved once by whoever took the request (:meth:`Engine.resolve_voice` for a
name; the server's :class:`~chorus.serving.voice_keys.StoredVoice` carries its store record): a base
:class:`~chorus.synthesis.voices.Speaker`, a :class:`~chorus.synthesis.voices.Blend`, or an
:class:`AdaptedVoice` found by its ``key``. :meth:`Engine.synthesize` reads a batch of requests through the
base's forward (:meth:`~chorus.synthesis.bases.Base.infer`, the one synthesis path), holding the lock for the
forward only.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch import nn

from chorus.adapters.inject import (
    adapter_layers,
    adapter_names,
    adapter_state_dict,
    remove_adapter,
)
from chorus.adapters.voice import Voice, apply_voice, read_voice
from chorus.models.bundle import ModelBundle
from chorus.models.speaker_mix import is_mix
from chorus.synthesis.bases import Base, open_base
from chorus.synthesis.forward import Sentence, SentenceResult, stamp
from chorus.synthesis.voices import Blend, Speaker, VoiceHandle

DEFAULT_CACHE_BYTES = 64 << 20


class UnknownVoice(KeyError):
    """A voice id that is neither a speaker of the base nor an adapted voice the engine can find."""

    def __init__(self, voice_id: str, detail: str = ""):
        super().__init__(voice_id)
        self.voice_id = voice_id
        self.detail = detail

    def __str__(self) -> str:  # KeyError would print the repr of its argument only
        return f"unknown voice {self.voice_id!r}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class AdaptedVoice:
    """An adapted voice, by its ``key`` in the engine's cache (the folder comes from :meth:`Engine.add_voice`
    or the engine's ``resolve``). ``speaker``: the row of the base's speaker table it speaks with where it
    has no speaker vector of its own (None: the default speaker)."""

    key: str
    speaker: int | None = field(default=None, kw_only=True)


EngineVoice = Speaker | Blend | AdaptedVoice


@dataclass(frozen=True)
class SentenceRequest:
    """One sentence to speak: ``text`` in ``voice`` (typed, or a name :meth:`Engine.resolve_voice` resolves) at
    ``speed`` (2.0 speaks twice as fast)."""

    text: str
    voice: EngineVoice | str
    speed: float = 1.0


@dataclass
class CachedVoice:
    """An adapted voice resident in the model (``base`` None), or a fully fine-tuned one: a base of its own.
    ``folder`` is None for a voice that joined from memory (:meth:`Engine.add_loaded`)."""

    voice_id: str
    adapter: str | None  # None: a full fine-tune that carries no adapter (its weights are the voice)
    folder: Path | None
    nbytes: int
    methods: list[str]
    mergeable: bool
    pinned: bool = False
    in_use: int = 0  # batches holding it right now (never evicted while > 0)
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    base: Base | None = None
    length_scale: float = 1.0  # the voice's own pace (VoiceCard.length_scale)
    noise_scale: float | None = None  # the prior noise it speaks at (VoiceCard.noise_scale; None: the base's)


@dataclass
class EngineStats:
    """Counters for metrics. A hit or miss is counted once per distinct adapted voice per
    :meth:`Engine.using` (one batch); speakers are not counted."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    load_seconds: float = 0.0  # total wall time spent reading and applying voice folders
    resident_bytes: int = 0
    resident_voices: int = 0
    pinned_voices: int = 0
    capacity_bytes: int = 0


def adapter_bytes(model, adapter: str) -> int:
    """Bytes of adapter ``adapter``'s tensors in ``model``."""
    return sum(t.numel() * t.element_size() for t in adapter_state_dict(model, adapter).values())


def model_bytes(model: nn.Module) -> int:
    """Bytes of all of ``model``'s parameters and buffers (what a fully fine-tuned voice holds)."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def is_mergeable(model, adapter: str) -> bool:
    """Whether every layer ``adapter`` adapts can fold it into the base weights."""
    layers = [layer for _, layer in adapter_layers(model) if adapter in layer.configs]
    return bool(layers) and all(layer.mergeable for layer in layers)


class Engine:
    """A resident base serving its speakers and cached adapted voices.

    Args:
        base: the base (:func:`~chorus.synthesis.bases.open_base`); the engine owns its model from now on
            (adapters are added to and removed from it).
        resolve: ``AdaptedVoice -> local voice folder`` for voices not added with :meth:`add_voice`;
            raising ``KeyError``/``FileNotFoundError`` or returning None means "no such voice".
        cache_bytes: budget for the adapter tensors of unpinned resident voices plus pinned ones;
            pinned voices and voices in use may push it over, never a reason to refuse them.
        pinned: voice ids loaded now and never evicted.
    """

    def __init__(
        self,
        base: Base,
        resolve: Callable[[AdaptedVoice], str | Path | None] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        pinned: Iterable[str] = (),
    ):
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.base = base
        self.resolve = resolve
        self.cache_bytes = cache_bytes
        self.lock = threading.RLock()
        self._cache: OrderedDict[str, CachedVoice] = OrderedDict()  # LRU order: least recent first
        self._folders: dict[str, Path] = {}  # voices added by add_voice
        self._pins: set[str] = set()
        self._next_adapter = 0
        self._stats = EngineStats(capacity_bytes=cache_bytes)
        self._speaker_ids = {name: index for index, name in enumerate(base.speakers)}
        self._default_speaker = base.speaker(None).index
        for voice_id in pinned:
            self.pin(voice_id)

    @classmethod
    def load(
        cls, base: str | Path | None = None, vocoder: str | Path | None = None, device: str = "cpu", **kwargs
    ) -> Engine:
        """An engine on :func:`~chorus.synthesis.bases.open_base` ``(base, vocoder, device)``: None for the
        shipped Chorus base, a Chorus model folder, ``"piper-joe"`` or a Piper ``voice.onnx``."""
        return cls(open_base(base, vocoder, device), **kwargs)

    # -- voices --------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The resident model (the base's), where adapted voices live."""
        return self.base.model

    @property
    def bundle(self) -> ModelBundle:
        """The Chorus base's model bundle (``ValueError`` on another kind of base)."""
        if self.base.kind != "chorus":
            raise ValueError(f"the {self.base.name} base is not a Chorus model: it has no model bundle")
        return self.base.bundle

    @property
    def speakers(self) -> list[str]:
        return self.base.speakers

    @property
    def default_speaker(self) -> str:
        return self.base.default_speaker

    @property
    def sample_rate(self) -> int:
        return self.base.sample_rate

    def is_speaker(self, voice_id: str) -> bool:
        """A speaker of the base, or a valid blend of them (``"flite-rms(2)+festival-kal(1)"``)."""
        if voice_id in self._speaker_ids:
            return True
        return is_mix(voice_id) and self.base.is_speaker(voice_id)

    def resident(self) -> list[str]:
        """Adapted voices loaded in the model, least recently used first."""
        with self.lock:
            return list(self._cache)

    def is_resident(self, voice_id: str) -> bool:
        """Whether ``voice_id`` is loaded now, without waiting for :attr:`lock` (a running batch holds it)."""
        return voice_id in self._cache  # one dict lookup: atomic under the GIL

    def resident_now(self) -> list[str]:
        """:meth:`resident` without waiting for :attr:`lock`: for a request's quick look (copying a dict of
        str keys runs no Python code, so no other thread changes it midway under the GIL)."""
        return list(self._cache)

    def cached(self, voice_id: str) -> CachedVoice | None:
        with self.lock:
            return self._cache.get(voice_id)

    def add_voice(self, voice_id: str, folder: str | Path, pin: bool = False, load: bool = True) -> None:
        """Make ``folder`` the voice ``voice_id`` (replacing a resident older version); loads it now
        with ``load`` or ``pin`` (a broken folder raises :class:`VoiceError` here), else on first use."""
        if self.is_speaker(voice_id):
            raise ValueError(f"{voice_id!r} is a speaker of this model; choose another voice id")
        folder = Path(folder)
        voice = read_voice(folder) if (load or pin) else None
        with self.lock:
            if voice_id in self._cache:
                self._unload(voice_id)
            self._folders[voice_id] = folder
            if pin:
                self._pins.add(voice_id)
            if voice is not None:
                self._apply(voice_id, folder, voice, started=time.perf_counter())
                self._evict()

    def add_loaded(self, voice_id: str, model: nn.Module, adapter: str) -> None:
        """Make adapter ``adapter`` of ``model``, a voice already in memory (just trained), the voice
        ``voice_id``, pinned: it has no folder to be read from again. ``model`` is the resident model (the
        adapter is already in it) or a model of its own (a fully fine-tuned copy)."""
        if self.is_speaker(voice_id):
            raise ValueError(f"{voice_id!r} is a speaker of this model; choose another voice id")
        own = model is not self.model
        with self.lock:
            if voice_id in self._cache:
                self._unload(voice_id)
            self._pins.add(voice_id)
            self._cache[voice_id] = CachedVoice(
                voice_id,
                adapter,
                None,
                model_bytes(model) if own else adapter_bytes(model, adapter),
                [],
                is_mergeable(model, adapter),
                pinned=True,
                base=self.base.with_model(model) if own else None,
            )

    def remove_voice(self, voice_id: str) -> None:
        """Unload ``voice_id`` (pinned or not) and forget a folder given by :meth:`add_voice`; a later
        request finds it again only through ``resolve``."""
        with self.lock:
            known = voice_id in self._cache or voice_id in self._folders
            if not known:
                raise UnknownVoice(voice_id, "not added and not resident")
            if voice_id in self._cache and self._cache[voice_id].in_use:
                raise RuntimeError(f"voice {voice_id!r} is in use by a running batch")
            self._pins.discard(voice_id)
            self._folders.pop(voice_id, None)
            if voice_id in self._cache:
                self._unload(voice_id)

    def unload(self, voice_id: str) -> bool:
        """Drop ``voice_id`` from the model now (it stays findable and loads again on next use);
        returns whether it was resident. Refused for a voice in use."""
        with self.lock:
            entry = self._cache.get(voice_id)
            if entry is None:
                return False
            if entry.in_use:
                raise RuntimeError(f"voice {voice_id!r} is in use by a running batch")
            self._unload(voice_id)
            return True

    def pin(self, voice_id: str) -> None:
        """Load ``voice_id`` (if needed) and keep it resident until :meth:`unpin` or :meth:`remove_voice`."""
        if self.is_speaker(voice_id):
            return  # speakers are always there
        with self.using([voice_id]) as (_, errors):
            if voice_id in errors:
                raise errors[voice_id]
            with self.lock:
                self._pins.add(voice_id)
                self._cache[voice_id].pinned = True

    def unpin(self, voice_id: str) -> None:
        with self.lock:
            self._pins.discard(voice_id)
            if voice_id in self._cache:
                self._cache[voice_id].pinned = False
            self._evict()

    def resize(self, cache_bytes: int) -> None:
        """Change the cache budget; evicts at once down to it."""
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        with self.lock:
            self.cache_bytes = cache_bytes
            self._evict()

    def base_copy(self) -> ModelBundle:
        """A private copy of the Chorus base, without any adapter, for one adaptation (a server's job adapts on it
        in place, ``adapt(..., in_place=True)``; the resident model must not see that). Onboarding trains on the Chorus
        base only: on another base this raises ``ValueError`` saying how its voices are made."""
        if self.base.kind != "chorus":
            raise ValueError(
                f"onboarding trains voices on the Chorus base; voices of the {self.base.name} base are made with "
                f"`chorus adapt DATA --base {self.base.name} --out VOICE` and added to the store (`chorus store add`)"
            )
        return dataclasses.replace(self.bundle, model=self._bare_model())

    def _bare_model(self) -> nn.Module:
        """A copy of the resident model without any adapter."""
        with self.lock:  # never copy mid-batch (a merged adapter would be copied in)
            model = copy.deepcopy(self.model)
        for name in adapter_names(model):
            remove_adapter(model, name)
        return model

    def stats(self) -> EngineStats:
        """A snapshot of the counters and the cache's current size."""
        with self.lock:
            snapshot = EngineStats(**{k: getattr(self._stats, k) for k in EngineStats.__dataclass_fields__})
            snapshot.resident_bytes = sum(entry.nbytes for entry in self._cache.values())
            snapshot.resident_voices = len(self._cache)
            snapshot.pinned_voices = sum(entry.pinned for entry in self._cache.values())
            snapshot.capacity_bytes = self.cache_bytes
            return snapshot

    # -- serving -------------------------------------------------------------------------------
    def resolve_voice(self, name: str) -> EngineVoice:
        """``name`` as a typed voice: a speaker of the base, a blend of them (``ValueError``/``KeyError`` for
        a bad one), else an adapted voice by that key (found when it is used)."""
        if name in self._speaker_ids:
            return Speaker(name, self._speaker_ids[name])
        if is_mix(name):
            return self.base.speaker(name)
        return AdaptedVoice(name)

    def _typed(self, voice: EngineVoice | str) -> EngineVoice:
        return self.resolve_voice(voice) if isinstance(voice, str) else voice

    def handle(self, voice: EngineVoice | str) -> VoiceHandle:
        """The handle of a speaker, a blend or a *resident* adapted voice (no loading, no counting)."""
        voice = self._typed(voice)
        if isinstance(voice, Speaker | Blend):
            return VoiceHandle.of(voice, self._default_speaker)
        with self.lock:
            entry = self._cache.get(voice.key)
            if entry is None:
                raise UnknownVoice(voice.key, "not resident")
            return self._adapted_handle(voice, entry)

    def _adapted_handle(self, voice: AdaptedVoice, entry: CachedVoice) -> VoiceHandle:
        row = self._default_speaker if voice.speaker is None else voice.speaker
        return VoiceHandle(
            voice.key,
            entry.adapter,
            row,
            entry.mergeable,
            length_scale=entry.length_scale,
            noise_scale=entry.noise_scale,
        )

    @contextmanager
    def using(
        self, voices: Iterable[EngineVoice | str]
    ) -> Iterator[tuple[dict[str, VoiceHandle], dict[str, Exception]]]:
        """Hold :attr:`lock` with every voice of ``voices`` resident; yields (handles by voice key,
        errors by voice key) so one bad voice fails only its own requests. Voices missing from the
        cache are read from disk first (outside the lock) and then added to the model; the voices
        held are exempt from eviction until the block ends, after which the cache is trimmed to
        its budget."""
        typed: dict[str, EngineVoice] = {}
        errors: dict[str, Exception] = {}
        for voice in voices:
            try:
                voice = self._typed(voice)
            except (KeyError, ValueError) as error:  # a bad blend
                errors[voice] = error
                continue
            typed.setdefault(voice.key, voice)
        read: dict[str, tuple[Path, Voice, float] | Exception] = {}
        for key, voice in typed.items():
            if isinstance(voice, AdaptedVoice) and key not in self._cache:  # unlocked peek: at worst read twice
                started = time.perf_counter()
                try:
                    folder = self._find(voice)
                    read[key] = (folder, read_voice(folder), started)
                except Exception as error:  # noqa: BLE001 - reported per voice
                    read[key] = error
        with self.lock:
            handles: dict[str, VoiceHandle] = {}
            held: list[CachedVoice] = []
            for key, voice in typed.items():
                if not isinstance(voice, AdaptedVoice):
                    handles[key] = VoiceHandle.of(voice, self._default_speaker)
                    continue
                try:
                    entry = self._lookup(voice, read.get(key))
                except Exception as error:  # noqa: BLE001 - reported per voice
                    errors[key] = error
                    continue
                entry.in_use += 1
                held.append(entry)
                handles[key] = self._adapted_handle(voice, entry)
            try:
                self._evict()
                yield handles, errors
            finally:
                for entry in held:
                    entry.in_use -= 1
                self._evict()

    def synthesize(
        self, requests: Sequence[SentenceRequest], merge: bool | str = "auto", vocode: bool = True
    ) -> list[SentenceResult | Exception]:
        """Speak ``requests`` through the base's forward (:meth:`~chorus.synthesis.bases.Base.infer`, one per
        model: the resident one, and each fully fine-tuned voice's own) under :attr:`lock`, then
        :meth:`~chorus.synthesis.bases.Base.finish` outside it (the Chorus base's vocoder). Returns a result
        (``speaker`` is the voice's key; ``seconds`` the time this took; timestamps by
        :meth:`~chorus.synthesis.bases.Base.timed` when wanted) or the exception for each request, in order;
        one bad request (voice, text, speed) fails alone. ``merge``: see
        :func:`~chorus.synthesis.forward.routed`; ``vocode=False`` leaves ``audio`` empty where the base
        makes it apart from the forward (for timing the acoustic model alone)."""
        started = time.perf_counter()
        results: list[SentenceResult | Exception | None] = [None] * len(requests)
        typed: list[EngineVoice | None] = []
        for index, request in enumerate(requests):
            try:
                if not isinstance(request.voice, str | Speaker | Blend | AdaptedVoice):
                    raise TypeError(f"voice must be a string or a typed voice, got {type(request.voice).__name__}")
                typed.append(self._typed(request.voice))
            except Exception as error:  # noqa: BLE001 - reported to that request
                results[index] = error
                typed.append(None)
        live = [i for i, voice in enumerate(typed) if voice is not None]
        spoken: list[tuple[Base, list[int], list[SentenceResult | Exception]]] = []
        with self.using(typed[i] for i in live) as (handles, errors):
            by_base: dict[int, tuple[Base, list[int]]] = {}
            for index in live:
                voice = typed[index]
                if voice.key in errors:
                    results[index] = errors[voice.key]
                    continue
                entry = self._cache.get(voice.key) if isinstance(voice, AdaptedVoice) else None
                base = entry.base if entry is not None and entry.base is not None else self.base
                by_base.setdefault(id(base), (base, []))[1].append(index)
            for base, rows in by_base.values():
                sentences = [
                    Sentence(requests[i].text, self._row_handle(typed[i], handles), requests[i].speed) for i in rows
                ]
                spoken.append((base, rows, base.infer(sentences, merge)))
        for base, rows, part in spoken:
            for index, result in zip(rows, base.finish(part) if vocode else part):
                if isinstance(result, SentenceResult) and not result.sample_rate:
                    result.audio, result.sample_rate = np.zeros(0, np.float32), self.sample_rate
                results[index] = result
        return stamp(results, started)

    def timed(self, result: SentenceResult) -> SentenceResult:
        """``result`` (of :meth:`synthesize`) with its words' and phonemes' times."""
        return self.base.timed(result)

    @staticmethod
    def _row_handle(voice: EngineVoice, handles: dict[str, VoiceHandle]) -> VoiceHandle:
        """The voice's handle, with the speaker row the request asked of an adapted voice."""
        handle = handles[voice.key]
        if isinstance(voice, AdaptedVoice) and voice.speaker is not None:
            return dataclasses.replace(handle, speaker_id=voice.speaker)
        return handle

    # -- internals (callers hold the lock) -----------------------------------------------------
    def _find(self, voice: AdaptedVoice) -> Path:
        voice_id = voice.key
        folder = self._folders.get(voice_id)
        if folder is None:
            if self.resolve is None:
                raise UnknownVoice(voice_id, f"not a speaker ({', '.join(self.speakers)}) and not added")
            try:
                folder = self.resolve(voice)
            except (KeyError, FileNotFoundError) as error:
                raise UnknownVoice(voice_id, str(error)) from error
            if folder is None:
                raise UnknownVoice(voice_id, "the resolver does not know it")
            folder = Path(folder)
        if not folder.exists():
            raise UnknownVoice(voice_id, f"its folder {folder} does not exist")
        return folder

    def _lookup(self, voice: AdaptedVoice, read: tuple[Path, Voice, float] | Exception | None) -> CachedVoice:
        voice_id = voice.key
        entry = self._cache.get(voice_id)
        if entry is not None:
            self._stats.hits += 1
            self._cache.move_to_end(voice_id)
            entry.last_used = time.time()
            return entry
        self._stats.misses += 1
        try:
            if isinstance(read, Exception):
                raise read
            if read is None:  # evicted between the unlocked read and now
                started = time.perf_counter()
                folder = self._find(voice)
                read = (folder, read_voice(folder), started)
            return self._apply(voice_id, *read)
        except UnknownVoice:
            raise
        except Exception:
            self._stats.load_failures += 1
            raise

    def _apply(self, voice_id: str, folder: Path, voice: Voice, started: float) -> CachedVoice:
        # Voice ids may hold characters module names cannot; a full fine-tune alone adds no adapter.
        adapter = None
        if voice.configs:  # a name no adapter on the model has: two engines may share one model
            taken = set(adapter_names(self.model))
            while f"voice{self._next_adapter}" in taken:
                self._next_adapter += 1
            adapter = f"voice{self._next_adapter}"
        self._next_adapter += 1
        # A full fine-tune overwrites the weights of the model it is applied to: a bare copy, its own base.
        model = self._bare_model() if voice.full else self.model
        apply_voice(model, voice, adapter, self.base.sha256, self.base.name, label=voice_id)
        entry = CachedVoice(
            voice_id,
            adapter,
            folder,
            model_bytes(model) if voice.full else adapter_bytes(model, adapter),
            voice.methods,
            is_mergeable(model, adapter),
            pinned=voice_id in self._pins,
            base=self.base.with_model(model) if voice.full else None,
            length_scale=voice.card.length_scale if voice.card else 1.0,
            noise_scale=voice.card.noise_scale if voice.card else None,
        )
        self._cache[voice_id] = entry
        self._stats.loads += 1
        self._stats.load_seconds += time.perf_counter() - started
        return entry

    def _unload(self, voice_id: str) -> None:
        entry = self._cache.pop(voice_id)
        # A voice with a model of its own goes with that model; an adapter leaves the resident one.
        if entry.base is None and entry.adapter in adapter_names(self.model):
            remove_adapter(self.model, entry.adapter)

    def _evict(self) -> None:
        """Remove least recently used voices (not pinned, not in use) until the cache fits its budget."""
        total = sum(entry.nbytes for entry in self._cache.values())
        for voice_id in list(self._cache):
            if total <= self.cache_bytes:
                break
            entry = self._cache[voice_id]
            if entry.pinned or entry.in_use:
                continue
            self._unload(voice_id)
            total -= entry.nbytes
            self._stats.evictions += 1
