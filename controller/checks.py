"""The checks every section of a fabric description shares, so each ConfigError reads alike.

Each names the value's path in the description (`switches.s1.device_id`,
`trimming.size`) and shows the value it refused, cut short if long or odd.
"""

from __future__ import annotations

import re

from controller.p4info import ConfigError

MAX_BYTES = (1 << 32) - 1
"""Byte counts are bit<32> parameters of forgive.p4's actions (4 GiB)."""


def show(value) -> str:
    """A value for a one-line message, however long or odd."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}...({len(text)} chars)"


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_:-]{1,40}")
"""A key that reads as one path component: no dot, no space, nothing that breaks a line."""


def key_path(where: str, key) -> str:
    """The path of a key a user chose, for a one-line message: `where.key`, or
    `where[...]` when the key would break the line or read as more path."""
    text = str(key)
    return f"{where}.{text}" if _PLAIN_KEY.fullmatch(text) else f"{where}[{show(key)}]"


def check_object(value, where: str, allowed: set[str] | tuple[str, ...] | None = None) -> dict:
    """An object (a JSON object, a TOML table) whose keys are all in `allowed`, if given."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be an object, got {show(value)}")
    unknown = set(value) - set(allowed) if allowed is not None else set()
    if unknown:
        raise ConfigError(f"unknown {where} keys {show(sorted(unknown))}")
    return value


def check_int(value, where: str, minimum: int, maximum: int) -> int:
    """An integer in minimum..maximum (a float with an integer value counts, not a bool)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError(f"{where} must be an integer in {minimum}..{maximum}, got {show(value)}")
    return value
