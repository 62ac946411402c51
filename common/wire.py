"""The FORGIVE transport header (FTH) and the Ethernet/IPv4/UDP framing it rides in.

The layout is fixed by docs/protocol.md ("Packets"). This is the one place its
numbers are written down: the host agent, the switch model and the PTF suite
import them, and p4src/include/constants.p4 and headers.p4 state the same
numbers for the P4 program (tests/test_p4_constants.py holds the two to each
other). Decoding validates every field that a receive loop relies on, so a
malformed packet turns into one typed error that the loop counts, never into a
half-applied state change.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Final

ETH_LEN: Final = 14
IPV4_LEN: Final = 20
"""Without options, the only IPv4 header FORGIVE sends or a switch forwards intact."""
UDP_LEN: Final = 8
FTH_LEN: Final = 16
HEADERS_LEN: Final = ETH_LEN + IPV4_LEN + UDP_LEN
"""Bytes in front of the FTH on every FORGIVE frame (42)."""
TRIMMED_FRAME_LEN: Final = HEADERS_LEN + FTH_LEN
"""A trimmed packet on the wire: Ethernet, IPv4, UDP and FTH (58 bytes)."""
TRIMMED_IPV4_TOTAL_LEN: Final = TRIMMED_FRAME_LEN - ETH_LEN
TRIMMED_UDP_LEN: Final = UDP_LEN + FTH_LEN

ETHERTYPE_IPV4: Final = 0x0800
ETHERTYPE_ARP: Final = 0x0806
IPPROTO_UDP: Final = 17
IPV4_IHL_NO_OPTIONS: Final = 5
IPV4_DONT_FRAGMENT: Final = 0x4000
IPV4_MORE_FRAGMENTS: Final = 0x2000
IPV4_FRAGMENT_OFFSET: Final = 0x1FFF
"""The flags and fragment offset word of IPv4: its flag bits and the offset's mask."""
FORGIVE_UDP_PORT: Final = 17991
FTH_VERSION: Final = 1
PACKET_BYTES: Final = 4096
"""Largest DATA payload, and so the largest range one trim can report."""
DATA_FRAME_LEN: Final = TRIMMED_FRAME_LEN + PACKET_BYTES
"""A full DATA packet on the wire (4154 bytes): the frame queues, rates and shapers are
sized in."""

# IPv4 ECN codepoints (RFC 3168), the low two bits of the TOS byte.
ECN_NOT_ECT: Final = 0
ECN_ECT0: Final = 2
ECN_CE: Final = 3
ECN_MASK: Final = 0x03

# Where each field starts, in bytes from the start of the Ethernet frame. Fields narrower
# than a byte share one: version/IHL, DSCP/ECN (the TOS byte), FTH version/opcode.
ETH_DST_AT: Final = 0
ETH_SRC_AT: Final = 6
ETH_TYPE_AT: Final = 12
IPV4_AT: Final = ETH_LEN
IPV4_VERSION_IHL_AT: Final = IPV4_AT
IPV4_TOS_AT: Final = IPV4_AT + 1
IPV4_TOTAL_LEN_AT: Final = IPV4_AT + 2
IPV4_IDENTIFICATION_AT: Final = IPV4_AT + 4
IPV4_FLAGS_FRAG_AT: Final = IPV4_AT + 6
IPV4_TTL_AT: Final = IPV4_AT + 8
IPV4_PROTOCOL_AT: Final = IPV4_AT + 9
IPV4_CHECKSUM_AT: Final = IPV4_AT + 10
IPV4_SRC_AT: Final = IPV4_AT + 12
IPV4_DST_AT: Final = IPV4_AT + 16
UDP_AT: Final = IPV4_AT + IPV4_LEN
UDP_SRC_PORT_AT: Final = UDP_AT
UDP_DST_PORT_AT: Final = UDP_AT + 2
UDP_LENGTH_AT: Final = UDP_AT + 4
UDP_CHECKSUM_AT: Final = UDP_AT + 6
FTH_AT: Final = UDP_AT + UDP_LEN
FTH_VERSION_OPCODE_AT: Final = FTH_AT
FTH_FLAGS_AT: Final = FTH_AT + 1
FTH_LENGTH_AT: Final = FTH_AT + 2
FTH_FLOW_ID_AT: Final = FTH_AT + 4
FTH_SEQ_AT: Final = FTH_AT + 8
FTH_AUX_AT: Final = FTH_AT + 12

FTH_STRUCT: Final = struct.Struct("!BBHIII")


class Opcode(IntEnum):
    DATA = 0
    ACK = 1
    NACK = 2
    CNP = 3


class Flag(IntFlag):
    TRIMMED = 0x01
    ECE = 0x02
    ELIGIBLE = 0x04
    EXHAUSTED = 0x08
    RETX = 0x10
    LAST = 0x20


MAX_DSCP: Final = 0x3F
"""DSCP is the top six bits of the TOS byte."""


class Dscp(IntEnum):
    """Traffic classes carried in the IPv4 DSCP (docs/protocol.md, "Packets")."""

    OTHER = 0
    GRADIENT = 10
    TENSOR_PARALLEL = 18
    PIPELINE_PARALLEL = 20
    CONTROL = 48


KNOWN_FLAGS: Final = int(
    Flag.TRIMMED | Flag.ECE | Flag.ELIGIBLE | Flag.EXHAUSTED | Flag.RETX | Flag.LAST
)
# Plain ints for the per-packet checks: enum arithmetic costs more than the check.
_DATA_ONLY_FLAGS: Final = int(Flag.TRIMMED | Flag.RETX | Flag.LAST)
_TRIMMED: Final = int(Flag.TRIMMED)
_DATA, _NACK, _CNP = int(Opcode.DATA), int(Opcode.NACK), int(Opcode.CNP)


class MalformedPacket(ValueError):
    """A packet that is too short, of another version or opcode, or whose lengths disagree.

    `reason` names the check that failed in a word the cores count packets under:
    "short", "bad_header", or "out_of_range" for a DATA range past the flow's length.
    """

    def __init__(self, message: str, reason: str = "bad_header") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Fth:
    opcode: Opcode
    flags: int
    """Flag bits: a Flag, or the plain int callers often write (0, 0x01)."""
    length: int
    flow_id: int
    seq: int
    aux: int

    def encode(self, payload: bytes = b"") -> bytes:
        return (
            FTH_STRUCT.pack(
                (FTH_VERSION << 4) | self.opcode,
                self.flags,
                self.length,
                self.flow_id,
                self.seq,
                self.aux,
            )
            + payload
        )

    @property
    def trimmed(self) -> bool:
        return bool(self.flags & Flag.TRIMMED)


def check_fields(
    version: int, opcode: int, flags: int, length: int, seq: int, aux: int, payload_len: int
) -> None:
    """Raise MalformedPacket unless the decoded fields describe a packet this version sends.

    Shared by `decode` and by the receivers' hot paths, which unpack with
    `FTH_STRUCT` directly to avoid building an `Fth` per packet.
    """
    if version != FTH_VERSION:
        raise MalformedPacket(f"FTH version {version}, expected {FTH_VERSION}")
    if opcode > _CNP:
        raise MalformedPacket(f"unknown FTH opcode {opcode}")
    if flags & ~KNOWN_FLAGS:
        raise MalformedPacket(f"unknown FTH flags 0x{flags:02x}")
    if opcode == _DATA:
        if length == 0 or length > PACKET_BYTES:
            raise MalformedPacket(f"DATA length {length} outside 1..{PACKET_BYTES}")
        if seq + length > aux:
            raise MalformedPacket(
                f"DATA range [{seq}, {seq + length}) beyond flow length {aux}", "out_of_range"
            )
        if flags & _TRIMMED:
            # A trim larger than the headers keeps some cut payload; it is ignored.
            if payload_len > length:
                raise MalformedPacket(
                    f"trimmed DATA carries {payload_len} payload bytes, more than its {length}"
                )
        elif payload_len != length:
            raise MalformedPacket(f"DATA carries {payload_len} payload bytes, header says {length}")
        return
    if flags & _DATA_ONLY_FLAGS:
        raise MalformedPacket(f"flags 0x{flags:02x} are for DATA only")
    if payload_len:
        raise MalformedPacket(f"{Opcode(opcode).name} carries {payload_len} payload bytes")
    if opcode == _CNP:
        if length or seq or aux:
            raise MalformedPacket("CNP with non-zero length, seq or aux")
    elif opcode == _NACK and length == 0:
        raise MalformedPacket("NACK of an empty range")


Fields = tuple[int, int, int, int, int, int]
"""(opcode, flags, length, flow_id, seq, aux): the FTH as plain ints, for per-packet paths."""


def unpack_fth(buf: bytes | bytearray | memoryview) -> Fields:
    """(version and opcode byte, flags, length, flow_id, seq, aux) of the FTH at the start of
    `buf`, unchecked: `FTH_STRUCT.unpack_from` typed, so that compiled callers work on machine
    integers, not on the objects of an untyped tuple."""
    return FTH_STRUCT.unpack_from(buf)  # type: ignore[no-any-return]


def peek(buf: bytes | bytearray | memoryview) -> Fields:
    """The FTH fields of a buffer that starts at the FTH, without checking them.

    For code above the cores that must route or account a packet the cores
    validate themselves; MalformedPacket only when there is no FTH at all.
    """
    if len(buf) < FTH_LEN:
        raise MalformedPacket(f"{len(buf)} bytes, shorter than the {FTH_LEN}-byte FTH")
    vo, flags, length, flow_id, seq, aux = unpack_fth(buf)
    return vo & 0x0F, flags, length, flow_id, seq, aux


def decode(buf: bytes | bytearray | memoryview) -> tuple[Fth, memoryview]:
    """Split a buffer that starts at the FTH into the header and its payload."""
    if len(buf) < FTH_LEN:
        raise MalformedPacket(f"{len(buf)} bytes, shorter than the {FTH_LEN}-byte FTH", "short")
    vo, flags, length, flow_id, seq, aux = unpack_fth(buf)
    check_fields(vo >> 4, vo & 0x0F, flags, length, seq, aux, len(buf) - FTH_LEN)
    header = Fth(Opcode(vo & 0x0F), Flag(flags), length, flow_id, seq, aux)
    # What a trim kept past the FTH is no payload: the receiver ignores it.
    return header, memoryview(buf)[FTH_LEN : FTH_LEN if flags & _TRIMMED else len(buf)]
