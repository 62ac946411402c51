"""tshark with the project's dissector, its fields read as forgive-dissect prints its rows, so
a test can hold the two readers of one capture to each other frame by frame."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from common.wire import Flag, Opcode

ROOT = Path(__file__).resolve().parents[1]
LUA = ROOT / "wireshark" / "forgive.lua"
FIELDS = (
    "frame.number",
    "frame.time_epoch",
    "ip.src",
    "ip.dst",
    "ip.dsfield.dscp",
    "ip.dsfield.ecn",
    "forgive.opcode",
    "forgive.flags",
    "forgive.flow_id",
    "forgive.seq",
    "forgive.length",
    "forgive.aux",
    "forgive.payload_len",
)
"""What tshark is asked for, in the order `rows` reads them."""

needs_tshark = pytest.mark.skipif(
    shutil.which("tshark") is None, reason="tshark is not installed (make setup installs it)"
)


def tshark(*args: str, home: Path) -> str:
    """tshark's output with this tree's dissector and no other: HOME points at an empty
    folder, so a plugin installed from another checkout cannot register the protocol first."""
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    proc = subprocess.run(
        ["tshark", "-X", f"lua_script:{LUA}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _flags(value: str) -> str:
    bits = int(value, 16)
    return "+".join(f.name or "" for f in sorted(Flag, key=int) if bits & f)


def rows(capture: Path, home: Path) -> list[dict]:
    """Every FORGIVE frame of `capture` as tshark decodes it, as forgive-dissect's rows."""
    out = tshark(
        "-r", str(capture), "-Y", "forgive", "-T", "fields", "-E", "separator=\t",
        *(arg for field in FIELDS for arg in ("-e", field)), home=home,
    )  # fmt: skip
    found = []
    for line in out.splitlines():
        cells = dict(zip(FIELDS, line.split("\t"), strict=True))
        found.append(
            {
                "index": int(cells["frame.number"]) - 1,
                "time": float(cells["frame.time_epoch"]),
                "src": cells["ip.src"],
                "dst": cells["ip.dst"],
                "dscp": int(cells["ip.dsfield.dscp"]),
                "ecn": int(cells["ip.dsfield.ecn"]),
                "opcode": Opcode(int(cells["forgive.opcode"])).name,
                "flags": _flags(cells["forgive.flags"]),
                "flow_id": int(cells["forgive.flow_id"]),
                "seq": int(cells["forgive.seq"]),
                "length": int(cells["forgive.length"]),
                "aux": int(cells["forgive.aux"]),
                "payload": int(cells["forgive.payload_len"]),
            }
        )
    return found


def assert_same_rows(theirs: list[dict], ours: list[dict]) -> None:
    """tshark's rows equal forgive-dissect's, frame by frame (times to the microsecond)."""
    assert len(theirs) == len(ours)
    for a, b in zip(theirs, ours, strict=True):
        assert abs(a["time"] - b["time"]) < 1e-6, (a, b)
        assert {**a, "time": 0} == {**b, "time": 0}


def check_capture(capture: Path, home: Path, snaplen: int) -> list[dict]:
    """A capture as both readers see it: tshark's rows equal forgive-dissect's frame by frame,
    scapy reads every frame, none longer than `snaplen`; returns forgive-dissect's rows."""
    from scapy.utils import rdpcap

    from commands import dissect

    ours = list(dissect.rows(str(capture)))
    assert_same_rows(rows(capture, home), ours)
    frames = rdpcap(str(capture))
    assert len(frames) >= len(ours) > 0
    assert all(len(f) <= snaplen for f in frames)
    return ours
