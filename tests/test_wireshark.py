"""The Wireshark dissector (wireshark/forgive.lua): its numbers are common.wire's, tshark reads
every FORGIVE frame of a capture as forgive-dissect does, and `make setup` installed it where
tshark finds it with no flag."""

from __future__ import annotations

import random
import re
from pathlib import Path

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap
from tshark_harness import LUA, assert_same_rows, needs_tshark, rows, tshark

from commands import dissect
from common.frames import FrameBuilder, ip_bytes, mac_bytes
from common.wire import (
    FORGIVE_UDP_PORT,
    FTH_LEN,
    FTH_VERSION,
    PACKET_BYTES,
    Dscp,
    Flag,
    Fth,
    Opcode,
)

HOME_PLUGIN = Path.home() / ".local" / "lib" / "wireshark" / "plugins" / "forgive.lua"


def _constants() -> dict[str, object]:
    """The Lua's constants block, read back: the scalars, the opcode names, the flags."""
    block = LUA.read_text().split("-- BEGIN constants")[1].split("-- END constants")[0]
    scalars = {k: int(v) for k, v in re.findall(r"local (\w+) = (\d+)\n", block)}
    opcodes = {int(k): v for k, v in re.findall(r'\[(\d+)\] = "(\w+)"', block)}
    flags = [
        (a, n, int(b, 16)) for a, n, b in re.findall(r'\{ "(\w+)", "(\w+)", 0x(\w+) \}', block)
    ]
    return {**scalars, "OPCODES": opcodes, "FLAGS": flags}


def test_the_dissectors_numbers_are_common_wires():
    assert _constants() == {
        "FORGIVE_UDP_PORT": FORGIVE_UDP_PORT,
        "FTH_LEN": FTH_LEN,
        "FTH_VERSION": FTH_VERSION,
        "OPCODES": {o.value: o.name for o in Opcode},
        "FLAGS": [(f.name.lower(), f.name, f.value) for f in sorted(Flag, key=int)],
    }


def _frames(seed: int = 7, count: int = 120) -> list[Ether]:
    """Every opcode with the flags it may carry, full and trimmed DATA (at 58 bytes and with
    a 128-byte trim's kept bytes), marked and unmarked, between other UDP traffic."""
    rng = random.Random(seed)
    builders = [
        FrameBuilder(mac_bytes(f"02:00:00:00:00:0{i}"), ip_bytes(f"10.0.{i}.1")) for i in (1, 2)
    ]
    frames = []
    for k in range(count):
        src, dst = rng.sample(builders, 2)
        opcode = Opcode(k % 4)
        flow, seq = rng.getrandbits(32), rng.randrange(1 << 20)
        payload = b""
        if opcode == Opcode.DATA:
            length = rng.randint(1, PACKET_BYTES)
            flags = rng.choice([0, Flag.RETX, Flag.LAST, Flag.RETX | Flag.LAST])
            if rng.random() < 0.4:
                flags |= Flag.TRIMMED
                payload = bytes(rng.choice([0, 128 - 58]))
            else:
                payload = rng.randbytes(length)
            fth = Fth(opcode, flags, length, flow, seq, seq + length + rng.randrange(1 << 20))
            dscp, ecn = (
                rng.choice([Dscp.GRADIENT, Dscp.TENSOR_PARALLEL, Dscp.OTHER]),
                rng.choice([2, 3]),
            )
        elif opcode == Opcode.CNP:
            fth, dscp, ecn = Fth(opcode, 0, 0, flow, 0, 0), Dscp.CONTROL, 0
        else:
            flags = rng.choice([0, Flag.ELIGIBLE, Flag.ELIGIBLE | Flag.EXHAUSTED, Flag.ECE])
            fth = Fth(
                opcode, flags, rng.randint(1, PACKET_BYTES), flow, seq, rng.randrange(seq + 1)
            )
            dscp, ecn = Dscp.CONTROL, 0
        pkt = fth.encode(payload)
        sport = 0xC000 | rng.getrandbits(14)
        raw = src.headers(dst.src_mac, dst.src_ip, dscp, ecn, sport, len(pkt)) + pkt
        frame = Ether(raw)
        frame.time = 1000 + k * 1e-3
        frames.append(frame)
        if k % 10 == 0:
            other = Ether() / IP(src="10.0.9.9", dst="10.0.1.1") / UDP(sport=53, dport=53) / b"dns"
            other.time = frame.time
            frames.append(other)
    return frames


@needs_tshark
def test_tshark_reads_every_frame_as_forgive_dissect_does(tmp_path):
    capture = tmp_path / "mixed.pcap"
    wrpcap(str(capture), _frames())
    ours = list(dissect.rows(str(capture)))
    assert len(ours) == 120
    assert {r["opcode"] for r in ours} == {o.name for o in Opcode}
    assert_same_rows(rows(capture, tmp_path), ours)


@needs_tshark
def test_trimmed_headers_are_marked(tmp_path):
    capture = tmp_path / "mixed.pcap"
    wrpcap(str(capture), _frames())
    listed = tshark("-r", str(capture), "-Y", "forgive.trimmed", "-T", "fields", "-e",
                    "frame.number", "-e", "_ws.col.Info", home=tmp_path)  # fmt: skip
    numbers = [r["index"] + 1 for r in dissect.rows(str(capture)) if "TRIMMED" in r["flags"]]
    assert numbers and [int(line.split("\t")[0]) for line in listed.splitlines()] == numbers
    assert all("\tTRIMMED DATA flow=" in line for line in listed.splitlines())
    detail = tshark("-r", str(capture), "-V", "-Y", f"frame.number == {numbers[0]}", home=tmp_path)
    assert "Trimmed DATA: bytes [" in detail and "cut by a switch" in detail


@needs_tshark
def test_make_setup_installed_this_dissector_where_tshark_loads_it():
    assert HOME_PLUGIN.read_bytes() == LUA.read_bytes(), "run make setup"
