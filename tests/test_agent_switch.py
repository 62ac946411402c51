"""Agents through the real FORGIVE P4 switch: trims and marks made by forgive.p4, on BMv2 and
on the switch model (every registered PTF target that is present)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from netns import Host, mac_of, netns_unavailable
from test_agent_netns import WORKLOAD, done, ok, start_agent, train

from common.wire import PACKET_BYTES
from ptf_tests.harness import AUX_PORT, GRPC_PORT, missing_prerequisite
from ptf_tests.targets import (
    PRIO_LOW,
    TARGETS,
    Bmv2Target,
    Endpoint,
    SwitchTarget,
    switch_targets,
)

_UNAVAILABLE = netns_unavailable()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or ""),
]
CONTROL = str(Path(__file__).with_name("p4rt_control.py"))
FRAME = 14 + 20 + 8 + 16 + PACKET_BYTES
DRAIN_PPS = 1500
"""The receiver's data queue drains this slowly, so two senders overflow it."""


@dataclass
class Fabric:
    hosts: list[Host]
    gateways: dict[str, str]
    """Per host, the MAC of the switch port it hangs off."""
    switch: SwitchTarget
    control: subprocess.Popen

    def counters(self) -> dict[str, dict[str, int]]:
        """Per switch port, its counters (ends the control session)."""
        out, _ = self.control.communicate("counters\n", timeout=30)
        return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(params=switch_targets())
def fabric(lab, request):
    """Three hosts on forgive.p4 in a target; port 1 (host b) drains its data queue slowly."""
    reason = missing_prerequisite(request.param)
    if reason:
        pytest.skip(f"{request.param}: {reason}")
    if TARGETS[request.param].arch != "v1model":
        pytest.skip(f"{request.param}: the incast needs a paced queue, which tofino-model lacks")
    hosts, hub = lab.star(3, "sw")
    endpoint = Endpoint(hub, {i: f"p{i}" for i in range(3)}, GRPC_PORT, AUX_PORT, lab.workdir)
    if request.param == "bmv2":
        switch: SwitchTarget = Bmv2Target(endpoint, log_level="off")
    else:
        switch = TARGETS[request.param](endpoint)
    switch.start()
    control = None
    try:
        routes = [f"{h.ip}={h.mac}={i}" for i, h in enumerate(hosts)]
        # Six full frames of data queue, marking from two, certain at four.
        limits = f"{6 * FRAME},{2 * FRAME},{4 * FRAME},65536"
        control = subprocess.Popen(
            ["ip", "netns", "exec", hub, sys.executable, CONTROL, *routes, "--thresholds", limits],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert control.stdout is not None
        assert control.stdout.readline().strip() == "ready"
        switch.set_queue_rate(1, DRAIN_PPS, PRIO_LOW)
        gateways = {h.name: mac_of(lab, hub, f"p{i}") for i, h in enumerate(hosts)}
        yield Fabric(hosts, gateways, switch, control)
    finally:
        if control is not None and control.poll() is None:
            control.kill()
            control.wait()
        switch.stop()


def test_incast_through_the_switch_is_trimmed_marked_and_forgiven(lab, fabric):
    hosts = fabric.hosts
    a, b, c = hosts
    rate = ("--line-rate", "1.2e8")  # each sender alone ~3600 pps, twice the drain
    clients = {
        h.name: start_agent(lab, h, "--gateway-mac", fabric.gateways[h.name], *rate) for h in hosts
    }
    rx = clients["b"]
    rng = random.Random(7)
    grads = {1: rng.randbytes(300_000), 2: rng.randbytes(300_000)}
    tps = {3: rng.randbytes(100_000), 4: rng.randbytes(100_000)}
    ok(rx.call("begin_step", step=4, critical=False, expected_gradient_bytes=600_000))
    for flow in grads:
        ok(rx.call("register_flow", flow=flow, step=4, traffic_class="gradient", deliver=True))
    for flow in tps:
        ok(
            rx.call(
                "register_flow",
                flow=flow,
                step=4,
                traffic_class="tensor-parallel",
                deliver=True,
            )
        )
    senders = {1: a, 3: a, 2: c, 4: c}
    for flow, data in {**grads, **tps}.items():
        cls = "gradient" if flow in grads else "tensor-parallel"
        ok(
            clients[senders[flow].name].call(
                "send", data, dst=b.ip, flow=flow, traffic_class=cls, step=4
            )
        )

    forgiven = trims = marks = 0
    for flow, data in {**grads, **tps}.items():
        event, payload = done(rx, "recv_done", flow)
        trims += event["trims"]
        marks += event["ce_marks"]
        if flow in tps:
            assert payload == data and event["forgiven_bytes"] == 0
        else:
            forgiven += event["forgiven_bytes"]
            differ = [i for i, (x, y) in enumerate(zip(payload, data, strict=True)) if x != y]
            assert len(differ) <= event["forgiven_bytes"]
            assert all(payload[i] == 0 for i in differ)
    state = ok(rx.call("step_state", step=4))["state"]
    assert state["forgiven"] == forgiven <= state["budget"]
    assert forgiven * (1 - state["p"]) <= state["p"] * state["received"]
    assert trims > 0 and marks > 0 and forgiven > 0
    for flow, sender in senders.items():
        done(clients[sender.name], "send_done", flow)
    stats = ok(rx.call("stats"))
    assert stats["counters"].get("bound_violations", 0) == 0

    counters = fabric.counters()["1"]
    assert counters["trims"] == stats["core_rx"]["trimmed"] >= trims, (
        "every trim the switch made reached the receiver"
    )
    assert counters["ce_marks"] > 0


def test_training_through_the_switch_forgives_only_within_the_bound(lab, fabric):
    hosts = fabric.hosts
    out = train(lab, hosts, fabric.gateways, "forgive", *WORKLOAD, "--line-rate", "1.2e8")
    steps = [r for r in out if r["type"] == "train_step"]
    final = [r for r in out if r["type"] == "train_done"]
    assert len(steps) == 3 * 6 and len(final) == 3
    assert all(r["content_errors"] == 0 and r["bound_violations"] == 0 for r in final)
    assert all(s["bound_held"] and s["grad_forgiven"] <= s["grad_budget"] for s in steps)
    counters = fabric.counters()
    assert counters["1"]["trims"] > 0
    assert sum(s["grad_forgiven"] for s in steps if s["rank"] == 1) > 0
