"""`forgive study note` on both engines, small: a second job on the fabric's other hosts, collected
as the first job's companion, and a detector that errs, through the same ranks and hosts."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest
from fabric_harness import FORGIVE, MININET


@pytest.mark.parametrize("engine", ["sim", pytest.param("mininet", marks=MININET)])
def test_second_job_and_misclassifying_detector(engine):
    with tempfile.TemporaryDirectory(prefix="st") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        variants = "second-job:tight,detector:critical-missed"
        proc = subprocess.run(
            [*FORGIVE, "study", "note", "--engine", engine,
             "--fabric", "2to1", "--nonblocking-fabric", "nonblocking", "--job", "default",
             "--steps", "2", "--seeds", "1", "--variants", variants, "--timeout", "120",
             "--cache", str(cache), "--out", str(out)],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs = {p.name.split("-seed")[0]: p for p in cache.iterdir()}
        second = json.loads((runs["tight"] / "result.json").read_text())
        missed = json.loads((runs["forgive"] / "result.json").read_text())
        doc = json.loads((out / "study.json").read_text())
    companion = second["companion"]
    assert companion["policy"] == "dcqcn" and len(companion["steps"]) == 2
    assert companion["loss"]["layout"]["ranks"] == 2 == second["loss"]["layout"]["ranks"]
    assert companion["metrics"]["forgiven_pct"] == 0
    assert companion["exemption"]["exempt_flows"] == 0, "the second job obeys throughout"
    steps = missed["steps"]
    assert [(s["critical"], s["misclassified"]) for s in steps] == [(False, True)] * 2
    assert all(len(s["trim_fifths"]) == 5 for s in steps)
    claims = {c["key"]: c for c in doc["claims"]}
    assert claims["detector.missed"]["values"]["1"] is not None
    assert doc["engine"] == engine
