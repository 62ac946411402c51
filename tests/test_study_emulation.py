"""`forgive study note` on the emulation: a second job on the fabric's other hosts, collected as
the first job's companion, and a detector that errs, both through real trainers in Mininet."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root"),
    pytest.mark.skipif(shutil.which("mnexec") is None, reason="Debian's mininet is not installed"),
]


def test_second_job_and_misclassifying_detector_on_the_emulation(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    variants = "second-job:tight,detector:critical-missed"
    proc = subprocess.run(
        [sys.executable, "-m", "topologies.cli", "study", "note", "--engine", "mininet",
         "--steps", "3", "--seeds", "1", "--variants", variants, "--timeout", "120",
         "--cache", str(cache), "--out", str(out)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    runs = {p.name.split("-seed")[0]: p for p in cache.iterdir()}
    second = json.loads((runs["tight"] / "result.json").read_text())
    companion = second["companion"]
    assert companion["policy"] == "dcqcn" and len(companion["steps"]) == 3
    assert companion["loss"]["layout"]["ranks"] == 2 == second["loss"]["layout"]["ranks"]
    assert second["companion"]["metrics"]["forgiven_pct"] == 0
    missed = json.loads((runs["forgive"] / "result.json").read_text())
    steps = missed["steps"]
    assert [(s["critical"], s["misclassified"]) for s in steps] == [(False, True)] * 3
    assert all(s["trim_fifths"] is not None for s in steps)
    doc = json.loads((out / "study.json").read_text())
    claims = {c["key"]: c for c in doc["claims"]}
    assert claims["detector.missed"]["values"]["1"] is not None
