"""Giving freed heap memory back to the operating system after large, short-lived work (an onboarding
job's copy of the base, its optimizer and batches).

glibc's malloc keeps freed memory in its arenas (one per thread that allocated, up to 8x the cores) for
reuse instead of returning it; after a job the server's resident memory stays hundreds of MB above what
it uses until something else reuses those pages (bench/job_memory.py: +500 MB after the first job,
about half of it given back by ``malloc_trim``). Elsewhere (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def give_back_freed_memory() -> bool:
    """Collect reference cycles, then return the free pages of every malloc arena to the OS; True if the
    C library could (glibc)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
