"""The Tofino program against the Tofino toolchain.

p4test (the p4c frontend and midend) type-checks p4src/tna/forgive.p4 against
the TNA include files for Tofino 1 and Tofino 2; where bf-p4c is installed the
program is compiled for real and its P4Info must be the committed one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tna_toolchain import ARCH_FILES, TARGETS, include_dir, tool

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "p4src" / "tna" / "forgive.p4"
BUILD = REPO / "p4src" / "tna" / "build"


def _p4test_or_skip() -> tuple[str, Path]:
    p4test = tool("p4test")
    if p4test is None:
        pytest.skip("p4test not installed")
    include, reason = include_dir()
    if include is None:
        pytest.skip(reason)
    return p4test, include


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_program_type_checks_against_tna(target: str, tmp_path: Path) -> None:
    p4test, include = _p4test_or_skip()
    if not (include / ARCH_FILES[target]).is_file():
        pytest.skip(f"{ARCH_FILES[target]} not in {include}")
    result = subprocess.run(
        [
            p4test,
            "--std",
            "p4-16",
            f"-D__TARGET_TOFINO__={TARGETS[target]}",
            "-I",
            str(include),
            str(PROGRAM),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"p4test rejected forgive.p4 for {target}:\n{result.stderr}"
    ours = [line for line in result.stderr.splitlines() if str(REPO) in line]
    assert not ours, "p4test warns about the program:\n" + "\n".join(ours)


def test_type_check_fails_on_a_broken_program(tmp_path: Path) -> None:
    """The check above can fail: the same invocation rejects the program with one
    intrinsic field misspelt."""
    p4test, include = _p4test_or_skip()
    text = PROGRAM.read_text()
    assert "ig_tm_md.deflect_on_drop = 1;" in text
    broken = tmp_path / "tna" / "forgive.p4"
    broken.parent.mkdir()
    broken.write_text(text.replace("ig_tm_md.deflect_on_drop = 1;", "ig_tm_md.deflect = 1;"))
    (tmp_path / "include").symlink_to(REPO / "p4src" / "include")
    result = subprocess.run(
        [p4test, "--std", "p4-16", "-D__TARGET_TOFINO__=1", "-I", str(include), str(broken)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "deflect" in result.stderr


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_committed_p4info_is_what_bf_p4c_compiles(target: str, tmp_path: Path) -> None:
    bf_p4c = tool("bf-p4c")
    if bf_p4c is None:
        pytest.skip("bf-p4c not installed (the open Tofino backend of p4c)")
    subprocess.run(
        [
            "make",
            "-s",
            "p4-tna",
            f"BF_P4C={bf_p4c}",
            f"TNA_OUT={tmp_path}",
            f"TNA_TARGETS={target}",
        ],
        cwd=REPO,
        check=True,
        timeout=3600,
    )
    committed = BUILD / target / "forgive.p4info.txtpb"
    assert committed.is_file(), f"{committed.relative_to(REPO)} missing: run `make p4-tna`, commit"
    fresh = (tmp_path / target / "forgive.p4info.txtpb").read_text()
    assert fresh == committed.read_text(), (
        f"{committed.relative_to(REPO)} is stale: run `make p4-tna` and commit"
    )
    for summary in ("mau.resources.log", "pa.results.log"):
        assert (BUILD / target / summary).is_file(), f"p4src/tna/build/{target}/{summary} missing"
