"""The committed BMv2 JSON and P4Info must be what the P4 source compiles to."""

from __future__ import annotations

import json
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


def comparable(name: str, text: str) -> object:
    """An artifact as compared. p4c-bm2-pna 1.2.5.5 lists the fields of the `scalars`
    header type (the program's metadata and temporaries, which no parser extracts or
    deparser emits, each used by name) in an order that changes from one run to the next,
    so that list is compared sorted; everything else as written."""
    if not name.endswith(".json"):
        return text
    doc = json.loads(text)
    for header_type in doc["header_types"]:
        if header_type["name"].startswith("scalars"):
            header_type["fields"] = sorted(header_type["fields"])
    return doc


@pytest.mark.parametrize(("compiler", "target", "out", "committed", "artifacts"), PROGRAMS)
def test_committed_artifacts_match_source(
    tmp_path: Path, compiler: str, target: str, out: str, committed: str, artifacts: tuple
) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} not installed")
    subprocess.run(["make", "-s", target, f"{out}={tmp_path}"], cwd=REPO, check=True)
    for name in artifacts:
        fresh = comparable(name, (tmp_path / name).read_text())
        kept = comparable(name, (REPO / committed / name).read_text())
        assert fresh == kept, f"{committed}/{name} is stale: run `make {target}` and commit"
