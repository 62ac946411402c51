"""The fabric lock and `forgive clean`: one emulation per machine, and no leftovers of a
run that was killed outright blocking the next."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fabric_harness import FORGIVE

from topologies.leftovers import FabricBusy, fabric_lock, our_interfaces, our_processes

pytestmark = [
    pytest.mark.netns,
    pytest.mark.fabric,
    pytest.mark.skipif(os.geteuid() != 0, reason="veths and the fabric lock need root"),
]


@pytest.fixture
def stale():
    """What a killed run leaves: a spine link and a switch process bound to its ports."""
    subprocess.run(
        ["ip", "link", "add", "leaf7-eth3", "type", "veth", "peer", "name", "spine7-eth1"],
        check=True,
    )
    switch = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-i", "1=leaf7-eth3"]
    )
    yield switch
    switch.kill()
    switch.wait()
    subprocess.run(["ip", "link", "del", "leaf7-eth3"], capture_output=True)


def test_clean_removes_a_killed_runs_links_and_switches(stale):
    assert {"leaf7-eth3", "spine7-eth1"} <= set(our_interfaces())
    assert stale.pid in our_processes()
    proc = subprocess.run([*FORGIVE, "clean"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"removed process {stale.pid}" in proc.stdout
    assert "leaf7-eth3" in proc.stdout and "spine7-eth1" in proc.stdout
    assert stale.wait(timeout=5) is not None
    assert not {"leaf7-eth3", "spine7-eth1"} & set(our_interfaces())
    again = subprocess.run([*FORGIVE, "clean"], capture_output=True, text=True, timeout=60)
    assert again.stdout.strip() == "nothing to remove"


def test_clean_leaves_a_live_run_alone(stale):
    with fabric_lock():
        proc = subprocess.run([*FORGIVE, "clean"], capture_output=True, text=True, timeout=60)
        with pytest.raises(FabricBusy, match=f"pid {os.getpid()}"), fabric_lock(wait=False):
            pass
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"forgive: another forgive emulation (pid {os.getpid()}) is running"
    )
    assert stale.poll() is None and "leaf7-eth3" in our_interfaces()


def test_a_second_run_waits_for_the_first(tmp_path):
    waiter = (
        "import sys, time; from topologies.leftovers import fabric_lock\n"
        "with fabric_lock(lambda line: print(line, flush=True)):\n"
        "    print('got it', time.monotonic(), flush=True)\n"
    )
    with fabric_lock():
        proc = subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True)
        first = proc.stdout.readline()
        assert (
            first.strip() == f"waiting for another forgive emulation (pid {os.getpid()}) to finish"
        )
        time.sleep(0.3)
        assert proc.poll() is None
        released = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert float(out.split()[-1]) >= released


def test_a_port_that_went_with_its_namespace_meanwhile_is_no_error(monkeypatch):
    """Listed, then gone before its turn (a host namespace ended and took its veth pairs)."""
    from topologies import leftovers

    subprocess.run(
        ["ip", "link", "add", "leaf8-eth2", "type", "veth", "peer", "name", "spine8-eth1"],
        check=True,
    )
    try:
        listed = {"leaf8-eth1": "", "leaf8-eth2": "spine8-eth1", "spine8-eth1": "leaf8-eth2"}
        monkeypatch.setattr(leftovers, "our_interfaces", lambda: listed)
        monkeypatch.setattr(leftovers, "our_processes", dict)
        assert leftovers.clear_leftovers() == ["veth leaf8-eth2 and its peer spine8-eth1"]
        assert not {"leaf8-eth2", "spine8-eth1"} & set(our_interfaces())
    finally:
        subprocess.run(["ip", "link", "del", "leaf8-eth2"], capture_output=True)
