"""Independent runs one after another, in worker processes, or on a Dask cluster: same results.

Each run is a pure function of its configuration (the simulator is
deterministic), so where it runs changes nothing but the wall time: the
results come back in the order of the configurations whichever way they ran.
Workers write each run's records into its folder under `out`, which must
therefore be a path every worker can reach (any path for `--workers`, a
shared file system for a remote Dask cluster).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from runplan.run import Captures, RunConfig, RunError, plan_run
from runs.collect import collect_run
from runs.progress import Progress, say
from runs.report import run_folder
from runs.results import RunResult
from topologies import runner


def run_one(
    config: RunConfig, out_dir: Path, label: str = "", tty: bool | None = None
) -> RunResult:
    """One run: compiled once, handed to its engine, collected from the records it left."""
    run = plan_run(config, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(label or f"{config.policy} seed {config.seed}", config.workload.steps)
    if tty is not None:
        progress.tty = tty
    try:
        if config.engine == "sim":
            from simulator.run import simulate

            engine = simulate(run, progress.update, label)
        else:
            engine = runner.emulate(run, out_dir, progress.update, say)
        progress.update(config.workload.steps, sum(c["trims"] for c in engine.counters.values()))
    finally:
        progress.close()
    for capture in engine.captures:
        say(captured(capture, config.captures))
    return collect_run(run, engine)


def captured(capture: dict, wanted: Captures) -> str:
    """One line on a capture a run wrote: where, how many frames, and the cap where it bit."""
    frames = capture["frames"]
    line = (
        f"capture {capture['link']}: {capture['path']}"
        + ("" if frames is None else f", {frames} frames")
        + f" cut to {wanted.snaplen} bytes"
    )
    over = capture["over_cap"]
    if over:
        return line + f"; {over} more past the cap of {wanted.max_frames} frames, not written"
    if over is None and frames == wanted.max_frames:
        return line + f"; the cap of {wanted.max_frames} frames reached, later ones not written"
    return line


def run_all(
    configs: Sequence[RunConfig], out: Path, *, workers: int = 1, dask: str | None = None
) -> list[RunResult]:
    """Every configuration's result, in order; RunError names the first run that failed."""
    labels = [f"[{i}/{len(configs)}] {c.policy} seed {c.seed}" for i, c in enumerate(configs, 1)]
    dirs = [run_folder(out, c.policy, c.seed) for c in configs]
    if dask:
        results: list[RunResult | None] = [None] * len(configs)
        for i, result in on_dask(dask, run_one, configs, dirs, labels):
            results[i] = result
        return [r for r in results if r is not None]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            # Progress lines from several processes would overwrite each other in place.
            futures = [
                pool.submit(run_one, c, d, label, False)
                for c, d, label in zip(configs, dirs, labels, strict=True)
            ]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    return [run_one(c, d, label) for c, d, label in zip(configs, dirs, labels, strict=True)]


def on_dask(
    address: str,
    runner: Callable[..., RunResult],
    configs: Sequence[RunConfig],
    dirs: Sequence[Path],
    labels: Sequence[str],
) -> Iterator[tuple[int, RunResult]]:
    """(index, result) of every configuration as the cluster finishes it, `runner(config,
    folder, label, False)` on a worker; RunError where the scheduler cannot be reached, and the
    first run's own error where one fails."""
    from distributed import Client, as_completed

    try:
        client = Client(address, timeout="10s")
    except OSError as err:
        raise RunError(f"--dask {address}: cannot reach the scheduler: {err}") from None
    with client:
        futures = client.map(runner, configs, dirs, labels, [False] * len(configs), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        for future in as_completed(futures):
            if future.status == "error":
                raise future.exception()
            i = index[future.key]
            print(f"{labels[i]}: done on the cluster", file=sys.stderr)
            yield i, future.result()
