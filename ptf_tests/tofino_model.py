"""The PTF target for p4src/tna/forgive.p4: tofino-model driven by bf_switchd.

Both come with an installed SDE (open-p4studio; $SDE_INSTALL). The model
attaches device ports to the harness's interfaces one to one (a PortToIf
file), so the suite's port numbers are Tofino 1 device ports (1 to 4 are in
pipe 0). bf_switchd starts without a program (--skip-p4) and serves P4Runtime
on the endpoint's gRPC port (--p4rt-server) and BF-RT on its second port;
queue rates and buffers, which P4Runtime cannot set, go over BF-RT
(controller.bfrt_tm).

The model runs with --dod-test-mode: it deflects every tenth packet sent with
deflect_on_drop, whatever the queue holds, to device port 0, and does not
pace queues by rate (docs/tofino.md). Tests needing a standing queue skip on
it; DeflectTrimTest exercises the trim path instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from controller.bfrt_tm import TmSession, TmUnavailable, bfrt_client
from controller.tofino import QID_HIGH, QID_LOW, queue_buffer
from controller.tofino_pipeline import CHIPS, device_config_path, p4info_path
from ptf_tests.target import SwitchTarget, wait_for_listen
from switch_model.port import PRIO_HIGH, PRIO_LOW
from topologies.processes import stop_process

SKIP_P4_CONF = Path("share/p4/targets/tofino/tofino_skip_p4.conf")
"""bf_switchd's configuration for a device with no program yet, under $SDE_INSTALL."""
TOFINO1_CHIP_TYPE = 2
"""tofino-model --chip-type for Tofino 1 (run_tofino_model.sh)."""


def sde_install() -> Path | None:
    value = os.environ.get("SDE_INSTALL")
    return Path(value) if value else None


class TofinoModelTarget(SwitchTarget):
    """tofino-model with bf_switchd's P4Runtime server (Tofino 1)."""

    name = "tofino-model"
    arch = "tna"
    chip = CHIPS["tofino"]
    TOOLS: ClassVar[tuple[str, ...]] = ("tofino-model", "bf_switchd")

    def __init__(self, endpoint) -> None:
        super().__init__(endpoint)
        self._procs: list[subprocess.Popen] = []

    @classmethod
    def pipeline(cls) -> tuple[Path, Path]:
        return p4info_path(cls.chip.name), device_config_path(cls.chip.name)

    @classmethod
    def missing(cls) -> str | None:
        sde = sde_install()
        if sde is None:
            return "SDE_INSTALL not set (tofino-model and bf_switchd come with the SDE)"
        for tool in cls.TOOLS:
            if not (sde / "bin" / tool).is_file():
                return f"{tool} not in $SDE_INSTALL/bin"
        if not (sde / SKIP_P4_CONF).is_file():
            return f"$SDE_INSTALL/{SKIP_P4_CONF} missing"
        try:
            bfrt_client()
        except TmUnavailable as err:
            return str(err)
        for artifact in cls.pipeline():
            if not artifact.is_file():
                return f"{artifact.name} for tofino missing (run make p4-tna; needs bf-p4c)"
        return None

    def _spawn(self, cmd: list[str], log: str, env: dict) -> subprocess.Popen:
        ep = self.endpoint
        with open(ep.log_dir / log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ep.netns, *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ep.log_dir,
            )
        self._procs.append(proc)
        return proc

    def start(self, timeout: float = 180.0) -> None:
        ep = self.endpoint
        sde = sde_install()
        assert sde is not None, "start() without SDE_INSTALL"
        ports = ep.log_dir / "tofino-model-ports.json"
        ports.write_text(
            json.dumps(
                {"PortToIf": [{"device_port": p, "if": i} for p, i in sorted(ep.ports.items())]}
            )
        )
        env = {**os.environ, "LD_LIBRARY_PATH": f"{sde / 'lib'}:/usr/local/lib"}
        model = [str(sde / "bin" / "tofino-model"), "--chip-type", str(TOFINO1_CHIP_TYPE)]
        model += ["-f", str(ports), "--install-dir", str(sde), "--log-dir", str(ep.log_dir)]
        model += ["--dod-test-mode"]
        self._spawn(model, "tofino-model.log", env)
        switchd = [str(sde / "bin" / "bf_switchd"), "--install-dir", str(sde)]
        switchd += ["--conf-file", str(sde / SKIP_P4_CONF), "--skip-p4", "--background"]
        switchd += ["--p4rt-server", ep.grpc_addr, "--bfrt-grpc-port", str(ep.aux_port)]
        proc = self._spawn(switchd, "bf_switchd.log", env)
        deadline = time.monotonic() + timeout
        wait_for_listen(ep.netns, ep.grpc_port, deadline, proc)
        wait_for_listen(ep.netns, ep.aux_port, deadline, proc)

    def stop(self) -> None:
        for proc in reversed(self._procs):
            stop_process(proc)
        self._procs = []

    def apply_tm(self, ops: list[dict]) -> None:
        """BF-RT operations (controller.tofino's, as tm_config writes them), reached from
        inside the switch's namespace like everything else."""
        session = TmSession(f"127.0.0.1:{self.endpoint.aux_port}")
        try:
            for op in ops:
                session.apply(op)
        finally:
            session.close()

    def _queue_op(self, table: str, port: int, qid: int, data: dict, **extra) -> dict:
        return {
            "table": f"{self.chip.bfrt_prefix}.tm.{table}",
            "pipe": port >> 7,
            "queue": {"dev_port": port, "qid": qid},
            "data": data,
            **extra,
        }

    def set_queue_rate(self, port: int, pps: int, priority: int = PRIO_LOW) -> None:
        qid = {PRIO_LOW: QID_LOW, PRIO_HIGH: QID_HIGH}[priority]
        shaping = {"unit": "PPS", "provisioning": "UPPER", "max_rate": pps, "max_burst_size": 1}
        self.apply_tm(
            [
                self._queue_op("queue.sched_shaping", port, qid, shaping),
                self._queue_op("queue.sched_cfg", port, qid, {"max_rate_enable": pps != 0}),
            ]
        )

    def set_data_queue(self, port: int, nbytes: int) -> None:
        """The TM buffer of the port's data queue: what it cannot hold is deflected."""
        self.apply_tm([queue_buffer(self.chip, port, QID_LOW, nbytes)])
