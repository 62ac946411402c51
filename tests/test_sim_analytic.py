"""The virtual-time engine against answers worked out by hand: one flow on an idle path, an
incast into one port, and trimmed headers overtaking queued data."""

from __future__ import annotations

import pytest

from common.wire import DATA_FRAME_LEN as FRAME_BYTES
from common.wire import PACKET_BYTES, TRIMMED_FRAME_LEN
from host_agent.endpoint import EndpointConfig
from host_agent.events import RecvDone
from host_agent.host import HostConfig
from host_agent.policies import parse_policy
from simulator.engine import SimulationError, VirtualFabric, star

HEADERS = FRAME_BYTES - PACKET_BYTES
"""Ethernet, IPv4, UDP and FTH bytes in front of every payload."""
NO_MARKS = 1 << 30


class Recorder:
    """An application that notes when each flow completed at its host."""

    def __init__(self) -> None:
        self.done: dict[int, float] = {}

    def handle_event(self, event, now: float) -> None:
        if isinstance(event, RecvDone):
            self.done[event.flow] = now

    def get_timer(self) -> None:
        return None

    def handle_timer(self, now: float) -> None:
        pass


def fabric(hosts: int, nic_bps: float, port_bps: int, queue_frames: int, delay_s: float):
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("dcqcn"), line_rate_bps=nic_bps, rto=1.0, rto_max=10.0
        )
    )
    description = star(
        hosts,
        port_rate_bps=port_bps,
        data_queue_bytes=queue_frames * FRAME_BYTES,
        ecn_kmin=NO_MARKS,
        ecn_kmax=NO_MARKS,
        ecn_pmax=0,
    )
    return VirtualFabric(description, host, delay_s=delay_s, seed=1)


def send(sim: VirtualFabric, src: int, dst: int, flow: int, size: int) -> None:
    sim.hosts[dst].endpoint.register_flow(flow, 0, "other", sim.now)
    sim.hosts[src].endpoint.send(sim.hosts[dst].config.ip, flow, bytes(size), "other", sim.now)


@pytest.mark.parametrize("size", [PACKET_BYTES, 10 * PACKET_BYTES, 37 * PACKET_BYTES + 123])
def test_one_flow_takes_its_bytes_over_the_rate_plus_propagation_plus_one_store_and_forward(size):
    rate, delay = 10e9, 3e-6
    sim = fabric(2, rate, int(rate), queue_frames=64, delay_s=delay)
    recorder = Recorder()
    sim.apps[1].append(recorder)
    send(sim, 0, 1, flow=7, size=size)
    sim.start()
    sim.run(lambda: 7 in recorder.done, limit_s=1.0)
    packets = -(-size // PACKET_BYTES)
    first_frame = HEADERS + min(size, PACKET_BYTES)
    wire_bytes = size + packets * HEADERS
    # The switch stores and forwards: it starts on the first frame once that has crossed the
    # host's link, then its port, as fast as the NIC, is never idle until the last frame has
    # left. So the flow takes every wire byte at the line rate, plus the first frame's
    # serialisation once more, plus a delay on each of the two links.
    expected = (wire_bytes + first_frame) * 8 / rate + 2 * delay
    assert recorder.done[7] == pytest.approx(expected, rel=1e-9)
    assert sim.switch_totals()["s1"]["trims"] == 0


SENDERS, PACKETS, QUEUE_FRAMES = 5, 8, 6
SLOW_PORT = 1_000_000
"""The receiver's port at 1 Mbit/s: a full frame holds it for 33 ms, far longer than the burst."""


def incast() -> tuple[VirtualFabric, list[bytes]]:
    sim = fabric(SENDERS + 1, 100e9, SLOW_PORT, QUEUE_FRAMES, delay_s=1e-6)
    arrivals: list[bytes] = []

    def noting(i, frame):
        if i == SENDERS:
            arrivals.append(bytes(frame))

    sim.tap = noting
    for src in range(SENDERS):
        send(sim, src, SENDERS, flow=100 + src, size=PACKETS * PACKET_BYTES)
    sim.start()
    return sim, arrivals


def test_an_incast_with_nothing_to_slow_it_trims_exactly_what_the_data_queue_cannot_hold():
    sim, _ = incast()
    burst = PACKETS * FRAME_BYTES * 8 / 100e9
    sim.env.run(until=burst + 10e-6)  # every sender done; no feedback can have come back yet
    port = sim.pipelines["s1"].ports[SENDERS + 1]
    # The first frame leaves at once and holds the slow port; the data queue then fills to
    # its threshold and every later DATA packet is trimmed.
    assert port.low_bytes == QUEUE_FRAMES * FRAME_BYTES
    trims = SENDERS * PACKETS - 1 - QUEUE_FRAMES
    assert sim.switch_totals()["s1"]["trims"] == trims
    assert port.high_bytes == trims * TRIMMED_FRAME_LEN


def test_trimmed_headers_overtake_the_queued_data():
    sim, arrivals = incast()
    full = FRAME_BYTES * 8 / SLOW_PORT
    header = TRIMMED_FRAME_LEN * 8 / SLOW_PORT
    trims = SENDERS * PACKETS - 1 - QUEUE_FRAMES
    # Time for the frame that held the port and for every header of the burst, and for one
    # more full frame had the queued data gone first.
    sim.env.run(until=2 * full + trims * header)
    sizes = [len(frame) for frame in arrivals]
    assert sizes[0] == FRAME_BYTES
    assert len(sizes) > trims
    assert set(sizes[1:]) == {TRIMMED_FRAME_LEN}, "no queued DATA left while a header waited"
    assert sim.pipelines["s1"].ports[SENDERS + 1].low_bytes == QUEUE_FRAMES * FRAME_BYTES


PHASE_PACKETS = 300
"""Per sender: long enough for the shared port to trim a few hundred headers."""


def phase_trims(jitter_frames: float, seed: int) -> list[int]:
    """Two senders at the line rate (no congestion control) into one port as fast as either:
    the trimmed headers each of their flows brought the receiver."""
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("dcqcn"), line_rate_bps=1e9, rto=1e-2, rto_max=1.0, dcqcn="off"
        )
    )
    description = star(
        3, 1_000_000_000, 8 * FRAME_BYTES, ecn_kmin=NO_MARKS, ecn_kmax=NO_MARKS, ecn_pmax=0
    )
    sim = VirtualFabric(description, host, delay_s=1e-6, seed=seed, jitter_frames=jitter_frames)
    recorder = Recorder()
    sim.apps[2].append(recorder)
    for src in (0, 1):
        send(sim, src, 2, flow=10 + src, size=PHASE_PACKETS * PACKET_BYTES)
    sim.start()
    sim.run(lambda: {10, 11} <= set(recorder.done), limit_s=1.0)
    return [sim.hosts[2].endpoint.rx.flow_state(flow).trims for flow in (10, 11)]


def test_exact_timing_trims_one_of_two_equally_paced_senders_only():
    """Both senders' frames reach the full queue together, the first host's always first:
    the phase effect that `jitter_frames` exists to break (docs/simulation.md)."""
    first, second = phase_trims(0.0, seed=1)
    assert second > 200 and first < 0.05 * second


@pytest.mark.parametrize("seed", [1, 2])
def test_jittered_senders_share_the_trims(seed):
    trims = phase_trims(1.0, seed)
    assert min(trims) > 0.35 * sum(trims), trims


def test_jitter_is_seeded_and_refused_when_negative():
    assert phase_trims(1.0, seed=3) == phase_trims(1.0, seed=3)
    with pytest.raises(SimulationError, match="jitter_frames"):
        VirtualFabric(star(2), HostConfig(), delay_s=1e-6, jitter_frames=-1.0)
