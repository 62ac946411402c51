"""Read access by name to the state the core returns.

docs/protocol.md's contract has `step_state` and `flow_state` return a mapping
(`rx.step_state(step)["forgiven"]`); the core returns frozen dataclasses so that code can
read typed fields (`.forgiven`). `FieldMapping` gives those dataclasses the mapping's
reads too, so both forms name the same value and a caller of the contract needs no
change.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields


class FieldMapping:
    """A read-only mapping over a dataclass's fields, in their order."""

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]  # type: ignore[arg-type]

    def __getitem__(self, key: str) -> object:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key) if key in self.keys() else default

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def items(self) -> list[tuple[str, object]]:
        return [(name, getattr(self, name)) for name in self.keys()]

    def values(self) -> list[object]:
        return [getattr(self, name) for name in self.keys()]
