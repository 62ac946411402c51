"""One emulated training run on a Mininet fabric of FORGIVE switches, start to teardown.

`run_once` builds the network from a fabric plan (switch model or BMv2),
configures every switch through the controller, starts one `forgive-train`
(training loop and host agent in one process) per host, samples the switches'
counters while the steps run, and collects the records into a RunResult.
Whatever happens — success, a failing rank, a timeout, Ctrl-C or SIGTERM — the
trainers, switch processes and Mininet links are removed before it returns.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller import DEVICE_CONFIG, P4INFO
from controller.topology import parse as parse_description
from controller.topology import switch_port_mac
from host_agent.policies import parse_policy
from topologies.collect import collect, read_jsonl
from topologies.fabric import FabricSpec, Host, Plan, plan
from topologies.processes import stop_process
from topologies.results import RunResult
from topologies.scaling import FRAME_BYTES
from workload.plan import TrainingConfig

MTU = 9000
SAMPLE_EVERY_S = 0.5
TARGETS = ("model", "bmv2")
PLACEMENTS = ("interleaved", "packed")


class RunError(RuntimeError):
    """A run that could not start or did not finish; the message says why in one line."""


@dataclass(frozen=True)
class Workload:
    """The training job at fabric scale; `RunConfig.training_args` shrinks it by the scaling rule."""

    steps: int = 20
    grad_bytes: int = 64 << 20
    """Gradient bytes each rank all-reduces per step."""
    tp_bytes: int = 16 << 20
    pp_bytes: int = 4 << 20
    compute_s: float = 0.5e-3
    detector: str = "static"
    burst: bool = False
    """A background burst (class other) from the last rank to rank 0 on step 2."""


@dataclass(frozen=True)
class RunConfig:
    fabric: FabricSpec
    switch: str = "model"
    policy: str = "forgive"
    seed: int = 1
    workload: Workload = Workload()
    timeout_s: float = 600.0
    placement: str = "interleaved"
    """Ranks to hosts: 'interleaved' alternates leaves, so ring, TP and PP neighbours sit
    on different leaves and cross the (oversubscribed) uplinks; 'packed' fills one leaf
    after another, which keeps most of the ring inside a leaf."""

    def validate(self) -> None:
        """Refuse a bad configuration before anything is started (one-line RunError)."""
        if self.switch not in TARGETS:
            raise RunError(f"--switch must be one of {', '.join(TARGETS)}, got {self.switch!r}")
        if self.placement not in PLACEMENTS:
            raise RunError(
                f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        try:
            parse_policy(self.policy)
            self.training_config(plan(self.fabric), rank=0).validate()
        except ValueError as err:
            raise RunError(str(err)) from None
        if self.switch == "bmv2":
            from topologies.switches import Bmv2Switch

            reason = Bmv2Switch.missing()
            if reason:
                raise RunError(f"--switch bmv2: {reason}")
        for artifact in (P4INFO, DEVICE_CONFIG):
            if not artifact.exists():
                raise RunError(f"{artifact} is missing: run `make p4`")

    def training_config(self, fabric_plan: Plan, rank: int) -> TrainingConfig:
        sc, wl = self.fabric.scaling, self.workload
        ranks = tuple(h.ip for h in self.rank_hosts(fabric_plan))
        return TrainingConfig(
            ranks=ranks,
            rank=rank,
            steps=wl.steps,
            grad_bytes=sc.size(wl.grad_bytes),
            compute_s=sc.duration(wl.compute_s),
            tp_bytes=sc.size(wl.tp_bytes) if wl.tp_bytes else 0,
            pp_bytes=sc.size(wl.pp_bytes) if wl.pp_bytes else 0,
            detector=wl.detector,
            burst_step=2 if wl.burst else None,
            burst_bytes=sc.size(wl.grad_bytes) * 2,
            burst_src=len(ranks) - 1,
            burst_dst=0,
            seed=self.seed,
        )

    def rank_hosts(self, fabric_plan: Plan) -> list[Host]:
        """The host of each rank, in rank order."""
        if self.placement == "packed":
            return list(fabric_plan.hosts)
        per_leaf = self.fabric.hosts_per_leaf
        hosts = fabric_plan.hosts
        leaves = [hosts[i : i + per_leaf] for i in range(0, len(hosts), per_leaf)]
        return [leaf[k] for k in range(per_leaf) for leaf in leaves]


def require_root() -> None:
    if os.geteuid() != 0:
        raise RunError("Mininet needs root: run as root (e.g. sudo)")
    if shutil.which("mnexec") is None:
        raise RunError("mnexec not found: install Debian's mininet package (make setup does)")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so the same teardown runs."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _build_network(fabric_plan: Plan, switch: str, log_dir: Path):
    from mininet.link import Link
    from mininet.net import Mininet
    from mininet.node import Host

    from topologies.switches import Bmv2Switch, ModelSwitch

    cls = ModelSwitch if switch == "model" else Bmv2Switch
    net = Mininet(topo=None, controller=None, host=Host, link=Link, build=False, autoSetMacs=False)
    for name in fabric_plan.switches:
        net.addSwitch(name, cls=cls, log_dir=str(log_dir))
    for host in fabric_plan.hosts:
        net.addHost(host.name, ip=f"{host.ip}/8", mac=host.mac)
    for link in fabric_plan.links:
        net.addLink(link.a, link.b, port1=link.a_port or 0, port2=link.b_port)
    return net


def _quiet_interfaces(net) -> None:
    """MTU 9000 everywhere, and no IPv6 chatter on the fabric (the switches route IPv4 only)."""
    for node in net.hosts + net.switches:
        for intf in node.intfList():
            if intf.name == "lo":
                continue
            node.cmd(f"ip link set {intf.name} mtu {MTU}")
            node.cmd(f"sysctl -qw net.ipv6.conf.{intf.name}.disable_ipv6=1")


class Progress:
    """One status line per run, rewritten in place on a terminal, one line per step elsewhere."""

    def __init__(self, label: str, steps: int, stream=sys.stderr) -> None:
        self.label, self.steps, self.stream = label, steps, stream
        self.tty = stream.isatty()
        self.last = -1
        self.started = time.monotonic()

    def update(self, done: int, trims: int) -> None:
        if done == self.last and not self.tty:
            return
        self.last = done
        text = (
            f"{self.label}: step {done}/{self.steps}, {trims} trims, "
            f"{time.monotonic() - self.started:.1f} s"
        )
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _steps_done(paths: list[Path]) -> int:
    """The last step every rank has finished, read from the training records so far."""
    done = []
    for path in paths:
        if not path.exists():
            return 0
        steps = [r["step"] for r in read_jsonl(path) if r.get("type") == "train_step"]
        done.append(max(steps, default=0))
    return min(done, default=0)


def _totals(controller, switches: list[str]) -> dict[str, dict[str, int]]:
    out = {}
    for name in switches:
        total: dict[str, int] = {}
        for row in controller.counters(name).values():
            for key, value in row.items():
                total[key] = total.get(key, 0) + value
        out[name] = total
    return out


def run_once(config: RunConfig, out_dir: Path, label: str = "") -> RunResult:
    """Run one policy and seed on a fresh network; raises RunError when the run fails."""
    config.validate()
    require_root()
    from controller.fabric_control import FabricController

    fabric_plan = plan(config.fabric)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = out_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    train_files = {h.name: out_dir / f"{h.name}.train.jsonl" for h in fabric_plan.hosts}
    stats_files = {h.name: out_dir / f"{h.name}.agent.jsonl" for h in fabric_plan.hosts}
    for path in (*train_files.values(), *stats_files.values()):
        path.unlink(missing_ok=True)
    sc = config.fabric.scaling
    net = controller = None
    trainers: dict[str, subprocess.Popen] = {}
    timeline: list[dict[str, Any]] = []
    progress = Progress(label or f"{config.policy} seed {config.seed}", config.workload.steps)
    with sigterm_as_interrupt(), ExitStack() as logs:
        try:
            net = _build_network(fabric_plan, config.switch, log_dir)
            net.build()
            _quiet_interfaces(net)
            net.start()
            endpoints = {s.name: s.spec() for s in net.switches}
            description = fabric_plan.controller_description(endpoints)
            controller = FabricController(parse_description(description), P4INFO, DEVICE_CONFIG)
            controller.apply()
            for rank, host in enumerate(config.rank_hosts(fabric_plan)):
                trainers[host.name] = net.get(host.name).popen(
                    _trainer_command(config, fabric_plan, rank, train_files, stats_files),
                    stdout=logs.enter_context(open(log_dir / f"{host.name}.log", "wb")),
                    stderr=subprocess.STDOUT,
                )
            started = time.monotonic()
            deadline = started + config.timeout_s
            while any(p.poll() is None for p in trainers.values()):
                if any(p.returncode for p in trainers.values()):
                    break  # the other ranks would only wait for it until their timeout
                if time.monotonic() > deadline:
                    raise RunError(f"run did not finish within {config.timeout_s:.0f} s")
                totals = _totals(controller, fabric_plan.switches)
                trims = sum(t["trims"] for t in totals.values())
                timeline.append(
                    {
                        "t": time.monotonic() - started,
                        "trims": trims,
                        "ce_marks": sum(t["ce_marks"] for t in totals.values()),
                    }
                )
                progress.update(_steps_done(list(train_files.values())), trims)
                time.sleep(SAMPLE_EVERY_S)
            failed = {name: p.returncode for name, p in trainers.items() if p.returncode}
            if failed:
                name, code = next(iter(failed.items()))
                raise RunError(
                    f"{len(failed)} rank(s) failed, {name} with status {code}: "
                    f"{_last_line(log_dir / f'{name}.log')} (logs in {log_dir})"
                )
            counters = _totals(controller, fabric_plan.switches)
            progress.update(config.workload.steps, sum(t["trims"] for t in counters.values()))
        finally:
            progress.close()
            for proc in trainers.values():
                stop_process(proc, timeout=5)
            if controller is not None:
                controller.close()
            if net is not None:
                net.stop()
    return collect(
        policy=config.policy,
        seed=config.seed,
        fabric=config.fabric.name,
        time_scale=sc.time_scale,
        train_files=train_files,
        stats_files=stats_files,
        switch_counters=counters,
        timeline=timeline,
    )


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"


def _trainer_command(
    config: RunConfig,
    fabric_plan: Plan,
    rank: int,
    train_files: dict[str, Path],
    stats_files: dict[str, Path],
) -> list[str]:
    host = config.rank_hosts(fabric_plan)[rank]
    sc = config.fabric.scaling
    cfg = config.training_config(fabric_plan, rank)
    cmd = [sys.executable, "-m", "workload.train", "--iface", f"{host.name}-eth0"]
    cmd += ["--policy", config.policy]
    cmd += ["--line-rate", str(sc.rate(config.fabric.host_link_gbps * 1e9))]
    cmd += ["--time-scale", str(sc.time_scale)]
    rto = initial_rto(fabric_plan)
    cmd += ["--rto", f"{rto:.6f}", "--rto-max", f"{10 * rto:.6f}"]
    cmd += ["--gateway-mac", _mac_text(switch_port_mac(host.leaf, host.port))]
    cmd += ["--stats", str(stats_files[host.name]), "--out", str(train_files[host.name])]
    cmd += ["--timeout", str(config.timeout_s), "--config", cfg.to_json()]
    return cmd


def initial_rto(fabric_plan: Plan) -> float:
    """A first timeout no shorter than a full data queue ahead of a packet plus a few hops'
    serialisation at the host rate; later flows use the measured round trip instead."""
    host_rate = fabric_plan.spec.scaling.rate(fabric_plan.spec.host_link_gbps * 1e9)
    queued = fabric_plan.thresholds()["data_queue_bytes"] + 4 * FRAME_BYTES
    return queued * 8 / host_rate


def _mac_text(mac: int) -> str:
    raw = mac.to_bytes(6, "big")
    return ":".join(f"{b:02x}" for b in raw)
