"""Runs the PTF suite (ptf_tests/) against every registered switch target present here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ptf_tests import harness
from ptf_tests.targets import TARGETS


@pytest.mark.netns
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_ptf_suite(target: str, tmp_path: Path) -> None:
    reason = harness.missing_prerequisite(target)
    if reason:
        pytest.skip(f"PTF suite on {target}: {reason}")
    result = harness.run(target, log_dir=tmp_path)
    assert result.returncode == 0, f"{result.output}\nlogs in {result.log_dir}"
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert result.netns not in namespaces.split(), "harness left its namespace behind"


def test_unknown_target_is_refused_in_one_line() -> None:
    reason = harness.missing_prerequisite("tofino")
    assert reason is not None and "\n" not in reason and "bmv2" in reason
