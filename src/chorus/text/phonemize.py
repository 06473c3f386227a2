"""espeak-ng IPA through ``phonemizer``, using the espeak-ng library shipped by ``espeakng-loader``.

No system espeak is needed: the wrapper is pointed at the packaged shared library and voice data once
per process, before the first backend is made.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading

_lock = threading.Lock()


@functools.cache
def _configure_espeak() -> None:
    import espeakng_loader
    from phonemizer.backend.espeak.wrapper import EspeakWrapper

    EspeakWrapper.set_library(espeakng_loader.get_library_path())
    EspeakWrapper.set_data_path(espeakng_loader.get_data_path())


@functools.cache
def _backend(language: str):
    _configure_espeak()
    from phonemizer.backend import EspeakBackend

    # phonemizer warns whenever espeak joins or splits words ("words count mismatch"), on most
    # single-sentence calls; nothing here depends on word counts, so its logger keeps to errors.
    quiet = logging.getLogger("chorus.text.phonemizer")
    quiet.setLevel(logging.ERROR)
    return EspeakBackend(
        language, preserve_punctuation=True, with_stress=True, language_switch="remove-flags", logger=quiet
    )


def close_backends() -> None:
    """Let go of the espeak-ng backends. phonemizer copies libespeak-ng into a temporary folder for each and
    removes it when the backend is collected; a process that ends by ``os._exit`` (a job's, as multiprocessing
    ends them) collects nothing, and a new user's probe found two such folders left in /tmp per job."""
    from phonemizer.backend.espeak.wrapper import EspeakWrapper

    with _lock:  # no phonemize call between the two: it would make a backend the cache then forgets
        _backend.cache_clear()
        # A method's lru_cache in phonemizer holds every wrapper it saw (and so its copy) until it is cleared.
        EspeakWrapper.available_voices.cache_clear()
    gc.collect()


def phonemize(texts: list[str], language: str = "en-us") -> list[str]:
    """IPA strings for already-normalized ``texts``; words separated by spaces, punctuation kept.

    >>> phonemize(["hello world."])
    ['həlˈoʊ wˈɜːld.']
    """
    if not texts:
        return []
    # The espeak library keeps global state; one caller at a time.
    with _lock:
        backend = _backend(language)
        # One text per call: phonemizer silently drops empty lines of a batch and its punctuation
        # restore then shifts the remaining results onto the wrong texts. Single calls cost the same
        # (espeak is driven line by line anyway) and make a batch identical to texts taken one by one.
        return [_phonemize_one(backend, text) for text in texts]


def _phonemize_one(backend, text: str) -> str:
    """IPA for one text; "" when phonemizer finds nothing to say (it then returns no line at all)."""
    if not text.strip():
        return ""
    result = backend.phonemize([text], strip=True, njobs=1)
    return result[0] if result else ""
