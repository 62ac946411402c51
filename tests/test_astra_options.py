"""ASTRA-sim's network mechanisms as options of the fabric and the job: a path per message, a
CNP per marked packet, and the all-reduce's structure, from a fabric file or the command line
to what the hosts do; every bad value refused in one line naming it."""

from __future__ import annotations

import argparse
import io
import json
from collections import defaultdict
from pathlib import Path

import pytest

from common import records
from common.frames import parse as parse_frame
from common.wire import DATA_FRAME_LEN, PACKET_BYTES, Opcode, peek
from host_agent.endpoint import EndpointConfig
from host_agent.events import SendDone
from host_agent.host import HostConfig
from host_agent.policies import parse_policy
from runplan.fabric import FabricError, parse, preset
from runplan.run import RunConfig, RunError, Workload, plan_run
from runs.options import add_regime_options, job_regime, with_regime
from simulator.engine import VirtualFabric, star, train
from workload.plan import TrainingConfig

BASE = {"leaves": 2, "spines": 1, "hosts_per_leaf": 2}


def test_a_fabric_file_sets_paths_and_cnps_and_refuses_bad_values_in_one_line():
    spec = parse({**BASE, "nic": {"paths": "message", "cnp": "per-mark"}})
    assert (spec.nic.paths, spec.nic.cnp) == ("message", "per-mark")
    assert (parse(BASE).nic.paths, parse(BASE).nic.cnp) == ("spray", "paced")
    for nic, message in [
        ({"paths": "flow"}, "[nic] paths must be one of spray, message, got 'flow'"),
        ({"cnp": "always"}, "[nic] cnp must be one of paced, per-mark, got 'always'"),
        ({"cnp": 1}, "[nic] cnp must be a string, got 1"),
    ]:
        with pytest.raises(FabricError) as err:
            parse({**BASE, "nic": nic})
        assert str(err.value) == message


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_regime_options(parser)
    return parser.parse_args(argv)


def test_the_command_line_sets_each_mechanism_and_names_a_bad_one():
    spec = with_regime(preset("2to1"), _args(["--paths", "message", "--cnp", "per-mark"]))
    assert (spec.nic.paths, spec.nic.cnp) == ("message", "per-mark")
    job = job_regime(
        _args(["--allreduce-splits", "4", "--active-splits", "2", "--completion", "sender-ack"])
    )
    assert job == {"splits": 4, "active_splits": 2, "completion": "sender-ack"}
    assert job_regime(_args([])) == {}, "unset, the job keeps its own"
    assert job_regime(_args(["--local-mem-gbs", "50"])) == {"reduce_bytes_per_s": 50e9}
    # 0 is the job's own value, no reduction time, so a profile's can be taken away
    none = job_regime(_args(["--profile", "astra-ns3", "--local-mem-gbs", "0"]))
    assert none["reduce_bytes_per_s"] == Workload.reduce_bytes_per_s == 0.0
    for argv, message in [
        (["--paths", "ecmp"], "--paths must be one of spray, message, got 'ecmp'"),
        (["--cnp", "none"], "--cnp must be one of paced, per-mark, got 'none'"),
    ]:
        with pytest.raises(FabricError) as err:
            with_regime(preset("2to1"), _args(argv))
        assert str(err.value) == message
    for argv, message in [
        (["--allreduce-splits", "0"], "--allreduce-splits must be an integer >= 1, got 0"),
        (["--active-splits", "-1"], "--active-splits must be an integer >= 1, got -1"),
        (
            ["--completion", "acked"],
            "--completion must be one of receiver, sender-ack, got 'acked'",
        ),
        (["--local-mem-gbs", "-1"], "--local-mem-gbs must be a finite number >= 0, got -1.0"),
        (["--local-mem-gbs", "inf"], "--local-mem-gbs must be a finite number >= 0, got inf"),
    ]:
        with pytest.raises(FabricError) as err:
            job_regime(_args(argv))
        assert str(err.value) == message


def test_the_plan_carries_the_mechanisms_to_every_host(tmp_path: Path):
    spec = with_regime(preset("2to1"), _args(["--paths", "message", "--cnp", "per-mark"]))
    workload = Workload(steps=2, splits=4, active_splits=2)
    run = plan_run(RunConfig(spec, workload=workload), tmp_path)
    assert all(not e.spray and e.endpoint.cnp_per_mark for e in run.hosts)
    assert {(e.training.splits, e.training.active_splits) for e in run.hosts} == {(4, 2)}
    default = plan_run(RunConfig(preset("2to1")), tmp_path)
    assert all(e.spray and not e.endpoint.cnp_per_mark for e in default.hosts)


def test_sender_ack_completion_is_refused_where_no_engine_can_tell_the_receiver(tmp_path):
    config = RunConfig(preset("2to1"), workload=Workload(completion="sender-ack"))
    with pytest.raises(RunError, match="--completion sender-ack needs --engine sim"):
        config.validate()
    RunConfig(preset("2to1"), workload=Workload(completion="sender-ack"), engine="sim").validate()


def _source_ports(spray: bool, cnp_per_mark: bool = False, marks: bool = False):
    """A ring all-reduce of four ranks on a star; per DATA flow, the source ports its packets
    reached their receiver with, and every receiver's completions. With `marks`, the switch's
    ports run at half the NICs' rate and mark every packet that finds its queue not empty."""
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("dcqcn"),
            line_rate_bps=100e9,
            rto=1.0,
            rto_max=10.0,
            dcqcn="nic",
            cnp_per_mark=cnp_per_mark,
        ),
        spray=spray,
    )
    fabric = star(
        4,
        port_rate_bps=50_000_000_000 if marks else 100_000_000_000,
        data_queue_bytes=64 * DATA_FRAME_LEN,
        ecn_kmin=0 if marks else 1 << 30,
        ecn_kmax=1 if marks else 1 << 30,
        ecn_pmax=1 << 16,
    )
    cfg = TrainingConfig(
        ranks=tuple(f"10.0.0.{i}" for i in range(1, 5)),
        rank=0,
        steps=1,
        grad_bytes=256 * PACKET_BYTES,
        compute_s=0.0,
        tp_bytes=0,
        pp_bytes=0,
        critical=(1,),
    )
    ports: dict[int, list[int]] = defaultdict(list)

    def watch(sim, ranks):
        def tap(i, frame):
            arrival = parse_frame(bytes(frame))
            if arrival is not None:
                opcode, _, _, flow, _, _ = peek(arrival.fth)
                if opcode == Opcode.DATA:
                    ports[flow].append(arrival.sport)

        sim.tap = tap
        yield 1.0

    logs = [io.StringIO() for _ in range(4)]
    _, ranks, _ = train(cfg, fabric, host, delay_s=1e-6, limit_s=1.0, watch=watch, logs=logs)
    assert not any(r.failed for r in ranks)
    received = [
        record
        for log in logs
        for record in map(json.loads, log.getvalue().splitlines())
        if record[records.TYPE] == records.FLOW_RECV
    ]
    return ports, received


def test_a_path_per_message_keeps_one_source_port_for_every_packet_of_a_message():
    ports, _ = _source_ports(spray=False)
    assert ports and all(len(set(p)) == 1 for p in ports.values())
    sprayed, _ = _source_ports(spray=True)
    several = [p for p in sprayed.values() if len(p) >= 8]
    assert several and all(len(set(p)) > 1 for p in several), "spraying varies the port"


def test_a_cnp_per_mark_answers_every_marked_packet():
    _, per_mark = _source_ports(spray=True, cnp_per_mark=True, marks=True)
    marks = sum(r["ce_marks"] for r in per_mark)
    assert marks > 0
    assert sum(r["cnps_sent"] for r in per_mark) == marks
    # The nic profile's notification point sends at most one CNP per 4 us, while a marked
    # packet comes every 0.66 us (4 KiB at 50 Gbit/s).
    _, paced = _source_ports(spray=True, marks=True)
    assert 0 < sum(r["cnps_sent"] for r in paced) < sum(r["ce_marks"] for r in paced) / 2


def test_an_ack_for_every_packet_as_ns3_sends_them(tmp_path: Path):
    spec = parse({**BASE, "nic": {"ack_every": 1}})
    assert plan_run(RunConfig(spec), tmp_path).hosts[0].endpoint.ack_every == 1
    assert plan_run(RunConfig(preset("2to1")), tmp_path).hosts[0].endpoint.ack_every is None
    with pytest.raises(FabricError, match=r"^--ack-every must lie in 0\.\.1024, got -1$"):
        with_regime(preset("2to1"), _args(["--ack-every", "-1"]))
    host = HostConfig(
        endpoint=EndpointConfig(
            policy=parse_policy("dcqcn"), line_rate_bps=10e9, rto=1.0, rto_max=10.0, ack_every=1
        )
    )
    fabric = star(2, port_rate_bps=10_000_000_000, data_queue_bytes=64 * DATA_FRAME_LEN)
    sim = VirtualFabric(fabric, host, delay_s=1e-6)
    counts = {Opcode.DATA: 0, Opcode.ACK: 0}

    def tap(i, frame):
        arrival = parse_frame(bytes(frame))
        if arrival is not None:
            opcode = peek(arrival.fth)[0]
            if opcode in counts:
                counts[Opcode(opcode)] += 1

    sim.tap = tap
    sent = _Sent()
    sim.apps[0].append(sent)
    sim.hosts[1].endpoint.register_flow(5, 0, "other", 0.0)
    sim.hosts[0].endpoint.send(sim.hosts[1].config.ip, 5, bytes(100 * PACKET_BYTES), "other", 0.0)
    sim.start()
    sim.run(lambda: sent.done, limit_s=1.0)
    assert counts[Opcode.DATA] == 100 and counts[Opcode.ACK] == 100


class _Sent:
    """An application that notes its host's first finished send."""

    done = False

    def handle_event(self, event, now: float) -> None:
        self.done = self.done or isinstance(event, SendDone)

    def get_timer(self) -> None:
        return None

    def handle_timer(self, now: float) -> None:
        pass
