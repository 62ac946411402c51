"""One emulated training run on a Mininet fabric of FORGIVE switches, start to teardown.

`emulate` takes a `FabricRun` through its steps: build the network from a
compiled run plan's fabric (switch model or BMv2), start dumpcap on each link
the run captures (`--pcap`), configure every switch
through the controller, start one `forgive-train` (training loop and host
agent in one process) per host, sample the switches' counters while the steps
run and watch every trainer and switch process, and hand back what the
switches counted (the sweep collects the records). Whatever happens — success,
a failing rank or switch, a timeout, Ctrl-C or SIGTERM — the trainers, switch
processes and Mininet links are removed before it returns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from controller import DEVICE_CONFIG, P4INFO
from controller.topology import parse as parse_description
from runplan.run import (
    EngineResult,
    LinkCapture,
    RunConfig,
    RunError,
    RunPlan,
    client_tls,
    server_tls,
)
from switch_model.surface import PortCounters
from topologies.leftovers import clear_leftovers, fabric_lock
from topologies.processes import is_stopped, stop_process
from topologies.steps import StepProgress

MTU = 9000
SAMPLE_EVERY_S = 0.5
CAPTURE_START_S = 10.0
"""How long dumpcap may take to open its interface."""
CAPTURED = re.compile(r"Packets captured: (\d+)")
"""dumpcap's last word on a capture: the frames it wrote."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _unwatched(done: int, trims: int) -> None:
    """No one to tell how far the run is."""


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


def _quiet_interfaces(net) -> None:
    """MTU 9000 everywhere, and no IPv6 chatter on the fabric (the switches route IPv4 only)."""
    for node in net.hosts + net.switches:
        for intf in node.intfList():
            if intf.name == "lo":
                continue
            node.cmd(f"ip link set {intf.name} mtu {MTU}")
            node.cmd(f"sysctl -qw net.ipv6.conf.{intf.name}.disable_ipv6=1")


def _exited(switch: Any) -> bool:
    """Whether a switch's current process has exited (a restart gives it a new one)."""
    return switch.process is not None and switch.process.poll() is not None


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

    def __init__(
        self,
        run: RunPlan,
        out_dir: Path,
        on_progress: Callable[[int, int], None] = _unwatched,
        say: Callable[[str], None] = _stderr,
    ) -> None:
        self.config = run.config
        self.run_plan = run
        self.plan = run.fabric
        self.out_dir = out_dir
        self.log_dir = out_dir / "logs"
        self.on_progress = on_progress
        self.say = say
        self.net = None
        self.controller = None
        self.trainers: dict[str, subprocess.Popen] = {}
        self.timeline: list[dict[str, Any]] = []
        self.counters: dict[str, dict[str, int]] = {}
        self.restarts: list[dict[str, Any]] = []
        self._captures: list[tuple[LinkCapture, Path]] = []
        """Each link captured, with dumpcap's log (which ends with the frames it wrote)."""
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
        for entry in self.run_plan.hosts:
            Path(entry.train_file).unlink(missing_ok=True)
            Path(entry.stats_file).unlink(missing_ok=True)
        cls = ModelSwitch if self.config.switch == "model" else Bmv2Switch
        net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False)
        self.net = net
        self._stack.callback(net.stop)
        tls = self.config.p4runtime_tls
        for name in self.plan.switches:
            net.addSwitch(
                name, cls=cls, log_dir=str(self.log_dir), tls=server_tls(tls) if tls else None
            )
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
        """Every switch configured over P4Runtime; the controller stays primary for the run.
        The description it is given goes to `fabric.json` in the run's folder first."""
        from controller.fabric_control import FabricController

        endpoints = {s.name: s.spec() for s in self.net.switches}
        description = self.plan.controller_description(endpoints)
        # the running switches as `forgive-ctl` (counters, shell) takes them, mid-run
        (self.out_dir / "fabric.json").write_text(json.dumps(description, indent=1))
        with self._failures("configuring the switches"):
            tls = self.config.p4runtime_tls
            self.controller = FabricController(
                parse_description(description),
                P4INFO,
                DEVICE_CONFIG,
                client_tls(tls) if tls else None,
            )
            self._stack.callback(self.controller.close)
            for switch in self.net.switches:
                self.controller.clients[switch.name].gone = partial(_exited, switch)
            self.controller.apply()

    def capture(self) -> None:
        """dumpcap on each link the run captures (`--pcap`), on the interface of the link's
        first end (a host's in its namespace, a leaf's in the root one), both directions, with
        the run's snap length and frame cap; each is capturing before the trainers start and
        is stopped, its file closed, before the network goes."""
        captures = self.config.captures
        for wanted in self.run_plan.captures:
            node, peer = self.net.get(wanted.link.a), self.net.get(wanted.link.b)
            interface = node.connectionsTo(peer)[0][0].name
            log_path = self.log_dir / f"{wanted.name}.dumpcap.log"
            command = ["dumpcap", "-i", interface, "-s", str(captures.snaplen), "-c",
                       str(captures.max_frames), "-w", str(wanted.path)]  # fmt: skip
            wanted.path.unlink(missing_ok=True)
            with open(log_path, "wb") as log:
                proc = node.popen(command, stdout=log, stderr=subprocess.STDOUT)
            self._stack.callback(stop_process, proc, timeout=5)
            self._captures.append((wanted, log_path))
            deadline = time.monotonic() + CAPTURE_START_S
            while "Capturing on" not in log_path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RunError(
                        f"--pcap {wanted.name}: dumpcap on {interface} did not start: "
                        f"{_last_line(log_path)}"
                    )
                time.sleep(0.05)

    def start(self) -> None:
        """One `forgive-train` per rank of each job, on its host, given its entry of the run
        plan as one JSON argument, logging to its own file."""
        for entry in self.run_plan.hosts:
            command = [sys.executable, "-m", "commands.train", "--host", entry.to_json()]
            with open(self.log_dir / f"{entry.name}.log", "wb") as log:
                proc = self.net.get(entry.name).popen(command, stdout=log, stderr=subprocess.STDOUT)
            self.trainers[entry.name] = proc
            self._stack.callback(stop_process, proc, timeout=5)

    def run(self) -> None:
        """Sample the switches until every trainer has finished; fail at once, in one line,
        when a switch process or a rank dies, or the run outlasts its timeout."""
        steps = StepProgress()
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
            self.on_progress(steps.done(Path(e.train_file) for e in self.run_plan.hosts), trims)
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

    def result(self) -> EngineResult:
        """What the switches counted over the run (after `run`), and (after `stop`) what each
        capture holds; the records are in the plan's files."""
        captures = []
        for wanted, log_path in self._captures:
            said = CAPTURED.search(log_path.read_text(errors="replace"))
            frames = int(said.group(1)) if said else None
            captures.append(
                {"link": wanted.name, "path": str(wanted.path), "frames": frames, "over_cap": None}
            )
        return EngineResult(self.counters, self.timeline, self.restarts, captures)

    # -- watching the switches -------------------------------------------------------

    def _supervise(self, started: float) -> None:
        """Start again, while the run's allowance lasts, each switch whose process exited,
        and have the controller, which sees its stream end, configure it again; otherwise
        end the run naming it (`_check_switches`)."""
        for switch in self.net.switches:
            if not _exited(switch):
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
            self.say(
                f"forgive: switch {switch.name} exited with {_status(code)}; started again and "
                f"configured ({reports[switch.name].inserted} entries) in "
                f"{self.restarts[-1]['lost_s']:.1f} s"
            )

    def _restart_due(self) -> bool:
        """A switch's process has exited and the run's restart allowance is not spent."""
        return len(self.restarts) < self.config.switch_restarts and any(
            _exited(s) for s in self.net.switches
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
        switches = {s.name: s for s in self.net.switches}
        for name in self.plan.switches:
            if name in switches and _exited(switches[name]):
                # Not read: the read would fail and reconnect, which SwitchClient.gone (set
                # in `configure`) ends only at its next look at the process, about 0.2 s on,
                # with this same RunError (from `_failures`); here it comes at once, so the
                # restart does. gone still covers a switch that exits during its own read.
                self._check_switches()
            with self._failures(f"reading switch {name}'s counters"):
                now = sum(self.controller.counters(name).values(), PortCounters())
            earlier = self._earlier_lives.get(name, {})
            totals[name] = {k: v + earlier.get(k, 0) for k, v in asdict(now).items()}
        self._last_totals = totals
        return totals


def check(config: RunConfig) -> None:
    """What the emulation needs beyond a valid configuration, refused in one RunError line
    before any run starts: root and Mininet, and the BMv2 binaries where `--switch bmv2`
    asks for them."""
    if config.switch == "bmv2":
        from topologies.switches import Bmv2Switch

        reason = Bmv2Switch.missing()
        if reason:
            raise RunError(f"--switch bmv2: {reason}")
    require_root()
    if config.captures.links and shutil.which("dumpcap") is None:
        raise RunError(
            "--pcap under Mininet needs dumpcap: install Debian's tshark (make setup does)"
        )


def emulate(
    run: RunPlan,
    out_dir: Path,
    on_progress: Callable[[int, int], None] = _unwatched,
    say: Callable[[str], None] = _stderr,
) -> EngineResult:
    """Run one compiled run on a fresh network; raises RunError when the run fails.
    Whatever happens, the trainers, switches and links are gone when it returns."""
    check(run.config)
    fabric = FabricRun(run, out_dir, on_progress, say)
    with sigterm_as_interrupt(), fabric_lock(lambda line: say(f"forgive: {line}")), fabric:
        cleared = clear_leftovers()
        if cleared:
            say(f"forgive: removed what a killed run left behind: {', '.join(cleared)}")
        fabric.build()
        fabric.capture()
        fabric.configure()
        fabric.start()
        fabric.run()
    return fabric.result()


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"
