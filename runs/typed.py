"""Dataclasses read back from JSON with every field checked against its type hint.

A results folder is input like any other: a runs.json edited by hand, cut short
or written by something else must be refused in one line that says where, not
trained on (a NaN figure, a seed beyond 64 bits, a policy that is a number) nor
answered with a traceback from deep inside the code that reads it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

INT_LIMIT = 2**63
"""Integers are held to a signed 64-bit range: what a seed or a counter can be anywhere else."""


class RecordError(ValueError):
    """A JSON document that does not hold the record it claims to; the message says where."""


def _check(value: Any, hint: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        return _check(value, rest[0] if len(rest) == 1 else Any, where)
    if dataclasses.is_dataclass(hint):
        return from_doc(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise RecordError(f"{where}: expected an integer, got {_show(value)}")
        if not -INT_LIMIT <= value < INT_LIMIT:
            raise RecordError(f"{where}: {_show(value)} is beyond a 64-bit integer")
        return value
    if hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise RecordError(f"{where}: expected a number, got {_show(value)}")
        if not math.isfinite(value):
            raise RecordError(f"{where}: {value} is not a finite number")
        return value  # an int stays one, so a record reads back byte for byte
    if hint is str:
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected a string, got {_show(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {_show(value)}")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {_show(value)}")
        return {k: _check(v, args[1], f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"no check for the type {hint!r}")  # a field type this module lacks


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} ({len(text)} characters)"


def from_doc(cls: type, doc: Any, where: str, ignore: frozenset[str] = frozenset()) -> Any:
    """`cls(**doc)` with every field checked, required ones present and no unknown key.

    `ignore` names keys the writer adds beside the fields (derived figures) and the
    reader recomputes."""
    if not isinstance(doc, dict):
        raise RecordError(f"{where}: expected an object, got {_show(doc)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(doc) - set(fields) - ignore)
    if unknown:
        raise RecordError(f"{where}: unknown field {unknown[0]!r}")
    missing = [
        name
        for name, f in fields.items()
        if name not in doc
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RecordError(f"{where}: missing field {missing[0]!r}")
    values = {k: _check(v, hints[k], f"{where}.{k}") for k, v in doc.items() if k in fields}
    return cls(**values)
