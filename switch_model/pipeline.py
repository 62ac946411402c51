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
ETHERTYPE_IPV4 = 0x0800
PROTO_UDP = 17
ECN_CE = 3
PMAX_ONE = 1 << 16

FTH_OFFSET = ETH_LEN + IPV4_LEN + UDP_LEN
_L3 = struct.Struct("!12xHBBH4xBBH4s4s")
_UDP = struct.Struct("!HHH")
_IP_WORDS = struct.Struct("!10H")
_HASH_FIELDS = struct.Struct("!4s4sBHH")
_U16 = struct.Struct("!H")


def ipv4_checksum(frame: bytearray) -> None:
    """Recompute the IPv4 header checksum in place, as the P4 deparser does."""
    frame[24:26] = b"\0\0"
    total = sum(_IP_WORDS.unpack_from(frame, ETH_LEN))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    _U16.pack_into(frame, 24, ~total & 0xFFFF)


def ecmp_member(src: bytes, dst: bytes, proto: int, sport: int, dport: int, members: int) -> int:
    """hash(crc16, base 0, max members) over the P4 program's five fields, as BMv2 computes it."""
    value = crc16(_HASH_FIELDS.pack(src, dst, proto, sport, dport))
    return value % (members or 1)


class Pipeline:
    """Ingress and queue admission of the FORGIVE switch for one set of ports."""

    def __init__(self, ports: dict[int, EgressPort], counters, seed: int | None = None):
        self.ports = ports
        self.counters = counters
        self.forwarding = Forwarding()
        self.dropped: Counter[str] = Counter()
        """Frames refused before any egress port was known, by reason (no P4 counter has them)."""
        self._random = random.Random(seed).random

    def process(self, frame: bytearray) -> EgressPort | None:
        """Admit `frame` to an egress queue (returning that port) or drop it (returning None)."""
        size = len(frame)
        drop = self.dropped
        if size < ETH_LEN + IPV4_LEN:
            drop["short frame"] += 1
            return None
        ethertype, vihl, tos, total_len, ttl, proto, _, src, dst = _L3.unpack_from(frame)
        if ethertype != ETHERTYPE_IPV4:
            drop["not IPv4"] += 1
            return None
        if vihl != 0x45 or total_len < IPV4_LEN or total_len > size - ETH_LEN:
            drop["bad IPv4 header"] += 1
            return None
        sport = dport = 0
        opcode = -1
        flags = 0
        if proto == PROTO_UDP:
            if total_len < IPV4_LEN + UDP_LEN:
                drop["truncated UDP"] += 1
                return None
            sport, dport, udp_len = _UDP.unpack_from(frame, ETH_LEN + IPV4_LEN)
            if udp_len != total_len - IPV4_LEN:
                drop["bad UDP length"] += 1
                return None
            if dport == FORGIVE_UDP_PORT:
                if udp_len < UDP_LEN + FTH_LEN:
                    drop["truncated FTH"] += 1
                    return None
                vo = frame[FTH_OFFSET]
                opcode = vo & 0x0F
                flags = frame[FTH_OFFSET + 1]
                if vo >> 4 != FTH_VERSION or opcode > Opcode.CNP:
                    drop["bad FTH"] += 1
                    return None
        fwd = self.forwarding
        dst_int = int.from_bytes(dst, "big")
        route = fwd.route(dst_int)
        if route[0] == 2:
            member = ecmp_member(src, dst, proto, sport, dport, route[2])
            route = fwd.ecmp.get((route[1], member), fwd.ecmp_default)
        if route[0] != 1:
            drop["no route"] += 1
            return None
        if ttl <= 1:
            drop["TTL expired"] += 1
            return None
        port = self.ports.get(route[2])
        if port is None:
            drop["no such port"] += 1
            return None
        eport = route[2]
        frame[6:12] = frame[0:6]
        frame[0:6] = route[1]
        frame[22] = ttl - 1
        counters = self.counters
        th = fwd.thresholds.get(eport, fwd.thresholds_default)
        high = False
        if opcode == Opcode.DATA and not flags & Flag.TRIMMED:
            if th is not None:
                occ = port.low_bytes
                if occ + size > th[0]:
                    del frame[TRIMMED_FRAME_LEN:]
                    frame[FTH_OFFSET + 1] = flags | Flag.TRIMMED
                    _U16.pack_into(frame, 16, TRIMMED_FRAME_LEN - ETH_LEN)
                    _U16.pack_into(frame, ETH_LEN + IPV4_LEN + 4, UDP_LEN + FTH_LEN)
                    counters.trims[eport] += 1
                    high = True
                elif tos & 3 and tos & 3 != ECN_CE and occ >= th[1]:
                    kmin, kmax, pmax = th[1], th[2], th[3]
                    if occ >= kmax or self._random() * PMAX_ONE * (kmax - kmin) < pmax * (
                        occ - kmin
                    ):
                        frame[15] = tos | ECN_CE
                        counters.ce_marks[eport] += 1
        elif opcode >= 0:
            high = True
        elif th is not None and port.low_bytes + size > th[0]:
            counters.drops[eport] += 1
            return None
        ipv4_checksum(frame)
        if not port.enqueue(frame, high):
            counters.drops[eport] += 1
            return None
        return port
