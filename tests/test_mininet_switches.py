"""Mininet with FORGIVE switches of either target, configured by the controller, carrying pings."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from switch_harness import can_use_netns, p4info_path

pytestmark = [pytest.mark.netns, pytest.mark.fabric]

UDP_RECEIVER = (
    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
    "s.bind(('0.0.0.0', 5000)); s.settimeout(5); print(s.recv(100).decode())"
)
UDP_SENDER = (
    "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
    ".sendto(b'forgive over udp', ('{dst}', 5000))"
)


def _skip_reason() -> str | None:
    reason = can_use_netns()
    if reason:
        return reason
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "mininet not installed"
    if shutil.which("mnexec") is None:
        return "mnexec not installed"
    return None


@pytest.mark.parametrize("targets", [("model", "model"), ("bmv2", "bmv2"), ("model", "bmv2")])
def test_two_switch_fabric_forwards_over_parallel_links(targets, tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from mininet.net import Mininet

    from controller.fabric_control import FabricController
    from controller.topology import parse
    from switch_model import control
    from topologies.switches import Bmv2Switch, ModelSwitch, describe

    kinds = {"model": ModelSwitch, "bmv2": Bmv2Switch}
    if "bmv2" in targets and Bmv2Switch.missing():
        pytest.skip(f"BMv2: {Bmv2Switch.missing()}")
    net = Mininet(controller=None, autoSetMacs=True, build=False, waitConnected=False)
    try:
        h1 = net.addHost("h1", ip="10.0.0.1/24")
        h2 = net.addHost("h2", ip="10.0.0.2/24")
        s1 = net.addSwitch("s1", cls=kinds[targets[0]], log_dir=str(tmp_path))
        s2 = net.addSwitch("s2", cls=kinds[targets[1]], log_dir=str(tmp_path))
        net.addLink(h1, s1)
        net.addLink(s1, s2)
        net.addLink(s1, s2)
        net.addLink(s2, h2)
        net.build()
        net.start()
        for host, peer in ((h1, h2), (h2, h1)):
            host.setARP(peer.IP(), peer.MAC())
        description = describe(
            net,
            thresholds={"data_queue_bytes": 1 << 20},
            queues={"low_queue_bytes": 8 << 20},
            ports={"s2:3": {"rate_bps": 100_000_000}},
        )
        assert description["switches"]["s1"]["target"] == targets[0]
        controller = FabricController(
            parse(description), p4info_path(), p4info_path().with_name("forgive.json")
        )
        try:
            # one call shapes both kinds: the model's socket, BMv2's Thrift CLI
            reports = controller.apply()
            assert all(r.pipeline_pushed for r in reports.values())
            if isinstance(s2, ModelSwitch):
                stats = control.request(s2.control_path, {"cmd": "stats"})["stats"]
                assert stats["ports"]["3"]["rate_bps"] == 100_000_000
                assert stats["ports"]["3"]["low_capacity"] == 8 << 20
            output = h1.cmd("ping -c 4 -i 0.2 -W 2", h2.IP())
            assert " 0% packet loss" in output, output
            # a kernel UDP socket's datagram (checksum and all) arrives intact
            receiver = h2.popen(
                [sys.executable, "-c", UDP_RECEIVER], stdout=subprocess.PIPE, text=True
            )
            time.sleep(0.3)
            h1.cmd(sys.executable, "-c", repr(UDP_SENDER.format(dst=h2.IP())))
            assert receiver.communicate(timeout=10)[0].strip() == "forgive over udp"
            s1_rows = controller.counters("s1")
            # s1 port 1 faces h1 (the echo replies), ports 2 and 3 face s2
            assert s1_rows[1].tx_packets >= 4
            assert s1_rows[2].tx_packets + s1_rows[3].tx_packets >= 4
        finally:
            controller.close()
    finally:
        net.stop()
    for switch in (s1, s2):
        assert switch.process is None


def test_a_model_switch_under_a_deep_results_folder_still_gets_its_control_socket(tmp_path):
    """A Unix socket's path holds 107 bytes; results folders can be deeper than that."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from pathlib import Path

    from topologies.switches import UNIX_PATH_MAX, ModelSwitch

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    shallow = ModelSwitch("fgs1", log_dir=str(tmp_path))
    switch = ModelSwitch("fgs2", log_dir=str(deep))
    try:
        assert shallow.control_path == str(tmp_path / "fgs1.model.sock")
        assert len(switch.control_path.encode()) <= UNIX_PATH_MAX
        assert Path(switch.control_path).parent.is_dir()
    finally:
        shallow.stop()
        switch.stop()
    assert not Path(switch.control_path).parent.exists()
