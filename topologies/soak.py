"""A soak: one long `forgive run`, every process of it sampled at every training step.

    python -m topologies.soak --steps 200 --out docs/soak      (make soak; root: Mininet)

The run goes as any other (`forgive run` in a process of its own, switch model by default);
beside it this samples, four times a second, every process under it: the `forgive run`
process itself, each switch, each rank's trainer and the shells Mininet keeps per node,
their resident memory (VmRSS) and their open file descriptors. Per training step it keeps
each process's largest sample. After a warm-up of WARMUP_FRACTION of the steps, memory and
descriptors must be flat (the bounds below), the loss bound must hold on every step and the
run must finish (a flow that cannot complete fails its rank, and the run with it). It
writes soak.json (every figure), soak.png (RSS and descriptors against steps, per process)
and table.txt, and exits 1 when a bound fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from topologies.collect import StepProgress
from topologies.switches import Bmv2Switch

SAMPLE_EVERY_S = 0.25
LOOK_EVERY_S = 0.02
"""How often the sampler looks at the ranks' progress; it samples at once when a step
begins, so a step shorter than SAMPLE_EVERY_S (a small job's last about 0.25 s) is sampled
too. Every step must be (the verdict counts those that were not)."""
WARMUP_FRACTION = 0.1
"""Steps left out before flatness is judged: imports, first allocations, caches filling."""
MIN_WARMUP = 5
RSS_GROWTH_BOUND_KIB = 4096
"""How much a process's largest RSS after warm-up may exceed its largest during the first
half after warm-up: a leak of 40 KiB a step over the second half of 200 steps passes it."""
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


def label(pid: int) -> str | None:
    """A process's role, stable across the run: what the soak's figures are keyed by."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    argv = [a for a in argv if a]
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


@dataclass
class Trace:
    """Per process label, per training step (index 0 is step 1): the largest sample."""

    rss_kib: dict[str, dict[int, int]] = field(default_factory=dict)
    fds: dict[str, dict[int, int]] = field(default_factory=dict)
    samples: int = 0
    steps: set[int] = field(default_factory=set)
    """The steps with at least one sample."""

    def add(self, step: int, name: str, rss: int, fds: int) -> None:
        self.steps.add(step)
        for into, value in ((self.rss_kib, rss), (self.fds, fds)):
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
    while not stop.is_set():
        step = progress.done(fresh_records(run_dir, since)) + 1
        if step > steps:
            break  # the training is over; what the command does next (tables, plots) is not
        if step != sampled or time.monotonic() - last >= SAMPLE_EVERY_S:
            for pid in descendants(root):
                name, figures = label(pid), sample(pid)
                if name is None or figures is None:
                    continue
                trace.add(step, name, *figures)
            trace.samples += 1
            sampled, last = step, time.monotonic()
        stop.wait(LOOK_EVERY_S)


@dataclass
class Verdict:
    warmup: int
    rss_growth_kib: dict[str, int]
    fd_growth: dict[str, int]
    bound_held_every_step: bool
    steps_recorded: int
    finished: bool
    failures: list[str]

    @property
    def held(self) -> bool:
        return not self.failures


def judge(trace: Trace, steps: int, run: dict | None, code: int) -> Verdict:
    """The soak's bounds (module docstring) over a trace and the run's record."""
    warmup = max(MIN_WARMUP, round(WARMUP_FRACTION * steps))
    mid = warmup + (steps - warmup) // 2
    failures = []
    rss_growth, fd_growth = {}, {}
    for name in sorted(trace.rss_kib):
        rss, fds = trace.rss_kib[name], trace.fds[name]
        early = [v for s, v in rss.items() if warmup < s <= mid]
        late = [v for s, v in rss.items() if s > mid]
        if early and late:
            rss_growth[name] = max(late) - max(early)
            if rss_growth[name] > RSS_GROWTH_BOUND_KIB:
                failures.append(f"{name}: RSS grew {rss_growth[name]} KiB after warm-up")
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
    return Verdict(warmup, rss_growth, fd_growth, held, len(records), code == 0, failures)


def table(trace: Trace, verdict: Verdict) -> str:
    lines = [
        f"{'process':<16}{'RSS start MiB':>14}{'RSS end MiB':>12}{'RSS growth KiB':>15}"
        f"{'fds start':>10}{'fds end':>8}{'fd growth':>10}"
    ]
    for name in sorted(trace.rss_kib):
        rss, fds = trace.rss_kib[name], trace.fds[name]
        first, last = min(rss), max(rss)
        lines.append(
            f"{name:<16}{rss[first] / 1024:>14.1f}{rss[last] / 1024:>12.1f}"
            f"{verdict.rss_growth_kib.get(name, 0):>15}{fds[first]:>10}{fds[last]:>8}"
            f"{verdict.fd_growth.get(name, 0):>10}"
        )
    lines.append(
        f"warm-up {verdict.warmup} steps; bounds: RSS growth <= {RSS_GROWTH_BOUND_KIB} KiB, "
        f"descriptor growth <= {FD_GROWTH_BOUND}; loss bound held on every step: "
        f"{'yes' if verdict.bound_held_every_step else 'no'}; "
        f"{'held' if verdict.held else 'FAILED: ' + '; '.join(verdict.failures)}"
    )
    return "\n".join(lines)


def plot(path: Path, trace: Trace, verdict: Verdict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    colours = plt.get_cmap("tab20").colors  # 16 or so processes: the default 10 would repeat
    for i, name in enumerate(sorted(trace.rss_kib)):
        steps, colour = sorted(trace.rss_kib[name]), colours[i % len(colours)]
        rss = [trace.rss_kib[name][s] / 1024 for s in steps]
        top.plot(steps, rss, label=name, lw=1, color=colour)
        bottom.plot(steps, [trace.fds[name][s] for s in steps], label=name, lw=1, color=colour)
    for ax in (top, bottom):
        ax.axvline(verdict.warmup, color="grey", ls=":", label="end of warm-up")
        ax.grid(alpha=0.3)
    top.set_ylabel("resident memory, MiB (largest sample per step)")
    bottom.set_ylabel("open file descriptors")
    bottom.set_xlabel("training step")
    top.set_title(title, fontsize=10)
    handles, names = top.get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def soak(
    steps: int, out: Path, extra: list[str], timeout: float, results: Path | None = None
) -> tuple[Trace, Verdict, dict]:
    """Run and sample; write soak.json, soak.png and table.txt into `out`, the run's own
    results folder (its logs and records) into `results` (default out/run)."""
    out.mkdir(parents=True, exist_ok=True)
    results = results or out / "run"
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
    verdict = judge(trace, steps, run, proc.returncode)
    doc = {
        "command": command[1:],
        "steps": steps,
        "wall_time_s": wall,
        "samples": trace.samples,
        "sample_every_s": SAMPLE_EVERY_S,
        "bounds": {"rss_growth_kib": RSS_GROWTH_BOUND_KIB, "fd_growth": FD_GROWTH_BOUND},
        "verdict": {**asdict(verdict), "held": verdict.held},
        "rss_kib": trace.rss_kib,
        "fds": trace.fds,
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
        prog="python -m topologies.soak", description=__doc__.splitlines()[0]
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
