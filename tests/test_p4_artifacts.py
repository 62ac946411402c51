"""The committed BMv2 JSON and P4Info must be what the P4 source compiles to."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = ("forgive.json", "forgive.p4info.txtpb")


@pytest.mark.skipif(shutil.which("p4c-bm2-ss") is None, reason="p4c-bm2-ss not installed")
def test_committed_artifacts_match_source(tmp_path: Path) -> None:
    subprocess.run(["make", "-s", "p4", f"P4_OUT={tmp_path}"], cwd=REPO, check=True)
    for name in ARTIFACTS:
        fresh = (tmp_path / name).read_text()
        committed = (REPO / "p4src" / "build" / name).read_text()
        assert fresh == committed, f"p4src/build/{name} is stale: run `make p4` and commit"
