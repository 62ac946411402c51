import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from commands import dissect
from common.wire import (
    FORGIVE_UDP_PORT,
    FTH_LEN,
    PACKET_BYTES,
    Flag,
    Fth,
    MalformedPacket,
    Opcode,
    decode,
)
from host_agent.scapy_layer import FTH


def data(seq=0, length=100, total=1000, flags=0, payload=None):
    body = b"\xab" * length if payload is None else payload
    return Fth(Opcode.DATA, flags, length, 7, seq, total).encode(body)


def test_encode_layout_is_network_order():
    raw = Fth(
        Opcode.NACK, Flag.ELIGIBLE | Flag.EXHAUSTED, 0x0102, 0x03040506, 0x0708090A, 0x0B0C0D0E
    ).encode()
    assert raw == bytes.fromhex("120c0102030405060708090a0b0c0d0e")
    assert len(raw) == FTH_LEN


@given(
    opcode=st.sampled_from([Opcode.ACK, Opcode.NACK]),
    flags=st.sampled_from([0, Flag.ELIGIBLE, Flag.ELIGIBLE | Flag.EXHAUSTED | Flag.ECE]),
    length=st.integers(1, 0xFFFF),
    flow=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**32 - 1),
    aux=st.integers(0, 2**32 - 1),
)
def test_control_round_trip(opcode, flags, length, flow, seq, aux):
    hdr = Fth(opcode, Flag(flags), length, flow, seq, aux)
    decoded, payload = decode(hdr.encode())
    assert decoded == hdr and len(payload) == 0


def test_data_round_trip_and_trimmed_header():
    hdr, payload = decode(data(seq=100, length=4, payload=b"abcd"))
    assert (hdr.opcode, hdr.seq, hdr.length, hdr.aux, bytes(payload)) == (
        Opcode.DATA,
        100,
        4,
        1000,
        b"abcd",
    )
    trimmed, payload = decode(Fth(Opcode.DATA, Flag.TRIMMED, 4096, 7, 0, 8192).encode())
    assert trimmed.trimmed and trimmed.length == 4096 and len(payload) == 0


def test_what_a_larger_trim_keeps_past_the_fth_is_ignored():
    """A 128-byte trim keeps 70 bytes of cut payload; they are no payload of the header."""
    header, payload = decode(Fth(Opcode.DATA, Flag.TRIMMED, 4096, 7, 0, 8192).encode(bytes(70)))
    assert header.trimmed and header.length == 4096 and len(payload) == 0


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\x10" * 15, "shorter"),
        (bytes([0x20]) + bytes(15), "version"),
        (bytes([0x14]) + bytes(15), "opcode"),
        (Fth(Opcode.ACK, Flag(0x40), 1, 1, 1, 1).encode(), "unknown FTH flags"),
        (data(length=10, payload=b"x" * 9), "payload bytes"),
        (data(length=PACKET_BYTES + 1), "outside"),
        (data(length=0, payload=b""), "outside"),
        (data(seq=995, length=10), "beyond flow length"),
        (Fth(Opcode.DATA, Flag.TRIMMED, 10, 1, 0, 100).encode(b"x" * 11), "payload bytes"),
        (Fth(Opcode.ACK, Flag.TRIMMED, 10, 1, 0, 0).encode(), "DATA only"),
        (Fth(Opcode.ACK, Flag(0), 0, 1, 0, 0).encode(b"zz"), "payload bytes"),
        (Fth(Opcode.CNP, Flag(0), 1, 1, 0, 0).encode(), "CNP"),
        (Fth(Opcode.NACK, Flag(0), 0, 1, 0, 0).encode(), "empty range"),
    ],
)
def test_malformed_is_rejected_with_a_typed_error(raw, reason):
    with pytest.raises(MalformedPacket, match=reason):
        decode(raw)


@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_malformed_only(raw):
    with contextlib.suppress(MalformedPacket):
        decode(raw)


def frame(fth_bytes, tos=0x2A):
    return (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src="10.0.0.1", dst="10.0.1.1", tos=tos)
        / UDP(sport=49152, dport=FORGIVE_UDP_PORT, chksum=0)
        / fth_bytes
    )


def test_scapy_layer_dissects_fth_on_its_port():
    pkt = Ether(bytes(frame(Fth(Opcode.DATA, Flag.TRIMMED, 4096, 9, 8192, 65536).encode())))
    assert FTH in pkt
    fth = pkt[FTH]
    assert (fth.version, fth.opcode, fth.flow_id, fth.seq, fth.length, fth.aux) == (
        1,
        0,
        9,
        8192,
        4096,
        65536,
    )
    assert fth.flags.TRIMMED and not fth.flags.LAST
    assert len(bytes(pkt)) == 58
    other = Ether(bytes(Ether() / IP() / UDP(sport=1, dport=53) / (b"x" * 16)))
    assert FTH not in other


def test_dissect_reads_a_capture(tmp_path, capsys):
    pcap = tmp_path / "cap.pcap"
    wrpcap(
        str(pcap),
        [
            frame(data(seq=0, length=8, total=16, payload=b"01234567")),
            frame(Fth(Opcode.ACK, Flag.ELIGIBLE | Flag.ECE, 8, 7, 8, 0).encode(), tos=48 << 2),
            Ether() / IP() / UDP(dport=53) / b"dns",
        ],
    )
    assert dissect.main([str(pcap), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert '"opcode": "ACK"' in lines[1] and '"dscp": 48' in lines[1] and "ELIGIBLE" in lines[1]
    assert dissect.main([str(tmp_path / "missing.pcap")]) == 2
    assert "forgive-dissect:" in capsys.readouterr().err


def _capture(tmp_path, snaplen=65535):
    """Two FORGIVE DATA frames (158 bytes) around a DNS one (45), each record cut to `snaplen`
    as tcpdump -s cuts them."""
    frames = [bytes(frame(data(seq=0))), bytes(Ether() / IP() / UDP(dport=53) / b"dns")]
    frames.append(bytes(frame(data(seq=100))))
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1)
    for i, raw in enumerate(frames):
        out += struct.pack("<IIII", 1000 + i, 0, min(len(raw), snaplen), len(raw))
        out += raw[:snaplen]
    pcap = tmp_path / "cap.pcap"
    pcap.write_bytes(out)
    return pcap


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty, not a capture"),
        (b"\xd4\xc3\xb2\xa1\x02\x00\x04\x00\x00\x00", "10 bytes, shorter than a pcap file header"),
        (bytes(range(7, 71)), "not a pcap capture (starts 0708090a)"),
        (b"\x0a\x0d\x0d\x0a" + bytes(60), "not a readable pcapng capture"),
    ],
)
def test_dissect_refuses_a_file_that_is_not_a_capture_in_one_line(
    tmp_path, capsys, content, message
):
    path = tmp_path / "bad.pcap"
    path.write_bytes(content)
    assert dissect.main([str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and message in out.err and len(out.err.strip().splitlines()) == 1, out.err


def test_dissect_says_where_a_capture_cut_inside_a_record_ends(tmp_path, capsys):
    whole = _capture(tmp_path).read_bytes()
    for cut, where in [
        (len(whole) - 10, "ends inside record 2"),
        (24 + 16 + 158 + 5, "ends inside the header of record 1"),
    ]:
        path = tmp_path / "cut.pcap"
        path.write_bytes(whole[:cut])
        assert dissect.main([str(path)]) == 2
        out = capsys.readouterr()
        assert where in out.err and len(out.err.strip().splitlines()) == 1, out.err
        assert len(out.out.splitlines()) == 1  # the packet before the cut is shown


def test_dissect_counts_packets_the_snap_length_cut(tmp_path, capsys):
    assert dissect.main([str(_capture(tmp_path, snaplen=50))]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "2 packets cut by the capture's snap length of 50 bytes before the end" in out.err
    assert len(out.err.strip().splitlines()) == 1
    assert dissect.main([str(_capture(tmp_path, snaplen=80))]) == 0  # headers whole, payload cut
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 2 and "payload=22" in out.out
    assert "2 packets cut by the capture's snap length of 80 bytes" in out.err
