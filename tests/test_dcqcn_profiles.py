"""Both DCQCN profiles against reference models of their equations, written here from the
paper (Zhu et al., SIGCOMM 2015) and from astra-network-ns3's rdma-hw.cc and config.txt.

The references run in integer nanoseconds on their own event lists; the core runs in
float seconds with lazy timers. The scripted CNP trains are the ones in issue 17:
one CNP every 50 us for 1 ms then none, a single cut, and jittered spacing.
"""

import heapq
import itertools
import random

import pytest
from helpers import ack, cnp, data, nack, parse
from link import Impairments, Link

from common.wire import Opcode
from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy, new_rate

US = 1_000  # nanoseconds
MS = 1_000_000

# (line rate, time scale): the note's 400 Gbps host link in real time, and the
# emulation's default scaling of it (20 Mbit/s, bytes / 64, so time x 312.5).
LINKS = [(400e9, 1.0), (20e6, 312.5)]


def paper_reference(line, scale, cnps, queries):
    """Paper: on a CNP, R_T = R_C, R_C = R_C (1 - a/2), a = (1-g) a + g, both timers and
    the stage restart. Every 55 us without a CNP: a = (1-g) a. Every 55 us after a cut a
    rate-increase event: the first F = 5 recover halfway to R_T, later ones first add
    R_AI (40 Mbps of 40 Gbps) to R_T, capped at the line. No bytes are sent here, so the
    byte counter stays at 0 and hyper increase never starts."""
    g, f = 1 / 256, 5
    period = round(55 * US * scale)
    ai = 40e6 * line / 40e9
    floor = 10e6 * line / 40e9
    rc = rt = line
    alpha, stage, alpha_from, inc_from = 1.0, 0, 0, 0
    out = []

    def advance(t):
        nonlocal rc, rt, alpha, stage, alpha_from, inc_from
        n = (t - alpha_from) // period
        alpha *= (1 - g) ** n
        alpha_from += n * period
        for _ in range((t - inc_from) // period):
            if stage >= f:
                rt = min(rt + ai, line)
            rc = (rc + rt) / 2
            stage += 1
            inc_from += period

    events = sorted([(t, 1) for t in cnps] + [(t, 0) for t in queries])
    for t, kind in events:
        advance(t)
        if kind == 0:
            out.append(rc)
            continue
        rt = rc
        rc = max(rc * (1 - alpha / 2), floor)
        alpha = (1 - g) * alpha + g
        alpha_from = inc_from = t
        stage = 0
    return out


def nic_reference(line, scale, cnps, queries):
    """ns-3's Mellanox DCQCN with astra-network-ns3's configuration. From the first CNP on,
    alpha updates every 1 us (+g if a CNP came since the last update, then x (1-g)) and a
    cut check every 4 us; the first CNP sets alpha to 1 and is not counted for alpha. A
    check after a CNP cuts R_C by a/2, sets R_T = R_C only if a timer event happened
    since the previous cut (CLAMP_TARGET_RATE 0), and restarts the 900 us timer. Timer
    event n after a cut (F = 1): n < F halfway to R_T; n == F R_T + 50 Mbps; n > F
    R_T + 100 Mbps, then halfway; all rates absolute on a 400 Gbps link.
    At one instant: query, alpha update, CNP, timer event, cut check."""
    g, f = 0.00390625, 1
    tick, check, timer = round(1 * US * scale), round(4 * US * scale), round(900 * US * scale)
    ai, hai, floor = (x * line / 400e9 for x in (50e6, 100e6, 100e6))
    rc = rt = line
    alpha, stage = 1.0, 0
    alpha_flag = cut_flag = started = False
    out = []
    events = [(t, 2, "cnp") for t in cnps] + [(t, 0, "query") for t in queries]
    heapq.heapify(events)
    while events:
        t, _, kind = heapq.heappop(events)
        if kind == "query":
            out.append(rc)
        elif kind == "tick":
            alpha = (1 - g) * alpha + g if alpha_flag else (1 - g) * alpha
            alpha_flag = False
            if events:
                heapq.heappush(events, (t + tick, 1, "tick"))
        elif kind == "cnp":
            if started:
                alpha_flag = True
            else:  # the flow's first CNP
                started = True
                alpha = 1.0
                rt = rc
                heapq.heappush(events, (t + tick, 1, "tick"))
                heapq.heappush(events, (t + check, 4, "check"))
            cut_flag = True
        elif kind == "check":
            if cut_flag:
                if stage:
                    rt = rc
                rc = max(rc * (1 - alpha / 2), floor)
                stage, cut_flag = 0, False
                events = [e for e in events if e[2] != "timer"]
                heapq.heapify(events)
                heapq.heappush(events, (t + timer, 3, "timer"))
            if any(k in ("cnp", "query") for *_, k in events):
                heapq.heappush(events, (t + check, 4, "check"))
        elif kind == "timer":
            if stage == f:
                rt = min(rt + ai, line)
            elif stage > f:
                rt = min(rt + hai, line)
            rc = (rc + rt) / 2
            stage += 1
            if any(k == "query" for *_, k in events):
                heapq.heappush(events, (t + timer, 3, "timer"))
    return out


REFERENCES = {"paper": paper_reference, "nic": nic_reference}


def core_trajectory(profile, line, scale, cnps, queries):
    r = new_rate(DcqcnParams.for_profile(profile, line, scale), now=0.0)
    out = []
    for t, kind in sorted([(t, 1) for t in cnps] + [(t, 0) for t in queries]):
        if kind:
            r.reduce(t * 1e-9)
        else:
            out.append(r.rate_at(t * 1e-9))
    return out, r


def assert_tracks(profile, line, scale, cnps, horizon, step):
    """The core's rate at every `step` ns up to `horizon` matches the reference's.

    The bound is far inside the 1 percent issue 17 asks for: the NIC's absolute
    steps (50 and 100 Mbps) move a 400 Gbps rate by hundredths of a percent, and a
    wrong F or step size must still show."""
    queries = [round(t * scale) for t in range(0, horizon, step)]
    cnps = [round(t * scale) for t in cnps]
    expected = REFERENCES[profile](line, scale, cnps, queries)
    got, rate = core_trajectory(profile, line, scale, cnps, queries)
    worst = max(abs(a - b) / b for a, b in zip(got, expected, strict=True))
    assert worst < 1e-6, f"{profile}: off by {worst:.2e} at worst"
    return got, expected, rate


def recovery_time(trajectory, step, after, line):
    """Nanoseconds from `after` until the rate is back at half the line rate."""
    for i, r in enumerate(trajectory):
        if i * step > after and r >= line / 2:
            return i * step - after
    raise AssertionError("never recovered")


TRAIN = list(range(0, 1 * MS + 1, 50 * US))  # one CNP every 50 us for 1 ms, then none


@pytest.mark.parametrize(("line", "scale"), LINKS)
@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_cnp_train_then_silence(profile, line, scale):
    _, _, rate = assert_tracks(profile, line, scale, TRAIN, horizon=32 * MS, step=10 * US)
    assert rate.cuts == len(TRAIN)  # no CNP of an exact 50 us train is lost


def test_after_the_train_the_nic_profile_recovers_about_thirty_times_sooner():
    line, step = 400e9, 10 * US
    times = {}
    for profile in ("paper", "nic"):
        got, _, _ = assert_tracks(profile, line, 1.0, TRAIN, horizon=32 * MS, step=step)
        times[profile] = recovery_time(got, step, TRAIN[-1], line)
    # issue 17: 27.7 ms against 0.91 ms; the paper's target falls with every cut, the
    # NIC's stays at the line rate while cuts come back to back
    assert 27 * MS <= times["paper"] <= 28.5 * MS
    assert 0.9 * MS <= times["nic"] <= 0.92 * MS
    assert times["paper"] / times["nic"] > 25


@pytest.mark.parametrize(("line", "scale"), LINKS)
@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_single_cut(profile, line, scale):
    got, _, _ = assert_tracks(profile, line, scale, [0], horizon=5 * MS, step=5 * US)
    first_up = next(i for i, r in enumerate(got) if i > 2 and r > got[2]) * 5 * US
    if profile == "paper":
        assert got[12] == pytest.approx(line * 0.75)  # one 55 us event: halfway back
        assert got[int(5 * 55 * US / (5 * US)) + 1] == pytest.approx(line * (1 - 0.5 / 32))
        assert first_up <= 60 * US
    else:
        assert first_up > 900 * US  # ns-3 waits for its 900 us timer


@pytest.mark.parametrize("jitter_us", [2, 5, 20])
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_jittered_cnp_spacing(profile, jitter_us, seed):
    rng = random.Random(seed)
    cnps = [k * 50 * US + rng.randint(-jitter_us * US, jitter_us * US) for k in range(1, 21)]
    _, _, rate = assert_tracks(profile, 400e9, 1.0, cnps, horizon=6 * MS, step=7 * US)
    if profile == "paper":
        assert rate.cuts == 20  # every CNP cuts: the paper has no sender-side limit


@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_sparse_cnps_let_increase_events_in_between(profile):
    """CNPs further apart than ns-3's 900 us timer: its target now falls at each cut, and
    fast recovery, additive and hyper increase all run."""
    cnps = [k * 1_300 * US for k in range(6)]
    got, _, _ = assert_tracks(profile, 400e9, 1.0, cnps, horizon=12 * MS, step=10 * US)
    assert got[-1] > got[int(cnps[-1] / (10 * US)) + 1]


def test_nic_timer_expiry_goes_before_a_cut_check_at_the_same_instant():
    # The first cut is at 4 us, so the timer expires at 904 us, where a check falls too.
    _, _, rate = assert_tracks("nic", 400e9, 1.0, [0, 902 * US], horizon=3 * MS, step=5 * US)
    assert rate.target < 400e9  # the expiry came first, so that check's cut lowered the target


def test_nic_checks_coalesce_cnps_within_one_check_period():
    cnps = [0, 1 * US, 2 * US, 10 * US, 11 * US]  # checks at 4, 8, 12 us: cuts at 4 and 12
    _, _, rate = assert_tracks("nic", 400e9, 1.0, cnps, horizon=100 * US, step=1 * US)
    assert rate.cuts == 2


@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_notification_point_follows_the_profile(profile):
    """A CE mark on every DATA packet, one every 10 us for 1 ms."""
    params = DcqcnParams.for_profile(profile, 400e9)
    rx = ForgiveReceiver(ReceiverPolicy(**params.receiver_fields()))
    rx.begin_step(1, critical=False, expected_bytes=10**6)
    rx.register_flow(1, step=1, gradient=False)
    sent = []
    for k in range(101):
        now = k * 10e-6
        while (due := rx.next_deadline()) is not None and due <= now:
            sent += [(due, p) for p in parse(rx.poll(due))]
        sent += [(now, p) for p in parse(rx.receive(data(1, k * 100, 100, 10**6), True, now))]
    last_due = rx.next_deadline()
    sent += [(last_due, p) for p in parse(rx.poll(1.01e-3))]
    assert rx.next_deadline() is None
    times = [t for t, p in sent if p.opcode == Opcode.CNP]
    if profile == "paper":
        # one at the first mark, then one at the end of every 50 us window
        assert times == pytest.approx([k * 50e-6 for k in range(21)])
    else:
        assert len(times) == 101  # every mark, 10 us apart, is past the NIC's 4 us


def test_profiles_are_data_with_one_constructor():
    paper = DcqcnParams.for_profile("paper", 20e6, 312.5)
    nic = DcqcnParams.for_profile("nic", 20e6, 312.5)
    assert paper == DcqcnParams(line_rate_bps=20e6, time_scale=312.5)  # the default
    assert (paper.fast_recovery_steps, paper.rate_reduce_period) == (5, 0.0)
    assert (nic.alpha_period, nic.rate_reduce_period, nic.rate_increase_period) == (
        1e-6, 4e-6, 900e-6,
    )  # fmt: skip
    assert (nic.fast_recovery_steps, nic.byte_counter) == (1, 0)
    assert nic.rate(nic.rate_ai_bps) == pytest.approx(50e6 / 20_000)  # absolute at 400G
    assert paper.receiver_fields() == {"cnp_interval": 50e-6 * 312.5, "cnp_at_window_end": True}
    assert nic.receiver_fields() == {"cnp_interval": 4e-6 * 312.5, "cnp_at_window_end": False}
    assert DcqcnParams(line_rate_bps=1e9, profile="nic", fast_recovery_steps=3).g == 1 / 256
    with pytest.raises(ValueError, match="unknown DCQCN profile 'ns3'; known: paper, nic"):
        DcqcnParams.for_profile("ns3", 1e9)
    with pytest.raises(ValueError, match="rate_reduce_period"):
        DcqcnParams(line_rate_bps=1e9, profile="nic", rate_reduce_period=0.0)


def test_sender_on_the_nic_profile_cuts_at_the_next_check():
    tx = ForgiveSender(DcqcnParams.for_profile("nic", 10e9), rto=1.0, rto_max=1.0)
    tx.open_flow(1, 10**6, now=0.0)
    tx.poll(0.0)
    tx.receive(cnp(1), 1e-6)
    early = tx.flow_state(1)  # the cut is due at the check at 5 us: counted, not yet applied
    assert early.rate_cuts == 1 and early.rate_bps == 10e9
    now = 0.0
    while now < 10e-6:
        tx.poll(now)
        now = tx.next_deadline()
    state = tx.flow_state(1)
    assert state.rate_cuts == 1 and state.rate_bps < 10e9 and state.cnps == 1


@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_both_profiles_carry_a_marked_flow_end_to_end(profile):
    params = DcqcnParams.for_profile(profile, 10e9)
    tx = ForgiveSender(params, rto=200e-6, rto_max=5e-3)
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0, **params.receiver_fields()))
    rx.begin_step(1, critical=False, expected_bytes=600_000)
    rx.register_flow(1, step=1, gradient=True, size=600_000)
    tx.open_flow(1, 600_000, now=0.0)
    Link(tx, rx, forward=Impairments(delay=5e-6, jitter=3e-6, ce=0.3, trim=0.02), seed=3).run(1.0)
    state = tx.flow_state(1)
    assert state.done and rx.flow_state(1).complete
    assert state.rate_cuts > 0 and state.rate_bps < 10e9 and state.cnps_ignored == 0


def integrated_departure(rate, wire_bits, sent_at, dt):
    """When `wire_bits` have drained at `rate` (a reference reaction point fed the same
    notifications), stepping `dt` at a time: the pacer's gap as the bytes still to send at
    the rate in force, whatever the rate does during it."""
    t, left = sent_at, float(wire_bits)
    while True:
        r = rate.rate_at(t)
        if left <= r * dt:
            return t + left / r
        left -= r * dt
        t += dt


@pytest.mark.parametrize(
    ("profile", "cuts"),
    # paper: 11 cuts leave the target twice the rate, and its 55 us timer recovers halfway;
    # nic: back-to-back cuts keep the target at the line, and its 900 us timer, due 900 us
    # after the last cut, lands halfway there inside a packet's gap at the floor
    [("paper", 11), ("nic", 40)],
)
def test_a_rate_increase_brings_the_pending_departure_forward(profile, cuts):
    """A packet sent at a low rate must not hold the next one for its whole gap at that
    rate: as the rate recovers, what is left of the gap drains at the new rate."""
    params = DcqcnParams.for_profile(profile, 400e9)
    tx = ForgiveSender(params, rto=1.0, rto_max=1.0)
    ref = new_rate(params, now=0.0)  # fed the same CNPs, it says what the rate is when
    tx.open_flow(1, 4096 * 4096, now=0.0)
    cnps = [k * 5e-6 for k in range(cuts)]
    sent, now = [], 0.0
    while now < 2e-3:
        while cnps and cnps[0] <= now:
            tx.receive(cnp(1), cnps[0])
            ref.reduce(cnps.pop(0))
        sent += [now for _ in tx.poll(now)]
        now = min(tx.next_deadline(), cnps[0] if cnps else 1.0)
    wire = (4096 + 58) * 8
    late = [(a, b) for a, b in itertools.pairwise(sent) if a > 5e-6 * cuts]
    assert len(late) >= 2
    shortened = 0
    for a, b in late:
        slow_gap = wire / ref.rate_at(a)
        expected = integrated_departure(ref, wire, a, dt=slow_gap / 20_000)
        assert b - a == pytest.approx(expected - a, rel=1e-3)
        shortened += expected - a < 0.9 * slow_gap
    assert shortened  # the rate recovered within some gap


def test_a_cut_due_after_the_flows_last_packet_is_counted():
    """The nic profile applies a cut at its next 4 us check; a flow whose last packet left
    before that check, and which completes before it, still took that cut."""
    tx = ForgiveSender(DcqcnParams.for_profile("nic", 400e9), rto=1.0, rto_max=1.0)
    tx.open_flow(1, 4096, now=0.0)
    assert len(tx.poll(0.0)) == 1  # the whole flow is on the wire
    tx.receive(cnp(1), 1e-6)  # its CE mark's CNP: the cut is due at the check, 4 us later
    tx.receive(ack(1, 4096, 0, 4096), 2e-6)
    assert tx.take_completed() == [1]
    state = tx.flow_state(1)
    assert state.cnps == 1 and state.rate_cuts == 1


def test_congestion_control_off_never_cuts_but_counts_every_signal():
    """`--dcqcn off`: CNPs and NACKs arrive and are counted, the rate stays at the line, and
    the flow is paced at the line rate throughout."""
    params = DcqcnParams.for_profile("off", 10e9)
    tx = ForgiveSender(params, rto=1.0, rto_max=1.0)
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.0, p_high=0.0, **params.receiver_fields()))
    rx.begin_step(1, critical=False, expected_bytes=600_000)
    rx.register_flow(1, step=1, gradient=True, size=600_000)
    tx.open_flow(1, 600_000, now=0.0)
    Link(tx, rx, forward=Impairments(delay=5e-6, jitter=3e-6, ce=0.3, trim=0.05), seed=3).run(1.0)
    state = tx.flow_state(1)
    assert state.done and state.cnps > 0 and state.nacks > 0
    assert state.rate_cuts == state.mark_cuts == 0 and state.rate_bps == 10e9
    with pytest.raises(ValueError, match="known: paper, nic, off"):
        DcqcnParams.for_profile("none", 1e9)


@pytest.mark.parametrize("profile", ["paper", "nic"])
def test_cuts_are_attributed_to_marks_or_to_trims(profile):
    """A cut answers a mark if a CNP (or a report's ECN echo) asked for it; a NACK alone is
    a trim's. The nic profile's one cut per check answers a mark if any of its
    notifications was one."""
    tx = ForgiveSender(DcqcnParams.for_profile(profile, 10e9), rto=1.0, rto_max=1.0)
    tx.open_flow(1, 10**6, now=0.0)
    tx.poll(0.0)
    tx.receive(nack(1, 0, 100, 0), 1e-6)  # a trim alone
    tx.receive(cnp(1), 20e-6)  # a mark, and a trim in the same check period
    tx.receive(nack(1, 0, 100, 0), 21e-6)
    now = 21e-6
    while now < 40e-6:
        tx.poll(now)
        now = tx.next_deadline()
    state = tx.flow_state(1)
    if profile == "paper":
        assert (state.rate_cuts, state.mark_cuts) == (3, 1)
    else:
        assert (state.rate_cuts, state.mark_cuts) == (2, 1)


def test_the_time_below_the_line_rate_ends_when_recovery_comes_within_a_thousandth():
    """The paper profile cut once from the line rate to half of it (alpha starts at 1) and
    left alone: each 55 us timer event halves the distance to the line rate (the target stays
    there), so after the k-th the rate is line * (1 - 2^-(k+1)), within a thousandth of it
    from the 9th on (2^10 > 1000), and the flow was below it for 9 periods."""
    params = DcqcnParams.for_profile("paper", 40e9, 1.0)
    rate = new_rate(params, 0.0)
    rate.reduce(1e-3)
    period = params.period(params.rate_increase_period)
    assert rate.below_line_s(1e-3 + 4.5 * period) == pytest.approx(4.5 * period)
    rate.rate_at(1e-3 + 20 * period)
    assert rate.below_line_s(1e-3 + 20 * period) == pytest.approx(9 * period)
    assert new_rate(DcqcnParams.for_profile("off", 40e9, 1.0), 0.0).below_line_s(1.0) == 0.0
