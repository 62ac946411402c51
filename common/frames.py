"""Ethernet, IPv4 and UDP around an FTH packet: the only place the agent sees those headers.

The protocol core works on bytes that start at the FTH (docs/protocol.md,
"The protocol core"). This module adds and strips the three outer headers, and reports
the two things the core needs from them: where a packet came from and whether
a switch marked it CE. Header templates are cached per destination and traffic
class so the per-packet work is one pack and one checksum fold.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

from common.wire import (
    ECN_CE,
    ECN_MASK,
    ETH_LEN,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    FORGIVE_UDP_PORT,
    HEADERS_LEN,
    IPPROTO_UDP,
    IPV4_CHECKSUM_AT,
    IPV4_DONT_FRAGMENT,
    IPV4_FRAGMENT_OFFSET,
    IPV4_LEN,
    IPV4_MORE_FRAGMENTS,
    UDP_LEN,
)

TTL: Final = 64
"""IPv4 flags and TTL of every frame the agent sends (the NIC program frames its replies alike)."""
_IP_WORDS: Final = struct.Struct("!10H")
"""The IPv4 header as ten 16-bit words: what csum16 sums."""
_U16: Final = struct.Struct("!H")
_CHECKSUM_OFFSET: Final = IPV4_CHECKSUM_AT - ETH_LEN
"""Where the checksum sits in the IPv4 header."""
_CHECKSUM_WORD: Final = _CHECKSUM_OFFSET // 2


class MalformedFrame(ValueError):
    """A frame for the FORGIVE port whose Ethernet, IPv4 or UDP headers do not add up."""


def mac_text(mac: int) -> str:
    """A 48-bit MAC address as 'aa:bb:cc:dd:ee:ff' (as `mac_bytes` reads it)."""
    return ":".join(f"{b:02x}" for b in mac.to_bytes(6, "big"))


def mac_bytes(text: str) -> bytes:
    """Parse 'aa:bb:cc:dd:ee:ff' into 6 bytes, with one clear error for anything else."""
    parts = text.split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ValueError(f"not a MAC address: {text!r}")
    try:
        return bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ValueError(f"not a MAC address: {text!r}") from None


_PACKED: Final[dict[str, bytes]] = {}
"""Addresses already packed (a host sends every message by its peer's address text)."""
_PACKED_MAX: Final = 4096


def ip_bytes(text: str) -> bytes:
    packed = _PACKED.get(text)
    if packed is None:
        try:
            packed = ipaddress.IPv4Address(text).packed
        except ValueError:
            raise ValueError(f"not an IPv4 address: {text!r}") from None
        if len(_PACKED) < _PACKED_MAX:
            _PACKED[text] = packed
    return packed


def ip_text(ip: bytes) -> str:
    return str(ipaddress.IPv4Address(ip))


def csum_fold(total: int) -> int:
    """A sum of 16-bit words folded to 16 bits in ones' complement (the checksum before its NOT)."""
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def ipv4_words_checksum(words: tuple[int, ...]) -> int:
    """The ones'-complement checksum of an IPv4 header's ten 16-bit words, its checksum word
    included: 0 when the header is valid (ForgiveVerifyChecksum), the checksum to write when
    that word is 0."""
    return ~csum_fold(sum(words)) & 0xFFFF


def ipv4_checksum(header: bytes | bytearray, offset: int = 0) -> int:
    """`ipv4_words_checksum` of the 20-byte IPv4 header at `offset`."""
    words: tuple[int, ...] = _IP_WORDS.unpack_from(header, offset)
    return ipv4_words_checksum(words)


def set_ipv4_checksum(frame: bytearray, offset: int = ETH_LEN) -> None:
    """Write into the IPv4 header at `offset` its checksum (ForgiveComputeChecksum, csum16):
    that of its ten words with the checksum word taken as zero."""
    words: tuple[int, ...] = _IP_WORDS.unpack_from(frame, offset)
    total = csum_fold(sum(words) - words[_CHECKSUM_WORD])
    _U16.pack_into(frame, offset + _CHECKSUM_OFFSET, ~total & 0xFFFF)


_ETH_IP: Final = struct.Struct("!6s6sH BBHHHBBH4s4s")
UDP_STRUCT: Final = struct.Struct("!HHHH")
"""The UDP header: source port, destination port, length, checksum (0)."""
_PREFIX_CACHE: Final = 4096
"""Distinct (destination, class, length) prefixes kept; bulk flows need a handful."""


class FrameBuilder:
    """Builds the 42 header bytes in front of an FTH packet for one source host.

    Ethernet and IPv4 depend only on the destination, the TOS byte and the
    length, so they are cached; the UDP header (whose source port may change
    per packet) is packed fresh. Its checksum is 0, so the port never touches
    the IPv4 checksum.
    """

    def __init__(self, src_mac: bytes, src_ip: bytes) -> None:
        self.src_mac = src_mac
        self.src_ip = src_ip
        self._prefixes: dict[tuple[bytes, bytes, int, int], bytes] = {}

    def _prefix(self, dst_mac: bytes, dst_ip: bytes, tos: int, total: int) -> bytes:
        header = _ETH_IP.pack(
            dst_mac,
            self.src_mac,
            ETHERTYPE_IPV4,
            0x45,
            tos,
            total,
            0,
            IPV4_DONT_FRAGMENT,
            TTL,
            IPPROTO_UDP,
            0,
            self.src_ip,
            dst_ip,
        )
        checksum = ipv4_checksum(header, ETH_LEN)
        prefix = (
            header[:IPV4_CHECKSUM_AT] + checksum.to_bytes(2, "big") + header[IPV4_CHECKSUM_AT + 2 :]
        )
        if len(self._prefixes) >= _PREFIX_CACHE:
            self._prefixes.clear()
        self._prefixes[(dst_mac, dst_ip, tos, total)] = prefix
        return prefix

    def ip_prefix(self, dst_mac: bytes, dst_ip: bytes, tos: int, fth_len: int) -> bytes:
        """Ethernet + IPv4 headers (34 bytes) for an FTH packet of `fth_len` bytes."""
        total = IPV4_LEN + UDP_LEN + fth_len
        prefix = self._prefixes.get((dst_mac, dst_ip, tos, total))
        if prefix is None:
            prefix = self._prefix(dst_mac, dst_ip, tos, total)
        return prefix

    def headers(
        self, dst_mac: bytes, dst_ip: bytes, dscp: int, ecn: int, sport: int, fth_len: int
    ) -> bytes:
        """Ethernet + IPv4 + UDP headers for an FTH packet of `fth_len` bytes."""
        prefix = self.ip_prefix(dst_mac, dst_ip, (dscp << 2) | ecn, fth_len)
        return prefix + udp_header(sport, fth_len)


def udp_header(sport: int, fth_len: int) -> bytes:
    return UDP_STRUCT.pack(sport, FORGIVE_UDP_PORT, UDP_LEN + fth_len, 0)


class Arrival:
    """What the agent keeps of an arriving frame's outer headers.

    One is made per received frame (plain, not a dataclass: common.native)."""

    def __init__(
        self,
        src_mac: bytes,
        src_ip: bytes,
        dst_ip: bytes,
        dscp: int,
        ce: bool,
        sport: int,
        fth: bytes | memoryview,
    ) -> None:
        self.src_mac = src_mac
        self.src_ip = src_ip
        self.dst_ip = dst_ip
        self.dscp = dscp
        self.ce = ce
        self.sport = sport
        self.fth = fth
        """The FTH and its payload, cut to the length IPv4 and UDP declare (Ethernet padding
        dropped): a view of the frame."""


_RX_HEADERS: Final = struct.Struct("!6x6sH BBHHHBBH4s4s HHH2x")
_FRAGMENT_BITS: Final = IPV4_MORE_FRAGMENTS | IPV4_FRAGMENT_OFFSET
"""Set in a fragment's flags and offset word, whichever fragment it is."""


def parse(frame: bytes | bytearray) -> Arrival | None:
    """Split a received frame; None for traffic that is not FORGIVE's, MalformedFrame for broken FORGIVE frames.

    A frame is FORGIVE's when it is unfragmented IPv4 without options (as
    docs/protocol.md, "Packets", has it) carrying UDP to port 17991. Anything
    else on the link (ARP, IPv6, other UDP) is simply not ours. One unpack
    reads every header field, since this runs once per received packet.
    """
    if len(frame) < HEADERS_LEN:
        return None
    # Typed, so that compiled code compares machine integers, not the unpacked objects.
    src_mac: bytes
    src_ip: bytes
    dst_ip: bytes
    ethertype: int
    ver_ihl: int
    tos: int
    total: int
    frag: int
    proto: int
    sport: int
    dport: int
    udp_len: int
    (src_mac, ethertype, ver_ihl, tos, total, _, frag, _, proto, _, src_ip, dst_ip, sport, dport,
     udp_len) = _RX_HEADERS.unpack_from(frame)  # fmt: skip
    if (
        ethertype != ETHERTYPE_IPV4
        or ver_ihl != 0x45
        or proto != IPPROTO_UDP
        or frag & _FRAGMENT_BITS
        or dport != FORGIVE_UDP_PORT
    ):
        return None
    if total > len(frame) - ETH_LEN or total < IPV4_LEN + UDP_LEN:
        raise MalformedFrame(f"IPv4 total length {total} against a {len(frame)}-byte frame")
    if ipv4_checksum(frame, ETH_LEN):
        raise MalformedFrame("IPv4 header checksum mismatch")
    if udp_len != total - IPV4_LEN:
        raise MalformedFrame(f"UDP length {udp_len}, IPv4 says {total - IPV4_LEN}")
    return Arrival(
        src_mac, src_ip, dst_ip, tos >> 2, (tos & ECN_MASK) == ECN_CE, sport,
        memoryview(frame)[HEADERS_LEN : ETH_LEN + total],
    )  # fmt: skip


ARP_REQUEST: Final = 1
ARP_REPLY: Final = 2
BROADCAST_MAC: Final = b"\xff" * 6
_ARP: Final = struct.Struct("!6s6sH HHBBH6s4s6s4s")


@dataclass(frozen=True, slots=True)
class ArpMessage:
    op: int
    sender_mac: bytes
    sender_ip: bytes
    target_ip: bytes


def arp_frame(
    op: int, src_mac: bytes, src_ip: bytes, dst_mac: bytes, target_mac: bytes, target_ip: bytes
) -> bytes:
    """An Ethernet/IPv4 ARP request or reply (padded to the 60-byte Ethernet minimum)."""
    body = _ARP.pack(
        dst_mac,
        src_mac,
        ETHERTYPE_ARP,
        1,
        ETHERTYPE_IPV4,
        6,
        4,
        op,
        src_mac,
        src_ip,
        target_mac,
        target_ip,
    )
    return body + bytes(60 - len(body))


def parse_arp(frame: bytes | bytearray) -> ArpMessage | None:
    """The fields of an Ethernet/IPv4 ARP frame, or None for any other frame."""
    if len(frame) < _ARP.size or frame[12:14] != b"\x08\x06":
        return None
    _, _, _, htype, ptype, hlen, plen, op, smac, sip, _, tip = _ARP.unpack_from(frame)
    if (htype, ptype, hlen, plen) != (1, ETHERTYPE_IPV4, 6, 4) or op not in (
        ARP_REQUEST,
        ARP_REPLY,
    ):
        return None
    return ArpMessage(op, smac, sip, tip)
