"""Framing at the agent's edge, checked against scapy's independent encoder and parser."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from common.frames import (
    ARP_REPLY,
    ARP_REQUEST,
    BROADCAST_MAC,
    HEADERS_LEN,
    FrameBuilder,
    MalformedFrame,
    arp_frame,
    ip_bytes,
    mac_bytes,
    parse,
    parse_arp,
)
from common.wire import ECN_CE, ECN_ECT0, FORGIVE_UDP_PORT, Fth, Opcode
from host_agent.scapy_layer import FTH

SRC_MAC = mac_bytes("02:00:00:00:00:01")
DST_MAC = mac_bytes("02:00:00:00:00:02")
SRC_IP = ip_bytes("10.9.0.1")
DST_IP = ip_bytes("10.9.0.2")


def build(body: bytes, dscp=10, ecn=ECN_ECT0, sport=50000) -> bytes:
    builder = FrameBuilder(SRC_MAC, SRC_IP)
    return builder.headers(DST_MAC, DST_IP, dscp, ecn, sport, len(body)) + body


@settings(deadline=None)
@given(
    dscp=st.sampled_from([0, 10, 18, 20, 48]),
    ecn=st.sampled_from([0, ECN_ECT0, ECN_CE]),
    sport=st.integers(0, 0xFFFF),
    length=st.integers(1, 4096),
)
def test_built_frames_are_what_scapy_reads(dscp, ecn, sport, length):
    body = Fth(Opcode.DATA, 0, length, 5, 0, length).encode(b"\x5a" * length)
    frame = build(body, dscp, ecn, sport)
    pkt = Ether(frame)
    assert pkt[Ether].dst == "02:00:00:00:00:02"
    assert pkt[IP].tos == (dscp << 2) | ecn
    assert pkt[IP].len == 20 + 8 + len(body)
    assert pkt[IP].ttl == 64 and pkt[IP].flags == "DF"
    assert pkt[UDP].dport == FORGIVE_UDP_PORT and pkt[UDP].sport == sport
    assert pkt[UDP].chksum == 0
    assert pkt[FTH].length == length
    recomputed = IP(bytes(pkt[IP]))
    del recomputed.chksum
    assert IP(bytes(recomputed)).chksum == pkt[IP].chksum


def test_parse_round_trip_and_ce():
    body = Fth(Opcode.ACK, 0, 10, 3, 0, 0).encode()
    arrival = parse(build(body, dscp=48, ecn=ECN_CE, sport=4242))
    assert arrival is not None
    assert bytes(arrival.fth) == body
    assert arrival.ce and arrival.dscp == 48 and arrival.sport == 4242
    assert arrival.src_ip == SRC_IP and arrival.dst_ip == DST_IP and arrival.src_mac == SRC_MAC
    assert not parse(build(body, ecn=ECN_ECT0)).ce


def test_ethernet_padding_is_cut_off():
    """A trimmed frame is 58 bytes and arrives padded to 60; the FTH must not grow."""
    body = Fth(Opcode.DATA, 0x01, 4096, 3, 0, 8192).encode()
    arrival = parse(build(body) + b"\x00\x00")
    assert bytes(arrival.fth) == body


def test_scapy_built_frame_parses():
    fth = Fth(Opcode.NACK, 0x04, 100, 9, 200, 0).encode()
    frame = bytes(
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src="10.9.0.1", dst="10.9.0.2", tos=48 << 2)
        / UDP(sport=1234, dport=FORGIVE_UDP_PORT, chksum=0)
        / fth
    )
    assert bytes(parse(frame).fth) == fth


@pytest.mark.parametrize(
    "frame",
    [
        bytes(Ether() / IP(dst="10.9.0.2") / UDP(dport=53) / (b"x" * 20)),
        bytes(Ether() / IP(dst="10.9.0.2", proto=6) / (b"\x00" * 30)),
        bytes(Ether(type=0x86DD) / (b"\x00" * 60)),
        bytes(Ether() / IP(dst="10.9.0.2", frag=5) / UDP(dport=FORGIVE_UDP_PORT) / (b"x" * 20)),
        b"\x00" * 10,
    ],
)
def test_other_traffic_is_not_ours(frame):
    assert parse(frame) is None


def test_broken_forgive_frames_raise_malformed():
    good = bytearray(build(Fth(Opcode.ACK, 0, 1, 3, 0, 0).encode()))
    bad_checksum = bytearray(good)
    bad_checksum[24] ^= 0xFF
    too_long = bytearray(good)
    too_long[16:18] = (2000).to_bytes(2, "big")
    bad_udp = bytearray(good)
    bad_udp[38:40] = (9).to_bytes(2, "big")
    for frame in (bad_checksum, too_long, bad_udp):
        with pytest.raises(MalformedFrame):
            parse(bytes(frame))
    assert len(good) == HEADERS_LEN + 16


def test_arp_request_and_reply():
    req = arp_frame(ARP_REQUEST, SRC_MAC, SRC_IP, BROADCAST_MAC, bytes(6), DST_IP)
    pkt = Ether(req)
    assert pkt[ARP].op == 1 and pkt[ARP].pdst == "10.9.0.2" and len(req) == 60
    msg = parse_arp(req)
    assert msg.op == ARP_REQUEST and msg.sender_mac == SRC_MAC and msg.target_ip == DST_IP
    reply = bytes(
        Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")
        / ARP(op=2, hwsrc="02:00:00:00:00:02", psrc="10.9.0.2", pdst="10.9.0.1")
    )
    msg = parse_arp(reply)
    assert msg.op == ARP_REPLY and msg.sender_mac == DST_MAC and msg.sender_ip == DST_IP
    assert parse_arp(build(b"\x00" * 16)) is None


@pytest.mark.parametrize("text", ["02:00:00:00:00", "zz:00:00:00:00:00", "0200.0000.0001"])
def test_bad_mac_is_one_clear_error(text):
    with pytest.raises(ValueError, match="not a MAC address"):
        mac_bytes(text)


def test_bad_ip_is_one_clear_error():
    with pytest.raises(ValueError, match="not an IPv4 address"):
        ip_bytes("10.0.0.300")
