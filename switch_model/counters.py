"""The program's indirect counters, one slot per egress port as in forgive.p4.

P4Runtime reads and writes these arrays by index (`switch_model.p4runtime_server`);
the pipeline adds to them per packet. Plain lists: the packet loop is their
only writer and a read of one slot needs no lock.
"""

from __future__ import annotations

NUM_PORTS = 512
"""One slot per v1model port number (bit<9>), the size of every counter array."""


class CounterArrays:
    """port_tx (packets and bytes), port_ce_marks, port_trims and port_drops."""

    def __init__(self, size: int = NUM_PORTS):
        self.size = size
        self.tx_packets = [0] * size
        self.tx_bytes = [0] * size
        self.ce_marks = [0] * size
        self.trims = [0] * size
        self.drops = [0] * size
