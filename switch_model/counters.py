"""The program's indirect counters, one slot per egress port as in forgive.p4.

P4Runtime reads and writes these arrays by index (`switch_model.p4runtime_server`);
the pipeline adds to them per packet. Plain lists: the packet loop is their
only writer and a read of one slot needs no lock.
"""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar, Final

from switch_model.surface import PortCounters

NUM_PORTS: Final = 512
"""One slot per v1model port number (bit<9>), the size of every counter array."""


class CounterArrays:
    """port_tx (packets and bytes), port_ce_marks, port_trims, port_trim_tx, port_trim_drops
    and port_drops, each named as the PortCounters field it fills."""

    def __init__(self, size: int = NUM_PORTS):
        self.size = size
        self.tx_packets = [0] * size
        self.tx_bytes = [0] * size
        self.ce_marks = [0] * size
        self.trims = [0] * size
        self.trim_tx = [0] * size
        self.trim_drops = [0] * size
        self.drops = [0] * size

    FIELDS: ClassVar[tuple[str, ...]] = tuple(f.name for f in fields(PortCounters))
    """Every array: each is named as the PortCounters field it fills."""

    def clear(self) -> None:
        """Zero every cell (a new pipeline starts from nothing, as on BMv2)."""
        for name in self.FIELDS:
            values = getattr(self, name)
            values[:] = [0] * len(values)

    def totals(self) -> dict[str, int]:
        """Each array summed over every port."""
        return {name: sum(getattr(self, name)) for name in self.FIELDS}
