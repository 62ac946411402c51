"""The sans-IO contract as docs/protocol.md writes it: the constructors and the state calls
by their names, each state read as a mapping and by field alike."""

import pytest

from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy


def test_the_receivers_states_read_as_mappings_and_by_field():
    rx = ForgiveReceiver(ReceiverPolicy(p_low=0.005, p_high=0.1, forgive_prob=1.0, seed=0))
    rx.begin_step(3, critical=False, expected_bytes=100_000)
    rx.register_flow(9, step=3, gradient=True)
    step = rx.step_state(3)
    for name in ("p", "budget", "received", "forgiven", "outstanding", "open"):
        assert name in step and step[name] == getattr(step, name)
    assert step["p"] == pytest.approx(0.1) and step["open"] is True
    assert dict(step) == dict(step.items()) and list(step) == step.keys() == list(dict(step))
    flow = rx.flow_state(9)
    assert (flow["rcv_nxt"], flow["exemption_eligible"], flow["complete"]) == (0, True, False)
    with pytest.raises(KeyError):
        step["nothing"]
    assert step.get("nothing", "absent") == "absent" and "nothing" not in step


def test_the_senders_flow_state_reads_as_a_mapping():
    tx = ForgiveSender(DcqcnParams(line_rate_bps=400e9), seed=0)
    tx.open_flow(1, 10_000, now=0.0)
    state = tx.flow_state(1)
    assert state["cc_mode"] in ("obeying", "exempt")
    assert state["rate_bps"] == state.rate_bps == 400e9
    assert (state["acked_bytes"], state["retransmitted_bytes"], state["done"]) == (0, 0, False)
    with pytest.raises(ValueError, match="seed"):
        ForgiveSender(DcqcnParams(line_rate_bps=400e9), seed="0")
