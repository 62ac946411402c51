"""A run's configuration goes down the floors once: from `forgive`'s main through either
engine, no module is entered more than twice (docs/layout.md traces both engines).

The trace records every call, in the project's packages, that is handed the run's
configuration, its compiled plan or a host's entry (or a list of them); a module is
entered when such a call goes into it from another module.
"""

from __future__ import annotations

import sys
from collections import Counter

from fabric_harness import MININET

from commands.forgive import main
from runplan.run import RunConfig, RunPlan
from simulator import run as simulator_run
from workload.hostplan import HostEntry

CARRIED = (RunConfig, RunPlan, HostEntry)
PACKAGES = {
    "commands",
    "study",
    "impact",
    "runs",
    "simulator",
    "topologies",
    "runplan",
    "controller",
    "workload",
}
"""The floors above switch_model and host_agent: those two and common cannot name the run's
types (the layers contract), and the trace skips their per-frame calls to stay quick."""


def _carries(frame) -> bool:
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if isinstance(value, list | tuple) and value:
            value = value[0]
        if isinstance(value, CARRIED):
            return True
    return False


def trace(argv: list[str]) -> list[str]:
    """The modules a `forgive` command's run configuration enters, in order, until its
    result is collected (the tables and plots after it need no trace)."""
    entered: list[str] = []

    def watch(frame, event, _):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            carried = module.partition(".")[0] in PACKAGES and _carries(frame)
            if carried and (not entered or entered[-1] != module):
                entered.append(module)
        elif event == "return" and frame.f_code.co_name == "collect_run":
            sys.setprofile(None)

    sys.setprofile(watch)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    assert code == 0
    return entered


def test_a_simulated_runs_configuration_enters_no_module_more_than_twice(tmp_path, monkeypatch):
    real_train_jobs = simulator_run.train_jobs

    def untraced_train_jobs(*args, **kwargs):
        """The engine's loop is handed jobs of host and training configurations, not the
        run's: traced, its millions of calls would only make the test slow."""
        watch = sys.getprofile()
        sys.setprofile(None)
        try:
            return real_train_jobs(*args, **kwargs)
        finally:
            sys.setprofile(watch)

    monkeypatch.setattr(simulator_run, "train_jobs", untraced_train_jobs)
    entered = trace(
        ["run", "--engine", "sim", "--fabric", "2to1", "--steps", "1", "--out", str(tmp_path)]
    )
    assert entered == [
        "runplan.run",  # RunConfig built and checked by the command
        "commands.forgive",  # the line describing the run
        "runs.sweep",  # run_all, run_one
        "runplan.run",  # plan_run, once
        "workload.hostplan",  # one entry per rank
        "simulator.run",  # the engine, handed the plan
        "runs.collect",  # the records, and what the engine counted
    ]
    assert max(Counter(entered).values()) <= 2


def test_an_emulated_runs_configuration_enters_no_module_more_than_twice(tmp_path):
    entered = trace(["run", "--steps", "1", "--grad-mib", "8", "--out", str(tmp_path)])
    assert entered == [
        "runplan.run",  # RunConfig built and checked by the command
        "topologies.runner",  # what the emulation needs: root, and BMv2 where asked
        "commands.forgive",  # the line describing the run
        "runs.sweep",  # run_all, run_one
        "runplan.run",  # plan_run, once
        "workload.hostplan",  # one entry per rank
        "topologies.runner",  # the engine, handed the plan; each trainer gets its entry
        "workload.hostplan",  # ... as JSON (HostEntry.to_json)
        "runs.collect",  # the records, and what the engine counted
    ]
    assert max(Counter(entered).values()) <= 2


for _mark in MININET:
    test_an_emulated_runs_configuration_enters_no_module_more_than_twice = _mark(
        test_an_emulated_runs_configuration_enters_no_module_more_than_twice
    )
