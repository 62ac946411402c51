"""A run's configuration goes down the floors once: from `forgive`'s main through the
simulator, no module is entered more than twice (docs/layout.md traces both engines).

The trace records every call, in the project's packages, that is handed the run's
configuration, its compiled plan or a host's entry (or a list of them); a module is
entered when such a call goes into it from another module.
"""

from __future__ import annotations

import sys
from collections import Counter

from commands.forgive import main
from topologies import simulated
from topologies.runplan import RunConfig, RunPlan
from workload.hostplan import HostEntry

CARRIED = (RunConfig, RunPlan, HostEntry)
PACKAGES = {"commands", "study", "impact", "topologies", "controller", "workload"}
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


def test_a_simulated_runs_configuration_enters_no_module_more_than_twice(tmp_path, monkeypatch):
    entered: list[str] = []

    def watch(frame, event, _):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            carried = module.partition(".")[0] in PACKAGES and _carries(frame)
            if carried and (not entered or entered[-1] != module):
                entered.append(module)
        elif event == "return" and frame.f_code.co_name == "collect_run":
            sys.setprofile(None)  # the result is made: the tables and plots need no trace

    real_train_jobs = simulated.train_jobs

    def untraced_train_jobs(*args, **kwargs):
        """The engine's loop is handed jobs of host and training configurations, not the
        run's: traced, its millions of calls would only make the test slow."""
        sys.setprofile(None)
        try:
            return real_train_jobs(*args, **kwargs)
        finally:
            sys.setprofile(watch)

    monkeypatch.setattr(simulated, "train_jobs", untraced_train_jobs)
    argv = ["run", "--engine", "sim", "--fabric", "2to1", "--steps", "1", "--out", str(tmp_path)]
    sys.setprofile(watch)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    assert code == 0
    assert entered == [
        "topologies.runplan",  # RunConfig built and checked by the command
        "commands.forgive",  # the line describing the run
        "topologies.sweep",
        "topologies.simulated",
        "topologies.runplan",  # plan_run
        "workload.hostplan",  # one entry per rank
        "topologies.collect",
    ]
    assert max(Counter(entered).values()) <= 2
