"""A switch process that is stopped (SIGSTOP) mid-run: alive, so nothing has exited, but it
answers nothing. Every error it causes names it: the client's, and the run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from p4.v1 import p4runtime_pb2
from switch_harness import device_config, free_tcp_port, p4info, p4info_path

from controller.client import SwitchClient, SwitchUnreachable
from controller.fabric_control import FabricController
from controller.topology import parse
from runplan.run import RunError
from topologies.processes import is_stopped, stop_process
from topologies.runner import FabricRun

SERVE = (
    "import sys, time\n"
    "from switch_model.dataplane import Dataplane\n"
    "from switch_model.p4runtime_server import SwitchService, serve\n"
    "server = serve(SwitchService(1, Dataplane({1: 'unused1'})), sys.argv[1])\n"
    "time.sleep(3600)\n"
)


def sigstop(proc: subprocess.Popen) -> None:
    """Stop `proc` and return once every thread of it is stopped. kill() only queues the
    signal: a thread busy on another core (a gRPC poller, on a loaded machine) can still
    answer a read sent in that moment, which the tests would take for a stopped switch's."""
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not all(is_stopped(int(t)) for t in os.listdir(f"/proc/{proc.pid}/task")):
        assert time.monotonic() < deadline, f"pid {proc.pid} not stopped 5 s after SIGSTOP"
        time.sleep(0.01)


@pytest.fixture
def switch():
    """A model switch's P4Runtime service in a process of its own, with forgive.p4 pushed."""
    address = f"127.0.0.1:{free_tcp_port()}"
    proc = subprocess.Popen([sys.executable, "-c", SERVE, address])
    client = SwitchClient("s1", address, 1, timeout=10.0)  # a loaded machine is slow
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.connect()
                break
            except SwitchUnreachable:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
        client.set_pipeline(p4info(), device_config(), 1)
        yield proc, address, client
    finally:
        # the process first: closing a client whose switch is still stopped waits out the
        # client's whole timeout for an answer that cannot come
        stop_process(proc)
        client.close()


def test_is_stopped_tells_a_stopped_process_from_a_running_or_gone_one():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not is_stopped(proc.pid)
        sigstop(proc)
        assert is_stopped(proc.pid)
    finally:
        stop_process(proc)  # SIGCONT with the SIGTERM: no 10 s wait for SIGKILL
    assert proc.returncode == -signal.SIGTERM
    assert not is_stopped(proc.pid)


def test_a_stalled_switch_is_named_by_the_client(switch):
    proc, address, client = switch
    query = [p4runtime_pb2.Entity(counter_entry=p4runtime_pb2.CounterEntry())]  # every counter
    client.read(query)  # it answers while running
    client.timeout = 1.0  # what a stopped switch is given to answer
    sigstop(proc)
    with pytest.raises(SwitchUnreachable) as err:
        client.read(query)
    assert str(err.value) == (
        f"switch s1 at {address} did not answer in time (P4Runtime DEADLINE_EXCEEDED): "
        "stalled or overloaded"
    )


def test_a_stalled_switch_is_named_when_the_run_reads_its_counters(switch, tmp_path):
    proc, address, _ = switch
    (tmp_path / "dev.json").write_bytes(device_config())
    desc = {
        "switches": {"s1": {"target": "model", "grpc": address, "control": "/tmp/x"}},
        "hosts": {
            "h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"},
            "h2": {"ip": "10.0.0.2", "mac": "02:00:00:00:00:02"},
        },
        "links": [{"a": "h1", "b": "s1:1"}, {"a": "h2", "b": "s1:2"}],
    }
    controller = FabricController(parse(desc), p4info_path(), tmp_path / "dev.json")
    # the run's own watch over its switches and their counters, on this one switch
    run = FabricRun.__new__(FabricRun)
    run.net = SimpleNamespace(switches=[SimpleNamespace(name="s1", target="model", process=proc)])
    run.plan = SimpleNamespace(switches=["s1"])
    run.controller = controller
    run._last_totals, run._earlier_lives = {}, {}  # what __init__ sets for counting restarts
    try:
        controller.connect(write=False)
        assert set(run._totals()) == {"s1"}
        controller.clients["s1"].timeout = 1.0
        sigstop(proc)
        with pytest.raises(RunError) as err:
            run._totals()
        assert str(err.value) == (
            f"reading switch s1's counters: switch s1 (model) is stopped (SIGSTOP or a "
            f"debugger; pid {proc.pid}) and answers nothing"
        )
    finally:
        controller.close()


def test_the_run_does_not_read_the_counters_of_a_switch_that_has_exited(switch, tmp_path):
    """Reading it would cost a failed read and a reconnect before the run could start the
    switch again: the client's whole timeout where it cannot see the process (as here), about
    0.2 s where the runner has told it how (SwitchClient.gone)."""
    proc, address, _ = switch
    (tmp_path / "dev.json").write_bytes(device_config())
    desc = {
        "switches": {"s1": {"target": "model", "grpc": address, "control": "/tmp/x"}},
        "hosts": {"h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}},
        "links": [{"a": "h1", "b": "s1:1"}],
    }
    controller = FabricController(parse(desc), p4info_path(), tmp_path / "dev.json")
    run = FabricRun.__new__(FabricRun)
    run.net = SimpleNamespace(switches=[SimpleNamespace(name="s1", target="model", process=proc,
                                                        log_file="s1.model.log")])  # fmt: skip
    run.plan = SimpleNamespace(switches=["s1"])
    run.controller = controller
    run._last_totals, run._earlier_lives = {}, {}
    try:
        controller.connect(write=False)
        assert set(run._totals()) == {"s1"}
        proc.kill()
        proc.wait()
        controller.counters = lambda name: pytest.fail(f"read the counters of exited {name}")
        with pytest.raises(RunError) as err:
            run._totals()
        assert str(err.value) == (
            "switch s1 (model) exited with signal SIGKILL during the run; its log: s1.model.log"
        )
    finally:
        controller.close()
