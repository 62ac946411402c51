"""A scapy dissector for FTH, so captures of FORGIVE traffic read like any other protocol.

Importing this module binds the layer to UDP destination port 17991; `scapy`
and `tcpdump -w` captures then show FTH fields by name.
"""

from __future__ import annotations

from scapy.fields import BitEnumField, BitField, FlagsField, IntField, ShortField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from common.wire import FORGIVE_UDP_PORT, FTH_VERSION, Flag, Opcode

_FLAG_NAMES = [f.name for f in sorted(Flag, key=int)]


class FTH(Packet):
    name = "FORGIVE transport header"
    fields_desc = [
        BitField("version", FTH_VERSION, 4),
        BitEnumField("opcode", Opcode.DATA, 4, {o.value: o.name for o in Opcode}),
        FlagsField("flags", 0, 8, _FLAG_NAMES),
        ShortField("length", 0),
        IntField("flow_id", 0),
        IntField("seq", 0),
        IntField("aux", 0),
    ]

    def mysummary(self) -> str:
        return self.sprintf(
            "FTH %opcode% flow=%flow_id% seq=%seq% len=%length% aux=%aux% flags=%flags%"
        )


bind_layers(UDP, FTH, dport=FORGIVE_UDP_PORT)
