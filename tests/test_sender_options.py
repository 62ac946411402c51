"""The sender's options beside DCQCN: a bandwidth-delay window, DCQCN state per QP, the payload
per packet; and how fabric files and command lines set them (and the TP phase)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from helpers import ack, cnp
from link import Impairments, Link

from common.wire import PACKET_BYTES, decode
from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy
from runplan.fabric import FabricError, parse, plan, preset, with_scaling
from runplan.run import RunConfig, bdp_bytes
from runplan.scaling import Scaling
from runs.cache import run_key
from runs.options import with_regime

K = PACKET_BYTES
LINE = 10e9
FULL = with_scaling(preset("note-4to1"), Scaling(host_link_bps=400e9, byte_scale=1))
"""The note's 4:1 fabric at its own rates and bytes."""


def carried(tx: ForgiveSender, size: int, delay: float) -> float:
    """Send one flow of `size` bytes over an idle link with `delay` each way; its duration."""
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0))
    rx.begin_step(1, critical=False, expected_bytes=size)
    rx.register_flow(1, step=1, gradient=True, size=size)
    tx.open_flow(1, size, now=0.0)
    imp = Impairments(delay=delay)
    Link(tx, rx, forward=imp, reverse=Impairments(delay=delay)).run(1.0)
    state = tx.flow_state(1)
    assert state.done
    return state.finished - state.opened


@pytest.mark.parametrize("packets", [4, 10, 25])
def test_a_window_limited_flow_on_an_idle_link_runs_at_window_over_rtt(packets):
    delay, size = 50e-6, 400 * K
    window = packets * K
    tx = ForgiveSender(DcqcnParams(line_rate_bps=LINE), rto=1.0, rto_max=1.0, window_bytes=window)
    rtt, wire = 2 * delay, (K + 58) * 8 / LINE
    assert packets * wire < rtt  # the window, not the line, limits it
    # window / RTT, and the last window's own serialisation
    assert carried(tx, size, delay) == pytest.approx(
        size / (window / rtt) + packets * wire, rel=0.01
    )


def test_without_a_window_the_same_flow_runs_at_the_line_rate():
    delay, size = 50e-6, 400 * K
    tx = ForgiveSender(DcqcnParams(line_rate_bps=LINE), rto=1.0, rto_max=1.0)
    wire = (K + 58) * 8 / LINE
    assert carried(tx, size, delay) == pytest.approx(400 * wire + 2 * delay, rel=0.02)


def test_the_window_shrinks_with_the_rate():
    """ns-3's VAR_WIN: at half the line rate, half the window is allowed in flight."""
    tx = ForgiveSender(DcqcnParams(line_rate_bps=LINE), rto=1.0, rto_max=1.0, window_bytes=8 * K)
    tx.open_flow(1, 100 * K, now=0.0)
    tx.receive(cnp(1), 0.0)  # the paper profile: alpha 1, one cut to half the line rate
    assert tx.flow_state(1).rate_bps == LINE / 2
    sent, now = 0, 0.0
    while now < 1e-3:
        sent += len(tx.poll(now))
        deadline = tx.next_deadline()
        if deadline is None or deadline > 1e-3:
            break
        now = deadline
    assert sent == 4  # 4 K in flight < 8 K x 1/2 stops at the fifth


@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_qp_state_carries_alpha_and_rate_from_one_message_to_the_next(profile):
    def run(qp_state: bool):
        tx = ForgiveSender(
            DcqcnParams.for_profile(profile, LINE), rto=1.0, rto_max=1.0, qp_state=qp_state
        )
        tx.open_flow(1, K, now=0.0, peer="b", qp=("b", "gradient"))
        tx.poll(0.0)
        for t in (1e-6, 6e-6):
            tx.receive(cnp(1), t)
        tx.poll(10e-6)  # the nic profile's checks have taken both cuts by now
        tx.receive(ack(1, K, 0, K), 11e-6)
        first = tx.flow_state(1)
        tx.close_flow(1)
        tx.open_flow(2, K, now=12e-6, peer="b", qp=("b", "gradient"))
        tx.open_flow(3, K, now=12e-6, peer="b", qp=("b", "tensor-parallel"))
        return first, tx.flow_state(2), tx.flow_state(3)

    first, same_qp, other_qp = run(qp_state=True)
    assert first.rate_cuts == 2 and first.rate_bps < LINE
    assert (same_qp.rate_bps, same_qp.alpha) == (first.rate_bps, first.alpha)
    assert same_qp.rate_cuts == 0  # the cuts were the first message's
    assert other_qp.rate_bps == LINE  # another traffic class is another QP
    _, fresh, _ = run(qp_state=False)
    assert fresh.rate_bps == LINE and fresh.alpha == 1.0


def test_with_congestion_control_off_state_per_qp_sends_what_state_per_message_sends():
    """So the run cache keeps one run for both (runs.cache.config_doc)."""

    def trace(qp_state: bool):
        tx = ForgiveSender(
            DcqcnParams.for_profile("off", LINE), rto=1.0, rto_max=1.0, window_bytes=4 * K,
            qp_state=qp_state,
        )  # fmt: skip
        qp = ("b", "gradient")
        tx.open_flow(1, 20 * K, now=0.0, peer="b", qp=qp)
        tx.open_flow(2, 20 * K, now=0.0, peer="b", qp=qp)  # open at once on one QP
        sent, now = [], 0.0
        for step in range(200):
            sent += [(now, frame) for frame in tx.poll(now)]
            if step in (3, 9):
                tx.receive(cnp(1), now)
            if step == 20:
                tx.receive(ack(1, 20 * K, 19 * K, K), now)
                tx.close_flow(1)
                tx.open_flow(3, 20 * K, now=now, peer="b", qp=qp)  # the QP's next message
            deadline = tx.next_deadline()
            if deadline is None:
                break
            now = max(now, deadline)
        return sent, [tx.flow_state(f) for f in (2, 3)]

    per_qp, per_message = trace(True), trace(False)
    assert len(per_qp[0]) > 20 and per_qp[1][1].rate_bps == LINE
    assert per_qp == per_message
    off = RunConfig(preset("2to1"), policy="dcqcn", dcqcn="off")
    qp_fabric = with_regime(preset("2to1"), _args(dcqcn_state="qp"))
    assert run_key(replace(off, fabric=qp_fabric)) == run_key(off)
    on = replace(off, dcqcn="paper")
    assert run_key(replace(on, fabric=qp_fabric)) != run_key(on)


def test_payload_bytes_sets_the_segment_size():
    tx = ForgiveSender(DcqcnParams(line_rate_bps=LINE), rto=1.0, rto_max=1.0, payload_bytes=1000)
    tx.open_flow(1, 2500, now=0.0)
    got, now = [], 0.0
    while (deadline := tx.next_deadline()) is not None and deadline < 1e-3:
        now = max(now, deadline)
        got += [decode(p)[0].length for p in tx.poll(now)]
    assert got == [1000, 1000, 500]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_bytes": -1.0}, "window_bytes must be a finite number >= 0"),
        ({"window_bytes": float("nan")}, "window_bytes must be a finite number >= 0"),
        ({"payload_bytes": 0}, "payload_bytes must lie in 1..4096"),
        ({"payload_bytes": 5000}, "payload_bytes must lie in 1..4096"),
    ],
)
def test_bad_sender_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ForgiveSender(DcqcnParams(line_rate_bps=LINE), **kwargs)


def test_the_bdp_window_is_ns3s_longest_path_round_trip_times_the_host_rate():
    spec = FULL  # 400 Gbit/s everywhere, 4 hops host to host
    rtt = 2 * 4 * 1e-6 + 4 * (K * 8 / 400e9)
    assert bdp_bytes(plan(spec), 1e-6) == pytest.approx(rtt * 400e9 / 8)
    thin = with_scaling(
        parse({"leaves": 2, "spines": 1, "hosts_per_leaf": 2, "nic": {"payload_bytes": 1000}}),
        FULL.scaling,
    )
    assert bdp_bytes(plan(thin), 1e-6) == pytest.approx((8e-6 + 4 * 8000 / 400e9) * 400e9 / 8)


def test_a_fabric_file_sets_the_nic_and_refuses_bad_values_in_one_line():
    base = {"leaves": 2, "spines": 1, "hosts_per_leaf": 2}
    spec = parse({**base, "nic": {"window": "bdp", "dcqcn_state": "qp", "payload_bytes": 1000}})
    assert (spec.nic.window, spec.nic.dcqcn_state, spec.nic.payload_bytes) == ("bdp", "qp", 1000)
    assert parse(base).nic == preset("2to1").nic  # unset: no window, per message, 4096
    for nic, message in [
        ({"window": "bpd"}, "[nic] window must be one of none, bdp, got 'bpd'"),
        ({"dcqcn_state": 1}, "[nic] dcqcn_state must be a string, got 1"),
        ({"payload_bytes": 0}, "[nic] payload_bytes must lie in 1..4096, got 0"),
        ({"mtu": 9000}, "unknown key(s) in [nic]: mtu"),
    ]:
        with pytest.raises(FabricError) as err:
            parse({**base, "nic": nic})
        assert str(err.value) == message


def _args(**given):
    keys = ("window", "dcqcn_state", "payload_bytes", "data_queue_kib", "tp_phase")
    return argparse.Namespace(**{k: given.get(k) for k in keys})


def test_command_line_options_override_the_fabric_and_name_themselves_when_bad():
    spec = with_regime(FULL, _args(window="bdp", data_queue_kib=1024))
    assert spec.nic.window == "bdp"
    sw = spec.switch
    assert (sw.data_queue_bytes, sw.ecn_kmin_bytes, sw.ecn_kmax_bytes) == (
        1 << 20,
        200_000,
        800_000,
    )
    assert with_regime(preset("2to1"), _args()) == preset("2to1")
    for given, message in [
        ({"window": "huge"}, "--window must be one of none, bdp, got 'huge'"),
        ({"dcqcn_state": "flow"}, "--dcqcn-state must be one of message, qp, got 'flow'"),
        ({"payload_bytes": 9000}, "--payload-bytes must lie in 1..4096, got 9000"),
        ({"data_queue_kib": -1.0}, "--data-queue-kib must be a finite number > 0, got -1.0"),
    ]:
        with pytest.raises(FabricError) as err:
            with_regime(preset("2to1"), _args(**given))
        assert str(err.value) == message


def test_the_astra_profile_names_its_options_and_an_option_beside_it_wins():
    from runs.options import dcqcn_profile

    args = argparse.Namespace(**{**vars(_args()), "profile": "astra", "dcqcn": None})
    spec = with_regime(FULL, args)
    assert (spec.nic.window, spec.nic.dcqcn_state, spec.nic.payload_bytes) == (
        "bdp", "message", 4096,
    )  # fmt: skip
    assert dcqcn_profile(args) == "nic"
    args.dcqcn, args.window = "paper", "none"
    assert dcqcn_profile(args) == "paper" and with_regime(FULL, args).nic.window == "none"
    assert dcqcn_profile(argparse.Namespace(profile=None, dcqcn=None)) == "paper"
    args.profile = "ns3"
    with pytest.raises(
        FabricError, match=r"^--profile must be one of astra, astra-buffer, astra-ns3, got 'ns3'$"
    ):
        with_regime(FULL, args)


def test_the_astra_buffer_profile_is_astra_with_an_8_mib_data_queue_and_the_notes_marking():
    from runs.options import dcqcn_profile

    args = argparse.Namespace(**{**vars(_args()), "profile": "astra-buffer", "dcqcn": None})
    spec = with_regime(FULL, args)
    assert (spec.nic.window, spec.nic.dcqcn_state, dcqcn_profile(args)) == ("bdp", "message", "nic")
    sw = spec.switch
    assert (sw.data_queue_bytes, sw.ecn_kmin_bytes, sw.ecn_kmax_bytes) == (
        8 << 20, 1_600_000, 6_400_000,
    )  # fmt: skip
    args.data_queue_kib = 4096  # an option given beside the profile wins
    assert with_regime(FULL, args).switch.data_queue_bytes == 4 << 20


def test_the_bdp_window_is_a_byte_quantity_that_shrinks_with_the_byte_scale():
    from runplan.fabric import sim_scaling

    scaled = sim_scaling(preset("note-4to1"), byte_scale=128)
    delay = 1e-6 * scaled.scaling.time_scale  # the simulator's link delay on its clock
    assert bdp_bytes(plan(scaled), delay) == pytest.approx(bdp_bytes(plan(FULL), 1e-6) / 128)
