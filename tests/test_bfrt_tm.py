"""controller.bfrt_tm turns tm-config operations into BF-RT calls.

The SDE's bfrt_grpc client is not installable here, so these tests hand
TmSession a recorder with the client's call shapes (ClientInterface,
Target, KeyTuple, DataTuple, table make_key/make_data/entry_get/entry_mod/
default_entry_set, as in bf-drivers' bfruntime_grpc_client/python/client.py)
and check what would be sent: queue operations resolved through tm.port.cfg,
per-pipe tables set as default entries, values typed as BF-RT wants them.
"""

from __future__ import annotations

import sys
import types

import pytest

from controller import bfrt_tm
from controller.tofino import tm_config
from controller.tofino_pipeline import CHIPS
from controller.topology import parse

PORT_CFG = {5: {"pg_id": 1, "egress_qid_queues": [4, 5, 6, 7]}}
"""dev_port -> what tm.port.cfg would say about it."""


def recorder() -> tuple[types.ModuleType, list]:
    calls: list = []
    gc = types.ModuleType("bfrt_grpc.client")

    class Tuple:
        def __init__(self, name, value=None, **typed):
            self.name, self.value = name, value if value is not None else typed

        def __repr__(self):
            return f"{self.name}={self.value}"

    class Data:
        def __init__(self, values):
            self.values = values

        def to_dict(self):
            return self.values

    class Table:
        def __init__(self, name):
            self.name = name

        def make_key(self, fields):
            return {f.name: f.value for f in fields}

        def make_data(self, fields, action=None):
            return ({f.name: f.value for f in fields}, action)

        def entry_get(self, target, keys, flags):
            calls.append(("get", self.name, target, keys[0]))
            yield Data(PORT_CFG[keys[0]["dev_port"]]), keys[0]

        def entry_mod(self, target, keys, data):
            calls.append(("mod", self.name, target, keys[0], data[0]))

        def default_entry_set(self, target, data):
            calls.append(("default", self.name, target, data))

    class Info:
        def table_get(self, name):
            return Table(name)

    class ClientInterface:
        def __init__(self, address, client_id, device_id):
            calls.append(("connect", address, device_id))

        def bfrt_info_get(self, program):
            return Info()

        def bind_pipeline_config(self, program):
            calls.append(("bind", program))

        def tear_down_stream(self):
            calls.append(("close",))

    gc.ClientInterface = ClientInterface
    gc.Target = lambda device_id, pipe_id: (device_id, pipe_id)
    gc.KeyTuple = Tuple
    gc.DataTuple = Tuple
    return gc, calls


@pytest.fixture
def bfrt(monkeypatch):
    gc, calls = recorder()
    package = types.ModuleType("bfrt_grpc")
    package.client = gc
    monkeypatch.setitem(sys.modules, "bfrt_grpc", package)
    monkeypatch.setitem(sys.modules, "bfrt_grpc.client", gc)
    return calls


def fabric():
    return parse(
        {
            "switches": {"s1": {"target": "tofino", "grpc": "127.0.0.1:1", "deflect_ports": [64]}},
            "hosts": {"h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}},
            "links": [{"a": "h1", "b": "s1:5", "rate_bps": 25_000_000_000}],
            "thresholds": {"data_queue_bytes": 8000},
        }
    )


def test_operations_become_bfrt_calls(bfrt) -> None:
    config = tm_config(fabric(), "s1", CHIPS["tofino"])
    assert bfrt_tm.apply_config(config, "10.0.0.9:50052") == len(config["operations"])
    assert bfrt[:2] == [("connect", "10.0.0.9:50052", 0), ("bind", "forgive")]
    assert bfrt[-1] == ("close",)
    writes = [c for c in bfrt if c[0] in ("mod", "default")]
    assert writes[0] == (
        "default",
        "tf1.tm.pipe.cfg",
        (0, 0),
        ({"mirror_drop_dev_port": 64, "mirror_drop_queue_nr": 0}, None),
    )
    # qid 0 and 1 of dev_port 5 are port group 1's queues 4 and 5
    mods = {(c[1], c[3].get("pg_queue", c[3].get("dev_port"))): c[4] for c in writes[1:]}
    assert mods["tf1.tm.queue.sched_cfg", 4] == ({"max_priority": {"str_val": "HIGH"}}, None)
    assert mods["tf1.tm.queue.sched_cfg", 5] == ({"max_priority": {"str_val": "LOW"}}, None)
    assert mods["tf1.tm.queue.buffer", 5] == (
        {"guaranteed_cells": 100, "tail_drop_enable": {"bool_val": True}},
        "buffer_only",
    )
    assert mods["tf1.tm.port.sched_shaping", 5][0]["max_rate"] == 25_000_000
    assert all(c[3] == {"dev_port": 5} for c in bfrt if c[0] == "get")


def test_cli_names_one_switch_and_reports_a_missing_client(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "tm.json"
    path.write_text('[{"switch": "a", "operations": []}, {"switch": "b", "operations": []}]')
    assert bfrt_tm.main([str(path), "--bfrt", "x:1"]) == 1
    assert "--switch" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "bfrt_grpc", None)
    monkeypatch.delenv("SDE_INSTALL", raising=False)
    assert bfrt_tm.main([str(path), "--bfrt", "x:1", "--switch", "a"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bfrt_grpc" in err[0] and "SDE_INSTALL" in err[0]
