"""JSON request bodies parsed within bounds a client cannot push past.

Python's parser recurses once per nesting level (a body nested 20,000 deep raises RecursionError) and
turns digit strings into ints whole (one of over 4,300 digits raises ValueError): both would surface as
a server error. The body's shape is checked on the raw text first, strings left out, so a bad body is a
plain 400 before ``json.loads`` ever sees it.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 32  # every Chorus body is an object of scalars, or one level more
MAX_NUMBER_CHARS = 64  # a float64 needs at most ~25 characters

# A string, or an unterminated one to the end of the body: every match succeeds where it starts, so the scan is
# linear. (Requiring the closing quote made a body of '"' and 32,700 '\\"' cost 28 s: each escaped quote began
# a new attempt that read to the end, on the event loop, stalling every client.) json.loads refuses the rest.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")
_LONG_NUMBER = re.compile(rb"[-+0-9.eE]{%d,}" % (MAX_NUMBER_CHARS + 1))


class BodyError(ValueError):
    """A body that is not JSON within the bounds; the message says which bound."""


def loads_bounded(body: bytes, max_depth: int = MAX_DEPTH, unique_keys: bool = False) -> object:
    """``json.loads(body)`` for a body nested at most ``max_depth`` deep with numbers of at most
    ``MAX_NUMBER_CHARS`` characters; :class:`BodyError` otherwise, or when it is not JSON, or (``unique_keys``)
    when an object names a key twice."""
    outside_strings = _STRING.sub(b'""', body)
    depth = deepest = 0
    for bracket in _BRACKET.finditer(outside_strings):
        depth += 1 if bracket.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
        if deepest > max_depth:
            raise BodyError(f"the request body is nested over {max_depth} levels deep")
    if _LONG_NUMBER.search(outside_strings):
        raise BodyError(f"the request body has a number over {MAX_NUMBER_CHARS} characters long")
    try:
        data = json.loads(body, object_pairs_hook=_unique if unique_keys else None)
    except _Twice as twice:
        raise BodyError(f"the request body names {twice.args[0]!r} twice") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        raise BodyError("the request body is not valid JSON") from None
    try:  # JSON may escape half of a surrogate pair ("\\ud800"): no character, and no text can hold it
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BodyError("the request body holds a string that is not valid Unicode (a lone surrogate escape)") from None
    return data


class _Twice(Exception):
    """A key an object of the JSON names twice."""


def _unique(pairs: list[tuple[str, object]]) -> dict:
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise _Twice(key)
        found[key] = value
    return found
