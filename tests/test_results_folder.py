"""A results folder that cannot be written is refused before the first run, on either engine,
in one line naming the folder (exit 2), and nothing is left where the folder was asked for."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commands.forgive import main

QUICK = ["--steps", "1", "--byte-scale", "64", "--timeout", "60"]


@pytest.fixture
def taken(tmp_path):
    path = tmp_path / "taken"
    path.write_text("someone's file\n")
    return path


@pytest.mark.parametrize("engine", ["sim", "mininet"])
def test_an_out_that_names_a_file_is_refused_before_the_run(engine, taken, capsys):
    assert main(["run", "--engine", engine, *QUICK, "--out", str(taken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"forgive: --out {taken}: exists and is not a folder"
    assert taken.read_text() == "someone's file\n"


@pytest.mark.parametrize("engine", ["sim", "mininet"])
@pytest.mark.parametrize("under", ["/proc", "taken"])
def test_an_out_where_nothing_can_be_made_is_refused_before_the_run(engine, under, taken, capsys):
    out = (Path(under) if under == "/proc" else taken) / "results"
    assert main(["run", "--engine", engine, *QUICK, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"forgive: --out {out}: cannot write there (") and "\n" not in err


def test_a_cache_that_cannot_be_written_is_refused_before_the_run(taken, tmp_path, capsys):
    args = ["compare", "--engine", "sim", *QUICK, "--policies", "tight", "--seeds", "1"]
    assert main([*args, "--out", str(tmp_path / "out"), "--cache", str(taken)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"forgive: --cache {taken}: exists and is not a folder"
    )


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_read_only_filesystem_is_refused_before_the_run(tmp_path):
    """A read-only tmpfs in a mount namespace of the test's own: the command sees EROFS."""
    ro = tmp_path / "ro"
    ro.mkdir()
    command = (
        f"mount -t tmpfs -o ro tmpfs {ro} && "
        f"{sys.executable} -m commands.forgive run --engine sim {' '.join(QUICK)} --out {ro}/results"
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", command], capture_output=True, text=True, timeout=60
    )
    if "mount:" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"forgive: --out {ro}/results: cannot write there (Read-only file system)"
    )
