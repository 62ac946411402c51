"""`forgive-ctl shell`: p4runtime-shell on the switch model beside a controller that holds it.

Before the controller has configured the switch the shell refuses in one line; once the
controller (the project's client, election id 1) has pushed the pipeline, written a route and set
a counter, the shell reads both as a backup, is refused a write, and leaves the controller
primary: its next write still goes through."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from p4.v1 import p4runtime_pb2
from switch_harness import model_switch

from commands.p4shell import SHELL_ELECTION_ID
from common import p4names
from controller import DEVICE_CONFIG, P4INFO, entries
from controller.client import ELECTION_ID, SwitchClient
from controller.p4info import P4InfoIndex, load_p4info

pytest.importorskip("p4runtime_sh.shell", reason="p4runtime-shell (test extras) missing")

DEVICE_ID = 3
READ = f"""
c = CounterEntry({p4names.PORT_TRIMS!r})
c.index = 2
(found,) = c.read()
print("trims on port 2:", found.packet_count)
print("routes:", len(list(TableEntry({p4names.LPM_TABLE!r}).read())))
"""
WRITE = f"""
e = TableEntry({p4names.TRIM_ELIGIBILITY_TABLE!r})(action={p4names.DISABLE_TRIM!r})
e.match[{p4names.DSCP!r}] = "20"
e.insert()
"""


@pytest.fixture
def switch():
    with model_switch(DEVICE_ID) as address:
        yield address


def shell(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "commands.ctl", "shell", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def controller(address: str, index: P4InfoIndex) -> SwitchClient:
    """The run's controller: primary, the pipeline pushed, a route and a counter written."""
    client = SwitchClient("s1", address, DEVICE_ID)
    client.connect(primary=True)
    client.set_pipeline(index.p4info, DEVICE_CONFIG.read_bytes(), cookie=1)
    client.write([_insert(entries.route(index, 0x0A000202, 32, 0x020000000002, 2))])
    counter = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
    entry = counter.entity.counter_entry
    entry.counter_id = index.counter(p4names.PORT_TRIMS).preamble.id
    entry.index.index = 2
    entry.data.packet_count = 17
    client.write([counter])
    return client


def _insert(entry) -> p4runtime_pb2.Update:
    update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    update.entity.table_entry.CopyFrom(entry)
    return update


def test_the_shells_election_id_is_below_the_controllers():
    high, low = SHELL_ELECTION_ID
    assert (high << 64) | low < ELECTION_ID


def test_the_shell_reads_a_running_switch_and_never_takes_it(switch, tmp_path):
    index = P4InfoIndex(load_p4info(P4INFO))
    assert "no pipeline yet" in shell(switch, "--device-id", str(DEVICE_ID), "-c", READ).stderr
    ctl = controller(switch, index)
    try:
        description = tmp_path / "fabric.json"
        description.write_text(json.dumps({
            "switches": {"leaf1": {"target": "model", "grpc": switch, "device_id": DEVICE_ID,
                                   "control": str(tmp_path / "leaf1.sock")}},
            "hosts": {}, "links": [],
        }))  # fmt: skip
        read = shell("leaf1", "--topology", str(description), "-c", READ)
        assert read.returncode == 0, read.stderr
        assert "trims on port 2: 17" in read.stdout and "routes: 1" in read.stdout
        assert "not the primary client" in read.stdout
        refused = shell(switch, "--device-id", str(DEVICE_ID), "-c", WRITE)
        assert refused.returncode != 0 and "PERMISSION_DENIED" in refused.stderr
        # still the primary: its writes go through
        ctl.write([_insert(entries.trim_ineligible(index, 20))])
    finally:
        ctl.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["leaf9"], "a switch's name needs --topology DESCRIPTION.json"),
        (["127.0.0.1:1"], "127.0.0.1:1"),
    ],
)
def test_a_switch_it_cannot_reach_is_one_line(args, message):
    proc = shell(*args, "-c", "pass")
    assert proc.returncode in (1, 2) and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr
