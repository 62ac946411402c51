"""`forgive-ctl`: configure a fabric's switches over P4Runtime and read their counters.

    forgive-ctl apply TOPOLOGY.json [--p4info P] [--device-config J]
    forgive-ctl counters TOPOLOGY.json [--switch s1] [--trim]
    forgive-ctl tm-config TOPOLOGY.json [--switch s1]   (Tofino: BF-RT TM settings as JSON)
    forgive-ctl sonic FABRIC [--switch s1]   (the trimming as SONiC config DB, JSON)
    forgive-ctl shell SWITCH [--topology T] [-c CODE]   (p4runtime-shell on a running switch)

Every command that dials the switches takes --tls-ca CA [--tls-cert PEM --tls-key PEM]
[--tls-server-name NAME] to speak P4Runtime over TLS (mutual TLS with the pair).

`counters --trim` prints SAI's trim counters per port and trimming queue:
trimmed, trimmed and sent, trimmed but dropped. `sonic` takes a description
(.json), a fabric file (.toml) or a fabric preset (2to1, ...) and touches no
switch.

The P4Info and device config default to the BMv2 build (p4src/build) or, for
a fabric of Tofino switches, that chip's bf-p4c build (p4src/tna/build).

Any refusal is one line on stderr: exit status 2 for bad input (a description,
P4Info or device config that does not check out, an unknown --switch), 1 for a
switch that does not answer or refuses a write. Nothing is written to any
switch unless the input is valid and every switch answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import grpc

from commands.tls_options import add_tls_options, client_tls
from common.tls import TlsError
from controller import DEVICE_CONFIG, P4INFO
from controller.client import SwitchUnreachable, WriteFailed
from controller.p4info import ConfigError
from controller.shaping import ShapingFailed
from controller.sonic import config_db
from controller.tofino import controller_for, tm_config
from controller.tofino_pipeline import CHIPS, device_config_path, p4info_path
from controller.topology import Fabric, load
from switch_model.port import PRIO_LOW
from switch_model.surface import PortCounters

TRIM_QUEUE = PRIO_LOW
"""The one queue of a port whose packets are trimmed (SAI counts trims per such queue)."""
COUNTER_COLUMNS = (
    ("tx_packets", 12),
    ("tx_bytes", 14),
    ("ce_marks", 10),
    ("trims", 9),
    ("drops", 9),
)
TRIM_COLUMNS = (("queue", 6), ("trims", 9), ("trim_tx", 9), ("trim_drops", 11))
"""SAI's trim counters: trimmed, trimmed and sent, trimmed but dropped."""


def format_counters(switch: str, rows: dict[int, PortCounters], columns=COUNTER_COLUMNS) -> str:
    """One line per port: `columns` are (PortCounters field or "queue", width)."""
    lines = [f"{'switch':<8}{'port':>5}" + "".join(f"{name:>{w}}" for name, w in columns)]
    for port, row in sorted(rows.items()):
        values = {**asdict(row), "queue": TRIM_QUEUE}
        cells = "".join(f"{values[name]:>{w}}" for name, w in columns)
        lines.append(f"{switch:<8}{port:>5}{cells}")
    return "\n".join(lines)


def load_fabric(name: str) -> Fabric:
    """A description file, or a fabric file or preset at the fabric's own scale (a real
    switch's queues, not an emulation's)."""
    if name.lower().endswith(".json"):
        return load(name)
    from runplan.fabric import FabricError, plan, preset, with_scaling
    from runplan.fabric import load as load_spec
    from runplan.scaling import Scaling

    try:
        spec = load_spec(name) if name.lower().endswith(".toml") else preset(name)
        own = Scaling(host_link_bps=spec.scaling.fabric_host_link_bps, byte_scale=1)
        return plan(with_scaling(spec, own)).fabric()
    except FabricError as err:
        raise ConfigError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["shell"]:
        from commands import p4shell

        return p4shell.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="forgive-ctl",
        description=__doc__.splitlines()[0],
        epilog="apply: configure every switch of TOPOLOGY (a description, .json); counters: "
        "print each switch's port counters; tm-config: Tofino's traffic-manager settings; "
        "sonic: the trimming as SONiC config DB; shell SWITCH: p4runtime-shell on a running "
        "switch as a reader beside the run's controller (forgive-ctl shell --help)",
    )
    parser.add_argument("command", choices=("apply", "counters", "tm-config", "sonic", "shell"))
    parser.add_argument("topology", help="the fabric description (.json); sonic also takes a "
                        "fabric file (.toml) or a preset")  # fmt: skip
    parser.add_argument("--p4info")
    parser.add_argument("--device-config")
    parser.add_argument(
        "--switch", action="append", help="only these switches (counters, tm-config, sonic)"
    )
    parser.add_argument("--trim", action="store_true", help="counters: the trim counters")
    add_tls_options(parser)
    args = parser.parse_args(argv)
    controller = None
    try:
        tls = client_tls(args)
        fabric = load_fabric(args.topology) if args.command == "sonic" else load(args.topology)
        chip = next(iter({s.target for s in fabric.switches.values()} & set(CHIPS)), None)
        names = args.switch or sorted(fabric.switches)
        for name in names:
            if name not in fabric.switches:
                raise ConfigError(f"no switch {name} in {args.topology}")
        if args.command == "sonic":
            print(json.dumps({n: config_db(fabric, n) for n in names}, indent=2))
            return 0
        if args.command == "tm-config":
            if chip is None:
                raise ConfigError("tm-config is for Tofino switches; this fabric has none")
            print(json.dumps([tm_config(fabric, n, CHIPS[chip]) for n in names], indent=1))
            return 0
        controller = controller_for(fabric)(
            fabric,
            args.p4info or (p4info_path(chip) if chip else P4INFO),
            args.device_config or (device_config_path(chip) if chip else DEVICE_CONFIG),
            tls,
        )
        if args.command == "apply":
            for name, report in controller.apply().items():
                print(
                    f"{name}: pipeline {'pushed' if report.pipeline_pushed else 'kept'}, "
                    f"{report.inserted} inserted, {report.modified} modified, "
                    f"{report.deleted} deleted"
                )
        else:
            controller.connect(write=False)  # reading needs no mastership
            columns = TRIM_COLUMNS if args.trim else COUNTER_COLUMNS
            for name in names:
                print(format_counters(name, controller.counters(name), columns))
    except (ConfigError, TlsError) as err:
        print(f"forgive-ctl: {err}", file=sys.stderr)
        return 2
    except (SwitchUnreachable, WriteFailed, ShapingFailed) as err:
        print(f"forgive-ctl: {err}", file=sys.stderr)
        return 1
    except grpc.RpcError as err:
        print(f"forgive-ctl: P4Runtime {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    finally:
        if controller is not None:
            controller.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
