"""The note's invariants, checked after every single event of random receiver traffic."""

from fractions import Fraction

from helpers import data, trim
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from host_agent.core import ForgiveReceiver, ReceiverPolicy

FLOW_BYTES = 3000
MAX_SEG = 700


class ReceiverMachine(RuleBasedStateMachine):
    @initialize(
        vesting=st.booleans(),
        p_low=st.sampled_from([0.0, 0.005, 0.05]),
        p_high=st.sampled_from([0.1, 0.3, 0.6]),
        forgive_prob=st.sampled_from([0.0, 0.5, 1.0]),
        seed=st.integers(0, 3),
        expected=st.lists(st.integers(0, 4 * FLOW_BYTES), min_size=3, max_size=3),
        critical=st.lists(st.booleans(), min_size=3, max_size=3),
        flows=st.lists(
            st.tuples(st.integers(1, 3), st.integers(1, FLOW_BYTES), st.booleans()),
            min_size=1,
            max_size=4,
        ),
    )
    def setup(self, vesting, p_low, p_high, forgive_prob, seed, expected, critical, flows):
        self.vesting = vesting
        self.rx = ForgiveReceiver(
            ReceiverPolicy(
                p_low=p_low, p_high=p_high, forgive_prob=forgive_prob, seed=seed, vesting=vesting
            )
        )
        self.flows: dict[int, tuple[int, int, bool]] = {}  # flow -> (step, size, gradient)
        self.steps: set[int] = set()
        self.settled: dict[int, dict[int, str]] = {}
        self.now = 0.0
        # Most steps are classified before their flows register, as in training.
        for step in (1, 2):
            self.begin_step(step, critical[step - 1], expected[step - 1])
        for step, size, gradient in flows:
            self.register(step, size, gradient)

    @rule(step=st.integers(1, 3), critical=st.booleans(), expected=st.integers(0, 4 * FLOW_BYTES))
    def begin_step(self, step, critical, expected):
        if step not in self.steps:
            self.rx.begin_step(step, critical=critical, expected_bytes=expected)
            self.steps.add(step)

    @rule(step=st.integers(1, 3))
    def complete_step(self, step):
        self.rx.complete_step(step)

    @rule(step=st.integers(1, 3), size=st.integers(1, FLOW_BYTES), gradient=st.booleans())
    def register(self, step, size, gradient):
        flow = len(self.flows) + 1
        if flow <= 5:
            self.rx.register_flow(flow, step=step, gradient=gradient)
            self.flows[flow] = (step, size, gradient)
            self.settled[flow] = {}

    @rule(
        pick=st.integers(0, 4),
        start=st.one_of(st.integers(0, FLOW_BYTES - 1), st.sampled_from(range(0, FLOW_BYTES, 500))),
        length=st.integers(1, MAX_SEG),
        trimmed=st.booleans(),
        ce=st.booleans(),
        dt=st.sampled_from([0.0, 1e-6, 1e-4]),
    )
    def arrive(self, pick, start, length, trimmed, ce, dt):
        if not self.flows:
            return
        flow = sorted(self.flows)[pick % len(self.flows)]
        size = self.flows[flow][1]
        start = start % size
        length = min(length, size - start)
        self.now += dt
        packet = (
            trim(flow, start, length, size)
            if trimmed
            else data(flow, start, length, size, fill=0x5A)
        )
        self.rx.receive(packet, ce, self.now)

    # -- invariants ------------------------------------------------------------

    @invariant()
    def step_bounds(self):
        for step in self.steps:
            s = self.rx.step_state(step)
            assert s.forgiven <= s.budget
            assert s.received + s.forgiven <= s.expected
            assert s.outstanding >= 0
            if self.vesting:
                p = Fraction(str(s.p))
                # forgiven <= p/(1-p) * received, in exact arithmetic
                assert s.forgiven * (1 - p) <= p * s.received
            flows = [f for f, (fs, _, g) in self.flows.items() if fs == step and g]
            forgiven = sum(self.rx.flow_state(f).forgiven_bytes for f in flows)
            assert s.forgiven == forgiven
            outstanding = sum(self.rx.flow_state(f).outstanding_bytes for f in flows)
            assert s.outstanding == outstanding
            # bytes that arrived before the step began are not the step's
            assert s.received <= sum(self.rx.flow_state(f).received_bytes for f in flows)

    @invariant()
    def settled_bytes_never_change_state(self):
        for flow, (_, size, gradient) in self.flows.items():
            state = self.rx.flow_state(flow)
            payload = self.rx.payload(flow) if state.total is not None else bytes(size)
            settled_above = [
                (s, e) for s, e, name in self.rx.flow_ranges(flow) if name != "requested"
            ]
            now_settled = {}
            for b in range(state.rcv_nxt):
                now_settled[b] = "R" if payload[b] else "F"
            for s, e in settled_above:
                for b in range(s, e):
                    now_settled[b] = "R" if payload[b] else "F"
            before = self.settled[flow]
            for b, kind in before.items():
                assert now_settled.get(b) == kind, f"flow {flow} byte {b} left {kind}"
            self.settled[flow] = now_settled
            counts = list(now_settled.values())
            assert state.received_bytes == counts.count("R")
            assert state.forgiven_bytes == counts.count("F")
            if not gradient:
                assert state.forgiven_bytes == 0


TestReceiverInvariants = ReceiverMachine.TestCase
TestReceiverInvariants.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
