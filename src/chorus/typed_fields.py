"""Checking a dataclass's values against its annotations, for dataclasses filled from files a user did not write.

A voice folder from elsewhere carries JSON that becomes method configs and a voice card: a string rank, a NaN
scale or a list where a name belongs must be refused where it is read, in the file's words, not crash far
away in a forward or a server route. The annotations used are the simple ones of Chorus's configs and cards:
``int``, ``float``, ``bool``, ``str``, ``dict``, ``list[X]``, ``X | None`` and unions of them.
"""

from __future__ import annotations

import functools
import math
import numbers
import types
import typing
from dataclasses import fields


def _fits(value: object, hint: object) -> bool:
    """Whether ``value`` is of type ``hint`` (bools are not ints; a float is finite; an int is a float)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:  # a tuple too: a library user writes targets=("q_proj",)
        (item,) = typing.get_args(hint)
        return isinstance(value, list | tuple) and all(_fits(element, item) for element in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    # numbers' abstract types take numpy's scalars as well (an np.int64 rank); a bool is no number here
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and _finite(value)
    if hint is str:
        return isinstance(value, str)
    return True  # an annotation this checker does not read (a class of Chorus's own) is not its to refuse


def _finite(value: numbers.Real) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range (JSON holds any: 10**400)
        return False


# Read once a class: a config is checked wherever it is made (dataclasses.replace included), and the annotations,
# strings under `from __future__ import annotations`, are evaluated by each call of get_type_hints.
_hints = functools.cache(typing.get_type_hints)


def wrong_fields(instance: object) -> list[str]:
    """``"name: value (not type)"`` for every field of the dataclass ``instance`` whose value does not fit its
    annotation; empty when all fit."""
    hints = _hints(type(instance))
    wrong = []
    for field in fields(instance):
        value = getattr(instance, field.name)
        if not _fits(value, hints[field.name]):
            wrong.append(f"{field.name}: {value!r} (not {_name(hints[field.name])})")
    return wrong


def _name(hint: object) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_name(option) for option in typing.get_args(hint))
    if hint is float:
        return "a finite number"
    return (
        "None" if hint is type(None) else str(hint).replace("typing.", "") if typing.get_origin(hint) else hint.__name__
    )
