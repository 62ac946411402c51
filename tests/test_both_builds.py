"""The tests that drive the compiled modules, run again as plain Python.

`make test` runs on the compiled build (`make setup` makes it, and a process uses it while
it matches its sources), so every test below tests the machine code; the plain build,
which a checkout without a build and `FORGIVE_PURE=1` run, would go untested but for
tests/test_native.py's one simulated run. Here the same modules run once more in a process
with FORGIVE_PURE=1, beside the rest of the suite on one pytest worker, so that each build
is held to the same tests (issue 39: a Write that worked plain crashed compiled).
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import types

import pytest

from common import native

BOTH_BUILDS = (
    # the core and the host above it
    "test_wire.py",
    "test_frames.py",
    "test_scoreboard.py",
    "test_detector.py",
    "test_acks.py",
    "test_sender.py",
    "test_sender_options.py",
    "test_receiver.py",
    "test_receiver_properties.py",
    "test_core_contract.py",
    "test_core_robustness.py",
    "test_fuzz.py",
    "test_dcqcn_profiles.py",
    "test_two_cores.py",
    "test_nscc.py",
    "test_host.py",
    "test_agent_units.py",
    "test_agent_cli.py",
    # the training rank
    "test_critical_schedule.py",
    "test_plan.py",
    # the switch model: pipeline, port, tables and the P4Runtime server over them
    "test_pipeline.py",
    "test_pipeline_properties.py",
    "test_control_queue.py",
    "test_port_model.py",
    "test_p4runtime_server.py",
    "test_p4runtime_spec_codes.py",
    "test_p4runtime_shell.py",
    "test_controller.py",
    # the simulator's engine
    "test_virtual_fabric.py",
    "test_collective_structure.py",
    "test_astra_options.py",
    "test_trimming.py",
    "test_sim_analytic.py",
    # what neither build may do to a compiled class
    "test_native_guard.py",
)
"""Test modules run on both builds (their namespace and fabric tests on the compiled one only:
those run the modules in processes of their own and take a worker queue of their own)."""

LEFT_OUT = {
    "test_agent_switch.py": "agents and switches as processes in namespaces (root)",
    "test_switch_model.py": "forgive-switch as a process over veths (root)",
    "test_queueing_agree.py": "the model and BMv2, each a process of its own",
    "test_targets_agree.py": "the model and BMv2, each a process of its own",
    "test_soak.py": "a soak of processes; its bounds are checked on made-up traces",
    "test_p4_constants.py": "compares the modules' constants with the P4 source",
    "test_ptf_tna_session.py": "a compiled module's constants only; its server is p4rt_store",
    "test_controller_tofino.py": "a compiled module's constants only; its server is p4rt_store",
    "test_wireshark.py": "tshark reads the frames; building them is test_frames.py's, on both",
}
"""Modules that import from a compiled module but have nothing to run on the plain build."""

CONSTANTS_ONLY = "common.wire"
"""The wire format's module, which nearly every test imports for its constants; test_wire.py,
on the list, is the one that drives it."""

PLAIN_PASS_LEAVES_OUT = "not bmv2"
"""Tests of BMv2 (P4Runtime status codes, TLS): BMv2 runs its own code on either build, and
the compiled build's pass has run them already."""
PLAIN_PASS_TIMEOUT_S = 600
"""The plain pass takes about a minute of CPU; ten minutes only on a machine badly stalled."""


def _defined_in(module: str, name: str | None = None) -> str | None:
    """The module an imported name is defined in (a re-exported class: where its class is)."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    if name is None:
        return mod.__name__
    value = getattr(mod, name, None)
    if isinstance(value, types.ModuleType):
        return value.__name__
    if value is None:
        try:
            return importlib.import_module(f"{module}.{name}").__name__
        except ImportError:
            return None
    return getattr(value, "__module__", None) or module


def driven(path) -> set[str]:
    """The compiled modules a test module imports from (by where each name is defined)."""
    packages = {m.partition(".")[0] for m in native.COMPILED}  # nothing else is imported
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {_defined_in(a.name) for a in node.names if a.name.split(".")[0] in packages}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            ours = node.module.split(".")[0] in packages
            found |= {_defined_in(node.module, a.name) for a in node.names if ours}
    return found & (set(native.COMPILED) - {CONSTANTS_ONLY})


TESTS = native.ROOT / "tests"


def test_every_test_module_that_drives_a_compiled_module_is_on_one_list():
    forced = {p.name for p in TESTS.glob("test_*.py") if driven(p)}
    unlisted = sorted(forced - set(BOTH_BUILDS) - set(LEFT_OUT))
    assert not unlisted, f"put on BOTH_BUILDS, or in LEFT_OUT saying why: {unlisted}"
    assert not set(BOTH_BUILDS) & set(LEFT_OUT)
    for name in (*BOTH_BUILDS, *LEFT_OUT):
        assert (TESTS / name).exists(), name
    assert driven(TESTS / "test_p4runtime_server.py") == {
        "switch_model.crc16",
        "switch_model.tables",
    }


def test_the_compiled_modules_tests_pass_as_plain_python():
    if not any(native.loaded().values()):
        pytest.skip(f"this run is already plain Python ({native.build_status()})")
    env = {**os.environ, native.PURE_ENV: "1"}
    for xdist in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        env.pop(xdist, None)
    env.pop("PYTEST_CURRENT_TEST", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra"]
    command += ["-m", "not netns and not fabric and not soak", "-k", PLAIN_PASS_LEAVES_OUT]
    proc = subprocess.run(
        [*command, *(str(TESTS / name) for name in BOTH_BUILDS)],
        cwd=native.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=PLAIN_PASS_TIMEOUT_S,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"the plain build fails tests the compiled one passes:\n{report}"
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    assert "this process runs plain Python (pure)" in proc.stdout, "FORGIVE_PURE=1 not in effect"
