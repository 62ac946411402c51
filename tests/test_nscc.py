"""NSCC against a reference model of its equations written here from uet-htsim's uec.cpp, the
sender's window and exemption under it, and one of uet-htsim's published incast results.

The reference keeps its state in a dict and computes every constant from the numbers
initNsccParams starts from (a 100 Gbps, 12 us reference network; 5, 0.15, 0.25 and 4
MSS-scaled factors; gamma 0.8; EWMA gain 0.0125; the quick-adapt gate 2^3), in the
order updateCwndOnAck_NSCC and updateCwndOnNack_NSCC apply them, with nothing shared
with host_agent.core.nscc but the event script.
"""

from __future__ import annotations

import json
import random

import pytest
from helpers import ack, nack, parse

from common.wire import DATA_FRAME_LEN as FRAME_BYTES
from common.wire import PACKET_BYTES, Flag
from host_agent.core import ForgiveSender, NsccParams, NsccWindow
from host_agent.endpoint import EndpointConfig
from host_agent.host import HostConfig
from host_agent.policies import parse_policy
from simulator.engine import VirtualFabric, star
from switch_model.surface import PMAX_ONE

ELIGIBLE = int(Flag.ELIGIBLE)
EXHAUSTED = int(Flag.ELIGIBLE | Flag.EXHAUSTED)
ECE = int(Flag.ECE)
MSS = 4096
# The note's fabric seen from a host: four 1 us links each way, and a 4154-byte frame and
# a 66-byte ACK serialised at 400 Gbps on each of the four hops.
NETWORK_RTT = 8e-6 + 4 * (4154 + 66) * 8 / 400e9
# (line rate, time scale): the fabric itself, and the emulation's default scaling of it.
LINKS = [(400e9, 1.0), (20e6, 312.5)]


def reference(line: float, scale: float) -> dict:
    """uet-htsim's initNsccParams and initNscc, at the note's 400 Gbps reference link."""
    shrink = line / 400e9 * scale  # bytes of the fabric -> bytes here
    mss = MSS * shrink
    bdp = NETWORK_RTT * 400e9 / 8
    a = bdp / (12e-6 * 100e9 / 8)
    target = 0.75 * NETWORK_RTT * scale
    b = target / (12e-6 * scale)
    base = NETWORK_RTT * scale
    maxwnd = max(1.5 * base * line / 8, MSS)
    return {
        "line": line,
        "target": target,
        "rtt": NETWORK_RTT * scale,
        "alpha": 4.0 * mss * a * b / target,
        "fi": 5 * mss * a,
        "eta": 0.15 * mss * a,
        "fi_scale": 0.25 * a,
        "qa_threshold": 4 * target,
        "adjust_bytes": 8 * mss,
        "fast_delay": 1e-6 * scale,
        "base": base,
        "measured": False,
        "maxwnd": maxwnd,
        "cwnd": maxwnd,
        "avg": 0.0,
        "achieved": 0.0,
        "received": 0.0,
        "inc": 0.0,
        "ignored": 0.0,
        "to_ignore": 0.0,
        "trigger": False,
        "qa_end": 0.0,
        "fi_count": 0.0,
        "increase": False,
        "last_dec": -1.0,
        "last_adjust": 0.0,
    }


def ref_base(s: dict, rtt: float) -> None:
    # update_base_rtt, except that the first sample replaces the configured guess
    if not s["measured"] or rtt < s["base"]:
        s["measured"] = True
        s["base"] = rtt
        s["maxwnd"] = max(1.5 * rtt * s["line"] / 8, MSS)


def ref_update_delay(s: dict, delay: float, skip: bool) -> None:
    if not skip and delay > s["target"]:
        s["avg"] = 0.0125 * s["base"] * 0.25 + (1 - 0.0125) * s["avg"]
    else:
        s["avg"] = 0.0125 * delay + (1 - 0.0125) * s["avg"]


def ref_bounds(s: dict) -> None:
    s["cwnd"] = min(max(s["cwnd"], MSS), s["maxwnd"])


def ref_quick_adapt(s: dict, is_loss: bool, skip: bool, delay: float, inflight, now) -> bool:
    done = False
    if s["ignored"] < s["to_ignore"] and skip:
        done = True
    elif now > s["qa_end"]:
        if (
            s["qa_end"] != 0
            and (s["trigger"] or is_loss or delay > s["qa_threshold"])
            and s["achieved"] < s["maxwnd"] / 8
        ):
            s["cwnd"] = max(s["achieved"], MSS)
            s["to_ignore"] = inflight
            s["ignored"] = 0.0
            s["trigger"] = False
            done = True
        s["achieved"] = 0.0
        s["qa_end"] = now + s["base"] + s["target"]
    if done:
        s["inc"] = 0.0
        s["received"] = 0.0
    return done


def ref_ack(s: dict, newly: int, rtt, skip: bool, inflight: int, now: float, full: bool) -> None:
    s["achieved"] += newly
    s["received"] += newly
    s["ignored"] += newly
    if rtt is not None and full:  # the base is a full-size packet's round trip
        ref_base(s, rtt)
    if rtt is not None and rtt >= s["base"]:
        ref_update_delay(s, rtt - s["base"], skip)
        delay = rtt - s["base"]
    else:
        delay = s["avg"]
    if ref_quick_adapt(s, False, skip, delay, inflight, now):
        return
    if not skip and delay >= s["target"]:
        s["inc"] += s["fi"] * newly  # fair_increase
    elif not skip:
        # proportional_increase, fast_increase first
        fast = False
        if delay < s["fast_delay"]:
            s["fi_count"] += newly
            if s["fi_count"] > s["cwnd"] or s["increase"]:
                s["cwnd"] += newly * s["fi_scale"]
                s["increase"] = True
                fast = True
        else:
            s["fi_count"] = 0.0
        if not fast:
            s["increase"] = False
            s["inc"] += s["alpha"] * newly * (s["target"] - delay)
    elif delay >= s["target"]:
        # multiplicative_decrease
        s["increase"] = False
        s["fi_count"] = 0.0
        if s["avg"] > s["target"] and now - s["last_dec"] > s["base"]:
            s["cwnd"] *= max(1 - 0.8 * (s["avg"] - s["target"]) / s["avg"], 0.5)
            s["cwnd"] = max(s["cwnd"], MSS)
            s["last_dec"] = now
    ref_bounds(s)
    if s["received"] > s["adjust_bytes"] or now - s["last_adjust"] > s["rtt"]:
        # fulfill_adjustment
        s["cwnd"] += s["inc"] / s["cwnd"]
        if now - s["last_adjust"] >= s["rtt"]:
            s["cwnd"] += s["eta"]
            s["last_adjust"] = now
        s["inc"] = 0.0
        s["received"] = 0.0
        ref_bounds(s)


def ref_nack(s: dict, nbytes: int, rtt, inflight: int, now: float) -> None:
    if rtt is not None:
        ref_base(s, rtt)
    s["ignored"] += nbytes
    ref_update_delay(s, s["rtt"], True)
    s["trigger"] = True
    if ref_quick_adapt(s, True, True, 0.0, inflight, now):
        return
    s["cwnd"] -= nbytes
    ref_bounds(s)


def script(scale: float, seed: int, n: int = 3000):
    """ACKs and NACKs of one flow: round trips from the base to many targets of queueing,
    marks more likely the longer the queue, now and then a NACK, and now and then the ACK
    of a short segment, whose round trip is shorter than the base."""
    rng = random.Random(seed)
    rtt0 = NETWORK_RTT * scale
    t, out = 1e-9, []
    for _ in range(n):
        t += rng.expovariate(1 / (0.3 * rtt0))
        queue = rng.choice([0.0, 0.01, 0.05, 0.3, 0.7, 1.2, 3.0, 6.0]) * rtt0
        rtt = None if rng.random() < 0.1 else rtt0 * rng.uniform(0.95, 1.05) + queue
        inflight = rng.randrange(0, 200) * MSS
        if rng.random() < 0.05:
            out.append(("nack", MSS, rtt, inflight, t))
        else:
            marked = rng.random() < min(1.0, queue / (2 * rtt0))
            full = rng.random() < 0.9
            if not full and rtt is not None:
                rtt *= 0.5
            newly = rng.choice([MSS, 2 * MSS, 8 * MSS, 32 * MSS])
            out.append(("ack", newly, rtt, marked, inflight, t, full))
    return out


@pytest.mark.parametrize("line,scale", LINKS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_window_follows_the_reference_equations(line, scale, seed):
    params = NsccParams.for_link(line, scale)
    window = NsccWindow(params, 0.0)
    ref = reference(line, scale)
    assert window.window == pytest.approx(ref["cwnd"], rel=1e-12)
    reactions = set()
    for event in script(scale, seed):
        if event[0] == "ack":
            _, newly, rtt, marked, inflight, t, full = event
            window.on_ack(newly, rtt, marked, inflight, t, full=full)
            ref_ack(ref, newly, rtt, marked, inflight, t, full)
        else:
            _, nbytes, rtt, inflight, t = event
            window.on_nack(nbytes, rtt, inflight, t)
            ref_nack(ref, nbytes, rtt, inflight, t)
        assert window.window == pytest.approx(ref["cwnd"], rel=1e-9, abs=1e-9 * MSS)
        assert window.avg_delay == pytest.approx(ref["avg"], rel=1e-9, abs=1e-18)
        reactions.add(round(window.window / max(ref["maxwnd"], 1), 1))
    # The script drives the window over much of its range, not one corner of it.
    assert len(reactions) > 5


def test_constants_at_400_gbps():
    """uet-htsim's values for the note's fabric: a = 2.78 (an 8.3 us round trip at 400 Gbps
    over 12 us at 100 Gbps), a 6.3 us target, 150 packets of window."""
    p = NsccParams.for_link(400e9)
    assert p.scaling_a == pytest.approx(2.78, abs=0.005)
    assert p.target_delay == pytest.approx(6.25e-6, abs=0.01e-6)
    assert p.fair_increase == pytest.approx(5 * MSS * p.scaling_a)
    assert p.max_window(p.network_rtt) / MSS == pytest.approx(152.67, abs=0.01)
    # The emulation's clock 312.5 times slower at 20 Mbit/s: bytes / 64, periods x 312.5.
    q = NsccParams.for_link(20e6, 312.5)
    assert q.target_delay == pytest.approx(312.5 * p.target_delay)
    assert q.fair_increase == pytest.approx(p.fair_increase / 64)


def test_bad_constants_are_refused():
    with pytest.raises(ValueError, match="gamma"):
        NsccParams(line_rate_bps=400e9, gamma=1.5)
    with pytest.raises(ValueError, match="time_scale"):
        NsccParams(line_rate_bps=400e9, time_scale=0)


# -- the sender under NSCC --------------------------------------------------------------------

K = PACKET_BYTES


def nscc_sender(line: float = 400e9) -> ForgiveSender:
    return ForgiveSender(NsccParams.for_link(line), rto=1.0, rto_max=2.0)


def sent(tx: ForgiveSender, now: float) -> list:
    return parse(tx.poll(now))


def test_the_window_holds_the_bytes_in_flight_and_an_ack_frees_room():
    tx = nscc_sender()
    tx.open_flow(1, 1000 * K, 0.0)
    window = tx._flows[1].rate.window
    first = []
    t = 0.0
    while t < 40e-6:  # three times as long as the window takes at the line rate
        first += sent(tx, t)
        t += 1e-7
    assert len(first) == int(window // K), "sends until the window is full, then waits"
    tx.receive(ack(1, 4 * K, 3 * K, K), t)
    more = []
    for k in range(20):
        more += sent(tx, t + k * 1e-7)
    flow = tx._flows[1]
    assert len(more) >= 4, "four packets acknowledged, at least four sent (the window grew)"
    assert flow.in_flight() <= flow.rate.window < flow.in_flight() + K, "and full again"


def deep_marked_acks(tx: ForgiveSender, flags: int, start: int, n: int, t0: float) -> float:
    """n marked ACKs of segments that waited many targets in queues."""
    flow = tx._flows[1]
    t = t0
    for k in range(start, start + n):
        t += 1e-6
        flow.inflight[k * K] = ((k + 1) * K, t - 60e-6, False)  # sent 60 us before
        tx.receive(ack(1, (k + 1) * K, k * K, K, flags | ECE), t)
    return t


def test_exempt_window_ignores_marks_and_delay_then_obeys_from_the_window_it_holds():
    tx = nscc_sender()
    tx.open_flow(1, 10_000 * K, 0.0)
    for t in range(200):
        tx.poll(t * 1e-9)
    flow = tx._flows[1]
    # A first unmarked ACK at the base round trip, so the flow knows its path.
    flow.inflight[0] = (K, 0.0, False)
    tx.receive(ack(1, K, 0, K, ELIGIBLE), NETWORK_RTT)
    held = flow.rate.window
    t = deep_marked_acks(tx, ELIGIBLE, 1, 100, 20e-6)
    tx.receive(nack(1, 101 * K, K, 101 * K, ELIGIBLE), t + 1e-6)
    assert flow.cc_mode == "exempt"
    assert flow.rate.window >= held, "marks, delay and a NACK move nothing while exempt"
    assert flow.rate.cuts == 0
    assert flow.rate.avg_delay > flow.rate.params.target_delay, "but delay is still measured"
    exempt_window = flow.rate.window
    deep_marked_acks(tx, EXHAUSTED, 102, 1, t + 2e-6)
    assert flow.cc_mode == "obeying"
    assert flow.rate.cuts == 1
    assert flow.rate.window < exempt_window
    assert flow.rate.window >= 0.5 * exempt_window, "one decrease, from the window it held"


def ring_step(tx: ForgiveSender, flow: int, packets: int, rtt: float, t0: float) -> float:
    """Send a flow of full packets to one peer, then acknowledge each, unmarked, `rtt` after
    it left; returns when the last ACK came."""
    tx.open_flow(flow, packets * K, t0, peer="next")
    t = t0
    while tx._flows[flow].next_new < packets * K:
        tx.poll(t)
        t += 1e-9
    sent = {lo: at for lo, (_, at, _) in tx._flows[flow].inflight.items()}
    for k in range(packets):
        t = sent[k * K] + rtt
        tx.receive(ack(flow, (k + 1) * K, k * K, K), t)
    return t


@pytest.mark.parametrize("queued", [0.3e-6, 3e-6])
def test_a_short_flows_smoothed_delay_is_its_paths_not_its_queues(queued):
    """The note's ring step at bytes / 32 (8 packets over four hops, 1 us links shrunk 32
    times) with every round trip queued above the target and unmarked: each sample enters
    the average as a quarter of the base round trip whatever the queue, the ACK that ends
    the flow included, so the recorded average is B/4 (1 - 0.9875^8) = 0.0140 us for
    B = 0.587 us, however long the queue (docs/nscc.md)."""
    tx = ForgiveSender(NsccParams.for_link(400e9, 1 / 32), rto=1.0, rto_max=2.0)
    base = 8 * 1e-6 / 32 + 4 * (FRAME_BYTES + 58) * 8 / 400e9
    end = ring_step(tx, 1, 1, base, 0.0)  # an earlier flow, one packet, measures the base
    assert tx.flow_state(1).window.base_rtt == base
    ring_step(tx, 2, 8, base + queued, end + 1e-6)
    window = tx.flow_state(2).window
    assert queued > tx._flows[2].rate.params.target_delay
    assert window.base_rtt == base
    assert window.avg_delay == pytest.approx(base / 4 * (1 - 0.9875**8), rel=1e-12)
    assert round(window.avg_delay * 1e6, 4) == 0.0140


def test_cnps_do_not_move_the_window():
    tx = nscc_sender()
    tx.open_flow(1, 100 * K, 0.0)
    before = tx._flows[1].rate.window
    from helpers import cnp

    tx.receive(cnp(1), 1e-6)
    assert tx._flows[1].rate.window == before
    assert tx.flow_state(1).cnps == 1


# -- against uet-htsim's published incast ------------------------------------------------------

HTSIM_8_TO_1 = {"tail_fct_us": 206.316, "rtx_packets": 1020}
"""htsim/sim/datacenter/results/experiment2_out.txt, "incast 400 Gbps _4_to_1 1 MB 8
connections 0 startdelta algorithm nscc": 8 flows of 1 MiB into one 400 Gbps host over the
4:1 leaf-spine with 1 us links, queues of 100 packets, ECN from 25 to 75 packets, an
initial window of 150 packets and an ACK per packet; tail FCT 206.316 us, 1020 packets
retransmitted (New 2056)."""


class _Starter:
    """Starts one flow at a given time (the senders are offset by a fraction of a frame, so
    that no two frames reach the switch at the same instant)."""

    def __init__(self, sim, src: int, dst: int, at: float) -> None:
        self.sim, self.src, self.dst, self.at = sim, src, dst, at

    def handle_event(self, event, now: float) -> None:
        pass

    def get_timer(self):
        return self.at

    def handle_timer(self, now: float) -> None:
        self.at = None
        ep = self.sim.hosts[self.dst].endpoint
        ep.register_flow(100 + self.src, 0, "other", now)
        self.sim.hosts[self.src].endpoint.send(
            self.sim.hosts[self.dst].config.ip, 100 + self.src, bytes(1 << 20), "other", now
        )


class _Done:
    def __init__(self) -> None:
        self.done: dict[int, float] = {}

    def handle_event(self, event, now: float) -> None:
        if type(event).__name__ == "RecvDone":
            self.done[event.flow] = now

    def get_timer(self):
        return None

    def handle_timer(self, now: float) -> None:
        pass


def test_an_8_to_1_incast_lands_near_uet_htsims_published_result():
    """Tolerances: retransmissions within 10 percent, since they are set by what NSCC does
    before its first quick adapt (150 packets in flight per sender against a 100-packet
    queue), which both runs share. Tail FCT within 15 percent: here the receiver's port is
    the only queue (one switch, 2 us links so the round trip is the same 8.3 us), where
    uet-htsim's leaf-spine spreads the flows over 32 paths whose spine downlinks can
    collide, and its packets carry 4086 payload bytes in 4150 against 4096 in 4154."""
    n = 8
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("dcqcn"),
            line_rate_bps=400e9,
            rto=200e-6,
            rto_max=2e-3,
            cc="nscc",  # and so an ACK per packet, as uet-htsim's receiver sends them
        )
    )
    fabric = star(
        n + 1,
        port_rate_bps=int(400e9),
        data_queue_bytes=100 * FRAME_BYTES,
        ecn_kmin=25 * FRAME_BYTES,
        ecn_kmax=75 * FRAME_BYTES,
        ecn_pmax=PMAX_ONE,
    )
    sim = VirtualFabric(fabric, host, delay_s=2e-6, seed=1)
    done = _Done()
    sim.apps[n].append(done)
    frame_time = FRAME_BYTES * 8 / 400e9
    for src in range(n):
        sim.apps[src].append(_Starter(sim, src, n, src * frame_time / n))
    sim.start()
    sim.run(lambda: len(done.done) == n, limit_s=0.1)
    tail_us = 1e6 * max(done.done.values())
    trims = sim.switch_totals()["s1"]["trims"]
    print(
        f"8-to-1 incast: tail FCT {tail_us:.1f} us (uet-htsim {HTSIM_8_TO_1['tail_fct_us']}),"
        f" {trims} trimmed (uet-htsim {HTSIM_8_TO_1['rtx_packets']} retransmitted)"
    )
    assert trims == pytest.approx(HTSIM_8_TO_1["rtx_packets"], rel=0.10)
    assert tail_us == pytest.approx(HTSIM_8_TO_1["tail_fct_us"], rel=0.15)
    # Without NSCC's reaction the same burst would trim far more: the window's cut is
    # what keeps it near uet-htsim's figure (an ideal 8 MiB at 400 Gbps takes 168 us).
    assert tail_us > 8 * (1 << 20) * 8 / 400e9 * 1e6


def test_the_emulation_gives_every_trainer_nscc_with_its_timers_stretched(tmp_path):
    """Both engines build the sender from the same EndpointConfig: the simulator directly,
    the emulation through the host entry each trainer is given as JSON, which must carry
    the congestion control."""
    from commands.train import agent_config
    from host_agent.endpoint import Endpoint
    from runplan.fabric import preset
    from runplan.run import RunConfig, plan_run
    from workload.hostplan import HostEntry

    config = RunConfig(preset("2to1"), cc="nscc")
    entry = plan_run(config, tmp_path).hosts[0]
    endpoint = Endpoint(agent_config(HostEntry.from_json(entry.to_json())).host.endpoint)
    params = endpoint.tx.params
    scaling = config.fabric.scaling
    assert isinstance(params, NsccParams)
    assert params.time_scale == scaling.time_scale == 312.5
    assert params.target_delay == pytest.approx(312.5 * 0.75 * NETWORK_RTT)
    assert params.line_rate_bps == scaling.rate(400e9)
    assert endpoint.acks.every == 1


def test_training_under_nscc_keeps_the_bound_and_repeats_byte_for_byte():
    """The training job of test_virtual_fabric with NSCC in every sender: every rank
    finishes within its loss bound, the windows are recorded, and one seed gives the
    same records twice."""
    from simulator.engine import train
    from workload.plan import TrainingConfig

    job = TrainingConfig(
        ranks=("", "", "", ""), rank=0, steps=6, grad_bytes=256 << 10, compute_s=0.5e-3,
        tp_bytes=32 << 10, pp_bytes=16 << 10, seed=3,
    )  # fmt: skip
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("forgive"), rto=1e-3, rto_max=0.02, line_rate_bps=10e9, cc="nscc"
        )
    )
    runs = [train(job, star(hosts=4), host) for _ in range(2)]
    (sim, ranks, outs), (again, _, outs_again) = runs
    assert all(r.finished and not r.failed for r in ranks)
    steps = [json.loads(line) for out in outs for line in out.getvalue().splitlines()]
    assert all(s["bound_held"] for s in steps if s["type"] == "train_step")
    logs = [log.getvalue() for log in sim.logs]
    assert any('"window": {"window_bytes"' in log for log in logs)
    assert [o.getvalue() for o in outs] == [o.getvalue() for o in outs_again]
    assert logs == [log.getvalue() for log in again.logs]
