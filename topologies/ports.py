"""TCP ports for the switch processes an emulation or a test starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_FLOOR = 20000
"""Switch ports are picked from here up to the kernel's ephemeral range."""
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port nothing listens on now, for a switch to bind a moment later.

    Not what binding port 0 gives: that port lies in the kernel's ephemeral range, and
    in the moment before the switch binds it, any outgoing connection (the controller
    talking to another switch) may be given it, and the switch fails with "Address
    already in use". Ports below that range are never given out so; each is handed
    out once per process, picked at random so that two processes rarely meet."""
    low = _ephemeral_low()
    candidates = [p for p in range(PORT_FLOOR, low) if p not in _handed_out]
    for port in random.SystemRandom().sample(candidates, min(64, len(candidates))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {PORT_FLOOR}..{low - 1}")
