"""Agents through the real FORGIVE P4 switch on BMv2: trims and marks made by forgive.p4."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from netns import Lab, mac_of, netns_unavailable, reap_stale
from test_agent_netns import done, ok, start_agent

from host_agent.wire import PACKET_BYTES
from ptf_tests.harness import AUX_PORT, GRPC_PORT, missing_prerequisite
from ptf_tests.targets import PRIO_LOW, Bmv2Target, Endpoint

_UNAVAILABLE = netns_unavailable() or missing_prerequisite("bmv2")
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or ""),
]
CONTROL = str(Path(__file__).with_name("bmv2_control.py"))
FRAME = 14 + 20 + 8 + 16 + PACKET_BYTES
DRAIN_PPS = 1500
"""The receiver's data queue drains this slowly, so two senders overflow it."""


@pytest.fixture
def lab(tmp_path):
    reap_stale()
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


def test_incast_through_bmv2_is_trimmed_marked_and_forgiven(lab):
    hosts, hub = lab.star(3, "sw")
    endpoint = Endpoint(hub, {i: f"p{i}" for i in range(3)}, GRPC_PORT, AUX_PORT, lab.workdir)
    switch = Bmv2Target(endpoint, log_level="off")
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
        assert control.stdout is not None and control.stdin is not None
        assert control.stdout.readline().strip() == "ready"
        switch.set_queue_rate(1, DRAIN_PPS, PRIO_LOW)

        a, b, c = hosts
        rate = ("--line-rate", "1.2e8")  # each sender alone ~3600 pps, twice the drain
        clients = {
            h.name: start_agent(lab, h, "--gateway-mac", mac_of(lab, hub, f"p{i}"), *rate)
            for i, h in enumerate(hosts)
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

        out, _ = control.communicate("counters\n", timeout=30)
        counters = json.loads(out.strip().splitlines()[-1])["1"]
        assert counters["trims"] == stats["core_rx"]["trimmed"] >= trims, (
            "every trim the switch made reached the receiver"
        )
        assert counters["ce_marks"] > 0
    finally:
        if control is not None and control.poll() is None:
            control.kill()
            control.wait()
        switch.stop()
