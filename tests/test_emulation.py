"""`forgive run` end to end on the switch model in Mininet, and its teardown on every exit."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fabric_harness import FORGIVE, MININET
from tls_certs import make_pki
from tshark_harness import check_capture

from workload.lossrecord import LossRecord

pytestmark = MININET
SHORT = ["--steps", "3", "--grad-mib", "32", "--timeout", "120"]
OUR_INTERFACES = re.compile(r"\b(?:leaf|spine)\d+-eth\d+")
OUR_PROCESSES = re.compile(
    r"(?:switch_model\.cli|simple_switch_grpc) .*-i \d+[=@](?:leaf|spine)\d+-eth\d+"
    r"|workload\.train --iface h\d+-eth0"
)
"""A run's switch and trainer processes: bound to the fabric's interfaces (other tests,
beside these on another worker, start switches and trainers of their own)."""


def leftovers() -> list[str]:
    """Interfaces and processes a run of ours could leave behind."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    names = sorted(set(OUR_INTERFACES.findall(links)))
    ps = subprocess.run(
        ["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True
    ).stdout
    procs = [line.strip() for line in ps.splitlines() if OUR_PROCESSES.search(line)]
    return names + procs


@pytest.fixture
def clean():
    """Start from a machine without our leftovers (a run killed outright, by anyone, leaves
    some) and check that the test's own runs leave none."""
    subprocess.run([*FORGIVE, "clean"], capture_output=True, check=True, timeout=60)
    assert leftovers() == []
    yield
    assert leftovers() == []


def test_short_run_completes_with_accounting_that_adds_up(tmp_path, clean):
    """Over P4Runtime with mutual TLS, which the run otherwise does without (loopback)."""
    # a killed run's spine link is still there: the run must clear it, not fail on it
    subprocess.run(
        ["ip", "link", "add", "leaf1-eth3", "type", "veth", "peer", "name", "spine1-eth1"],
        check=True,
    )
    out = tmp_path / "results"
    captured = ["--pcap", "h1,leaf1-spine1"] if shutil.which("dumpcap") else []
    pki = make_pki(tmp_path / "pki")  # the controller and the switches over mutual TLS
    proc = subprocess.run(
        [*FORGIVE, "run", *SHORT, *captured, "--out", str(out), "--p4runtime-tls", str(pki.folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "removed what a killed run left behind: veth leaf1-eth3" in proc.stderr
    # what forgive-ctl takes to reach the running switches, and the captures tshark reads
    assert set(json.loads((out / "forgive-seed1" / "fabric.json").read_text())["switches"]) == {
        "leaf1",
        "leaf2",
        "spine1",
    }
    if captured and shutil.which("tshark"):
        for link in ("h1", "leaf1-spine1"):
            rows = check_capture(out / "forgive-seed1" / f"{link}.pcapng", tmp_path, 128)
            assert {r["opcode"] for r in rows} >= {"DATA", "ACK"}
            assert f"capture {link}: " in proc.stderr
    switch_logs = sorted((out / "forgive-seed1" / "logs").glob("*.model.log"))
    assert len(switch_logs) == 3
    assert all(" over mutual TLS, control " in log.read_text() for log in switch_logs)
    assert "forgive seed 1: step 3/3" in proc.stderr
    assert proc.stdout.splitlines()[0].startswith("policy")
    (run,) = json.loads((out / "runs.json").read_text())
    assert [s["step"] for s in run["steps"]] == [1, 2, 3]
    assert all(s["bound_held"] for s in run["steps"]) and run["bound_violations"] == 0
    acc = run["accounting"]
    assert acc["flows_sent"] == acc["flows_received"] > 0
    # every byte sent was delivered or forgiven, and nothing else was
    assert acc["flow_bytes_sent"] == acc["flow_bytes_received"] + acc["flow_bytes_forgiven"]
    # every trim a switch made reached its receiver, unless a switch dropped it on the way
    assert acc["trims_seen_by_receivers"] <= acc["trims_at_switches"]
    assert acc["trims_at_switches"] <= acc["trims_seen_by_receivers"] + acc["drops_at_switches"]
    assert run["trims"] > 0 and run["ce_marks"] > 0, "the 2:1 fabric should congest"
    for step in run["steps"]:
        assert step["forgiven_bytes"] <= step["budget_bytes"]
    # the loss record lists every forgiven range with its place in the ring
    loss = LossRecord.from_json(run["loss"])
    assert (loss.layout.ranks, loss.layout.steps) == (4, 3)
    assert sum(e.lost_bytes for e in loss.entries) == sum(s["forgiven_bytes"] for s in run["steps"])
    for name in ("step_times.png", "forgiven_vs_budget.png", "trims_over_time.png", "table.txt"):
        assert (out / name).stat().st_size > 0
    assert len(list((out / "forgive-seed1").glob("h*.agent.jsonl"))) == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fabric", "{file}"], "fabric file .*: unknown key\\(s\\) colour"),
        (["--fabric", "8to1"], "unknown fabric preset '8to1'"),
        (["--policy", "reckless"], "unknown policy 'reckless'"),
        (["--switch", "tofino"], "--switch must be one of model, bmv2"),
    ],
)
def test_bad_configuration_is_rejected_before_anything_starts(tmp_path, clean, args, message):
    bad = tmp_path / "bad.toml"
    bad.write_text("leaves = 2\nspines = 1\nhosts_per_leaf = 2\ncolour = 1\n")
    args = [a.replace("{file}", str(bad)) for a in args]
    out = tmp_path / "results"
    proc = subprocess.run(
        [*FORGIVE, "run", *args, "--out", str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), proc.stderr
    assert not out.exists()


def test_failed_run_is_torn_down(tmp_path, clean):
    out = tmp_path / "results"
    proc = subprocess.run(
        [*FORGIVE, "run", "--steps", "20", "--timeout", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "forgive: " in proc.stderr.splitlines()[-1]


def _as_in_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a test runner started in the background (as
    CI may start it) ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_run(out: Path) -> subprocess.Popen:
    """A 20-step `forgive run` in the background, its output captured."""
    return subprocess.Popen(
        [*FORGIVE, "run", "--steps", "20", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_in_a_terminal,
    )


def _wait_for_first_step(proc: subprocess.Popen, out: Path) -> None:
    train = out / "forgive-seed1" / "h1.train.jsonl"
    deadline = time.monotonic() + 60
    while not (train.exists() and "train_step" in train.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
        time.sleep(0.2)


def test_ctrl_c_tears_the_network_down(tmp_path, clean):
    out = tmp_path / "results"
    proc = _start_run(out)
    _wait_for_first_step(proc, out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; network torn down" in err
    assert not Path(out / "runs.json").exists()


def test_a_run_killed_outright_is_cleared_by_forgive_clean(tmp_path, clean):
    out = tmp_path / "results"
    proc = _start_run(out)
    _wait_for_first_step(proc, out)
    proc.kill()  # no teardown can run: the switches and their links stay
    proc.wait(timeout=10)
    assert any("spine" in name for name in leftovers())
    cleaned = subprocess.run([*FORGIVE, "clean"], capture_output=True, text=True, timeout=60)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "removed veth" in cleaned.stdout and "removed process" in cleaned.stdout
    assert leftovers() == []


def _kill_one(marker: str) -> None:
    """SIGKILL the one process whose command line has `marker` (the fabric lock lets
    one run at a time exist, so there is exactly one)."""
    ps = subprocess.run(
        ["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True
    )
    (pid,) = [int(line.split()[0]) for line in ps.stdout.splitlines() if marker in line]
    os.kill(pid, signal.SIGKILL)


def _end_of_run_after(out: Path, marker: str) -> tuple[subprocess.Popen, str, float]:
    """Start a run, kill `marker` after the first step; the run, its stderr and how long
    it took to end after the kill."""
    proc = _start_run(out)
    try:
        _wait_for_first_step(proc, out)
        _kill_one(marker)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
        return proc, err, time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


def test_a_rank_that_dies_ends_the_run_at_once_even_behind_a_live_one(tmp_path, clean):
    # h3's rank, not the first: the others keep running and would wait for it
    proc, err, took = _end_of_run_after(tmp_path / "results", '{"name": "h3"')
    assert proc.returncode == 1, err
    assert took < 20, f"the run took {took:.1f} s to notice"
    assert re.search(r"forgive: 1 rank\(s\) failed, h3 with signal SIGKILL", err), err


def test_a_switch_that_dies_ends_the_run_in_one_line(tmp_path, clean):
    proc, err, _ = _end_of_run_after(tmp_path / "results", "commands.switch --name leaf1 ")
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"forgive: switch leaf1 \(model\) exited with signal SIGKILL during the run; "
        r"its log: \S+/leaf1\.model\.log",
        last,
    ), err
