"""Runs kept by configuration and seed, so that no command repeats a run it already has.

A run's folder in the cache is named for its policy, seed and a key: a hash of
everything that decides what the run does (the RunConfig without its timeout,
and CACHE_VERSION). The engine writes the run's host records into that folder;
`result.json` (the RunResult) is written last, atomically, so a folder without
it is a run that never finished, and it is run again. `forgive study` always
keeps its runs here; `forgive compare --cache DIR` does too, and links each
run's folder into its results folder, so the two share runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

from host_agent.core.dcqcn import OFF
from runplan.fabric import NicSettings
from runplan.run import RunConfig
from runs.atomic import write_whole
from runs.report import run_folder
from runs.results import RunResult
from runs.typed import RecordError

CACHE_VERSION = 4
"""Raise it when what a run records changes, so that older runs are not taken for new ones."""
NSCC_VERSION = 2
"""Raise it when what an NSCC run records changes and a DCQCN run's does not: only NSCC
runs carry it, so DCQCN runs keep their keys (2: the ACK that completes a flow is its
window's sample, 7f546ae)."""
LATER_SETTINGS = (
    (("workload",), "splits", 1),
    (("workload",), "active_splits", 1),
    (("workload",), "completion", "receiver"),
    (("workload",), "reduce_bytes_per_s", 0.0),
    (("fabric", "nic"), "paths", "spray"),
    (("fabric", "nic"), "cnp", "paced"),
    (("fabric", "nic"), "ack_every", 0),
    (("fabric", "switch"), "control", "high"),
)
"""Settings added after runs were cached, with the default those runs ran: a run at the
default keeps the key it had before the setting existed."""
RESULT = "result.json"
CONFIG = "config.json"


def config_doc(config: RunConfig) -> dict[str, Any]:
    """What decides a run: the configuration without its timeout and captures, and the cache
    version."""
    doc = asdict(config)
    doc.pop("timeout_s")
    doc.pop("captures")  # what is captured changes nothing a run does
    doc.pop("p4runtime_tls")  # how the controller reaches the switches, not what they do
    if doc["cc"] == "dcqcn":
        doc.pop("cc")  # DCQCN runs keep the keys they had before NSCC existed
    else:
        doc["nscc_version"] = NSCC_VERSION
    if not doc["switch_restarts"]:
        doc.pop("switch_restarts")  # nor do runs that restart no switch change theirs
    if not doc["workload"]["critical"]:
        doc["workload"].pop("critical")  # nor do runs on the note's schedule
    if not doc["jitter_frames"]:
        doc.pop("jitter_frames")  # nor do runs in exact timing
    for path, key, default in LATER_SETTINGS:
        section = doc
        for name in path:
            section = section[name]
        if section[key] == default:
            section.pop(key)  # nor do runs that leave a later setting at its default
    if doc["dcqcn"] == OFF and "cc" not in doc:
        # congestion control off: every flow at the line rate whatever its QP, so DCQCN
        # state per QP runs what state per message runs (tests/test_sender_options.py)
        doc["fabric"]["nic"]["dcqcn_state"] = NicSettings.dcqcn_state
    return {"cache_version": CACHE_VERSION, **doc}


def run_key(config: RunConfig) -> str:
    text = json.dumps(config_doc(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, config: RunConfig) -> Path:
        return self.root / f"{config.policy}-seed{config.seed}-{run_key(config)}"

    def get(self, config: RunConfig) -> RunResult | None:
        """The stored result of this exact configuration, or None."""
        folder = self.folder(config)
        try:
            stored = json.loads((folder / CONFIG).read_text())
            doc = json.loads((folder / RESULT).read_text())
        except (OSError, ValueError):
            return None
        if stored != json.loads(json.dumps(config_doc(config))):
            return None  # a hash collision, or a folder edited by hand
        try:
            return RunResult.from_json(doc, str(folder / RESULT))
        except RecordError:
            return None  # written by another version, or damaged: run it again

    def put(self, config: RunConfig, result: RunResult) -> None:
        folder = self.folder(config)
        folder.mkdir(parents=True, exist_ok=True)
        write_whole(folder / CONFIG, json.dumps(config_doc(config), indent=1, sort_keys=True))
        write_whole(folder / RESULT, json.dumps(result.to_json()))


Runner = Callable[..., RunResult]
"""Runs one configuration: `runner(config, folder, label)`, and in a worker process
`runner(config, folder, label, False)` (no progress line rewritten in place)."""


def run_cached(
    configs: Sequence[RunConfig],
    cache: RunCache,
    runner: Runner,
    *,
    fresh: bool = False,
    workers: int = 1,
    dask: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> list[RunResult]:
    """Every configuration's result, in order: from the cache where it has one (unless
    `fresh`), else run into its cache folder and stored the moment it ends, so an
    interrupted sequence resumes where it stopped. `workers` > 1 runs them in that many
    processes, `dask` on that scheduler's cluster (the runner must then be a module-level
    function; on a cluster the workers write each run's records into its cache folder, so the
    cache must be on a file system they share, and this process stores each result)."""
    labels = [f"[{i}/{len(configs)}] {c.policy} seed {c.seed}" for i, c in enumerate(configs, 1)]
    results: list[RunResult | None] = [None] * len(configs)
    todo = []
    for i, config in enumerate(configs):
        cached = None if fresh else cache.get(config)
        if cached is None:
            todo.append(i)
        else:
            say(f"{labels[i]}: cached in {cache.folder(config)}")
            results[i] = cached
    if dask:
        from runs.sweep import on_dask

        for j, result in on_dask(
            dask,
            runner,
            [configs[i] for i in todo],
            [cache.folder(configs[i]) for i in todo],
            [labels[i] for i in todo],
        ):
            results[todo[j]] = result
            cache.put(configs[todo[j]], result)
    elif workers <= 1:
        for i in todo:
            results[i] = runner(configs[i], cache.folder(configs[i]), labels[i])
            cache.put(configs[i], results[i])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(runner, configs[i], cache.folder(configs[i]), labels[i], False): i
                for i in todo
            }
            try:
                for future in as_completed(futures):
                    i = futures[future]
                    results[i] = future.result()
                    cache.put(configs[i], results[i])
                    say(f"{labels[i]}: done")
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return [r for r in results if r is not None]


def link_runs(out: Path, configs: Sequence[RunConfig], cache: RunCache) -> None:
    """`out/<policy>-seed<n>` as a link to each run's cache folder: a results folder's layout."""
    out.mkdir(parents=True, exist_ok=True)
    for config in configs:
        link = run_folder(out, config.policy, config.seed)
        if link.is_symlink() or link.exists():
            if not link.is_symlink():
                continue  # a real folder of an earlier run: leave it
            link.unlink()
        link.symlink_to(cache.folder(config).resolve(), target_is_directory=True)
