"""The sans-IO host without sockets or root: ACK coalescing inside the endpoint, the
independent bound checks, shedding, and the framing of `Host`, over in-memory frames."""

from __future__ import annotations

import io
import json

import pytest
from helpers import ack, data, trim

from common.frames import FrameBuilder, ip_bytes, mac_bytes, parse
from common.wire import Dscp, Flag, Fth, Opcode, decode
from host_agent.acks import ACK_DELAY, AckCoalescer
from host_agent.endpoint import Endpoint, EndpointConfig
from host_agent.events import BoundViolation, FlowFailed, RecvDone, SendDone, Shed
from host_agent.host import Host, HostConfig
from host_agent.policies import parse_policy
from host_agent.stats import StatsLog
from simulator.engine import VirtualFabric, host_ports, star
from workload.plan import Kind, TrainingConfig, flow_id
from workload.rank import Rank

PEER = ip_bytes("10.0.0.2")


def events(endpoint: Endpoint) -> list:
    out = []
    while (event := endpoint.next_event()) is not None:
        out.append(event)
    return out


def test_an_ack_that_changes_the_mode_is_sent_at_once():
    """ELIGIBLE/EXHAUSTED differing from the last report sent on the flow skip the hold."""
    coalescer = AckCoalescer(every=32, delay=1.0)
    total = 100_000
    assert coalescer.offer(ack(1, 1000, 0, 1000), None, 0.0, total) == []
    eligible = ack(1, 2000, 1000, 1000, Flag.ELIGIBLE)
    assert [r for r, _ in coalescer.offer(eligible, None, 0.0, total)] == [
        ack(1, 1000, 0, 1000),
        eligible,
    ], "the held ACK first, then the mode change, at once"
    # Same flags again: held as before.
    assert coalescer.offer(ack(1, 3000, 2000, 1000, Flag.ELIGIBLE), None, 0.0, total) == []
    exhausted = ack(1, 4000, 3000, 1000, Flag.ELIGIBLE | Flag.EXHAUSTED)
    assert [r for r, _ in coalescer.offer(exhausted, None, 0.0, total)][-1] == exhausted
    # A first ACK that is already exempt changes the sender's initial (obeying) mode.
    assert coalescer.offer(ack(2, 1000, 0, 1000, Flag.ELIGIBLE), None, 0.0, total) != []


def test_the_ack_hold_time_scales_with_the_run():
    for scale in (1.0, 5.0):
        endpoint = Endpoint(EndpointConfig(policy=parse_policy("dcqcn"), time_scale=scale))
        endpoint.register_flow(7, 0, "other", 0.0)
        endpoint.receive(data(7, 0, 1000, 100_000), PEER, False, 5.0)
        assert endpoint.datagrams_to_send(5.0) == [], "a plain ACK is held"
        assert endpoint.get_timer() == pytest.approx(5.0 + ACK_DELAY * scale)
        endpoint.handle_timer(5.0 + ACK_DELAY * scale)
        ((peer, dscp, _, reply),) = endpoint.datagrams_to_send(5.0 + ACK_DELAY * scale)
        assert peer == PEER and dscp == Dscp.CONTROL and decode(reply)[0].seq == 1000


def test_an_ack_is_never_held_past_a_quarter_of_the_first_timeout():
    """At a fabric's own rates the first timeout is microseconds: a held ACK would fire it."""
    rto = 20e-6
    config = EndpointConfig(policy=parse_policy("dcqcn"), rto=rto, rto_max=10 * rto)
    endpoint = Endpoint(config)
    endpoint.register_flow(7, 0, "other", 0.0)
    endpoint.receive(data(7, 0, 1000, 100_000), PEER, False, 5.0)
    assert endpoint.datagrams_to_send(5.0) == [], "a plain ACK is held"
    assert endpoint.get_timer() == pytest.approx(5.0 + rto / 4)


def test_the_bound_check_does_not_trust_the_cores_budget():
    endpoint = Endpoint(EndpointConfig(policy=parse_policy("forgive")), warn=lambda m: None)
    endpoint.begin_step(1, False, 100_000, 0.0)
    assert events(endpoint) == []
    step = endpoint.rx._steps[1]
    step.budget = step.expected  # a receiver core that claims a budget of every expected byte
    endpoint.register_flow(5, 1, "gradient", 0.0)
    endpoint.receive(trim(5, 0, 4096, 100_000), PEER, False, 0.0)
    (violation,) = events(endpoint)
    assert isinstance(violation, BoundViolation) and violation.where == "trim"
    assert "budget 100000 != floor(p * expected) = 10000" in violation.problem
    assert endpoint.counters["bound_violations"] == 1


def test_a_completed_step_must_account_for_every_expected_byte():
    endpoint = Endpoint(EndpointConfig(policy=parse_policy("forgive")), warn=lambda m: None)
    endpoint.begin_step(2, False, 8192, 0.0)
    endpoint.register_flow(9, 2, "gradient", 0.0)
    endpoint.receive(data(9, 0, 4096, 4096), PEER, False, 0.0)
    assert [type(e) for e in events(endpoint)] == [RecvDone]
    endpoint.complete_step(2, 0.0)  # the workload said 8192 bytes, one flow of 4096 came
    (violation,) = events(endpoint)
    assert isinstance(violation, BoundViolation) and violation.where == "complete_step"
    assert violation.problem.startswith("received 4096 + forgiven 0 + shed 0 != expected 8192")


def test_a_step_settled_by_arrivals_and_forgiveness_passes_every_check():
    endpoint = Endpoint(EndpointConfig(policy=parse_policy("forgive")), warn=lambda m: None)
    endpoint.begin_step(3, False, 40960, 0.0)  # budget 4096
    for flow in (1, 2, 3):
        endpoint.register_flow(flow, 3, "gradient", 0.0)
    for seq in range(0, 36864, 4096):
        endpoint.receive(data(1, seq, 4096, 36864), PEER, False, 0.0)
    endpoint.receive(trim(2, 0, 4096, 4096), PEER, False, 0.0)  # forgiven: 4096 <= 0.1 * 40960
    assert endpoint.rx.step_state(3).forgiven == 4096
    endpoint.complete_step(3, 0.0)  # flow 3 (no bytes expected of it) is open: nothing to check
    assert endpoint.step_problem(3) is None
    assert [type(e) for e in events(endpoint)] == [RecvDone, RecvDone]


def test_trims_are_profiled_over_the_step_with_what_vesting_forgave():
    """Step 4 runs from 1.0 to 2.0: a trim early is refused (nothing vested), a trim late,
    after 36 KiB arrived, is forgiven; a TP trim counts as trimmed but not gradient."""
    endpoint = Endpoint(EndpointConfig(policy=parse_policy("forgive")), warn=lambda m: None)
    endpoint.begin_step(4, False, 40960, 0.5)
    endpoint.register_flow(1, 4, "gradient", 0.5)
    endpoint.register_flow(2, 4, "gradient", 0.5)
    endpoint.register_flow(3, 4, "tensor-parallel", 0.5)
    endpoint.receive(trim(2, 0, 4096, 4096), PEER, False, 1.05)  # refused: nothing vested yet
    endpoint.receive(trim(3, 0, 1000, 1000), PEER, False, 1.5)
    for seq in range(0, 36864, 4096):
        endpoint.receive(data(1, seq, 4096, 36864), PEER, False, 1.6)
    endpoint.receive(trim(2, 0, 4096, 4096), PEER, False, 1.9)  # forgiven now
    profile = endpoint.trim_profile(4, 1.0, 2.0)
    assert profile == [[4096, 4096, 0], [0, 0, 0], [1000, 0, 0], [0, 0, 0], [4096, 4096, 4096]]
    done = {e.flow: e for e in events(endpoint) if isinstance(e, RecvDone)}
    assert done[2].trimmed_bytes == 8192 and done[1].trimmed_bytes == 0
    endpoint.forget_step(4)
    with pytest.raises(ValueError, match="forgotten"):
        endpoint.trim_profile(4, 1.0, 2.0)


@pytest.mark.parametrize(
    ("profile", "window_end"), [("paper", True), ("nic", False), ("off", False)]
)
def test_the_dcqcn_profile_reaches_both_halves_of_the_endpoint(profile, window_end):
    endpoint = Endpoint(EndpointConfig(dcqcn=profile, line_rate_bps=1e9, time_scale=2.0))
    assert endpoint.tx.params.profile == profile
    assert endpoint.rx.policy.cnp_at_window_end is window_end
    assert endpoint.rx.policy.cnp_interval == pytest.approx(2.0 * endpoint.tx.params.cnp_interval_s)
    with pytest.raises(ValueError, match="unknown DCQCN profile"):
        EndpointConfig(dcqcn="ns3").validate()


def test_shedding_ends_agree_without_a_packet():
    sender, receiver = (Endpoint(EndpointConfig(policy=parse_policy("loose"))) for _ in range(2))
    shed = sent = 0
    for end in (sender, receiver):
        end.begin_step(1, False, 0, 0.0)
    for flow in range(40):
        receiver.register_flow(flow, 1, "gradient", 0.0, size=1000)
        sender.send("10.0.0.9", flow, bytes(1000), "gradient", 0.0, step=1)
    rx_shed = {e.flow for e in events(receiver) if isinstance(e, Shed) and not e.sending}
    tx_shed = {e.flow for e in events(sender) if isinstance(e, Shed) and e.sending}
    shed, sent = len(rx_shed), 40 - len(tx_shed)
    assert rx_shed == tx_shed and 0 < shed < 40 and sent > 0


def wire(a: Host, b: Host, until, limit: int = 100_000, tap=None) -> float:
    """Move frames between two hosts with no delay, in virtual time, until `until()`;
    `tap(dst, frame)` sees each frame on its way."""
    now = 0.0
    for _ in range(limit):
        moved = False
        for src, dst in ((a, b), (b, a)):
            for parts in src.frames_to_send(now):
                frame = b"".join(parts)
                if tap is not None:
                    tap(dst, frame)
                dst.receive_frame(frame, now)
                moved = True
        if until():
            return now
        if not moved:
            timers = [t for t in (a.get_timer(), b.get_timer()) if t is not None]
            assert timers, "the link went idle"
            now = max(now, min(timers))
            a.handle_timer(now)
            b.handle_timer(now)
    raise AssertionError("no end within the limit")


def pair(**endpoint) -> tuple[Host, Host]:
    config = EndpointConfig(policy=parse_policy("forgive"), **endpoint)
    a = Host(HostConfig(endpoint=config, neighbors={"10.0.0.2": "02:00:00:00:00:02"}),
             mac_bytes("02:00:00:00:00:01"), "10.0.0.1")  # fmt: skip
    b = Host(HostConfig(endpoint=config, neighbors={"10.0.0.1": "02:00:00:00:00:01"}),
             mac_bytes("02:00:00:00:00:02"), "10.0.0.2")  # fmt: skip
    return a, b


def test_two_hosts_deliver_every_byte_with_class_and_ecn_on_the_frames():
    a, b = pair()
    seen = []
    payload = bytes(range(256)) * 300
    b.endpoint.register_flow(4, 0, "pipeline-parallel", 0.0, deliver=True)
    a.endpoint.send("10.0.0.2", 4, payload, "pipeline-parallel", 0.0)
    got: list = []

    def finished():
        for host in (a, b):
            while (e := host.next_event()) is not None:
                got.append(e)
        return len(got) == 2

    wire(a, b, finished, tap=lambda dst, frame: dst is b and seen.append(parse(frame)))
    recv = next(e for e in got if isinstance(e, RecvDone))
    send = next(e for e in got if isinstance(e, SendDone))
    assert recv.payload == payload and send.acked_bytes == len(payload) and send.dst == "10.0.0.2"
    assert seen and all(s.dscp == Dscp.PIPELINE_PARALLEL and not s.ce for s in seen)
    assert len({s.sport for s in seen}) > 1, "spraying varies the source port"


def test_malformed_and_foreign_frames_are_counted_and_dropped():
    _, b = pair()
    b.endpoint.register_flow(77, 0, "other", 0.0, deliver=True)
    builder = FrameBuilder(mac_bytes("02:00:00:00:00:01"), ip_bytes("10.0.0.1"))
    body = Fth(Opcode.DATA, Flag(0), 100, 77, 0, 100).encode(bytes(100))

    def frame(fth: bytes, dst: str = "10.0.0.2") -> bytes:
        return builder.headers(b.mac, ip_bytes(dst), 10, 2, 40000, len(fth)) + fth

    broken = bytearray(frame(body))
    broken[25] ^= 0xFF  # IPv4 checksum
    for raw in (frame(b"\x10\x00"), frame(body[:-1]), bytes(broken), frame(body, "10.0.0.9")):
        b.receive_frame(raw, 0.0)
    b.receive_frame(frame(Fth(Opcode.ACK, Flag(0), 100, 999, 100, 0).encode()), 0.0)
    b.receive_frame(bytes(60), 0.0)
    summary = b.endpoint.summary()
    assert summary["malformed_frames"] == 2 and summary["not_for_us"] == 1
    assert summary["ignored_frames"] == 1
    assert summary["core_rx"]["malformed"] == 1 and summary["core_tx"]["unknown_flow"] == 1
    b.receive_frame(frame(body), 0.0)
    (event,) = [e for e in iter(b.next_event, None)]
    assert isinstance(event, RecvDone) and event.payload == bytes(100)


def test_a_flow_nobody_acknowledges_fails_once_and_stops():
    log = io.StringIO()
    config = EndpointConfig(policy=parse_policy("forgive"), rto=1e-3, rto_max=4e-3, max_timeouts=3)
    sender = Endpoint(config, StatsLog(log, "10.0.0.1"), warn=lambda m: None)
    sender.send("10.0.0.2", 11, bytes(20_000), "gradient", 0.0, step=1)
    now, sent = 0.0, 0
    while (timer := sender.get_timer()) is not None:
        now = max(now, timer)
        sender.handle_timer(now)
        sent += len(sender.datagrams_to_send(now))
        assert now < 1.0, "a flow must not retransmit for ever"
    (failed,) = events(sender)
    assert isinstance(failed, FlowFailed) and failed.flow == 11 and failed.dst == "10.0.0.2"
    assert (
        failed.acked_bytes == 0
        and failed.rtos >= 3
        and "3 retransmission timeout rounds in a row" in failed.reason
    )
    assert sent > 5 and sender.datagrams_to_send(now + 1.0) == []
    assert sender.summary()["flows_failed"] == 1
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [r["type"] for r in records] == ["flow_failed"] and records[0]["flow"] == 11


def test_a_rank_whose_peer_never_answers_fails_with_a_reason():
    """Rank 1 has a host but no training loop: its receiver knows none of rank 0's flows."""
    fabric = star(hosts=2)
    ips = [h.ip for h in host_ports(fabric)]
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("forgive"), rto=1e-3, rto_max=4e-3, max_timeouts=3
        )
    )
    sim = VirtualFabric(fabric, host, delay_s=2e-6)
    cfg = TrainingConfig(ranks=(ips[0], ips[1]), rank=0, steps=2)
    out = io.StringIO()
    rank = Rank(cfg, sim.hosts[0].endpoint, out)
    sim.apps[0].append(rank)
    rank.start(0.0)
    sim.start()
    sim.run(lambda: rank.finished, limit_s=5.0)
    assert rank.failed and rank.failure is not None
    assert rank.failure.startswith(f"flow {flow_id(0, Kind.BARRIER, 0, 1)} to 10.0.0.2 failed: ")
    assert "\n" not in rank.failure and sim.now < 1.0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["type"] for r in records] == ["loss_layout", "train_failed"]
    assert records[1]["reason"] == rank.failure


def test_a_sender_whose_last_ack_was_lost_completes_after_the_receiver_forgot_the_flow():
    """A barrier's sender does not wait for its last ACK before its next step (only its
    receives end a step), so the receiver may finish that step and forget the flow while
    the ACK is lost (to a switch restarting, say). The sender's resends must still be
    answered, or the flow fails after max_timeouts rounds, and its rank with it."""
    a, b = pair(rto=1e-3, rto_max=4e-3, max_timeouts=3)
    b.endpoint.begin_step(1, critical=True, expected_gradient_bytes=0, now=0.0)
    b.endpoint.register_flow(9, 1, "other", 0.0)
    a.endpoint.send("10.0.0.2", 9, bytes(9000), "other", 0.0, step=1)
    now, received = 0.0, []
    while not received:  # every frame from b lost
        for parts in a.frames_to_send(now):
            b.receive_frame(b"".join(parts), now)
        b.frames_to_send(now)
        received = [e for e in events(b.endpoint) if isinstance(e, RecvDone)]
        now = max(now, a.get_timer() or now)
        a.handle_timer(now)
    b.endpoint.forget_step(1)  # the step after it has finished at b
    assert b.endpoint.rx.flow_state(9) is None
    sent: list = []
    wire(a, b, lambda: bool(sent.extend(events(a.endpoint)) or sent))
    (done,) = sent
    assert isinstance(done, SendDone) and done.acked_bytes == 9000, done
    assert b.endpoint.summary()["core_rx"]["unknown_flow"] == 0


def test_a_batch_of_acks_is_applied_before_the_sender_runs_again():
    """Host.receive_frames, the raw-socket agent's read of a backlog: the ACKs are taken
    in, but nothing the sender's timers would resend goes out until the next pump."""
    a, b = pair(rto=1e-3, rto_max=4e-3, max_timeouts=3, ack_every=1)
    b.endpoint.register_flow(5, 0, "other", 0.0)
    a.endpoint.send("10.0.0.2", 5, bytes(40_000), "other", 0.0)
    now, acks = 0.0, []
    while len(acks) < 10:  # every DATA to b, none of b's ACKs back yet
        for parts in a.frames_to_send(now):
            b.receive_frame(b"".join(parts), now)
        acks += [b"".join(parts) for parts in b.frames_to_send(now)]
        now = a.get_timer() or now
    late = now + 0.5  # long past every segment's timeout
    out: list = []
    a.receive_frames(acks[:5], lambda: late, [], out.append)
    assert out == [], "the batch is read; the sender has not run"
    a.pump([], late, out.append)
    resent = [decode(frame[-1])[0] for frames in out for frame in frames]
    assert resent and all(f.opcode == Opcode.DATA and f.flags & Flag.RETX for f in resent)
    acked = {decode(ack[42:])[0].aux for ack in acks[:5]}
    assert not acked & {f.seq for f in resent}, "nothing the batch acknowledged is resent"
