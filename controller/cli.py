"""`forgive-ctl`: configure a fabric's switches over P4Runtime and read their counters.

    forgive-ctl apply TOPOLOGY.json [--p4info P] [--device-config J]
    forgive-ctl counters TOPOLOGY.json [--switch s1]

Any refusal is one line on stderr: exit status 2 for bad input (a description,
P4Info or device config that does not check out, an unknown --switch), 1 for a
switch that does not answer or refuses a write. Nothing is written to any
switch unless the input is valid and every switch answered.
"""

from __future__ import annotations

import argparse
import sys

import grpc

from controller import DEVICE_CONFIG, P4INFO
from controller.client import SwitchUnreachable, WriteFailed
from controller.fabric_control import FabricController
from controller.p4info import ConfigError
from controller.shaping import ShapingFailed
from controller.topology import load
from switch_model.surface import PortCounters


def format_counters(switch: str, rows: dict[int, PortCounters]) -> str:
    header = f"{'switch':<8}{'port':>5}{'tx_packets':>12}{'tx_bytes':>14}{'ce_marks':>10}{'trims':>9}{'drops':>9}"
    lines = [header]
    for port, row in sorted(rows.items()):
        lines.append(
            f"{switch:<8}{port:>5}{row.tx_packets:>12}{row.tx_bytes:>14}"
            f"{row.ce_marks:>10}{row.trims:>9}{row.drops:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forgive-ctl", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("apply", "counters"))
    parser.add_argument("topology")
    parser.add_argument("--p4info", default=str(P4INFO))
    parser.add_argument("--device-config", default=str(DEVICE_CONFIG))
    parser.add_argument("--switch", action="append", help="only these switches (counters)")
    args = parser.parse_args(argv)
    controller = None
    try:
        controller = FabricController(load(args.topology), args.p4info, args.device_config)
        if args.command == "apply":
            for name, report in controller.apply().items():
                print(
                    f"{name}: pipeline {'pushed' if report.pipeline_pushed else 'kept'}, "
                    f"{report.inserted} inserted, {report.modified} modified, "
                    f"{report.deleted} deleted"
                )
        else:
            controller.connect(write=False)  # reading needs no mastership
            for name in args.switch or sorted(controller.fabric.switches):
                if name not in controller.fabric.switches:
                    raise ConfigError(f"no switch {name} in {args.topology}")
                print(format_counters(name, controller.counters(name)))
    except ConfigError as err:
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
