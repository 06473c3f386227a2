"""The serving engine: one resident base model, its speakers, and a byte-bounded cache of adapted voices.

A speaker (a row of the base model's speaker table) is always available by name. An adapted voice is a voice
folder (``chorus adapt`` output) that the engine finds through ``resolve(voice_id) -> folder`` (the
voice store provides it) or through :meth:`Engine.add_voice`, and loads on first use as a named
adapter inside the one resident model. Adapters live in a cache bounded in bytes (the adapter
tensors' bytes): least recently used voices are removed from the model (``remove_adapter``) when the
cache is over budget; pinned voices and voices in use by a running batch are never evicted. An unknown
voice raises :class:`UnknownVoice`, never a fallback to another voice.

The model is shared by every request, so whatever runs it or changes its adapters holds
:attr:`Engine.lock` (the batcher holds it for a whole batch through :meth:`Engine.using`).

Typical use::

    engine = Engine(load_base("runs/base", "griffin-lim"), resolve=lambda voice: folders[voice.key])
    engine.add_voice("ann", "voices/ann", pin=True)
    results = engine.speak([Request("Hello.", engine.voice("ann")), Request("Hi.", engine.voice("flite-rms"))])

A voice reaches the engine typed, resolved once by whoever took the request (:meth:`Engine.voice` for a
name; the server's :class:`~chorus.serving.voice_keys.StoredVoice` carries its store record): a base
:class:`~chorus.synthesis.voices.Speaker`, a :class:`~chorus.synthesis.voices.Blend`, or an
:class:`AdaptedVoice` found by its ``key``. :meth:`Engine.speak` reads a batch of requests through the
library's one synthesis path (:mod:`chorus.synthesis.forward`), holding the lock for the forward only.
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

from chorus.adapters.inject import (
    adapter_layers,
    adapter_names,
    adapter_state_dict,
    remove_adapter,
)
from chorus.adapters.voice import Voice, VoiceError, apply_voice, read_voice
from chorus.models.bundle import ModelBundle
from chorus.models.speaker_mix import is_mix
from chorus.synthesis import Synthesizer, load_base
from chorus.synthesis.forward import Sentence, SentenceResult, infer_batch, stamp, vocode_batch
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
    or the engine's ``resolve``)."""

    key: str


EngineVoice = Speaker | Blend | AdaptedVoice


@dataclass(frozen=True)
class Request:
    """One sentence to speak: ``text`` in ``voice`` (typed, or a name :meth:`Engine.voice` resolves) at
    ``speed`` (2.0 speaks twice as fast)."""

    text: str
    voice: EngineVoice | str
    speed: float = 1.0


@dataclass
class CachedVoice:
    """An adapted voice resident in the model."""

    voice_id: str
    adapter: str
    folder: Path
    nbytes: int
    methods: list[str]
    mergeable: bool
    pinned: bool = False
    in_use: int = 0  # batches holding it right now (never evicted while > 0)
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)


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

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.hits + self.misses, 1)


def adapter_bytes(model, adapter: str) -> int:
    """Bytes of adapter ``adapter``'s tensors in ``model``."""
    return sum(t.numel() * t.element_size() for t in adapter_state_dict(model, adapter).values())


def is_mergeable(model, adapter: str) -> bool:
    """Whether every layer ``adapter`` adapts can fold it into the base weights."""
    layers = [layer for _, layer in adapter_layers(model) if adapter in layer.configs]
    return bool(layers) and all(layer.mergeable for layer in layers)


class Engine:
    """A resident base model serving its speakers and cached adapted voices.

    Args:
        synthesizer: the base model and vocoder (:func:`chorus.synthesis.load_base`); the engine owns
            its model from now on (adapters are added to and removed from it).
        resolve: ``AdaptedVoice -> local voice folder`` for voices not added with :meth:`add_voice`;
            raising ``KeyError``/``FileNotFoundError`` or returning None means "no such voice".
        cache_bytes: budget for the adapter tensors of unpinned resident voices plus pinned ones;
            pinned voices and voices in use may push it over, never a reason to refuse them.
        pinned: voice ids loaded now and never evicted.
    """

    def __init__(
        self,
        synthesizer: Synthesizer,
        resolve: Callable[[AdaptedVoice], str | Path | None] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        pinned: Iterable[str] = (),
    ):
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.synthesizer = synthesizer
        self.bundle = synthesizer.bundle
        self.model = synthesizer.bundle.model
        self.vocoder = synthesizer.vocoder
        self.resolve = resolve
        self.cache_bytes = cache_bytes
        self.lock = threading.RLock()
        self._cache: OrderedDict[str, CachedVoice] = OrderedDict()  # LRU order: least recent first
        self._folders: dict[str, Path] = {}  # voices added by add_voice
        self._pins: set[str] = set()
        self._next_adapter = 0
        self._stats = EngineStats(capacity_bytes=cache_bytes)
        self._speaker_ids = {name: index for index, name in enumerate(self.bundle.speakers)}
        self._default_speaker = self.bundle.speaker_index(self.bundle.default_speaker)
        for voice_id in pinned:
            self.pin(voice_id)

    @classmethod
    def load(
        cls, base: str | Path | None = None, vocoder: str | Path | None = None, device: str = "cpu", **kwargs
    ) -> Engine:
        """An engine on :func:`~chorus.synthesis.load_base` ``(base, vocoder, device)``."""
        return cls(load_base(base, vocoder, device), **kwargs)

    # -- voices --------------------------------------------------------------------------------
    @property
    def speakers(self) -> list[str]:
        return list(self.bundle.speakers)

    @property
    def sample_rate(self) -> int:
        return self.bundle.mel_config.sample_rate

    def is_speaker(self, voice_id: str) -> bool:
        """A speaker of the base, or a valid blend of them (``"flite-rms(2)+festival-kal(1)"``)."""
        if voice_id in self._speaker_ids:
            return True
        if not is_mix(voice_id):
            return False
        try:
            self.bundle.speaker_mix(voice_id)
        except (KeyError, ValueError):
            return False
        return True

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
        """A private copy of the base, without any adapter, for one adaptation (``adapt`` adds its adapter
        to the model it gets; the resident model must not see that)."""
        with self.lock:  # never copy mid-batch (a merged adapter would be copied in)
            model = copy.deepcopy(self.model)
        for name in adapter_names(model):
            remove_adapter(model, name)
        return dataclasses.replace(self.bundle, model=model)

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
    def voice(self, name: str) -> EngineVoice:
        """``name`` as a typed voice: a speaker of the base, a blend of them (``ValueError``/``KeyError`` for
        a bad one), else an adapted voice by that key (found when it is used)."""
        if name in self._speaker_ids:
            return Speaker(name, self._speaker_ids[name])
        if is_mix(name):
            return Blend(name, self.bundle.speaker_mix(name))
        return AdaptedVoice(name)

    def _typed(self, voice: EngineVoice | str) -> EngineVoice:
        return self.voice(voice) if isinstance(voice, str) else voice

    def handle(self, voice: EngineVoice | str) -> VoiceHandle:
        """The handle of a speaker, a blend or a *resident* adapted voice (no loading, no counting)."""
        voice = self._typed(voice)
        if isinstance(voice, Speaker | Blend):
            return VoiceHandle.of(voice, self._default_speaker)
        with self.lock:
            entry = self._cache.get(voice.key)
            if entry is None:
                raise UnknownVoice(voice.key, "not resident")
            return VoiceHandle(voice.key, entry.adapter, self._default_speaker, entry.mergeable)

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
                handles[key] = VoiceHandle(key, entry.adapter, self._default_speaker, entry.mergeable)
            try:
                self._evict()
                yield handles, errors
            finally:
                for entry in held:
                    entry.in_use -= 1
                self._evict()

    def speak(
        self, requests: Sequence[Request], merge: bool | str = "auto", vocode: bool = True
    ) -> list[SentenceResult | Exception]:
        """Speak ``requests`` through the library's one synthesis path (:mod:`chorus.synthesis.forward`):
        one forward under :attr:`lock`, then the vocoder outside it (it does not touch the acoustic model).
        Returns a result (``speaker`` is the voice's key; ``seconds`` the time this took) or the exception
        for each request, in order; one bad request (voice, text, speed) fails alone. ``merge``: see
        :func:`~chorus.synthesis.forward.infer_batch`; ``vocode=False`` leaves ``audio`` empty (for timing
        the acoustic model alone)."""
        started = time.perf_counter()
        results: list[SentenceResult | Exception | None] = [None] * len(requests)
        keys: list[str | None] = []
        for index, request in enumerate(requests):
            try:
                if not isinstance(request.voice, str | Speaker | Blend | AdaptedVoice):
                    raise TypeError(f"voice must be a string or a typed voice, got {type(request.voice).__name__}")
                keys.append(self._typed(request.voice).key)
            except Exception as error:  # noqa: BLE001 - reported to that request
                results[index] = error
                keys.append(None)
        live = [i for i, key in enumerate(keys) if key is not None]
        with self.using(requests[i].voice for i in live) as (handles, errors):
            rows = []
            for index in live:
                if keys[index] in errors:
                    results[index] = errors[keys[index]]
                else:
                    rows.append(index)
            sentences = [Sentence(requests[i].text, handles[keys[i]], requests[i].speed) for i in rows]
            spoken = infer_batch(self.model, self.bundle.front_end, sentences, merge)
        if vocode:
            spoken = vocode_batch(self.vocoder, self.synthesizer.postfilter, self.sample_rate, spoken)
        for index, result in zip(rows, spoken):
            if isinstance(result, SentenceResult) and not vocode:
                result.audio, result.sample_rate = np.zeros(0, np.float32), self.sample_rate
            results[index] = result
        return stamp(results, started)

    # -- internals (callers hold the lock) -----------------------------------------------------
    def _find(self, voice: AdaptedVoice) -> Path:
        voice_id = voice.key
        folder = self._folders.get(voice_id)
        if folder is None:
            if self.resolve is None:
                raise UnknownVoice(voice_id, f"not a speaker ({', '.join(self.bundle.speakers)}) and not added")
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
        if voice.full:
            raise VoiceError(
                f"voice {voice_id!r} is a fully fine-tuned model, not an adapter; the engine "
                "serves adapters on one shared base (serve it as a model of its own)"
            )
        adapter = f"voice{self._next_adapter}"  # voice ids may hold characters module names cannot
        self._next_adapter += 1
        apply_voice(self.model, voice, adapter, self.bundle.weights_sha256)
        entry = CachedVoice(
            voice_id,
            adapter,
            folder,
            adapter_bytes(self.model, adapter),
            voice.methods,
            is_mergeable(self.model, adapter),
            pinned=voice_id in self._pins,
        )
        self._cache[voice_id] = entry
        self._stats.loads += 1
        self._stats.load_seconds += time.perf_counter() - started
        return entry

    def _unload(self, voice_id: str) -> None:
        entry = self._cache.pop(voice_id)
        if entry.adapter in adapter_names(self.model):
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
