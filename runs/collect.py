"""Turn what a run left behind (each host's JSON lines, the switches' counters) into a RunResult.

Each host writes two files: the training loop's records (`train_step`,
`train_done`, the loss record's `loss_layout` and `loss` lines) and its agent's
statistics (`flow_send`, `flow_recv`, `flow_shed`, `bound_violation`, the
closing `agent` summary).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from common import records
from runplan.run import EngineResult, RunPlan
from runs.results import RunResult, StepResult
from workload.lossrecord import LossRecord, LossRecordError, StepClass, assemble

ENGINE = "mininet"
"""The engine named in the loss records this module assembles."""
TRIMS_AT = "rx_trims_"
"""An agent summary's counts of trimmed headers by where they were trimmed (asymmetric DSCP):
rx_trims_host, rx_trims_fabric, rx_trims_unlocated."""


class CollectError(RuntimeError):
    """A run's records are missing or inconsistent."""


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise CollectError(f"cannot read {path}: {err.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            raise CollectError(f"{path}:{number}: not JSON") from None


def _steps(train: dict[str, list[dict[str, Any]]]) -> list[StepResult]:
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for lines in train.values():
        for rec in lines:
            if rec.get(records.TYPE) == records.TRAIN_STEP:
                by_step[rec["step"]].append(rec)
    steps = []
    for step in sorted(by_step):
        recs = by_step[step]
        if len(recs) != len(train):
            raise CollectError(f"step {step} was recorded by {len(recs)} of {len(train)} ranks")
        steps.append(
            StepResult(
                step=step,
                critical=any(r["critical"] for r in recs),
                duration_s=max(r["step_time"] for r in recs),
                allreduce_s=[r["allreduce_time"] for r in recs],
                expected_bytes=sum(r["grad_expected"] for r in recs),
                forgiven_bytes=sum(r["grad_forgiven"] + r["grad_shed"] for r in recs),
                budget_bytes=sum(r["grad_budget"] for r in recs),
                bound_held=all(r["bound_held"] for r in recs),
                misclassified=any(r.get("misclassified", False) for r in recs),
                trim_fifths=_sum_fifths([r["trim_fifths"] for r in recs if "trim_fifths" in r]),
                allreduce_trim_fifths=_sum_fifths(
                    [r["allreduce_trim_fifths"] for r in recs if "allreduce_trim_fifths" in r]
                ),
                ended_s=max((r["ended"] for r in recs if "ended" in r), default=None),
            )
        )
    return steps


def _sum_fifths(per_rank: list[list[list[int]]]) -> list[list[int]] | None:
    """Element-wise sum of the ranks' per-fifth counters; None when no rank recorded them."""
    if not per_rank:
        return None
    return [[sum(col) for col in zip(*rows, strict=True)] for rows in zip(*per_rank, strict=True)]


def _exemption(sends: list[dict[str, Any]]) -> dict[str, float]:
    """A flow's first mode change begins its exemption; every second one after it is a
    return to obeying congestion control."""
    exempt = [r for r in sends if r["mode_changes"] >= 1]
    return {
        "exempt_flows": len(exempt),
        "obeyed_again_flows": sum(1 for r in exempt if r["mode_changes"] >= 2),
        "obeying_again_episodes": sum(r["mode_changes"] // 2 for r in exempt),
        "obeying_again_s": sum(r.get("obeying_again_time", 0.0) for r in exempt),
    }


def loss_record(train: dict[str, list[dict[str, Any]]]) -> LossRecord:
    """Every rank's loss lines as one record, checked against what each rank said it lost per step."""
    lines = [rec for recs in train.values() for rec in recs]
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in lines:
        if rec.get(records.TYPE) == records.TRAIN_STEP:
            by_step[rec["step"]].append(rec)
    steps = [
        StepClass(step, any(r["critical"] for r in recs), max(r["p"] for r in recs))
        for step, recs in sorted(by_step.items())
    ]
    try:
        record = assemble(
            [r for r in lines if r.get(records.TYPE) == records.LOSS_LAYOUT],
            [r for r in lines if r.get(records.TYPE) == records.LOSS],
            steps,
            ENGINE,
        )
    except LossRecordError as err:
        raise CollectError(f"loss record: {err}") from None
    lost: dict[tuple[int, int], int] = defaultdict(int)
    for entry in record.entries:
        lost[entry.step, entry.dst] += entry.lost_bytes
    for step, recs in by_step.items():
        for r in recs:
            said = r["grad_forgiven"] + r["grad_shed"]
            if lost[step, r["rank"]] != said:
                raise CollectError(
                    f"loss record: rank {r['rank']} step {step} lists {lost[step, r['rank']]} "
                    f"bytes lost, its step record {said}"
                )
    return record


def collect(
    *,
    policy: str,
    seed: int,
    fabric: str,
    time_scale: float,
    train_files: dict[str, Path],
    stats_files: dict[str, Path],
    switch_counters: dict[str, dict[str, int]],
    timeline: Iterable[dict[str, Any]] = (),
) -> RunResult:
    """One run's record. `switch_counters` maps switch -> counter -> total over its ports."""
    train = {host: list(read_jsonl(path)) for host, path in train_files.items()}
    stats = [rec for path in stats_files.values() for rec in read_jsonl(path)]
    steps = _steps(train)
    if not steps:
        raise CollectError("no training step was recorded")
    sends = [r for r in stats if r[records.TYPE] == records.FLOW_SEND]
    recvs = [r for r in stats if r[records.TYPE] == records.FLOW_RECV]
    step_time = {
        host: sum(r["step_time"] for r in recs if r.get(records.TYPE) == records.TRAIN_STEP)
        for host, recs in train.items()
    }
    switch_total = defaultdict(int)
    for counters in switch_counters.values():
        for name, value in counters.items():
            switch_total[name] += value
    gradient_recvs = [r for r in recvs if r["traffic_class"] == "gradient"]
    loss = loss_record(train)
    located: dict[str, int] = defaultdict(int)
    for agent in (r for r in stats if r[records.TYPE] == records.AGENT):
        for key, value in agent.items():
            if key.startswith(TRIMS_AT):
                located[key[len(TRIMS_AT) :]] += value
    return RunResult(
        policy=policy,
        seed=seed,
        fabric=fabric,
        time_scale=time_scale,
        training_time_s=max(step_time.values()),
        steps=steps,
        data_bytes_sent=sum(r["sent_bytes"] for r in sends),
        retransmitted_bytes=sum(r["retransmitted_bytes"] for r in sends),
        data_packets_sent=sum(r["sent_packets"] for r in sends),
        trims=switch_total["trims"],
        trim_drops=switch_total["trim_drops"],
        trims_located=dict(located),
        ce_marks=switch_total["ce_marks"],
        cnps=sum(r["cnps"] for r in sends),
        rtos=sum(r["rtos"] for r in sends),
        rate_cuts=sum(r["rate_cuts"] for r in sends),
        mark_cuts=sum(r.get("mark_cuts", 0) for r in sends),
        late_acks=sum(r["late_acks"] for r in sends),
        rtt_max_s=max((r["rtt_max"] for r in sends), default=0.0),
        # The first change is a flow's start of exemption; every later one is a toggle.
        exemption_toggles=[r["mode_changes"] - 1 for r in sends if r["mode_changes"] >= 1],
        tp_completion_s=[r["duration"] for r in recvs if r["traffic_class"] == "tensor-parallel"],
        bound_violations=sum(1 for r in stats if r[records.TYPE] == records.BOUND_VIOLATION),
        switch_counters={k: dict(v) for k, v in switch_counters.items()},
        timeline=list(timeline),
        loss=loss.to_json(),
        exemption=_exemption(sends),
        trimmed_bytes={
            "eligible": sum(r.get("trimmed_bytes", 0) for r in recvs if r["exemption_eligible"]),
            "other": sum(r.get("trimmed_bytes", 0) for r in recvs if not r["exemption_eligible"]),
        },
        accounting={
            "flow_bytes_sent": sum(r["bytes"] for r in sends),
            "flow_bytes_received": sum(r["received_bytes"] for r in recvs),
            "flow_bytes_forgiven": sum(r["forgiven_bytes"] for r in recvs),
            "gradient_bytes_forgiven": sum(r["forgiven_bytes"] for r in gradient_recvs),
            "flows_sent": len(sends),
            "flows_received": len(recvs),
            "flows_shed": sum(
                1
                for r in stats
                if r[records.TYPE] == records.FLOW_SHED and r["event"] == "send_done"
            ),
            "trims_seen_by_receivers": sum(
                r["core_rx"]["trimmed"] for r in stats if r[records.TYPE] == records.AGENT
            ),
            "trims_at_switches": switch_total["trims"],
            "trims_sent_at_switches": switch_total["trim_tx"],
            "trim_drops_at_switches": switch_total["trim_drops"],
            "drops_at_switches": switch_total["drops"],
        },
    )


def collect_run(run: RunPlan, engine: EngineResult) -> RunResult:
    """The first job's RunResult, with the second job's (if any) as its companion; the
    switches' counters, timeline and restarts are the whole fabric's in both."""
    config = run.config
    results = [
        collect(
            policy=policy,
            seed=config.seed,
            fabric=config.fabric.name,
            time_scale=config.fabric.scaling.time_scale,
            train_files={h.name: run.train_files[h.name] for h in hosts},
            stats_files={h.name: run.stats_files[h.name] for h in hosts},
            switch_counters=engine.counters,
            timeline=engine.timeline,
        )
        for policy, hosts in run.jobs
    ]
    first = results[0]
    first.switch_restarts = engine.switch_restarts
    if len(results) > 1:
        first.companion = results[1].to_json()
    return first
