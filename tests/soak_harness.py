"""A soak: one long `forgive run`, every process of it sampled at every training step.

    python tests/soak_harness.py --steps 200 --out docs/soak      (root: Mininet; make soak
    runs it through tests/test_soak.py)

The run goes as any other (`forgive run` in a process of its own, switch model by default);
beside it this samples, four times a second, every process under it: the `forgive run`
process itself, each switch, each rank's trainer and the shells Mininet keeps per node,
their resident memory (VmRSS) and their open file descriptors. Per training step it keeps
each process's largest sample. After a warm-up of WARMUP_FRACTION of the steps, no step's
sample of a process may exceed its value at the end of the warm-up by more than what the
process may legitimately hold beyond it (`allowances`: for a switch, its queues full; for
a rank, two steps' messages; for the run, its timeline), its descriptors must
not grow, the loss bound must hold on every step and the run must finish (a flow that
cannot complete fails its rank, and the run with it). Beside the processes it samples each
switch's queues (their bytes, from the switch) and its trims, so that a rise in a switch's
memory can be set against its queues. It writes soak.json (every figure),
soak.png (RSS, descriptors and the switches' queues against steps) and table.txt, and
exits 1 when a bound fails. docs/soak.md says why these bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.p4names import HIGH_QUEUE_OCCUPANCY, LOW_QUEUE_OCCUPANCY
from common.wire import DATA_FRAME_LEN, TRIMMED_FRAME_LEN
from controller import P4INFO
from controller.client import SwitchClient
from controller.entries import read_port_counters
from controller.nic import bmv2_python_dir
from controller.p4info import P4InfoIndex, load_p4info
from runplan.fabric import plan
from runs.options import add_regime_options, fabric_from, with_regime
from switch_model import control
from topologies.steps import StepProgress
from topologies.switches import Bmv2Switch
from workload.hostplan import HostEntry
from workload.plan import plan_step

SAMPLE_EVERY_S = 0.25
LOOK_EVERY_S = 0.02
"""How often the sampler looks at the ranks' progress; it samples at once when a step
begins, so a step shorter than SAMPLE_EVERY_S (a small job's last about 0.25 s) is sampled
too. Every step must be (the verdict counts those that were not)."""
WARMUP_FRACTION = 0.1
"""Steps left out before flatness is judged: imports, first allocations, caches filling."""
MIN_WARMUP = 5
END_OF_WARMUP = 0.25
"""The warm-up's end value of a process is its largest sample over the last quarter of the
warm-up (at least 2 steps): a Python process's per-step largest sample moves with its
garbage collector, and one step's figure may be one of its low points."""
PYTHON_SLACK_KIB = 1024
"""What a Python process may add with no more live data: CPython (3.10 on, 64-bit) takes
its small objects' memory in arenas of 1 MiB, and one more arena may be touched."""
NATIVE_SLACK_KIB = 128
"""The same for a C/C++ process: glibc's malloc grows its heap by the request and 128 KiB
of padding (M_TOP_PAD)."""
BMV2_PACKET_BYTES = {"full": 61_264, "header": 57_082}
"""What simple_switch_grpc with forgive.p4 holds per packet queued, measured by
`benchmarks/bmv2_packet_memory.py` (BMv2 1.15.5 built here, 2026-12-02: 61,149-61,264 B per
4154-byte DATA frame, 56,930-57,082 B per 58-byte trimmed header, over 3 batches of 1,000):
the packet's buffer (its length and 512 bytes) is the least of it; most is its header
vector (one per packet alive, from a pool that keeps them)."""
FD_GROWTH_BOUND = 0
"""How many more descriptors a process may hold over the last tenth of the steps than over
the first tenth after warm-up, counting the fewest it held in each (a descriptor open for
a moment, as the run reading a record, is not held): a descriptor leaked per step, or per
flow, shows at once."""


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(root: int) -> list[int]:
    """`root` and every process under it."""
    tree, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def argv_of(pid: int) -> list[str] | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return [a for a in argv if a] or None


def label(pid: int, argv: list[str] | None = None) -> str | None:
    """A process's role, stable across the run: what the soak's figures are keyed by."""
    argv = argv or argv_of(pid)
    if not argv:
        return None
    if "commands.switch" in argv and "--name" in argv:
        return f"switch {argv[argv.index('--name') + 1]}"
    if Path(argv[0]).name == Bmv2Switch.BINARY and "--log-file" in argv:  # its log: NAME.bmv2.log
        return f"switch {Path(argv[argv.index('--log-file') + 1]).name.split('.')[0]}"
    if "commands.train" in argv and "--host" in argv:
        return f"trainer {json.loads(argv[argv.index('--host') + 1])['name']}"
    if "commands.forgive" in argv:
        return "forgive run"
    if argv[-1].startswith("mininet:"):
        return f"shell {argv[-1].split(':', 1)[1]}"
    program = Path(argv[0]).name
    if program.startswith("python") and len(argv) > 1 and not argv[1].startswith("-"):
        return Path(argv[1]).name  # a script, as simple_switch_CLI setting BMv2's queues
    return program


def sample(pid: int) -> tuple[int, int] | None:
    """(VmRSS in KiB, open descriptors) of `pid`, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
    )
    return rss, fds


def switch_ports(argv: list[str]) -> list[int]:
    """The port numbers a switch's command line gives it (`-i N=IF` on the model, `-i N@IF`
    on BMv2)."""
    ports = []
    for option, value in itertools.pairwise(argv):
        if option == "-i":
            ports.append(int(value.replace("@", "=").split("=", 1)[0]))
    return ports


class SwitchProbe:
    """Reads a switch as the run goes: its trims so far (the program's port_trims counter,
    over P4Runtime as the run reads it, without mastership) and per port the bytes queued
    low and high (the model's control channel; on BMv2 the program's occupancy registers,
    over Thrift). The queues are a point sample: they show a standing queue, not each
    burst; the trims are counted, so a step's trims are exact."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.ports = switch_ports(argv)
        self.bmv2 = Path(argv[0]).name == Bmv2Switch.BINARY
        self.control = _option(argv, "--control")
        self.thrift_port = int(_option(argv, "--thrift-port") or 0)
        self.grpc = _option(argv, "--grpc") or _option(argv, "--grpc-server-addr")
        self.device_id = int(_option(argv, "--device-id") or 1)
        self._thrift_client = None
        self._transport = None
        self._p4rt: SwitchClient | None = None
        self._index: P4InfoIndex | None = None

    def _thrift(self):
        if self._thrift_client is None:
            from thrift.protocol import TBinaryProtocol, TMultiplexedProtocol
            from thrift.transport import TSocket, TTransport

            pydir = bmv2_python_dir("simple_switch_CLI")
            if pydir is not None and str(pydir) not in sys.path:
                sys.path.append(str(pydir))
            from bm_runtime.standard import Standard

            sock = TSocket.TSocket("127.0.0.1", self.thrift_port)
            sock.setTimeout(1000)
            self._transport = TTransport.TBufferedTransport(sock)
            protocol = TMultiplexedProtocol.TMultiplexedProtocol(
                TBinaryProtocol.TBinaryProtocol(self._transport), "standard"
            )
            client = Standard.Client(protocol)
            self._transport.open()
            self._thrift_client = client
        return self._thrift_client

    def queues(self) -> tuple[int, int] | None:
        """(low bytes, high bytes) queued over the switch's ports, or None when it does not
        answer (starting, gone)."""
        try:
            if self.bmv2:
                rt = self._thrift()
                low = rt.bm_register_read_all(0, LOW_QUEUE_OCCUPANCY)
                high = rt.bm_register_read_all(0, HIGH_QUEUE_OCCUPANCY)
                return sum(low[p] for p in self.ports), sum(high[p] for p in self.ports)
            if self.control is None:
                return None
            ports = control.request(self.control, {"cmd": "stats"}, timeout=0.5)["stats"]["ports"]
            return sum(p["low_bytes"] for p in ports.values()), sum(
                p["high_bytes"] for p in ports.values()
            )
        except Exception:  # a switch that is not (or no longer) there: no sample, as for /proc
            self._close_thrift()
            return None

    def trims(self) -> int | None:
        """The switch's trims so far over its ports, or None when it does not answer."""
        if self.grpc is None:
            return None
        try:
            if self._p4rt is None:
                client = SwitchClient(self.name, self.grpc, self.device_id, timeout=1.0)
                client.connect(primary=False)
                self._p4rt, self._index = client, self._index or P4InfoIndex(load_p4info(P4INFO))
            counters = read_port_counters(self._p4rt, self._index, self.ports)
            return sum(c.trims for c in counters.values())
        except Exception:  # not answering yet (no pipeline) or any more
            self._close_p4rt()
            return None

    def _close_thrift(self) -> None:
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.close()
        self._thrift_client = self._transport = None

    def _close_p4rt(self) -> None:
        if self._p4rt is not None:
            with contextlib.suppress(Exception):
                self._p4rt.close()
        self._p4rt = None

    def close(self) -> None:
        self._close_thrift()
        self._close_p4rt()


def _option(argv: list[str], option: str) -> str | None:
    return argv[argv.index(option) + 1] if option in argv[:-1] else None


@dataclass
class Trace:
    """Per process label, per training step (index 0 is step 1): the largest sample."""

    rss_kib: dict[str, dict[int, int]] = field(default_factory=dict)
    fds: dict[str, dict[int, int]] = field(default_factory=dict)
    samples: int = 0
    steps: set[int] = field(default_factory=set)
    """The steps with at least one sample."""
    argv: dict[str, list[str]] = field(default_factory=dict)
    """Each label's command line, as first seen (what its allowance is worked out from)."""
    queued_bytes: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per switch, per step: the most bytes sampled in its queues (low and high, all ports)."""
    high_bytes: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per switch, per step: the most bytes sampled in its high queues (control, trims)."""
    trims: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per switch, per step: its trims counted so far, at the step's last sample."""

    def add(self, step: int, name: str, rss: int, fds: int) -> None:
        self.steps.add(step)
        _keep_largest(self.rss_kib, name, step, rss)
        _keep_largest(self.fds, name, step, fds)

    def add_switch(
        self, step: int, name: str, queues: tuple[int, int] | None, trims: int | None
    ) -> None:
        if queues is not None:
            low, high = queues
            _keep_largest(self.queued_bytes, name, step, low + high)
            _keep_largest(self.high_bytes, name, step, high)
        if trims is not None:
            _keep_largest(self.trims, name, step, trims)


def _keep_largest(into: dict[str, dict[int, int]], name: str, step: int, value: int) -> None:
    """`value` as `name`'s figure for `step` if it is the largest sampled there so far."""
    per = into.setdefault(name, {})
    per[step] = max(per.get(step, 0), value)


def fresh_records(run_dir: Path, since: float) -> list[Path]:
    """The ranks' training records in `run_dir` written since `since` (time.time()): a
    results folder used before still holds the last run's until each rank starts its own,
    and read as they were, they would say the training is already over."""
    fresh = []
    for path in sorted(run_dir.glob("*.train.jsonl")):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime >= since:
                fresh.append(path)
    return fresh


def _sampler(
    root: int, run_dir: Path, since: float, steps: int, trace: Trace, stop: threading.Event
) -> None:
    progress, sampled, last = StepProgress(), 0, 0.0
    probes: dict[int, SwitchProbe] = {}
    try:
        while not stop.is_set():
            step = progress.done(fresh_records(run_dir, since)) + 1
            if step > steps:
                break  # the training is over; what the command does next (tables, plots) is not
            if step != sampled or time.monotonic() - last >= SAMPLE_EVERY_S:
                for pid in descendants(root):
                    argv = argv_of(pid)
                    name, figures = label(pid, argv), sample(pid)
                    if name is None or figures is None or argv is None:
                        continue
                    trace.argv.setdefault(name, argv)
                    trace.add(step, name, *figures)
                    if name.startswith("switch "):
                        probe = probes.setdefault(pid, SwitchProbe(name, argv))
                        trace.add_switch(step, name, probe.queues(), probe.trims())
                trace.samples += 1
                sampled, last = step, time.monotonic()
            stop.wait(LOOK_EVERY_S)
    finally:
        for probe in probes.values():
            probe.close()


def _step_bytes(entry: HostEntry) -> int:
    """The most bytes a rank's messages of one step hold, sent and received: each is a
    bytes object of its own (the sender's content, the receiver's payload)."""
    cfg = entry.training
    most = 0
    for step in range(1, min(cfg.steps, 3) + 1):  # step 2 has the burst, where there is one
        plan = plan_step(cfg, step)
        sends = plan.compute_sends + plan.gradient_sends + plan.barrier_sends + plan.burst_sends
        most = max(most, sum(m.size for m in sends + plan.registrations()))
    return most


def allowances(trace: Trace, queues: dict[str, int], run: dict | None) -> dict[str, dict]:
    """Per process: how many KiB its RSS may exceed its warm-up's end value by, and why.
    `queues`: the run's queue sizes per port (`queues_of`).

    - a switch: its queues full, each packet as the switch holds it. Per port the data
      queue holds what the program admits (`data_queue_bytes // DATA_FRAME_LEN` full
      frames and the one admitted last) and the high queue what the run sizes it to
      (`high_queue_bytes`: on BMv2 that many bytes of 58-byte packets is its depth, on the
      model its byte capacity). The model holds a frame as a bytearray of its length and
      a queue entry (measured here with sys.getsizeof); BMv2 holds about 60 KB per
      packet, trimmed or not (BMV2_PACKET_BYTES, measured). Plus the allocator's slack;
    - a rank's trainer: two steps' messages, sent and received (a rank keeps a step until
      the next has finished: `Rank._forget`), and a Python arena;
    - the `forgive run` process: its trims timeline, which grows by one sample each
      `runner.SAMPLE_EVERY_S` by design (its length and one entry's size as measured), and
      a Python arena;
    - anything else (the shells Mininet keeps, BMv2's CLI): its allocator's slack.
    """
    out: dict[str, dict] = {}
    low = queues["data_queue_bytes"] // DATA_FRAME_LEN + 1
    high = -(-queues["high_queue_bytes"] // TRIMMED_FRAME_LEN)
    entry = sys.getsizeof((None, 0)) + 8  # the (frame, bytes) tuple and its deque slot
    for name, argv in sorted(trace.argv.items()):
        python = Path(argv[0]).name.startswith("python")
        slack = PYTHON_SLACK_KIB if python else NATIVE_SLACK_KIB
        if name.startswith("switch "):
            ports = len(switch_ports(argv))
            if python:
                full = sys.getsizeof(bytearray(DATA_FRAME_LEN)) + entry
                header = sys.getsizeof(bytearray(TRIMMED_FRAME_LEN)) + entry
            else:
                full, header = BMV2_PACKET_BYTES["full"], BMV2_PACKET_BYTES["header"]
            held = ports * (low * full + high * header)
            why = f"{ports} ports x ({low} x {full} B + {high} x {header} B)"
        elif name.startswith("trainer ") and "--host" in argv:
            step = _step_bytes(HostEntry.from_json(argv[argv.index("--host") + 1]))
            held, why = 2 * step, f"2 steps x {step} B of messages"
        elif name == "forgive run" and run and run.get("timeline"):
            sample = run["timeline"][-1]
            size = sys.getsizeof(sample) + sum(sys.getsizeof(v) for v in sample.values()) + 8
            held = len(run["timeline"]) * size
            why = f"timeline {len(run['timeline'])} x {size} B"
        else:
            held, why = 0, ""
        kib = -(-held // 1024) + slack
        out[name] = {
            "kib": kib,
            "why": f"{why} + {slack} KiB slack" if why else f"{slack} KiB slack",
        }
    return out


@dataclass
class Verdict:
    warmup: int
    warmup_end_kib: dict[str, int]
    """Per process, its warm-up's end value (END_OF_WARMUP)."""
    rss_peak_after: dict[str, tuple[int, int]]
    """Per process, (step, KiB) of its largest sample after warm-up."""
    rss_rise_kib: dict[str, int]
    """Per process, that peak less its warm-up's end value."""
    allowed_kib: dict[str, int]
    fd_growth: dict[str, int]
    bound_held_every_step: bool
    steps_recorded: int
    finished: bool
    failures: list[str]

    @property
    def held(self) -> bool:
        return not self.failures


def warmup_of(steps: int) -> tuple[int, int]:
    """(the warm-up's length, the first step of its end window)."""
    warmup = max(MIN_WARMUP, round(WARMUP_FRACTION * steps))
    return warmup, warmup - max(2, round(END_OF_WARMUP * warmup)) + 1


def judge(
    trace: Trace, steps: int, run: dict | None, code: int, allowed: dict[str, int] | None = None
) -> Verdict:
    """The soak's bounds (module docstring) over a trace and the run's record; `allowed`:
    per process, the KiB its RSS may exceed its warm-up's end value by (0 where not given)."""
    allowed = allowed or {}
    warmup, end_from = warmup_of(steps)
    failures = []
    ends, peaks, rises, fd_growth = {}, {}, {}, {}
    for name in sorted(trace.rss_kib):
        rss, fds = trace.rss_kib[name], trace.fds[name]
        end = [v for s, v in rss.items() if end_from <= s <= warmup]
        after = {s: v for s, v in rss.items() if s > warmup}
        if end and after:
            ends[name] = max(end)
            peak = max(after.values())
            at = min(s for s, v in after.items() if v == peak)  # the first step it was reached
            peaks[name] = (at, peak)
            rises[name] = peak - ends[name]
            if rises[name] > allowed.get(name, 0):
                failures.append(
                    f"{name}: RSS {peak} KiB at step {at}, {rises[name]} KiB over its "
                    f"{ends[name]} KiB at the end of warm-up (steps {end_from}-{warmup}); "
                    f"allowed {allowed.get(name, 0)} KiB"
                )
        window = max(3, steps // 10)
        first = [v for s, v in fds.items() if warmup < s <= warmup + window]
        last = [v for s, v in fds.items() if s > steps - window]
        if first and last:
            # the floors, not the peaks: a file open while a sample was taken is no leak
            fd_growth[name] = min(last) - min(first)
            if fd_growth[name] > FD_GROWTH_BOUND:
                failures.append(f"{name}: {fd_growth[name]} more descriptors after warm-up")
    if not trace.rss_kib:
        failures.append("no process was sampled")
    elif unsampled := steps - len(trace.steps & set(range(1, steps + 1))):
        failures.append(f"{unsampled} of {steps} steps without a sample")
    records = run["steps"] if run else []
    held = bool(records) and all(s["bound_held"] for s in records) and not run["bound_violations"]
    if code != 0:
        failures.append(f"the run failed (exit status {code})")
    if len(records) != steps:
        failures.append(f"{len(records)} of {steps} steps recorded")
    if not held:
        failures.append("the loss bound did not hold on every step")
    return Verdict(
        warmup,
        ends,
        peaks,
        rises,
        {name: allowed.get(name, 0) for name in sorted(trace.rss_kib)},
        fd_growth,
        held,
        len(records),
        code == 0,
        failures,
    )


def trims_per_step(trace: Trace, name: str) -> dict[int, int]:
    """A switch's trims in each step: its count at the step's last sample less the step
    before's (a step sampled after one that was not gets none)."""
    trims = trace.trims.get(name, {})
    return {s: trims[s] - trims[s - 1] for s in trims if s - 1 in trims}


def _new_highs(per_step: dict[int, int]) -> set[int]:
    """The steps at which a series reached a new high (above every step before)."""
    highs, top = set(), 0
    for s in sorted(per_step):
        if per_step[s] > top:
            top = per_step[s]
            highs.add(s)
    return highs


def queue_highs(trace: Trace, verdict: Verdict, jump_kib: int = 1024) -> dict[str, dict]:
    """Per switch: the steps after warm-up where its RSS rose by more than `jump_kib` over
    its largest so far, and at each whether its queues (all of them, or the high ones:
    control and trimmed headers) or its trims in a step reached a new high that step or
    the step before: what a high-water mark of its buffers would show, where growth
    would not."""
    out = {}
    for name in sorted(set(trace.queued_bytes) | set(trace.trims)):
        rss, queued = trace.rss_kib.get(name, {}), trace.queued_bytes.get(name, {})
        high, per_step = trace.high_bytes.get(name, {}), trims_per_step(trace, name)
        queue_highs, trim_highs = _new_highs(queued) | _new_highs(high), _new_highs(per_step)
        jumps, top = [], 0
        for s in sorted(rss):
            if s > verdict.warmup and rss[s] - top > jump_kib:
                jumps.append(
                    {
                        "step": s,
                        "rss_kib": rss[s],
                        "rise_kib": rss[s] - top,
                        "queued_bytes": queued.get(s),
                        "high_bytes": high.get(s),
                        "queue_high": bool({s, s - 1} & queue_highs),
                        "trims_in_step": per_step.get(s),
                        "trims_high": bool({s, s - 1} & trim_highs),
                    }
                )
            top = max(top, rss[s])
        out[name] = {
            "largest_queued_bytes": max(queued.values(), default=0),
            "largest_high_bytes": max(high.values(), default=0),
            "largest_trims_in_step": max(per_step.values(), default=None),
            "rss_jumps": jumps,
        }
    return out


def table(trace: Trace, verdict: Verdict) -> str:
    mib = lambda kib: f"{kib / 1024:.1f}"  # noqa: E731
    lines = [
        f"{'process':<16}{'RSS start':>10}{'warm-up end':>12}{'max after':>10}{'at step':>8}"
        f"{'end':>7}{'rise KiB':>9}{'allowed':>8}{'fds start':>10}{'fds end':>8}{'fd growth':>10}"
    ]
    for name in sorted(trace.rss_kib):
        rss, fds = trace.rss_kib[name], trace.fds[name]
        first, last = min(rss), max(rss)
        at, peak = verdict.rss_peak_after.get(name, (0, 0))
        end = verdict.warmup_end_kib.get(name)
        lines.append(
            f"{name:<16}{mib(rss[first]):>10}{mib(end) if end else '-':>12}"
            f"{mib(peak) if at else '-':>10}{at or '-':>8}{mib(rss[last]):>7}"
            f"{verdict.rss_rise_kib.get(name, '-'):>9}{verdict.allowed_kib.get(name, 0):>8}"
            f"{fds[first]:>10}{fds[last]:>8}{verdict.fd_growth.get(name, 0):>10}"
        )
    lines.append(
        f"RSS in MiB; warm-up {verdict.warmup} steps; bounds: no sample after warm-up more than "
        f"'allowed' KiB over the warm-up's end, descriptor growth <= {FD_GROWTH_BOUND}; "
        f"loss bound held on every step: {'yes' if verdict.bound_held_every_step else 'no'}; "
        f"{'held' if verdict.held else 'FAILED: ' + '; '.join(verdict.failures)}"
    )
    return "\n".join(lines)


def plot(path: Path, trace: Trace, verdict: Verdict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    switch_panels = [
        (f, ylabel)
        for f, ylabel in (
            (lambda n: trace.queued_bytes.get(n, {}), "switch queues, bytes\n(largest sample)"),
            (lambda n: trims_per_step(trace, n), "switch trims\nper step"),
        )
        if any(f(n) for n in trace.rss_kib)
    ]
    panels = 2 + len(switch_panels)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 3.2 * panels + 1.5), sharex=True)
    top, middle = axes[0], axes[1]
    colours = plt.get_cmap("tab20").colors  # 16 or so processes: the default 10 would repeat
    names = sorted(trace.rss_kib)
    for i, name in enumerate(names):
        steps, colour = sorted(trace.rss_kib[name]), colours[i % len(colours)]
        rss = [trace.rss_kib[name][s] / 1024 for s in steps]
        top.plot(steps, rss, label=name, lw=1, color=colour)
        middle.plot(steps, [trace.fds[name][s] for s in steps], label=name, lw=1, color=colour)
        for ax, (figures, _) in zip(axes[2:], switch_panels, strict=True):
            per = figures(name)
            if per:
                ax.plot(sorted(per), [per[s] for s in sorted(per)], lw=1, color=colour)
    for ax, (_, ylabel) in zip(axes[2:], switch_panels, strict=True):
        ax.set_ylabel(ylabel)
    for ax in axes:
        ax.axvline(verdict.warmup, color="grey", ls=":", label="end of warm-up")
        ax.grid(alpha=0.3)
    top.set_ylabel("resident memory, MiB (largest sample per step)")
    middle.set_ylabel("open file descriptors")
    axes[-1].set_xlabel("training step")
    top.set_title(title, fontsize=10)
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def queues_of(extra: list[str]) -> dict[str, int]:
    """The data queue (the program's trimming threshold) and the low and high queues' sizes
    per port, in bytes at emulation scale, that a `forgive run` with `extra` options gives
    its switches: from the same options and fabric plan the run reads."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--fabric", default="2to1")
    parser.add_argument("--host-link-mbps", type=float)
    parser.add_argument("--byte-scale", type=float)
    add_regime_options(parser)
    args, _ = parser.parse_known_args(extra)
    spec = fabric_from(args.fabric, "mininet", args.host_link_mbps, args.byte_scale)
    fabric_plan = plan(with_regime(spec, args))
    endpoints = {n: {"target": "model", "grpc": "-", "control": "-"} for n in fabric_plan.switches}
    return {
        "data_queue_bytes": fabric_plan.thresholds().data_queue_bytes,
        **fabric_plan.controller_description(endpoints)["queues"],
    }


def soak(
    steps: int, out: Path, extra: list[str], timeout: float, results: Path | None = None
) -> tuple[Trace, Verdict, dict]:
    """Run and sample; write soak.json, soak.png and table.txt into `out`, the run's own
    results folder (its logs and records) into `results` (default out/run)."""
    out.mkdir(parents=True, exist_ok=True)
    results = results or out / "run"
    queues = queues_of(extra)
    policy = "forgive"
    command = [sys.executable, "-m", "commands.forgive", "run", "--steps", str(steps)]
    command += ["--policy", policy, "--timeout", str(timeout), "--out", str(results), *extra]
    started, since = time.monotonic(), time.time()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    trace, stop = Trace(), threading.Event()
    thread = threading.Thread(
        target=_sampler, args=(proc.pid, results / f"{policy}-seed1", since, steps, trace, stop)
    )
    thread.start()
    try:
        _, err = proc.communicate()
    finally:
        stop.set()
        thread.join()
    wall = time.monotonic() - started
    try:
        run = json.loads((results / "runs.json").read_text())[0]
    except (OSError, ValueError, IndexError):
        run = None
    allowed = allowances(trace, queues, run)
    verdict = judge(trace, steps, run, proc.returncode, {n: a["kib"] for n, a in allowed.items()})
    doc = {
        "command": command[1:],
        "steps": steps,
        "wall_time_s": wall,
        "samples": trace.samples,
        "sample_every_s": SAMPLE_EVERY_S,
        "bounds": {
            "warmup_steps": verdict.warmup,
            "warmup_end_steps": list(warmup_of(steps)[::-1]),
            "rss_allowed": allowed,
            "fd_growth": FD_GROWTH_BOUND,
            "queues": queues,
        },
        "verdict": {**asdict(verdict), "held": verdict.held},
        "argv": trace.argv,
        "rss_kib": trace.rss_kib,
        "fds": trace.fds,
        "switch_queues": {
            "queued_bytes": trace.queued_bytes,
            "high_bytes": trace.high_bytes,
            "trims": trace.trims,
            "highs": queue_highs(trace, verdict),
        },
        "run": None if run is None else {k: run[k] for k in ("training_time_s", "rtos", "trims")},
        "stderr_tail": err.strip().splitlines()[-3:],
    }
    (out / "soak.json").write_text(json.dumps(doc, indent=1))
    text = table(trace, verdict)
    (out / "table.txt").write_text(text + "\n")
    plot(
        out / "soak.png",
        trace,
        verdict,
        f"forgive run, {steps} steps ({' '.join(extra) or 'defaults'})",
    )
    return trace, verdict, doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tests/soak_harness.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("results/soak"))
    parser.add_argument("--timeout", type=float, default=7200.0, help="the run's, s")
    parser.add_argument("run_args", nargs="*", help="more `forgive run` options, after --")
    args = parser.parse_args(argv)
    if args.steps < 2 * MIN_WARMUP:
        print(f"soak: --steps must be >= {2 * MIN_WARMUP}", file=sys.stderr)
        return 2
    trace, verdict, doc = soak(args.steps, args.out, args.run_args, args.timeout)
    print(table(trace, verdict))
    print(
        f"\nwall time {doc['wall_time_s']:.0f} s; results: {args.out} (soak.json, soak.png, table.txt)",
        file=sys.stderr,
    )
    return 0 if verdict.held else 1


if __name__ == "__main__":
    sys.exit(main())
