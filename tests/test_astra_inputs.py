"""ASTRA-sim's inputs written from a run description (study.astra): the same fabric, hosts in
rank order, every rate and byte quantity over the byte scale and every time the fabric's; its
outputs read back; and, where ASTRA-sim and Chakra are installed (docs/astra-sim.md), a run."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from runplan.fabric import plan, preset, sim_scaling
from runplan.run import JOBS, RunConfig
from runs.options import with_settings
from study import astra
from study.slack import allreduce_bound_s

ASTRA_SIM = os.environ.get("FORGIVE_ASTRA_SIM")
CHAKRA_PYTHON = os.environ.get("FORGIVE_CHAKRA_PYTHON")


def config(scale: float = 32, **workload) -> RunConfig:
    spec = with_settings(
        sim_scaling(preset("note-4to1"), byte_scale=scale),
        {"window": "bdp", "payload_bytes": 1000},
    )
    wl = replace(JOBS["note"], steps=2, tp_bytes=0, pp_bytes=0, critical=(1,), splits=4, **workload)
    return RunConfig(spec, policy="dcqcn", workload=wl, engine="sim", dcqcn="nic")


def test_the_topology_puts_rank_r_on_node_r_and_scales_every_rate():
    cfg = config()
    lines = astra.topology_text(cfg).splitlines()
    nodes, switches, links = map(int, lines[0].split())
    assert (nodes, switches, links) == (64 + 10, 10, 64 + 8 * 2)
    assert lines[1].split() == [str(i) for i in range(64, 74)]
    hosts = cfg.jobs(plan(cfg.fabric))[0][1]
    leaf_of = {f"leaf{i + 1}": 64 + i for i in range(8)}
    host_links = [line.split() for line in lines[2:] if int(line.split()[0]) < 64]
    assert len(host_links) == 64
    for src, dst, rate, delay, error in host_links:
        assert int(dst) == leaf_of[hosts[int(src)].leaf], "node r is the host of rank r"
        assert (rate, delay, error) == ("12500000000bps", "0.001ms", "0")


def test_the_config_scales_dcqcns_rates_the_marking_and_the_buffer_and_keeps_its_times(tmp_path):
    text = astra.config_text(config(), tmp_path, "dcqcn")
    values = dict(line.split(" ", 1) for line in text.splitlines())
    assert values["CC_MODE"] == "1"
    assert values["RATE_AI"] == "1562500bps" and values["MIN_RATE"] == "3125000bps"
    assert values["RP_TIMER"] == "900" and values["RATE_DECREASE_INTERVAL"] == "4"
    assert values["KMIN_MAP"] == "1 12500000000 25" and values["KMAX_MAP"] == "1 12500000000 100"
    assert values["BUFFER_SIZE"] == "1" and values["PACKET_PAYLOAD_SIZE"] == "1000"
    assert values["HAS_WIN"] == "1" and values["GLOBAL_T"] == "1"
    assert int(values["QLEN_MON_START"]) > 10**12, "the queue monitor never writes"
    off = dict(
        line.split(" ", 1) for line in astra.config_text(config(), tmp_path, "off").splitlines()
    )
    assert off["CC_MODE"] == "12"


def test_the_system_layer_takes_the_jobs_parts_and_a_scaled_memory_bandwidth():
    system = astra.system_json(config(scale=8, active_splits=2))
    assert system["preferred-dataset-splits"] == 4 and system["active-chunks-per-dimension"] == 2
    assert system["local-mem-bw"] == pytest.approx(50 / 8)
    assert system["all-reduce-implementation"] == ["ring"]
    assert astra.logical_dims(config()) == ["64"]
    with_tp = replace(config(), workload=replace(config().workload, tp_bytes=1 << 20))
    assert astra.logical_dims(with_tp) == ["8", "8"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scale": 64}, "byte scale 64: ASTRA-sim's buffer is whole MB"),
        ({"scale": 3}, "byte scale 3"),
        ({"pp_bytes": 1 << 20}, "no pipeline-parallel traffic"),
        ({"tp_phase": "overlap", "tp_bytes": 1 << 20}, "--tp-phase own only"),
    ],
)
def test_what_astra_sim_cannot_run_is_refused_in_one_line(changes, message):
    scale = changes.pop("scale", 32)
    cfg = config(scale)
    cfg = replace(cfg, workload=replace(cfg.workload, **changes))
    with pytest.raises(astra.AstraError, match=message.replace("(", r"\(")):
        astra.topology_text(cfg)


def test_the_outputs_are_read_back_into_each_ranks_all_reduce_per_step():
    # Two ranks, two steps, two messages each way per step (a ring of two, one part).
    fct = []
    for base in (1000, 9000):
        for k in range(2):
            for src, dst in ((0, 1), (1, 0)):
                start = base + 1000 * k + src * 10
                fct.append(f"0b00{src:02x}01 0b00{dst:02x}01 10000 100 8192 {start} 900 800")
    messages = astra.read_messages("\n".join(fct))
    assert messages[0][:2] == (0, 1)
    # Rank 0 starts first and receives last (1.91 us); rank 1 starts 10 ns later (1.9 us).
    times = astra.allreduce_times(messages, 2, 2)
    assert times == [pytest.approx([1.91e-6, 1.9e-6])] * 2
    stdout = "rank 0 finished at 5000 ns\nrank 1 finished at 6000 ns\nCC_COUNTERS a=1 b=22\n"
    assert astra.read_finished(stdout, 2) == [5e-6, 6e-6]
    assert astra.read_counters(stdout) == {"a": 1, "b": 22}
    with pytest.raises(astra.AstraError, match="1 of 2 ranks reported finishing"):
        astra.read_finished("rank 0 finished at 5000 ns\n", 2)
    with pytest.raises(astra.AstraError, match="no CC_COUNTERS line"):
        astra.read_counters("")


@pytest.mark.skipif(
    not (ASTRA_SIM and CHAKRA_PYTHON),
    reason="ASTRA-sim and Chakra not installed (FORGIVE_ASTRA_SIM, FORGIVE_CHAKRA_PYTHON; "
    "docs/astra-sim.md)",
)
def test_astra_sim_runs_the_inputs_and_its_all_reduce_is_at_least_the_line_rate_bound(tmp_path):
    # The 4:1 fabric at bytes / 32 with 8 ranks' worth of hosts is still 64; a short run:
    # one step of a small all-reduce.
    cfg = config()
    cfg = replace(cfg, workload=replace(cfg.workload, steps=1, grad_bytes=8 << 20, critical=()))
    inputs = astra.write_inputs(cfg, tmp_path / "in", CHAKRA_PYTHON)
    assert len(list((tmp_path / "in" / "workload").glob("job.*.et"))) == 64
    run = astra.run(ASTRA_SIM, inputs, "dcqcn", steps=1, timeout_s=1800)
    assert len(run.allreduce_s[0]) == 64
    assert min(run.allreduce_s[0]) >= allreduce_bound_s(cfg)
    assert run.counters["qps_completed"] == 64 * 2 * 63 * 4
    json.dumps(run.to_json())
    assert shutil.which(ASTRA_SIM) or Path(ASTRA_SIM).is_file()


def test_the_same_run_written_under_two_folders_is_one_cached_astra_run(tmp_path):
    """Its config names its files by path; the cache key must not, or every --out reruns it."""
    from commands.study_astra import _astra_key

    keys = []
    for name in ("a", "b"):
        inputs = astra.Inputs(tmp_path / name / "astra-inputs", 64)
        out = inputs.output("dcqcn")
        out.mkdir(parents=True)
        (inputs.folder / "system.json").write_text('{"preferred-dataset-splits": 4}')
        (out / "config.txt").write_text(astra.config_text(config(), inputs.folder, "dcqcn"))
        assert str(inputs.folder) in (out / "config.txt").read_text()
        keys.append(_astra_key(inputs, "dcqcn", shutil.which("python3") or "/bin/sh"))
    assert keys[0] == keys[1]
    (inputs.folder / "system.json").write_text('{"preferred-dataset-splits": 1}')
    assert _astra_key(inputs, "dcqcn", shutil.which("python3") or "/bin/sh") != keys[0]
