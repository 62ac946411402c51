"""The P4 program and the Python code state the wire format and the switch's numbers once each:
p4src/include/constants.p4 and headers.p4 for forgive.p4, common.wire (and the switch
model's own modules) for Python. These tests read the two P4 files and hold every constant and
every header field's offset to its Python counterpart, so neither side can drift alone."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from common import frames, wire
from controller import nic
from host_agent import host
from switch_model import counters, port, surface

INCLUDE = Path(__file__).resolve().parent.parent / "p4src" / "include"
NIC_CONSTANTS = INCLUDE.parent / "pna" / "include" / "nic_constants.p4"

PYTHON_CONSTANTS = {
    "ETHERTYPE_IPV4": wire.ETHERTYPE_IPV4,
    "IPPROTO_UDP": wire.IPPROTO_UDP,
    "IPV4_IHL_NO_OPTIONS": wire.IPV4_IHL_NO_OPTIONS,
    "FORGIVE_UDP_PORT": wire.FORGIVE_UDP_PORT,
    "FTH_VERSION": wire.FTH_VERSION,
    "FTH_OPCODE_DATA": wire.Opcode.DATA,
    "FTH_FLAG_TRIMMED": wire.Flag.TRIMMED,
    "ECN_NOT_ECT": wire.ECN_NOT_ECT,
    "ECN_CE": wire.ECN_CE,
    "TRIMMED_FRAME_BYTES": wire.TRIMMED_FRAME_LEN,
    "TRIMMED_IPV4_TOTAL_LEN": wire.TRIMMED_IPV4_TOTAL_LEN,
    "TRIMMED_UDP_LEN": wire.TRIMMED_UDP_LEN,
    "ETH_HEADER_BYTES": wire.ETH_LEN,
    "IPV4_HEADER_BYTES": wire.IPV4_LEN,
    "PRIO_HIGH": port.PRIO_HIGH,
    "PRIO_LOW": port.PRIO_LOW,
    "ECN_RANDOM_MAX": surface.PMAX_ONE - 1,
    "NUM_PORTS": counters.NUM_PORTS,
}
"""Every constant of constants.p4, by its P4 name."""

NIC_PYTHON_CONSTANTS = {
    "FTH_OPCODE_ACK": wire.Opcode.ACK,
    "FTH_OPCODE_NACK": wire.Opcode.NACK,
    "FTH_FLAG_ELIGIBLE": wire.Flag.ELIGIBLE,
    "FTH_FLAG_EXHAUSTED": wire.Flag.EXHAUSTED,
    "FTH_KNOWN_FLAGS": wire.KNOWN_FLAGS,
    "PACKET_BYTES": wire.PACKET_BYTES,
    "DSCP_CONTROL": wire.Dscp.CONTROL,
    "REPLY_TTL": frames.TTL,
    "IPV4_FLAG_DONT_FRAGMENT": wire.IPV4_DONT_FRAGMENT >> 13,
    "REPLY_UDP_SRC_PORT": host.SPORT_BASE,
    "P_SCALE": nic.P_SCALE,
    "FORGIVE_PROB_ONE": nic.FORGIVE_PROB_ONE,
    "NUM_FLOW_SLOTS": nic.NUM_FLOW_SLOTS,
    "NUM_STEP_SLOTS": nic.NUM_STEP_SLOTS,
    "FLOW_IN_ORDER": nic.FLOW_IN_ORDER,
    "FLOW_HOLE": nic.FLOW_HOLE,
    "FLOW_HOST": nic.FLOW_HOST,
}
"""Every constant of the NIC program's nic_constants.p4, by its P4 name."""

PYTHON_OFFSETS = {
    "ethernet.dstAddr": wire.ETH_DST_AT,
    "ethernet.srcAddr": wire.ETH_SRC_AT,
    "ethernet.etherType": wire.ETH_TYPE_AT,
    "ipv4.version": wire.IPV4_VERSION_IHL_AT,
    "ipv4.dscp": wire.IPV4_TOS_AT,
    "ipv4.totalLen": wire.IPV4_TOTAL_LEN_AT,
    "ipv4.identification": wire.IPV4_IDENTIFICATION_AT,
    "ipv4.flags": wire.IPV4_FLAGS_FRAG_AT,
    "ipv4.ttl": wire.IPV4_TTL_AT,
    "ipv4.protocol": wire.IPV4_PROTOCOL_AT,
    "ipv4.hdrChecksum": wire.IPV4_CHECKSUM_AT,
    "ipv4.srcAddr": wire.IPV4_SRC_AT,
    "ipv4.dstAddr": wire.IPV4_DST_AT,
    "udp.srcPort": wire.UDP_SRC_PORT_AT,
    "udp.dstPort": wire.UDP_DST_PORT_AT,
    "udp.length": wire.UDP_LENGTH_AT,
    "udp.checksum": wire.UDP_CHECKSUM_AT,
    "fth.version": wire.FTH_VERSION_OPCODE_AT,
    "fth.flags": wire.FTH_FLAGS_AT,
    "fth.length": wire.FTH_LENGTH_AT,
    "fth.flow_id": wire.FTH_FLOW_ID_AT,
    "fth.seq": wire.FTH_SEQ_AT,
    "fth.aux": wire.FTH_AUX_AT,
}
"""Byte offset in the frame of every P4 field that starts on a byte boundary."""

SHARED_BYTES = {
    "ipv4.ihl": "ipv4.version",
    "ipv4.ecn": "ipv4.dscp",
    "ipv4.fragOffset": "ipv4.flags",
    "fth.opcode": "fth.version",
}
"""Fields that start inside a byte, with the field whose byte they share."""

HEADER_LENGTHS = {
    "ethernet": wire.ETH_LEN,
    "ipv4": wire.IPV4_LEN,
    "udp": wire.UDP_LEN,
    "fth": wire.FTH_LEN,
}
HEADER_STARTS = {"ethernet": 0, "ipv4": wire.IPV4_AT, "udp": wire.UDP_AT, "fth": wire.FTH_AT}


def _source(name: str | Path) -> str:
    """The file without comments."""
    text = (INCLUDE / name).read_text()
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def p4_constants(name: str | Path = "constants.p4") -> dict[str, tuple[int, int]]:
    """Name -> (bit width, value) of every `const bit<N>` in constants.p4 (or `name`)."""
    source = _source(name)
    found = {
        name: (int(width), int(value, 0))
        for width, name, value in re.findall(
            r"const\s+bit<(\d+)>\s+(\w+)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)\s*;", source
        )
    }
    assert len(found) == source.count("const "), "a constant this test cannot read"
    return found


def p4_fields() -> dict[str, tuple[int, int]]:
    """'header.field' -> (bit offset in the frame, bit width), headers stacked as in headers_t."""
    source = _source("headers.p4")
    typedefs = {
        name: int(width) for width, name in re.findall(r"typedef\s+bit<(\d+)>\s+(\w+)\s*;", source)
    }
    headers = {}
    for name, body in re.findall(r"header\s+(\w+)\s*\{(.*?)\}", source, flags=re.S):
        fields = []
        for kind, field in re.findall(r"(bit<\d+>|\w+)\s+(\w+)\s*;", body):
            width = int(kind[4:-1]) if kind.startswith("bit<") else typedefs[kind]
            fields.append((field, width))
        headers[name] = fields
    stack = re.search(r"struct\s+headers_t\s*\{(.*?)\}", source, flags=re.S)
    assert stack is not None
    out = {}
    offset = 0
    for kind, instance in re.findall(r"(\w+)\s+(\w+)\s*;", stack.group(1)):
        out[instance] = (offset, sum(w for _, w in headers[kind]))
        for field, width in headers[kind]:
            out[f"{instance}.{field}"] = (offset, width)
            offset += width
    return out


@pytest.mark.parametrize(
    ("source", "python"),
    [("constants.p4", PYTHON_CONSTANTS), (NIC_CONSTANTS, NIC_PYTHON_CONSTANTS)],
    ids=["switch", "nic"],
)
def test_every_p4_constant_has_its_python_value(source, python):
    constants = p4_constants(source)
    assert set(constants) == set(python), f"{source} and its table list different names"
    for name, (width, value) in constants.items():
        assert value < 1 << width, f"{name} does not fit bit<{width}>"
        assert python[name] == value, f"{name}: P4 {value}, Python {python[name]}"


def test_header_lengths_and_starts_match():
    fields = p4_fields()
    for header, length in HEADER_LENGTHS.items():
        start, bits = fields[header]
        assert bits == 8 * length, f"{header}_t is {bits} bits, Python says {length} bytes"
        assert start == 8 * HEADER_STARTS[header], f"{header} starts at bit {start}"
    assert wire.HEADERS_LEN == wire.FTH_AT
    assert sum(HEADER_LENGTHS.values()) == wire.TRIMMED_FRAME_LEN


def test_every_p4_field_offset_matches_python():
    fields = {name: v for name, v in p4_fields().items() if "." in name}
    assert set(fields) == set(PYTHON_OFFSETS) | set(SHARED_BYTES), "headers.p4 fields changed"
    for name, at in PYTHON_OFFSETS.items():
        bit, _ = fields[name]
        assert bit == 8 * at, f"{name} is at bit {bit}, Python says byte {at}"
    for name, first in SHARED_BYTES.items():
        bit, _ = fields[name]
        first_bit, first_width = fields[first]
        assert bit == first_bit + first_width and bit // 8 == first_bit // 8, name


@pytest.mark.parametrize(
    ("field", "mask"),
    [("ipv4.ecn", wire.ECN_MASK), ("ipv4.ihl", 0x0F), ("fth.opcode", 0x0F), ("fth.version", 0xF0)],
)
def test_sub_byte_fields_sit_where_the_python_masks_read_them(field, mask):
    """The masks and shifts Python applies (ECN_MASK, `& 0x0F`, `>> 4`) select the P4 field."""
    bit, width = p4_fields()[field]
    within = bit % 8
    assert ((1 << width) - 1) << (8 - within - width) == mask


def test_the_fth_struct_is_the_p4_fth_header():
    fields = p4_fields()
    fth_start, _ = fields["fth"]
    formats = wire.FTH_STRUCT.format.lstrip("!")
    offsets = [struct.calcsize("!" + formats[:i]) for i in range(len(formats))]
    p4 = ["fth.version", "fth.flags", "fth.length", "fth.flow_id", "fth.seq", "fth.aux"]
    assert [(fields[name][0] - fth_start) // 8 for name in p4] == offsets
    assert wire.FTH_STRUCT.size == wire.FTH_LEN
