"""One emulated training run on a Mininet fabric of FORGIVE switches, start to teardown.

`run_once` takes a `FabricRun` through its steps: build the network from a
fabric plan (switch model or BMv2), configure every switch through the
controller, start one `forgive-train` (training loop and host agent in one
process) per host, sample the switches' counters while the steps run and
watch every trainer and switch process, then collect the records into a
RunResult. Whatever happens — success, a failing rank or switch, a timeout,
Ctrl-C or SIGTERM — the trainers, switch processes and Mininet links are
removed before it returns.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from common.wire import DATA_FRAME_LEN
from controller import DEVICE_CONFIG, P4INFO
from controller.topology import parse as parse_description
from controller.topology import switch_port_mac
from host_agent.core import CONTROLS, DEFAULT_CONTROL, DEFAULT_PROFILE, PROFILES
from host_agent.policies import DEFAULT_POLICY, parse_policy
from switch_model.surface import PortCounters
from topologies.collect import StepProgress, collect
from topologies.fabric import FabricSpec, Host, Plan, plan
from topologies.leftovers import clear_leftovers, fabric_lock
from topologies.processes import is_stopped, stop_process
from topologies.results import RunResult
from workload.plan import TrainingConfig

MTU = 9000
SAMPLE_EVERY_S = 0.5
TARGETS = ("model", "bmv2")
PLACEMENTS = ("interleaved", "packed")
ENGINES = ("mininet", "sim")
"""Where a run happens: Mininet and real processes (root), or virtual time (topologies.simulated)."""


class RunError(RuntimeError):
    """A run that could not start or did not finish; the message says why in one line."""


@dataclass(frozen=True)
class Workload:
    """The training job at fabric scale; `RunConfig.training_args` shrinks it by the scaling rule."""

    steps: int = 20
    grad_bytes: int = 64 << 20
    """Gradient bytes each rank all-reduces per step."""
    tp_bytes: int = 16 << 20
    """Bytes each rank sends to every other member of its tensor-parallel group."""
    tp_group: int = 2
    pp_bytes: int = 4 << 20
    compute_s: float = 0.5e-3
    detector: str = "static"
    burst: bool = False
    """A background burst (class other) from the last rank to rank 0 on step 2."""
    misclassify: tuple[int, ...] = ()
    """Steps the detector gets wrong on purpose (TrainingConfig.misclassify)."""
    tp_phase: str = "own"
    """Tensor-parallel traffic in its own phase before the all-reduce, or overlapping it
    (TrainingConfig.tp_phase)."""


JOBS: dict[str, Workload] = {
    "default": Workload(),
    # The note's job: tensor-parallel groups of 8 whose all-to-all makes seven senders
    # converge on every receiving link (7 x 54 MiB, three quarters of the bytes), beside the
    # ring all-reduce of 64 MiB gradients (2 x 63/64 x 64 MiB, the quarter that is eligible).
    "note": Workload(grad_bytes=64 << 20, tp_bytes=54 << 20, tp_group=8, pp_bytes=0),
}
"""Named training jobs at fabric scale (`--job`); single options override their sizes."""


@dataclass(frozen=True)
class RunConfig:
    fabric: FabricSpec
    switch: str = "model"
    policy: str = DEFAULT_POLICY
    seed: int = 1
    workload: Workload = Workload()
    timeout_s: float = 600.0
    placement: str = "interleaved"
    """Ranks to hosts: 'interleaved' alternates leaves, so ring, TP and PP neighbours sit
    on different leaves and cross the (oversubscribed) uplinks; 'packed' fills one leaf
    after another, which keeps most of the ring inside a leaf."""
    engine: str = "mininet"
    dcqcn: str = DEFAULT_PROFILE
    """The DCQCN profile every host runs (host_agent.core.dcqcn)."""
    cc: str = DEFAULT_CONTROL
    """The congestion control every sender runs (host_agent.core.CONTROLS; docs/nscc.md)."""
    companion: str | None = None
    """The policy of a second job of the same shape on the other half of the hosts, or None:
    the first job takes the first half of the ranks' hosts, the second the rest."""
    switch_restarts: int = 0
    """How many times a run starts again a switch whose process exited (emulation only).
    0: a switch that exits ends the run, in one line naming it. Above 0: the switch is
    started again on its interfaces, the controller sees its stream end and gives it the
    pipeline and every entry again, the flows recover by retransmission, and each outage is
    counted in the result (RunResult.switch_restarts)."""
    jitter_frames: float = 0.0
    """Simulator only: the most a host's frame is late at its switch port, in full frames at
    the host's line rate (topologies.virtual; 0, exact timing). It breaks the fixed phase
    between equally paced senders that exact timing keeps and the emulation's late
    processes never do (docs/simulation.md, "Agreement with the emulation")."""

    def validate(self) -> None:
        """Refuse a bad configuration before anything is started (one-line RunError)."""
        if self.engine not in ENGINES:
            raise RunError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.switch not in TARGETS:
            raise RunError(f"--switch must be one of {', '.join(TARGETS)}, got {self.switch!r}")
        if self.engine == "sim" and self.switch != "model":
            raise RunError("--engine sim runs the switch model's pipeline: use --switch model")
        if self.placement not in PLACEMENTS:
            raise RunError(
                f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        if self.dcqcn not in PROFILES:
            raise RunError(f"--dcqcn must be one of {', '.join(PROFILES)}, got {self.dcqcn!r}")
        if self.cc not in CONTROLS:
            raise RunError(f"--cc must be one of {', '.join(CONTROLS)}, got {self.cc!r}")
        if self.switch_restarts < 0:
            raise RunError(f"--switch-restarts must be >= 0, got {self.switch_restarts}")
        if self.switch_restarts and self.engine != "mininet":
            raise RunError(
                "--switch-restarts needs --engine mininet (the simulator has no processes)"
            )
        if not (0.0 <= self.jitter_frames < math.inf):
            raise RunError(f"--jitter must be a finite number >= 0, got {self.jitter_frames}")
        if self.jitter_frames and self.engine != "sim":
            raise RunError(
                "--jitter needs --engine sim (the emulation's hosts are late by themselves)"
            )
        if self.companion is not None and self.fabric.host_count < 4:
            raise RunError("a second job needs a fabric of at least 4 hosts (2 per job)")
        try:
            parse_policy(self.policy)
            if self.companion is not None:
                parse_policy(self.companion)
            for job in range(len(self.jobs(plan(self.fabric)))):
                self.training_config(plan(self.fabric), rank=0, job=job).validate()
        except ValueError as err:
            raise RunError(str(err)) from None
        if self.switch == "bmv2" and self.engine == "mininet":
            from topologies.switches import Bmv2Switch

            reason = Bmv2Switch.missing()
            if reason:
                raise RunError(f"--switch bmv2: {reason}")
        for artifact in (P4INFO, DEVICE_CONFIG):
            if not artifact.exists():
                raise RunError(f"{artifact} is missing: run `make p4`")

    def training_config(self, fabric_plan: Plan, rank: int, job: int = 0) -> TrainingConfig:
        sc, wl = self.fabric.scaling, self.workload
        ranks = tuple(h.ip for h in self.jobs(fabric_plan)[job][1])
        return TrainingConfig(
            ranks=ranks,
            rank=rank,
            steps=wl.steps,
            grad_bytes=sc.size(wl.grad_bytes),
            compute_s=sc.duration(wl.compute_s),
            tp_bytes=sc.size(wl.tp_bytes) if wl.tp_bytes else 0,
            tp_group=wl.tp_group,
            pp_bytes=sc.size(wl.pp_bytes) if wl.pp_bytes else 0,
            detector=wl.detector,
            burst_step=2 if wl.burst else None,
            burst_bytes=sc.size(wl.grad_bytes) * 2,
            burst_src=len(ranks) - 1,
            burst_dst=0,
            misclassify=wl.misclassify,
            tp_phase=wl.tp_phase,
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

    def jobs(self, fabric_plan: Plan) -> list[tuple[str, list[Host]]]:
        """(policy, hosts in rank order) of each training job: one, or two with a companion.
        Halving the interleaved order gives each job hosts on every leaf, so both cross the
        same uplinks."""
        hosts = self.rank_hosts(fabric_plan)
        if self.companion is None:
            return [(self.policy, hosts)]
        half = len(hosts) // 2
        return [(self.policy, hosts[:half]), (self.companion, hosts[half : 2 * half])]


def require_root() -> None:
    if os.geteuid() != 0:
        raise RunError("Mininet needs root: run as root (e.g. sudo)")
    if shutil.which("mnexec") is None:
        raise RunError("mnexec not found: install Debian's mininet package (make setup does)")


def say(line: str) -> None:
    """One progress or status line on stderr, at once (the commands' one way to talk)."""
    print(line, file=sys.stderr, flush=True)


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


def _status(code: int) -> str:
    """A process's exit as a person reads it: `status 3`, or the signal that ended it."""
    if code >= 0:
        return f"status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


class FabricRun:
    """One run's network, controller and trainers, each released through one ExitStack.

    As Mininet's own start/stop/run, a run is a few short steps: `build` the
    network and start its switches, `configure` them through the controller,
    `start` the trainers, `run` until they finish, and `stop`, which releases
    whatever the earlier steps acquired, newest first, however far they got.
    Used as a context manager, `stop` runs on every exit.
    """

    def __init__(self, config: RunConfig, out_dir: Path, label: str = "") -> None:
        self.config = config
        self.plan = plan(config.fabric)
        self.out_dir = out_dir
        self.log_dir = out_dir / "logs"
        self.jobs = config.jobs(self.plan)
        hosts = [h for _, job_hosts in self.jobs for h in job_hosts]
        self.train_files = {h.name: out_dir / f"{h.name}.train.jsonl" for h in hosts}
        self.stats_files = {h.name: out_dir / f"{h.name}.agent.jsonl" for h in hosts}
        self.label = label or f"{config.policy} seed {config.seed}"
        self.net = None
        self.controller = None
        self.trainers: dict[str, subprocess.Popen] = {}
        self.timeline: list[dict[str, Any]] = []
        self.counters: dict[str, dict[str, int]] = {}
        self.restarts: list[dict[str, Any]] = []
        self._last_totals: dict[str, dict[str, int]] = {}
        self._earlier_lives: dict[str, dict[str, int]] = {}
        self._stack = ExitStack()

    def __enter__(self) -> FabricRun:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Trainers, controller, switches and links, newest first; safe to call twice."""
        self._stack.close()

    # -- the steps -----------------------------------------------------------------

    def build(self) -> None:
        """A Mininet network of the plan, built and started: every switch process answers."""
        from mininet.net import Mininet

        from topologies.switches import Bmv2Switch, ModelSwitch

        self.log_dir.mkdir(parents=True, exist_ok=True)
        for path in (*self.train_files.values(), *self.stats_files.values()):
            path.unlink(missing_ok=True)
        cls = ModelSwitch if self.config.switch == "model" else Bmv2Switch
        net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False)
        self.net = net
        self._stack.callback(net.stop)
        for name in self.plan.switches:
            net.addSwitch(name, cls=cls, log_dir=str(self.log_dir))
        for host in self.plan.hosts:
            net.addHost(host.name, ip=f"{host.ip}/8", mac=host.mac)
        for link in self.plan.links:
            net.addLink(link.a, link.b, port1=link.a_port or 0, port2=link.b_port)
        net.build()
        _quiet_interfaces(net)
        try:
            net.start()
        except RuntimeError as err:  # a switch that never answered (ForgiveSwitch.start)
            raise RunError(str(err)) from None

    def configure(self) -> None:
        """Every switch configured over P4Runtime; the controller stays primary for the run."""
        from controller.fabric_control import FabricController

        endpoints = {s.name: s.spec() for s in self.net.switches}
        description = self.plan.controller_description(endpoints)
        with self._failures("configuring the switches"):
            self.controller = FabricController(
                parse_description(description), P4INFO, DEVICE_CONFIG
            )
            self._stack.callback(self.controller.close)
            self.controller.apply()

    def start(self) -> None:
        """One `forgive-train` per rank of each job, on its host, logging to its own file."""
        for job, (_, hosts) in enumerate(self.jobs):
            for rank, host in enumerate(hosts):
                command = _trainer_command(
                    self.config, self.plan, rank, self.train_files, self.stats_files, job
                )
                with open(self.log_dir / f"{host.name}.log", "wb") as log:
                    proc = self.net.get(host.name).popen(
                        command, stdout=log, stderr=subprocess.STDOUT
                    )
                self.trainers[host.name] = proc
                self._stack.callback(stop_process, proc, timeout=5)

    def run(self) -> None:
        """Sample the switches until every trainer has finished; fail at once, in one line,
        when a switch process or a rank dies, or the run outlasts its timeout."""
        progress, steps = Progress(self.label, self.config.workload.steps), StepProgress()
        self._stack.callback(progress.close)
        started = time.monotonic()
        deadline = started + self.config.timeout_s
        while True:
            # every trainer polled each time: a rank that failed behind one still running
            # must end the run now, not at the timeout
            codes = [p.poll() for p in self.trainers.values()]
            if all(code is not None for code in codes):
                break
            self._supervise(started)
            if any(codes):
                break  # the other ranks would only wait for it until their timeout
            if time.monotonic() > deadline:
                raise RunError(f"run did not finish within {self.config.timeout_s:.0f} s")
            try:
                totals = self._totals()
            except RunError:
                if not self._restart_due():
                    raise
                continue  # a switch died after _supervise looked: start it again first
            trims = sum(t["trims"] for t in totals.values())
            self.timeline.append(
                {
                    "t": time.monotonic() - started,
                    "trims": trims,
                    "ce_marks": sum(t["ce_marks"] for t in totals.values()),
                }
            )
            progress.update(steps.done(self.train_files.values()), trims)
            time.sleep(SAMPLE_EVERY_S)
        self._check_switches()
        failed = {name: p.returncode for name, p in self.trainers.items() if p.returncode}
        if failed:
            name, code = next(iter(failed.items()))
            raise RunError(
                f"{len(failed)} rank(s) failed, {name} with {_status(code)}: "
                f"{_last_line(self.log_dir / f'{name}.log')} (logs in {self.log_dir})"
            )
        self.counters = self._totals()
        progress.update(self.config.workload.steps, sum(t["trims"] for t in self.counters.values()))

    def result(self) -> RunResult:
        """What the run measured, from the records it left (after `run`)."""
        result = collect_jobs(
            self.config, self.jobs, self.train_files, self.stats_files, self.counters, self.timeline
        )
        result.switch_restarts = self.restarts
        return result

    # -- watching the switches -------------------------------------------------------

    def _supervise(self, started: float) -> None:
        """Start again, while the run's allowance lasts, each switch whose process exited,
        and have the controller, which sees its stream end, configure it again; otherwise
        end the run naming it (`_check_switches`)."""
        for switch in self.net.switches:
            if switch.process is None or switch.process.poll() is None:
                continue
            if len(self.restarts) >= self.config.switch_restarts:
                self._check_switches()
            noticed = time.monotonic()
            code = switch.process.returncode
            self._earlier_lives[switch.name] = self._last_totals.get(switch.name, {})
            try:
                switch.start([])
            except RuntimeError as err:
                raise RunError(
                    f"switch {switch.name} exited and did not start again: {err}"
                ) from None
            with self._failures(f"configuring switch {switch.name} again"):
                reports = self.controller.recover()
            if switch.name not in reports:
                raise RunError(
                    f"switch {switch.name} was started again, but its P4Runtime stream had not "
                    "ended: the controller did not see the restart"
                )
            self.restarts.append(
                {
                    "switch": switch.name,
                    "exit": _status(code),
                    "noticed_s": noticed - started,
                    "lost_s": time.monotonic() - noticed,
                    "entries": reports[switch.name].inserted,
                }
            )
            say(
                f"forgive: switch {switch.name} exited with {_status(code)}; started again and "
                f"configured ({reports[switch.name].inserted} entries) in "
                f"{self.restarts[-1]['lost_s']:.1f} s"
            )

    def _restart_due(self) -> bool:
        """A switch's process has exited and the run's restart allowance is not spent."""
        return len(self.restarts) < self.config.switch_restarts and any(
            s.process is not None and s.process.poll() is not None for s in self.net.switches
        )

    def _check_switches(self) -> None:
        """Raise RunError naming the first switch whose process has ended."""
        for switch in self.net.switches:
            code = switch.process.poll() if switch.process is not None else None
            if code is not None:
                raise RunError(
                    f"switch {switch.name} ({switch.target}) exited with {_status(code)} "
                    f"during the run; its log: {switch.log_file}"
                )

    @contextmanager
    def _failures(self, doing: str) -> Iterator[None]:
        """A controller error becomes one RunError line: the dead switch behind it if there
        is one, else what the controller said."""
        from controller.client import SwitchUnreachable, WriteFailed
        from controller.p4info import ConfigError
        from controller.shaping import ShapingFailed

        try:
            yield
        except (SwitchUnreachable, WriteFailed, ShapingFailed, ConfigError) as err:
            self._check_switches()
            self._check_stalled(doing)
            raise RunError(f"{doing}: {err}") from None
        except grpc.RpcError as err:
            self._check_switches()
            self._check_stalled(doing)
            raise RunError(f"{doing}: P4Runtime {err.code().name}: {err.details()}") from None

    def _check_stalled(self, doing: str) -> None:
        """Raise RunError naming the first switch whose process is stopped (SIGSTOP): alive,
        so `_check_switches` passes it, but it answers nothing."""
        for switch in self.net.switches:
            if switch.process is not None and is_stopped(switch.process.pid):
                raise RunError(
                    f"{doing}: switch {switch.name} ({switch.target}) is stopped (SIGSTOP or a "
                    f"debugger; pid {switch.process.pid}) and answers nothing"
                )

    def _totals(self) -> dict[str, dict[str, int]]:
        """Per switch, its counters summed over its ports, and over its earlier lives: a
        restarted switch counts from zero again, so what it had counted at the last sample
        before it exited is added (what it counted after that sample is lost with it)."""
        totals = {}
        for name in self.plan.switches:
            with self._failures(f"reading switch {name}'s counters"):
                now = sum(self.controller.counters(name).values(), PortCounters())
            earlier = self._earlier_lives.get(name, {})
            totals[name] = {k: v + earlier.get(k, 0) for k, v in asdict(now).items()}
        self._last_totals = totals
        return totals


def run_once(config: RunConfig, out_dir: Path, label: str = "") -> RunResult:
    """Run one policy and seed on a fresh network; raises RunError when the run fails.
    Whatever happens, the trainers, switches and links are gone when it returns."""
    config.validate()
    require_root()
    with (
        sigterm_as_interrupt(),
        fabric_lock(lambda line: say(f"forgive: {line}")),
        FabricRun(config, out_dir, label) as run,
    ):
        cleared = clear_leftovers()
        if cleared:
            say(f"forgive: removed what a killed run left behind: {', '.join(cleared)}")
        run.build()
        run.configure()
        run.start()
        run.run()
    return run.result()


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"


def collect_jobs(
    config: RunConfig,
    jobs: list[tuple[str, list[Host]]],
    train_files: dict[str, Path],
    stats_files: dict[str, Path],
    counters: dict[str, dict[str, int]],
    timeline: list[dict[str, Any]],
) -> RunResult:
    """The first job's RunResult, with the second job's (if any) as its companion; the
    switches' counters and timeline are the whole fabric's in both."""
    results = [
        collect(
            policy=policy,
            seed=config.seed,
            fabric=config.fabric.name,
            time_scale=config.fabric.scaling.time_scale,
            train_files={h.name: train_files[h.name] for h in hosts},
            stats_files={h.name: stats_files[h.name] for h in hosts},
            switch_counters=counters,
            timeline=timeline,
        )
        for policy, hosts in jobs
    ]
    first = results[0]
    if len(results) > 1:
        first.companion = results[1].to_json()
    return first


def _trainer_command(
    config: RunConfig,
    fabric_plan: Plan,
    rank: int,
    train_files: dict[str, Path],
    stats_files: dict[str, Path],
    job: int = 0,
) -> list[str]:
    policy, hosts = config.jobs(fabric_plan)[job]
    host = hosts[rank]
    cfg = config.training_config(fabric_plan, rank, job)
    agent = agent_settings(config, fabric_plan)
    cmd = [sys.executable, "-m", "commands.train", "--iface", f"{host.name}-eth0"]
    cmd += ["--policy", policy, "--dcqcn", agent["dcqcn"], "--cc", agent["cc"]]
    cmd += ["--line-rate", str(agent["line_rate_bps"])]
    cmd += ["--time-scale", str(agent["time_scale"])]
    cmd += ["--rto", f"{agent['rto']:.6f}", "--rto-max", f"{agent['rto_max']:.6f}"]
    cmd += ["--window-bytes", str(agent["window_bytes"])]
    cmd += ["--payload-bytes", str(agent["payload_bytes"])]
    cmd += ["--qp-state"] if agent["qp_state"] else []
    cmd += ["--gateway-mac", _mac_text(switch_port_mac(host.leaf, host.port))]
    for dscp, where in agent["trim_locations"].items():
        cmd += ["--trim-dscp", f"{where}={dscp}"]
    cmd += ["--stats", str(stats_files[host.name]), "--out", str(train_files[host.name])]
    cmd += ["--timeout", str(config.timeout_s), "--config", cfg.to_json()]
    return cmd


def agent_settings(
    config: RunConfig, fabric_plan: Plan, link_delay_s: float = 0.0
) -> dict[str, Any]:
    """Every host's NIC rate, timer stretch and timeouts, DCQCN profile, and what the switches' trim DSCPs
    say of where a trim happened, whichever engine runs it; `link_delay_s` is each link's
    propagation delay (none on veths)."""
    sc, nic = config.fabric.scaling, config.fabric.nic
    rto = initial_rto(fabric_plan, link_delay_s)
    return {
        "line_rate_bps": sc.rate(config.fabric.host_link_gbps * 1e9),
        "time_scale": sc.time_scale,
        "rto": rto,
        "rto_max": 10 * rto,
        "trim_locations": fabric_plan.fabric().trim_locations(),
        "dcqcn": config.dcqcn,
        "cc": config.cc,
        "window_bytes": bdp_bytes(fabric_plan, link_delay_s) if nic.window == "bdp" else 0.0,
        "qp_state": nic.dcqcn_state == "qp",
        "payload_bytes": nic.payload_bytes,
    }


def bdp_bytes(fabric_plan: Plan, link_delay_s: float = 0.0) -> float:
    """The longest path's bandwidth-delay product, as ns-3's third.cc sizes its windows (a
    round trip of twice the links' propagation delays plus one packet's payload serialised
    at each hop's rate, times the host's line rate), worked out at fabric scale and divided
    by the byte scale like every byte quantity, so that a window keeps its ratio to the
    queues. `link_delay_s` is a link's delay on the run's clock (stretched by the time
    scale)."""
    spec, sc = fabric_plan.spec, fabric_plan.spec.scaling
    host_rate = spec.host_link_gbps * 1e9
    rates = [host_rate, host_rate]
    if spec.spines:
        rates[1:1] = [spec.spine_link_gbps * 1e9] * 2
    payload_bits = spec.nic.payload_bytes * 8
    delay = link_delay_s / sc.time_scale
    rtt = 2 * len(rates) * delay + sum(payload_bits / r for r in rates)
    return rtt * host_rate / 8 / sc.byte_scale


def initial_rto(fabric_plan: Plan, link_delay_s: float = 0.0) -> float:
    """A first timeout no shorter than the longest path's propagation round trip plus a
    full data queue ahead of a packet and a few hops' serialisation at the host rate;
    later flows use the measured round trip instead."""
    host_rate = fabric_plan.spec.scaling.rate(fabric_plan.spec.host_link_gbps * 1e9)
    queued = fabric_plan.thresholds().data_queue_bytes + 4 * DATA_FRAME_LEN
    hops = 4 if fabric_plan.spec.spines else 2
    return 2 * hops * link_delay_s + queued * 8 / host_rate


def _mac_text(mac: int) -> str:
    raw = mac.to_bytes(6, "big")
    return ":".join(f"{b:02x}" for b in raw)
