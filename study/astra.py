"""One run description, two simulators: ASTRA-sim's ns-3 backend's inputs from a RunConfig,
and its outputs read back into the figures this project's runs give.

The note's figures came from ASTRA-sim with its ns-3 packet backend (astra-sim 6ba156a,
astra-network-ns3 8fd3604; docs/astra-sim.md has the build). To check this project's DCQCN
baseline against that instrument, both simulators must run the same job on the same fabric:

- **Scale.** This project's simulator divides byte quantities by the byte scale B and runs at
  the fabric's rates, so its durations are the fabric's over B. ns-3's timers (DCQCN's
  periods, link delays, the compute node, the system layer's delays) cannot all be scaled, so
  ASTRA-sim gets the same byte scale with every rate divided by B instead: its durations are
  then the fabric's own, by the same scaling rule (runplan.scaling), and both read at fabric
  scale. DCQCN's absolute rate steps, the ECN thresholds, the shared buffer and the local
  memory bandwidth of the system layer shrink with B too; the packet payload does not.
- **Fabric.** ns-3 node i is the host of rank i (ASTRA-sim's NPU i), so the ring runs over
  the same hosts in the same order; leaves, then spines, follow; every link has the fabric's
  propagation delay (runplan.fabric.LINK_DELAY_S).
- **Job.** Per step a compute node of the job's compute time, the tensor-parallel all-to-all
  (on the first of two logical dimensions, the tensor-parallel group) where the job has one,
  then the gradient all-reduce; ASTRA-sim splits it into the job's parts (`splits`,
  `active_splits`). With tensor parallelism its all-reduce runs over both dimensions, which
  ASTRA-sim does hierarchically, where this project runs one ring: same bytes per rank, not
  the same order (docs/astra-sim.md says what that changes).

The config file's keys are those of astra-network-ns3's scratch/config/config.txt, with its
values except where the run description says otherwise (each is named in CONFIG_NOTES).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runplan.fabric import LINK_DELAY_S, plan
from runplan.run import RunConfig
from study.slack import allreduce_bound_s

BUFFER_MB = 32
"""ns-3's shared switch buffer in the shipped config (BUFFER_SIZE, MB): scaled by B, an integer
of MB, so the byte scale must divide it."""
LOCAL_MEM_GBPS = 50.0
"""The system layer's local memory bandwidth in astra-sim's Ring.json (GB/s): a reduce-scatter
step holds its message for three passes over it at this rate."""
ENDPOINT_DELAY_NS = 10
"""The system layer's endpoint delay in Ring.json (cycles of 1 ns)."""
DCQCN_CONSTANTS = {
    "ALPHA_RESUME_INTERVAL": 1,
    "RATE_DECREASE_INTERVAL": 4,
    "CLAMP_TARGET_RATE": 0,
    "RP_TIMER": 900,
    "EWMA_GAIN": 0.00390625,
    "FAST_RECOVERY_TIMES": 1,
}
"""DCQCN's periods (us) and gains in the shipped config: the nic profile's (docs/dcqcn.md)."""
DCQCN_RATES_BPS = {"RATE_AI": 50e6, "RATE_HAI": 100e6, "MIN_RATE": 100e6}
"""DCQCN's absolute rate steps in the shipped config, at fabric scale."""
CC_MODES = {"dcqcn": 1, "off": 12}
"""CC_MODE: 1 is rdma-hw.cc's Mellanox DCQCN; 12, the shipped value, is a mode rdma-hw.cc does
not act on, so every QP stays at the line rate (congestion control off)."""
CONFIG_NOTES = {
    "CC_MODE": "1 for DCQCN, 12 (the shipped value: no rate control) for congestion control off",
    "PACKET_PAYLOAD_SIZE": "the run's payload (--payload-bytes; the shipped 1000 is ns-3's)",
    "HAS_WIN": "the run's window (--window bdp: 1, none: 0)",
    "GLOBAL_T": "1: every QP's window is the longest path's BDP, as this project sizes it",
    "RATE_AI, RATE_HAI, MIN_RATE": "the shipped 50, 100 and 100 Mb/s over the byte scale",
    "KMIN_MAP, KMAX_MAP, PMAX_MAP": "the fabric's marking thresholds over the byte scale",
    "BUFFER_SIZE": "the shipped 32 MB over the byte scale",
    "ENABLE_TRACE": "0: no per-packet trace",
}
READ_VERSION = 2
"""Raise it when what a run's outputs are read into changes (2: the all-to-all's messages
left out of the all-reduce's), so that a kept figure is read again."""
QLEN_NEVER_NS = 10**15
"""QLEN_MON_START: the queue monitor writes every switch queue of 1000 bytes or more every
100 ns from this time on (100 MB a minute here); this is later than any run ends."""
FINISHED = re.compile(r"^rank (\d+) finished at (-?\d+) ns$", re.M)
COUNTERS = re.compile(r"^CC_COUNTERS (.*)$", re.M)


STOP_AT_S = 10.0
"""A run's simulated-time limit (the frontend patch's --stop-at-seconds): ten seconds of
fabric time, hundreds of steps of the note's job. A fabric that goes idle with work left (a
PFC pause never resumed, a go-back-N tail lost with no timeout) ends there."""
UNFINISHED = re.compile(r"^all ranks finished: no, simulated time (\d+) ns$", re.M)


class AstraError(RuntimeError):
    """Inputs that cannot be written for ASTRA-sim, or a run of it that failed; one line."""


class AstraUnfinished(AstraError):
    """A run that stopped with ranks unfinished: its fabric went idle with work left, or it
    reached its simulated-time limit."""

    def __init__(self, message: str, stopped_s: float, counters: dict[str, int]) -> None:
        super().__init__(message)
        self.stopped_s = stopped_s
        self.counters = counters


def _check(config: RunConfig) -> float:
    """The byte scale, after refusing what ASTRA-sim's inputs cannot express."""
    spec, wl = config.fabric, config.workload
    scale = spec.scaling.byte_scale
    if spec.scaling.rate_scale != 1:
        raise AstraError("ASTRA-sim inputs are written from a simulator run's scaling")
    if scale != int(scale) or BUFFER_MB % int(scale):
        raise AstraError(
            f"byte scale {scale:g}: ASTRA-sim's buffer is whole MB, so the scale must divide "
            f"{BUFFER_MB} (1, 2, 4, 8, 16 or 32)"
        )
    if config.companion is not None:
        raise AstraError("ASTRA-sim runs one job: a companion job is not written")
    if wl.pp_bytes:
        raise AstraError("ASTRA-sim inputs have no pipeline-parallel traffic: use --pp-mib 0")
    if wl.tp_bytes and (len(config.jobs(plan(spec))[0][1]) % wl.tp_group):
        raise AstraError("tensor-parallel groups must divide the ranks for ASTRA-sim's dimensions")
    if wl.tp_phase != "own":
        raise AstraError("ASTRA-sim's all-reduce waits for the all-to-all: --tp-phase own only")
    return scale


def _rate(bps: float) -> str:
    return f"{round(bps)}bps"


def topology_text(config: RunConfig) -> str:
    """ns-3's topology file: hosts 0..n-1 in rank order, then the leaves and the spines; every
    link at its fabric rate over the byte scale, with the fabric's propagation delay."""
    scale = _check(config)
    fabric_plan = plan(config.fabric)
    ranks = config.jobs(fabric_plan)[0][1]
    if len(ranks) != len(fabric_plan.hosts):
        raise AstraError("ASTRA-sim needs every host to run a rank")
    ids = {h.name: i for i, h in enumerate(ranks)}
    for i, switch in enumerate(fabric_plan.switches):
        ids[switch] = len(ranks) + i
    spec = config.fabric
    rates = {"host": spec.host_link_gbps * 1e9 / scale, "spine": spec.spine_link_gbps * 1e9 / scale}
    delay = f"{LINK_DELAY_S * 1e3:g}ms"
    lines = [
        f"{len(ids)} {len(fabric_plan.switches)} {len(fabric_plan.links)}",
        " ".join(str(ids[s]) for s in fabric_plan.switches),
    ]
    for link in fabric_plan.links:
        rate = rates["host"] if link.a_port is None else rates["spine"]
        lines.append(f"{ids[link.a]} {ids[link.b]} {_rate(rate)} {delay} 0")
    return "\n".join(lines) + "\n"


def link_rates(config: RunConfig) -> list[float]:
    """Every link rate ASTRA-sim will see (bit/s): each needs its marking thresholds."""
    spec, scale = config.fabric, config.fabric.scaling.byte_scale
    return sorted({spec.host_link_gbps * 1e9 / scale, spec.spine_link_gbps * 1e9 / scale})


def config_text(config: RunConfig, folder: Path, cc: str, out: Path | None = None) -> str:
    """ns-3's config.txt for `config`, DCQCN on (`cc` "dcqcn") or off ("off"), reading its
    topology from `folder` and writing its outputs into `out` (default: `folder`)."""
    out = out or folder
    scale = _check(config)
    if cc not in CC_MODES:
        raise AstraError(f"cc must be one of {', '.join(CC_MODES)}, got {cc!r}")
    spec = config.fabric
    sw = spec.switch
    rates = link_rates(config)

    def rate_map(values: Sequence[float]) -> str:
        return " ".join(
            [str(len(rates))] + [f"{round(r)} {v:g}" for r, v in zip(rates, values, strict=True)]
        )

    kmin_kb = sw.ecn_kmin_bytes / scale / 1000
    kmax_kb = sw.ecn_kmax_bytes / scale / 1000
    if kmin_kb != int(kmin_kb) or kmax_kb != int(kmax_kb):
        raise AstraError(
            f"marking thresholds of {kmin_kb:g} and {kmax_kb:g} KB: ns-3 reads whole KB"
        )
    values: dict[str, Any] = {
        "ENABLE_QCN": 1,
        "USE_DYNAMIC_PFC_THRESHOLD": 1,
        "PACKET_PAYLOAD_SIZE": spec.nic.payload_bytes,
        "TOPOLOGY_FILE": folder / "topology.txt",
        "FLOW_FILE": folder / "flow.txt",
        "TRACE_FILE": folder / "trace.txt",
        "TRACE_OUTPUT_FILE": out / "mix.tr",
        "FCT_OUTPUT_FILE": out / "fct.txt",
        "PFC_OUTPUT_FILE": out / "pfc.txt",
        "SIMULATOR_STOP_TIME": "40000000000000.00",
        "CC_MODE": CC_MODES[cc],
        **DCQCN_CONSTANTS,
        **{key: _rate(bps / scale) for key, bps in DCQCN_RATES_BPS.items()},
        "DCTCP_RATE_AI": _rate(1000e6 / scale),
        "ERROR_RATE_PER_LINK": "0.0000",
        "L2_CHUNK_SIZE": 4000,
        "L2_ACK_INTERVAL": 1,
        "L2_BACK_TO_ZERO": 0,
        "HAS_WIN": 1 if spec.nic.window == "bdp" else 0,
        "GLOBAL_T": 1,
        "VAR_WIN": 1,
        "FAST_REACT": 1,
        "U_TARGET": 0.95,
        "MI_THRESH": 0,
        "INT_MULTI": 1,
        "MULTI_RATE": 0,
        "SAMPLE_FEEDBACK": 0,
        "PINT_LOG_BASE": 1.05,
        "PINT_PROB": 1.0,
        "NIC_TOTAL_PAUSE_TIME": 0,
        "RATE_BOUND": 1,
        "ACK_HIGH_PRIO": 0,
        "LINK_DOWN": "0 0 0",
        "ENABLE_TRACE": 0,
        "KMAX_MAP": rate_map([kmax_kb] * len(rates)),
        "KMIN_MAP": rate_map([kmin_kb] * len(rates)),
        "PMAX_MAP": rate_map([sw.ecn_pmax] * len(rates)),
        "BUFFER_SIZE": BUFFER_MB // int(scale),
        "QLEN_MON_FILE": out / "qlen.txt",
        "QLEN_MON_START": QLEN_NEVER_NS,
        "QLEN_MON_END": 20000,
    }
    return "".join(f"{key} {value}\n" for key, value in values.items())


def system_json(config: RunConfig) -> dict[str, Any]:
    """The system layer as astra-sim's Ring.json sets it, with the job's parts and the local
    memory bandwidth over the byte scale (a reduction of B times fewer bytes takes as long)."""
    scale = _check(config)
    wl = config.workload
    dims = 2 if wl.tp_bytes else 1
    return {
        "scheduling-policy": "LIFO",
        "endpoint-delay": ENDPOINT_DELAY_NS,
        "active-chunks-per-dimension": wl.active_splits,
        "preferred-dataset-splits": wl.splits,
        "all-reduce-implementation": ["ring"] * dims,
        "all-gather-implementation": ["ring"] * dims,
        "reduce-scatter-implementation": ["ring"] * dims,
        "all-to-all-implementation": ["direct"] * dims,
        "collective-optimization": "localBWAware",
        "local-mem-bw": LOCAL_MEM_GBPS / scale,
        "boost-mode": 0,
    }


def logical_dims(config: RunConfig) -> list[str]:
    """ASTRA-sim's logical topology: one ring of every rank, or tensor-parallel groups by the
    rest when the job has tensor-parallel traffic."""
    ranks = len(config.jobs(plan(config.fabric))[0][1])
    wl = config.workload
    if wl.tp_bytes:
        return [str(wl.tp_group), str(ranks // wl.tp_group)]
    return [str(ranks)]


def trace_job(config: RunConfig, prefix: Path) -> dict[str, Any]:
    """What study.chakra_trace writes: the job's steps at the byte scale, the compute at
    fabric time (ASTRA-sim's clock is the fabric's)."""
    scale = _check(config)
    wl = config.workload
    dims = logical_dims(config)
    compute_us = wl.compute_s * 1e6
    if compute_us != int(compute_us):
        raise AstraError(f"compute of {compute_us:g} us: Chakra takes whole microseconds")
    return {
        "prefix": str(prefix),
        "npus": math.prod(int(d) for d in dims),
        "dims": len(dims),
        "steps": wl.steps,
        "compute_us": int(compute_us),
        "allreduce_bytes": round(wl.grad_bytes / scale),
        # ASTRA-sim's all-to-all takes the rank's whole buffer, a share per peer.
        "alltoall_bytes": round(wl.tp_bytes * wl.tp_group / scale) if wl.tp_bytes else 0,
    }


@dataclass(frozen=True)
class Inputs:
    """One run's ASTRA-sim inputs, written into `folder`."""

    folder: Path
    npus: int
    job: dict[str, Any] = field(default_factory=dict)
    """What the traces hold (trace_job)."""
    splits: int = 1
    tp_group: int = 1

    @property
    def alltoall_message_bytes(self) -> int | None:
        """The size of each message of the tensor-parallel all-to-all: ASTRA-sim's direct
        all-to-all sends each of its parts' share to every group peer. None without one."""
        if not self.job.get("alltoall_bytes"):
            return None
        return int(self.job["alltoall_bytes"]) // self.splits // self.tp_group

    @property
    def workload(self) -> Path:
        return self.folder / "workload" / "job"

    def output(self, cc: str) -> Path:
        """Where the run with congestion control `cc` writes."""
        return self.folder / f"out-{cc}"

    def arguments(self, cc: str) -> list[str]:
        """The simulator's command-line arguments for a run with congestion control `cc`."""
        return [
            f"--workload-configuration={self.workload}",
            f"--system-configuration={self.folder / 'system.json'}",
            f"--network-configuration={self.output(cc) / 'config.txt'}",
            f"--remote-memory-configuration={self.folder / 'memory.json'}",
            f"--logical-topology-configuration={self.folder / 'logical.json'}",
            "--comm-group-configuration=empty",
            f"--stop-at-seconds={STOP_AT_S:g}",
        ]


def write_inputs(config: RunConfig, folder: Path, chakra_python: str | None = None) -> Inputs:
    """Every input file of `config` for ASTRA-sim into `folder`: the topology, a config per
    congestion control, the system and logical topology JSON, the memory JSON, and one Chakra
    trace per NPU (written by `chakra_python`, a Python with Chakra; this one if it has it)."""
    folder = folder.resolve()
    (folder / "workload").mkdir(parents=True, exist_ok=True)
    (folder / "topology.txt").write_text(topology_text(config))
    for cc in CC_MODES:
        out = folder / f"out-{cc}"
        out.mkdir(exist_ok=True)
        (out / "config.txt").write_text(config_text(config, folder, cc, out))
    (folder / "flow.txt").write_text("0\n")
    (folder / "trace.txt").write_text("0\n\n")
    (folder / "system.json").write_text(json.dumps(system_json(config), indent=1) + "\n")
    dims = logical_dims(config)
    (folder / "logical.json").write_text(json.dumps({"logical-dims": dims}) + "\n")
    (folder / "memory.json").write_text(json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}) + "\n")
    job = trace_job(config, folder / "workload" / "job")
    python = chakra_python or sys.executable
    done = subprocess.run(
        [python, str(Path(__file__).with_name("chakra_trace.py"))],
        input=json.dumps(job),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise AstraError(
            f"writing the Chakra traces with {python}: {last} (a Python with Chakra installed: "
            "--chakra-python, docs/astra-sim.md)"
        )
    (folder / "run.json").write_text(json.dumps(_describe(config), indent=1) + "\n")
    wl = config.workload
    return Inputs(folder, job["npus"], job, wl.splits, wl.tp_group if wl.tp_bytes else 1)


def _describe(config: RunConfig) -> dict[str, Any]:
    wl, spec = config.workload, config.fabric
    return {
        "fabric": spec.name,
        "byte_scale": spec.scaling.byte_scale,
        "steps": wl.steps,
        "grad_bytes": wl.grad_bytes,
        "tp_bytes": wl.tp_bytes,
        "splits": wl.splits,
        "active_splits": wl.active_splits,
        "payload_bytes": spec.nic.payload_bytes,
        "window": spec.nic.window,
        "allreduce_bound_s": allreduce_bound_s(config),
        "config_notes": CONFIG_NOTES,
    }


@dataclass
class AstraRun:
    """What one ASTRA-sim run measured, at fabric scale (its clock is the fabric's)."""

    finished_s: list[float]
    """Per rank, when its workload ended."""
    allreduce_s: list[list[float]]
    """Per step, per rank: its all-reduce, from its first message's start to its last
    message's end (fct.txt)."""
    counters: dict[str, int] = field(default_factory=dict)
    """The CC_COUNTERS line of docs/astra-sim.md's counters patch."""
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "finished_s": self.finished_s,
            "allreduce_s": self.allreduce_s,
            "counters": self.counters,
            "wall_s": self.wall_s,
        }


def read_counters(stdout: str) -> dict[str, int]:
    """The counters patch's one line, as numbers; AstraError if it is not there."""
    match = COUNTERS.search(stdout)
    if match is None:
        raise AstraError("no CC_COUNTERS line: the binary lacks docs/astra-sim.md's patches")
    return {k: int(v) for k, v in (item.split("=") for item in match.group(1).split())}


def read_finished(stdout: str, npus: int) -> list[float]:
    """Each rank's finish time (s), from the end-of-run patch's lines."""
    times = {int(r): int(ns) * 1e-9 for r, ns in FINISHED.findall(stdout)}
    if sorted(times) != list(range(npus)) or any(t < 0 for t in times.values()):
        raise AstraError(f"{len(times)} of {npus} ranks reported finishing")
    return [times[r] for r in range(npus)]


def node_of(address: str) -> int:
    """ns-3's node of a host address in fct.txt (11.0.<id>.1, as hex)."""
    value = int(address, 16)
    return (value >> 8) & 0xFFFF


def read_messages(
    fct: str, leave_out_bytes: int | None = None
) -> list[tuple[int, int, float, float]]:
    """(source, destination, start s, end s) of every message in fct.txt, but those of
    `leave_out_bytes` (another collective's)."""
    out = []
    for line in fct.splitlines():
        parts = line.split()
        if len(parts) < 8 or int(parts[4]) == leave_out_bytes:
            continue
        start_ns, fct_ns = int(parts[5]), int(parts[6])
        out.append(
            (node_of(parts[0]), node_of(parts[1]), start_ns * 1e-9, (start_ns + fct_ns) * 1e-9)
        )
    return out


def allreduce_times(
    messages: Sequence[tuple[int, int, float, float]], npus: int, steps: int
) -> list[list[float]]:
    """Per step, per rank, the all-reduce's time: the rank's messages of the step, from the
    first one it sent to the last one it sent or received. The all-reduce's messages alone
    (read_messages leaves the all-to-all's out), taken to steps in time order, each step
    sending as many as the next."""
    sent: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    received: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for src, dst, start, end in sorted(messages, key=lambda m: m[2]):
        sent[src].append((start, end, dst))
        received[dst].append((start, end, src))
    out: list[list[float]] = [[] for _ in range(steps)]
    for rank in range(npus):
        mine = sent[rank]
        if len(mine) % steps:
            raise AstraError(f"rank {rank} sent {len(mine)} messages over {steps} steps")
        per = len(mine) // steps
        theirs = received[rank]
        if len(theirs) != len(mine):
            raise AstraError(f"rank {rank} sent {len(mine)} messages and received {len(theirs)}")
        for s in range(steps):
            block = mine[s * per : (s + 1) * per]
            got = theirs[s * per : (s + 1) * per]
            start = block[0][0]
            end = max(max(e for _, e, _ in block), max(e for _, e, _ in got))
            out[s].append(end - start)
    return out


def run(binary: str, inputs: Inputs, cc: str, steps: int, timeout_s: float = 7200.0) -> AstraRun:
    """Run ASTRA-sim on `inputs` with congestion control `cc`; AstraRun, or AstraError in one
    line when it fails or does not end within `timeout_s` of wall time."""
    import time

    out = inputs.output(cc)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [binary, *inputs.arguments(cc)],
            cwd=out,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise AstraError(
            f"ASTRA-sim did not end within {timeout_s:.0f} s (inputs: {out})"
        ) from None
    except OSError as err:
        raise AstraError(f"cannot run {binary}: {err.strerror}") from None
    wall = time.monotonic() - started
    (out / "stdout.txt").write_text(done.stdout)
    (out / "stderr.txt").write_text(done.stderr)
    if UNFINISHED.search(done.stdout) is not None:
        left = len([1 for _, ns in FINISHED.findall(done.stdout) if int(ns) < 0])
        messages = read_messages((out / "fct.txt").read_text())
        last = max((m[3] for m in messages), default=0.0)
        raise AstraUnfinished(
            f"ASTRA-sim stopped with {left} of {inputs.npus} ranks unfinished, its last "
            f"message done at {last * 1e3:.2f} ms of {STOP_AT_S:g} s (see {out})",
            last,
            read_counters(done.stdout),
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]
        raise AstraError(f"ASTRA-sim exited with {done.returncode}: {last} (see {out})")
    finished = read_finished(done.stdout, inputs.npus)
    messages = read_messages((out / "fct.txt").read_text(), inputs.alltoall_message_bytes)
    return AstraRun(
        finished_s=finished,
        allreduce_s=allreduce_times(messages, inputs.npus, steps),
        counters=read_counters(done.stdout),
        wall_s=wall,
    )


def median_ms(values: Sequence[Sequence[float]], steps: Sequence[int]) -> float | None:
    """The median over ranks of the all-reduce in the given steps (1-based), ms."""
    chosen = [v for s in steps for v in values[s - 1]]
    return statistics.median(chosen) * 1e3 if chosen else None
