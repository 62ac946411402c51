"""The committed BMv2 JSON and P4Info must be what the P4 source compiles to."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = [
    # compiler, make target, its output variable, committed directory, artifacts
    ("p4c-bm2-ss", "p4", "P4_OUT", "p4src/build", ("forgive.json", "forgive.p4info.txtpb")),
    (
        "p4c-bm2-pna",
        "p4-nic",
        "NIC_OUT",
        "p4src/pna/build",
        ("forgive_nic.json", "forgive_nic.p4info.txtpb"),
    ),
]


@pytest.mark.parametrize(("compiler", "target", "out", "committed", "artifacts"), PROGRAMS)
def test_committed_artifacts_match_source(
    tmp_path: Path, compiler: str, target: str, out: str, committed: str, artifacts: tuple
) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} not installed")
    subprocess.run(["make", "-s", target, f"{out}={tmp_path}"], cwd=REPO, check=True)
    for name in artifacts:
        fresh = (tmp_path / name).read_text()
        kept = (REPO / committed / name).read_text()
        assert fresh == kept, f"{committed}/{name} is stale: run `make {target}` and commit"
