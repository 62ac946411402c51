"""Line rate and queue sizes per port, through whichever channel the target has.

P4Runtime has no queue API. BMv2 takes rates and depths over Thrift through
`simple_switch_CLI`, in packets per second and packets, per priority queue;
the model takes bits per second and bytes on its control socket. One call
serves both, so a runner does not care which target it drives.

BMv2 cannot share one line rate between a port's two queues: each priority
queue is paced on its own, in packets. The closest setting gives each queue
its share of the line in the packets it carries. The high queue is paced and
sized in 58-byte packets (trimmed headers; FTH control packets are as long).
The data queue is sized in full DATA frames (`DATA_FRAME_LEN`) and
paced as if each one shared the line with one such 58-byte packet: at the
emulation's rates a FORGIVE receiver answers every DATA packet with an ACK or
NACK, and the symmetric collectives put about one control packet on a port
per data packet, which the model's shared line rate takes from the data
queue. docs/dataplane.md ("Queueing on the two targets") measures what
remains.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

from common.wire import DATA_FRAME_LEN, TRIMMED_FRAME_LEN
from controller.topology import PortSpec, SwitchSpec
from switch_model import control
from switch_model.port import PRIO_HIGH, PRIO_LOW


class ShapingFailed(RuntimeError):
    pass


def bmv2_commands(port: int, spec: PortSpec) -> list[str]:
    """Per priority queue, its rate in packets/s and its depth in packets (see above)."""
    commands = []
    for prio, paced, sized, depth_bytes in (
        (
            PRIO_LOW,
            DATA_FRAME_LEN + TRIMMED_FRAME_LEN,
            DATA_FRAME_LEN,
            spec.low_queue_bytes,
        ),
        (PRIO_HIGH, TRIMMED_FRAME_LEN, TRIMMED_FRAME_LEN, spec.high_queue_bytes),
    ):
        if spec.rate_bps is not None:
            pps = max(1, round(spec.rate_bps / (8 * paced)))
            commands.append(f"set_queue_rate {pps} {port} {prio}")
        if depth_bytes is not None:
            depth = max(1, math.ceil(depth_bytes / sized))
            commands.append(f"set_queue_depth {depth} {port} {prio}")
    return commands


def check_shaping_channel(switch: SwitchSpec) -> None:
    """Raise ShapingFailed unless the switch's rate/buffer channel answers (model) or its
    CLI is installed (BMv2)."""
    if switch.target == "model":
        try:
            control.request(switch.control, {"cmd": "stats"})
        except (OSError, ValueError) as err:
            raise ShapingFailed(
                f"switch {switch.name}: control socket {switch.control}: {err}"
            ) from None
    elif shutil.which("simple_switch_CLI") is None:
        raise ShapingFailed(f"switch {switch.name}: simple_switch_CLI not found on PATH")


def apply_shaping(switch: SwitchSpec, ports: dict[int, PortSpec]) -> None:
    """Set every port's rate and buffer on one switch; raise ShapingFailed with the reason."""
    if switch.target == "model":
        for port, spec in sorted(ports.items()):
            try:
                control.request(
                    switch.control,
                    {
                        "cmd": "set_port",
                        "port": port,
                        "rate_bps": spec.rate_bps,
                        "low_queue_bytes": spec.low_queue_bytes,
                        "high_queue_bytes": spec.high_queue_bytes,
                    },
                )
            except (OSError, ValueError) as err:
                raise ShapingFailed(f"switch {switch.name} port {port}: {err}") from None
        return
    commands = [c for port, spec in sorted(ports.items()) for c in bmv2_commands(port, spec)]
    if not commands:
        return
    cli = shutil.which("simple_switch_CLI")
    if cli is None:
        raise ShapingFailed(f"switch {switch.name}: simple_switch_CLI not found on PATH")
    # the CLI is a Python script; this interpreter sees Debian's python3-thrift
    result = subprocess.run(
        [sys.executable, cli, "--thrift-port", str(switch.thrift_port)],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0 or "Error" in result.stdout:
        raise ShapingFailed(
            f"switch {switch.name}: simple_switch_CLI failed: "
            f"{(result.stderr or result.stdout).strip().splitlines()[-1:]}"
        )
