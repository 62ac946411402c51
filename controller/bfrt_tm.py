"""Apply controller.tofino.tm_config's operations over BF-RT gRPC.

bf_switchd serves BF-RT on --bfrt-grpc-port (50052 by default). The client
is the SDE's own Python package, bfrt_grpc (installed under
$SDE_INSTALL/lib/python3.*/site-packages/tofino), not on PyPI: where it cannot
be imported, `TmSession` says so in one line.

    python -m controller.bfrt_tm tm-config.json --bfrt 127.0.0.1:50052
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from controller.tofino_pipeline import PROGRAM


class TmUnavailable(RuntimeError):
    """No BF-RT client here, or the switch refused."""


def bfrt_client():
    """The SDE's bfrt_grpc.client module, or TmUnavailable."""
    sde = os.environ.get("SDE_INSTALL")
    if sde:
        for site in sorted(Path(sde).glob("lib/python3*/site-packages")):
            for path in (site, site / "tofino", site / "tofino" / "bfrt_grpc"):
                if path.is_dir() and str(path) not in sys.path:
                    sys.path.append(str(path))
    try:
        return importlib.import_module("bfrt_grpc.client")
    except ImportError:
        raise TmUnavailable(
            "bfrt_grpc (the SDE's BF-RT client) is not importable: install the SDE "
            "and set SDE_INSTALL"
        ) from None


class TmSession:
    """One BF-RT connection to one device, bound to the FORGIVE program."""

    def __init__(self, address: str, device_id: int = 0, client_id: int = 1):
        self.gc = bfrt_client()
        self.device_id = device_id
        try:
            self.interface = self.gc.ClientInterface(address, client_id, device_id)
            self.info = self.interface.bfrt_info_get(PROGRAM)
            self.interface.bind_pipeline_config(PROGRAM)
        except Exception as err:  # the SDE client raises its own exception types
            raise TmUnavailable(f"BF-RT at {address}: {err}") from None

    def close(self) -> None:
        self.interface.tear_down_stream()

    def _target(self, pipe: int):
        return self.gc.Target(device_id=self.device_id, pipe_id=pipe)

    def _data(self, table, data: dict, action: str | None = None):
        fields = []
        for name, value in data.items():
            if isinstance(value, bool):
                fields.append(self.gc.DataTuple(name, bool_val=value))
            elif isinstance(value, str):
                fields.append(self.gc.DataTuple(name, str_val=value))
            else:
                fields.append(self.gc.DataTuple(name, value))
        return table.make_data(fields, action)

    def queue_key(self, prefix: str, pipe: int, dev_port: int, qid: int) -> dict:
        """(dev_port, qid) as the TM's queue tables name it: port group and its queue."""
        table = self.info.table_get(f"{prefix}.tm.port.cfg")
        key = table.make_key([self.gc.KeyTuple("dev_port", dev_port)])
        data, _ = next(table.entry_get(self._target(pipe), [key], {"from_hw": False}))
        port = data.to_dict()
        return {"pg_id": port["pg_id"], "pg_queue": port["egress_qid_queues"][qid]}

    def apply(self, op: dict) -> None:
        table = self.info.table_get(op["table"])
        target = self._target(op["pipe"])
        data = self._data(table, op["data"], op.get("action"))
        if "queue" in op:
            prefix = op["table"].split(".")[0]
            key = self.queue_key(prefix, op["pipe"], op["queue"]["dev_port"], op["queue"]["qid"])
        else:
            key = op.get("key")
        if key is None:
            table.default_entry_set(target, data)
            return
        fields = [self.gc.KeyTuple(name, value) for name, value in key.items()]
        table.entry_mod(target, [table.make_key(fields)], [data])


def apply_config(config: dict, address: str, device_id: int = 0) -> int:
    """Apply one switch's tm_config; returns how many operations were written."""
    session = TmSession(address, device_id)
    try:
        for op in config["operations"]:
            session.apply(op)
    finally:
        session.close()
    return len(config["operations"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="output of forgive-ctl tm-config (one switch or a list)")
    parser.add_argument("--bfrt", required=True, help="HOST:PORT of bf_switchd's BF-RT server")
    parser.add_argument("--switch", help="which switch of the list (default: the only one)")
    parser.add_argument("--device-id", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        loaded = json.loads(Path(args.config).read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"bfrt_tm: cannot read {args.config}: {err}", file=sys.stderr)
        return 1
    configs = loaded if isinstance(loaded, list) else [loaded]
    chosen = [c for c in configs if args.switch in (None, c.get("switch"))]
    if len(chosen) != 1:
        print("bfrt_tm: name one switch with --switch", file=sys.stderr)
        return 1
    try:
        count = apply_config(chosen[0], args.bfrt, args.device_id)
    except TmUnavailable as err:
        print(f"bfrt_tm: {err}", file=sys.stderr)
        return 1
    print(f"{chosen[0]['switch']}: {count} TM settings applied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
