"""The per-packet decisions of forgive.p4: parse, route, choose a queue, trim or mark.

`Pipeline.process` takes one received frame and either drops it (counting why)
or rewrites it in place and hands it to the egress port's high or low queue.
It mirrors the P4 program step by step so the two targets agree packet by
packet; the sockets and the pacing live in `ports`.
"""

from __future__ import annotations

import random
import struct
from collections import Counter

from host_agent.wire import FORGIVE_UDP_PORT, FTH_LEN, FTH_VERSION, TRIMMED_FRAME_LEN, Flag, Opcode
from switch_model.crc16 import crc16
from switch_model.queues import EgressPort
from switch_model.tables import Forwarding

ETH_LEN = 14
IPV4_LEN = 20
UDP_LEN = 8
PROTO_UDP = 17
ECN_CE = 3
PMAX_ONE = 1 << 16

FTH_OFFSET = ETH_LEN + IPV4_LEN + UDP_LEN
_L3 = struct.Struct("!12xHBBH4xBBH4s4s")
_UDP = struct.Struct("!HHH")
_IP_WORDS = struct.Struct("!10H")
_HASH_FIELDS = struct.Struct("!4s4sBHH")
_U16 = struct.Struct("!H")
_TRIMMED_UDP = struct.Struct("!HH")


def ipv4_checksum(frame: bytearray) -> None:
    """Recompute the IPv4 header checksum in place, as the P4 deparser does."""
    frame[24:26] = b"\0\0"
    total = sum(_IP_WORDS.unpack_from(frame, ETH_LEN))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    _U16.pack_into(frame, 24, ~total & 0xFFFF)


def ipv4_checksum_ok(frame: bytearray) -> bool:
    """verify_checksum(csum16) over the 20-byte header as received."""
    total = sum(_IP_WORDS.unpack_from(frame, ETH_LEN))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def ecmp_member(src: bytes, dst: bytes, proto: int, sport: int, dport: int, members: int) -> int:
    """hash(crc16, base 0, max members) over the P4 program's five fields, as BMv2 computes it."""
    return crc16(_HASH_FIELDS.pack(src, dst, proto, sport, dport)) % members


class Pipeline:
    """Ingress and queue admission of the FORGIVE switch for one set of ports."""

    def __init__(self, ports: dict[int, EgressPort], counters, seed: int | None = None):
        self.ports = ports
        self.counters = counters
        self.forwarding = Forwarding()
        self.dropped: Counter[str] = Counter()
        """Every frame refused, by reason. Those refused before routing (no egress port) are
        in no P4 counter; the others are also in port_drops of their egress port."""
        self._draw = random.Random(seed).randrange

    def process(self, frame: bytearray) -> EgressPort | None:
        """Admit `frame` to an egress queue (returning that port) or drop it (returning None).

        The steps and their order are forgive.p4's: parse (a parser error does
        not stop the packet), verify the IPv4 checksum, route, then drop a
        routed packet that is malformed or expiring and count it at its egress
        port, then queue, trim or mark.
        """
        size = len(frame)
        drop = self.dropped
        if size < ETH_LEN + IPV4_LEN or frame[12:14] != b"\x08\x00":
            ipv4 = frame[12:14] == b"\x08\x00"
            drop["short frame" if ipv4 or size < ETH_LEN else "not IPv4"] += 1
            return None
        _, vihl, tos, _, ttl, proto, _, src, dst = _L3.unpack_from(frame)
        parser_error = vihl & 0x0F != 5
        sport = dport = 0
        opcode = -1
        flags = 0
        if not parser_error and proto == PROTO_UDP:
            if size < FTH_OFFSET:
                parser_error = True
            else:
                sport, dport, _ = _UDP.unpack_from(frame, ETH_LEN + IPV4_LEN)
                if dport == FORGIVE_UDP_PORT:
                    if size < FTH_OFFSET + FTH_LEN:
                        parser_error = True
                    else:
                        vo = frame[FTH_OFFSET]
                        opcode = vo & 0x0F
                        flags = frame[FTH_OFFSET + 1]
                        parser_error = vo >> 4 != FTH_VERSION
        malformed = parser_error or not ipv4_checksum_ok(frame)
        fwd = self.forwarding
        route = fwd.route(int.from_bytes(dst, "big"))
        if route[0] == 2:
            if route[2] == 0:
                drop["empty ECMP group"] += 1
                return None
            member = ecmp_member(src, dst, proto, sport, dport, route[2])
            route = fwd.ecmp.get((route[1], member), fwd.ecmp_default)
        if route[0] != 1:
            drop["no route"] += 1
            return None
        eport = route[2]
        counters = self.counters
        if ttl <= 1 or malformed:
            counters.drops[eport] += 1
            drop["TTL expired" if ttl <= 1 and not malformed else "malformed"] += 1
            return None
        port = self.ports.get(eport)
        if port is None:
            drop["no such port"] += 1
            return None
        frame[6:12] = frame[0:6]
        frame[0:6] = route[1]
        frame[22] = ttl - 1
        high = opcode >= 0 and (opcode != Opcode.DATA or flags & Flag.TRIMMED)
        if not high:
            th = fwd.thresholds.get(eport, fwd.thresholds_default)
            if th is not None:
                occ = port.low_bytes
                if occ + size > th[0]:
                    if opcode < 0:
                        counters.drops[eport] += 1
                        return None
                    del frame[TRIMMED_FRAME_LEN:]
                    frame[FTH_OFFSET + 1] = flags | Flag.TRIMMED
                    _U16.pack_into(frame, 16, TRIMMED_FRAME_LEN - ETH_LEN)
                    _TRIMMED_UDP.pack_into(frame, ETH_LEN + IPV4_LEN + 4, UDP_LEN + FTH_LEN, 0)
                    counters.trims[eport] += 1
                    high = True
                elif opcode == Opcode.DATA and tos & 3 and tos & 3 != ECN_CE and occ >= th[1]:
                    kmin, kmax = th[1], th[2]
                    if occ >= kmax or self._draw(PMAX_ONE) * (kmax - kmin) < th[3] * (occ - kmin):
                        frame[15] = tos | ECN_CE
                        counters.ce_marks[eport] += 1
        ipv4_checksum(frame)
        if not port.enqueue(frame, size, high):
            counters.drops[eport] += 1
            drop["queue full"] += 1
            return None
        return port
