"""Switch ports come from below the ephemeral range, once each, skipping taken ones."""

from __future__ import annotations

import socket

import pytest

from topologies import ports


def test_ports_lie_below_the_ephemeral_range_and_repeat_never():
    low = ports._ephemeral_low()
    picked = [ports.free_port() for _ in range(200)]
    assert all(ports.PORT_FLOOR <= p < low for p in picked)
    assert len(set(picked)) == len(picked)


def test_a_port_someone_holds_is_not_handed_out(monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    taken = holder.getsockname()[1]
    monkeypatch.setattr(ports, "PORT_FLOOR", taken)
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: taken + 2)
    monkeypatch.setattr(ports, "_handed_out", set())
    try:
        assert ports.free_port() == taken + 1
        with pytest.raises(RuntimeError, match=f"no free TCP port in {taken}..{taken + 1}"):
            ports.free_port()
    finally:
        holder.close()
