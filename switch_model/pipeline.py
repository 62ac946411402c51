"""forgive.p4 in Python, block by block, so that the two read side by side.

`Pipeline` has a method per block of the P4 program: `parse` (ForgiveParser, with
ForgiveVerifyChecksum's verdict), `ingress` (ForgiveIngress's apply block, in its order),
the actions `drop`, `set_nhop`, `choose_ecmp_member`, `drop_at_port`,
`admit_high`, `trim`, `set_trim_dscp`, `drop_trimmed`, `mark_ce` and `admit_low`, and
`egress` (ForgiveEgress). The tables are applied through the `Forwarding` snapshot
(`switch_model.tables`), whose routes are tagged by the action they run. What
sits between ingress and egress on a target, the traffic manager, is the
port model (`switch_model.port`); ForgiveComputeChecksum runs as a frame is handed
to it, since egress rewrites no header. Header offsets and numbers come from
`common.wire`, which p4src/include/*.p4 mirror.

The model refuses a frame for the same reasons as the program, and counts
each in `dropped` by reason; those that had an egress port are also in
`port_drops` there, as in the program.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from typing import Final

from common.frames import ipv4_words_checksum, set_ipv4_checksum
from common.wire import (
    ECN_CE,
    ECN_MASK,
    ECN_NOT_ECT,
    ETH_DST_AT,
    ETH_LEN,
    ETH_SRC_AT,
    ETH_TYPE_AT,
    ETHERTYPE_IPV4,
    FORGIVE_UDP_PORT,
    FTH_AT,
    FTH_FLAGS_AT,
    FTH_LEN,
    FTH_VERSION,
    FTH_VERSION_OPCODE_AT,
    IPPROTO_UDP,
    IPV4_AT,
    IPV4_DST_AT,
    IPV4_IHL_NO_OPTIONS,
    IPV4_LEN,
    IPV4_SRC_AT,
    IPV4_TOS_AT,
    IPV4_TOTAL_LEN_AT,
    IPV4_TTL_AT,
    UDP_AT,
    UDP_LEN,
    UDP_LENGTH_AT,
    Flag,
    Opcode,
)
from switch_model.counters import CounterArrays
from switch_model.crc16 import crc16
from switch_model.port import PRIO_HIGH, PRIO_LOW, EgressPort
from switch_model.surface import DEFAULT_TRIMMING, PMAX_ONE, Thresholds
from switch_model.tables import EcmpGroup, Forwarding, NextHop

_ETHERTYPE_IPV4: Final = ETHERTYPE_IPV4.to_bytes(2, "big")
_PORTS: Final = struct.Struct("!HH")
_IP_WORDS: Final = struct.Struct("!10H")
"""The IPv4 header as ten 16-bit words: what csum16 sums, and the fields parse_ipv4 reads."""
_U16: Final = struct.Struct("!H")
_HASH_TAIL: Final = struct.Struct("!BHH")
"""protocol and the two L4 ports, after srcAddr and dstAddr, as choose_ecmp_member hashes them."""
_TRIMMED_UDP: Final = struct.Struct("!HH")
_DATA: Final = int(Opcode.DATA)
_TRIMMED: Final = int(Flag.TRIMMED)


class Headers:
    """What ingress reads of a parsed packet with a valid IPv4 header: fields of hdr.ipv4,
    meta.l4_*_port, and the booleans the program's apply block starts with.

    One is made per frame at every switch (plain, not a dataclass: common.native)."""

    def __init__(
        self,
        tos: int,
        ttl: int,
        protocol: int,
        dst: int,
        l4_src_port: int,
        l4_dst_port: int,
        is_data: bool,
        is_control: bool,
        malformed: bool,
        opcode: int,
    ) -> None:
        self.tos = tos
        self.ttl = ttl
        self.protocol = protocol
        self.dst = dst
        self.l4_src_port = l4_src_port
        self.l4_dst_port = l4_dst_port
        self.is_data = is_data
        """FTH DATA not yet trimmed: may be trimmed or marked."""
        self.is_control = is_control
        """Any other FTH packet (ACK, NACK, CNP, trimmed DATA): the high queue."""
        self.malformed = malformed
        """A parser error (IPv4 options, a header cut short, FTH version) or a bad checksum."""
        self.opcode = opcode
        """hdr.fth.opcode (0 without an FTH): what control_queue is keyed on."""


class Pipeline:
    """forgive.p4 for one switch: the ports' queues, the program's counters, the tables."""

    def __init__(
        self, ports: dict[int, EgressPort], counters: CounterArrays, seed: int | None = None
    ):
        self.ports = ports
        self.counters = counters
        self.forwarding = Forwarding()
        """Replaced whole by the P4Runtime server after every write."""
        self.dropped: Counter[str] = Counter()
        """Every frame refused, by reason. Those refused before routing (no egress port) are
        in no P4 counter; the others are also in port_drops of their egress port."""
        self._draw = random.Random(seed).randrange

    def process(self, frame: bytearray, now: float) -> EgressPort | None:
        """Take in one received frame: the port whose queue it joined, or None if dropped."""
        hdr = self.parse(frame)
        if hdr is None:
            ipv4 = frame[ETH_TYPE_AT : ETH_TYPE_AT + 2] == _ETHERTYPE_IPV4
            return self.drop("short frame" if ipv4 or len(frame) < ETH_LEN else "not IPv4")
        return self.ingress(frame, hdr, now)

    # -- ForgiveParser, ForgiveVerifyChecksum -------------------------------------------------

    @staticmethod
    def parse(frame: bytearray) -> Headers | None:
        """Ethernet, IPv4, UDP, FTH; None when there is no valid IPv4 header.

        As on BMv2, a parser error does not stop the packet: the headers
        extracted so far stay valid and the error is only noted (`malformed`).
        """
        size = len(frame)
        # state start: Ethernet, then IPv4 by EtherType
        if size < IPV4_AT + IPV4_LEN or frame[ETH_TYPE_AT : ETH_TYPE_AT + 2] != _ETHERTYPE_IPV4:
            return None
        # state parse_ipv4: words 0 (version/IHL, TOS), 4 (TTL, protocol), 8-9 (dstAddr)
        words: tuple[int, ...] = _IP_WORDS.unpack_from(frame, IPV4_AT)
        version_ihl, tos = words[0] >> 8, words[0] & 0xFF
        ttl, protocol = words[4] >> 8, words[4] & 0xFF
        dst = words[8] << 16 | words[9]
        error = version_ihl & 0x0F != IPV4_IHL_NO_OPTIONS
        sport: int = 0
        dport: int = 0
        opcode: int = 0
        is_data = is_control = False
        if not error and protocol == IPPROTO_UDP:
            # state parse_udp
            if size < UDP_AT + UDP_LEN:
                error = True
            else:
                sport, dport = _PORTS.unpack_from(frame, UDP_AT)
                if dport == FORGIVE_UDP_PORT:
                    # state parse_fth
                    if size < FTH_AT + FTH_LEN:
                        error = True
                    else:
                        version_opcode = frame[FTH_VERSION_OPCODE_AT]
                        error = version_opcode >> 4 != FTH_VERSION
                        opcode = version_opcode & 0x0F
                        is_data = opcode == _DATA and not frame[FTH_FLAGS_AT] & _TRIMMED
                        is_control = not is_data
        return Headers(
            tos,
            ttl,
            protocol,
            dst,
            sport,
            dport,
            is_data,
            is_control,
            error or ipv4_words_checksum(words) != 0,  # ForgiveVerifyChecksum
            opcode,
        )

    # -- ForgiveIngress ------------------------------------------------------------------

    def ingress(self, frame: bytearray, hdr: Headers, now: float) -> EgressPort | None:
        """The apply block: route, then drop, queue high, trim, mark or admit low."""
        fwd = self.forwarding
        route = fwd.ipv4_lpm(hdr.dst)
        if route.__class__ is EcmpGroup:
            if route.num_members == 0:
                return self.drop("empty ECMP group")
            member = self.choose_ecmp_member(frame, hdr, route.num_members)
            route = fwd.ecmp_nhop(route.group_id, member)
        if route.__class__ is not NextHop:
            return self.drop("no route")
        port = route.port
        if hdr.ttl <= 1 or hdr.malformed:
            return self.drop_at_port(port, "malformed" if hdr.malformed else "TTL expired")
        egress = self.ports.get(port)
        if egress is None:
            return self.drop("no such port")
        self.set_nhop(frame, route, hdr)
        if hdr.is_control and (hdr.opcode == _DATA or not fwd.control_queue(hdr.opcode)):
            return self.admit_high(frame, egress, now)
        th = fwd.port_thresholds(port)
        if th is None:
            return self.admit_low(frame, egress, now)
        occupancy = egress.low_bytes
        size = len(frame)
        if occupancy + size > th.data_queue_bytes:
            if not hdr.is_data or self.trim_disabled(fwd, frame, hdr):
                return self.drop_at_port(port, "data queue full")
            trimming = fwd.switch_trimming() or DEFAULT_TRIMMING
            kept = size if size < trimming.size else trimming.size
            # The trimmed packet must fit its queue: the data queue's budget, or the high
            # queue's limit where one is set.
            if trimming.queue_index == PRIO_LOW:
                full = occupancy + kept > th.data_queue_bytes
            else:
                limit = fwd.trim_queue_limit(port)
                full = limit is not None and egress.high_bytes + kept > limit
            if full:
                return self.drop_trimmed(port)
            self.trim(frame, port, kept)
            dscp = fwd.trim_dscp(port)
            if dscp is not None:
                self.set_trim_dscp(frame, dscp)
            return self._enqueue(frame, size, egress, trimming.queue_index == PRIO_HIGH, now, True)
        ecn = hdr.tos & ECN_MASK
        if (
            hdr.is_data
            and ecn != ECN_NOT_ECT
            and ecn != ECN_CE
            and occupancy >= th.ecn_kmin
            and (occupancy >= th.ecn_kmax or self.red_draw(th, occupancy))
        ):
            self.mark_ce(frame, hdr, port)
        return self.admit_low(frame, egress, now)

    def drop(self, reason: str) -> None:
        """mark_to_drop, for a packet without an egress port: counted only in `dropped`."""
        self.dropped[reason] += 1

    def set_nhop(self, frame: bytearray, nhop: NextHop, hdr: Headers) -> None:
        frame[ETH_SRC_AT : ETH_SRC_AT + 6] = frame[ETH_DST_AT : ETH_DST_AT + 6]
        frame[ETH_DST_AT : ETH_DST_AT + 6] = nhop.dmac
        frame[IPV4_TTL_AT] = hdr.ttl - 1

    @staticmethod
    def choose_ecmp_member(frame: bytearray, hdr: Headers, num_members: int) -> int:
        """hash(crc16, base 0, max num_members) over srcAddr, dstAddr, protocol and the L4
        ports, as BMv2 computes it."""
        fields = frame[IPV4_SRC_AT : IPV4_DST_AT + 4] + _HASH_TAIL.pack(
            hdr.protocol, hdr.l4_src_port, hdr.l4_dst_port
        )
        return crc16(fields) % num_members

    def drop_at_port(self, port: int, reason: str) -> None:
        """Malformed, expired or over-budget: counted in port_drops of its egress port."""
        self.counters.drops[port] += 1
        self.dropped[reason] += 1

    def admit_high(self, frame: bytearray, egress: EgressPort, now: float) -> EgressPort | None:
        """Into the high queue, whose byte count is the program's high_queue_occupancy."""
        return self._enqueue(frame, len(frame), egress, True, now)

    @staticmethod
    def trim_disabled(fwd: Forwarding, frame: bytearray, hdr: Headers) -> bool:
        """trim_eligibility, then trim_acl: either may run disable_trim."""
        dscp = hdr.tos >> 2
        src = int.from_bytes(frame[IPV4_SRC_AT : IPV4_SRC_AT + 4], "big")
        disabled = fwd.trim_eligibility(dscp)
        return fwd.trim_acl(src, hdr.dst, dscp) or disabled

    def trim(self, frame: bytearray, port: int, kept: int) -> None:
        """Cut to `kept` bytes (Ethernet/IPv4/UDP/FTH and, past a 58-byte trim size, some
        payload the receiver ignores); the FTH length stays: it names the lost range. The
        UDP checksum no longer covers the payload, so it becomes 0 (none)."""
        del frame[kept:]
        frame[FTH_FLAGS_AT] |= _TRIMMED
        _U16.pack_into(frame, IPV4_TOTAL_LEN_AT, kept - ETH_LEN)
        _TRIMMED_UDP.pack_into(frame, UDP_LENGTH_AT, kept - ETH_LEN - IPV4_LEN, 0)
        counters = self.counters
        counters.trims[port] += 1
        counters.trim_tx[port] += 1

    @staticmethod
    def set_trim_dscp(frame: bytearray, dscp: int) -> None:
        frame[IPV4_TOS_AT] = dscp << 2 | frame[IPV4_TOS_AT] & ECN_MASK

    def drop_trimmed(self, port: int) -> None:
        """Trimmed, but the trim queue has no room: SAI's trimmed-but-dropped."""
        counters = self.counters
        counters.trims[port] += 1
        counters.trim_drops[port] += 1
        self.dropped["trim queue full"] += 1

    def red_draw(self, th: Thresholds, occupancy: int) -> bool:
        """Mark with probability pmax/65536 * (occ-kmin)/(kmax-kmin), as the program draws it:
        r*(kmax-kmin) < pmax*(occ-kmin), r uniform in 0..65535."""
        kmin = th.ecn_kmin
        return self._draw(PMAX_ONE) * (th.ecn_kmax - kmin) < th.ecn_pmax * (occupancy - kmin)

    def mark_ce(self, frame: bytearray, hdr: Headers, port: int) -> None:
        frame[IPV4_TOS_AT] = hdr.tos | ECN_CE
        self.counters.ce_marks[port] += 1

    def admit_low(self, frame: bytearray, egress: EgressPort, now: float) -> EgressPort | None:
        """Into the data queue, whose byte count is the program's low_queue_occupancy."""
        return self._enqueue(frame, len(frame), egress, False, now)

    def _enqueue(
        self,
        frame: bytearray,
        received: int,
        egress: EgressPort,
        high: bool,
        now: float,
        trimmed: bool = False,
    ) -> EgressPort | None:
        """ForgiveComputeChecksum, then the traffic manager: a queue whose buffer is full drops.
        A trimmed packet it refuses was trimmed but dropped, not sent."""
        set_ipv4_checksum(frame)
        if egress.enqueue(frame, received, high, now):
            return egress
        port = egress.number
        if trimmed:
            counters = self.counters
            counters.trim_tx[port] -= 1
            counters.trim_drops[port] += 1
            self.dropped["trim queue full"] += 1
            return None
        return self.drop_at_port(port, "buffer full")

    # -- ForgiveEgress -------------------------------------------------------------------

    def egress(self, port: int, received: int) -> None:
        """port_tx for a frame leaving `port`, in bytes as received (BMv2's counters do the
        same). release_low is the port model's dequeue."""
        counters = self.counters
        counters.tx_packets[port] += 1
        counters.tx_bytes[port] += received

    def not_sent(self, port: int, received: int) -> None:
        """The wire refused a frame egress had counted: it was never sent, so a drop."""
        counters = self.counters
        counters.tx_packets[port] -= 1
        counters.tx_bytes[port] -= received
        self.drop_at_port(port, "send failed")
