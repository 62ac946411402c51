"""A results folder that cannot be written is refused before the first run, on either engine,
in one line naming the folder (exit 2), and nothing is left where the folder was asked for.
One that holds a run is refused too unless replaced; its files are written whole, completion
marked last, and a disk that fills ends the command in one line with what was written kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commands.forgive import main
from common import native
from runs.atomic import write_whole, written_whole
from runs.report import read_runs
from runs.typed import RecordError

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


# -- one run per folder, written whole -------------------------------------------------

SIM = ["--engine", "sim", "--steps", "1", "--byte-scale", "64"]
PAGE = 4096
"""tmpfs counts a file's bytes in whole pages."""


def snapshot(folder: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every entry under `folder`: its bytes (a link: its target) and its modification time."""
    found: dict[str, tuple[bytes | str, int]] = {".": (b"", folder.stat().st_mtime_ns)}
    for entry in sorted(folder.rglob("*")):
        stat = entry.lstat()
        if entry.is_symlink():
            content: bytes | str = str(entry.readlink())
        elif entry.is_file():
            content = entry.read_bytes()
        else:
            content = b""
        found[str(entry.relative_to(folder))] = (content, stat.st_mtime_ns)
    return found


def test_a_folder_holding_a_run_is_refused_whole_and_replaced_only_when_asked(tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(["compare", *SIM, "--policies", "tight,forgive", "--seeds", "1", "--out", str(out)])
        == 0
    )
    (out / "notes.txt").write_text("the user's own\n")
    before = snapshot(out)
    capsys.readouterr()
    assert main(["run", *SIM, "--policy", "shed", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"forgive: --out {out}: holds an earlier run (complete.json, ")
    assert err.endswith("; name another folder, or --replace to replace it") and "\n" not in err
    assert snapshot(out) == before  # nothing written, removed or touched
    assert main(["run", *SIM, "--policy", "shed", "--out", str(out), "--replace"]) == 0
    assert f"--replace: removed the earlier run from {out}" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["shed-seed1"]
    assert (out / "notes.txt").read_text() == "the user's own\n"  # not a run's: kept
    assert [r.policy for r in read_runs(out)] == ["shed"]


def test_a_run_cut_short_and_a_folder_without_a_run(tmp_path, capsys):
    """A run's folder alone (a run killed before its results) still holds a run; a folder of
    other files does not, and takes one."""
    cut = tmp_path / "cut"
    (cut / "forgive-seed1").mkdir(parents=True)
    assert main(["run", *SIM, "--out", str(cut)]) == 2
    assert "holds an earlier run (forgive-seed1)" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "README").write_text("x")
    assert main(["run", *SIM, "--out", str(other)]) == 0
    assert (other / "complete.json").is_file() and (other / "README").read_text() == "x"


def test_replace_unlinks_the_cache_links_and_keeps_the_cached_runs(tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["compare", *SIM, "--policies", "forgive", "--seeds", "1", "--cache", str(cache)]
    assert main([*args, "--out", str(out)]) == 0
    link = out / "forgive-seed1"
    cached = link.resolve()
    assert link.is_symlink() and (cached / "result.json").is_file()
    assert main([*args, "--out", str(out)]) == 2
    assert main([*args, "--out", str(out), "--replace"]) == 0
    assert link.is_symlink() and (cached / "result.json").is_file()


def test_a_reader_tells_a_finished_run_from_one_cut_short(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *SIM, "--out", str(out)]) == 0
    assert read_runs(out)
    (out / "complete.json").unlink()
    with pytest.raises(RecordError, match="the run was cut short"):
        read_runs(out)
    capsys.readouterr()
    assert main(["impact", str(out), "--hidden", "8", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the run was cut short (complete.json" in err and "\n" not in err


def test_a_file_written_whole_is_the_old_one_or_the_new_one(tmp_path):
    path = tmp_path / "runs.json"
    write_whole(path, "old")
    with pytest.raises(OSError), written_whole(path) as tmp:
        tmp.write_text("half of the ne")
        raise OSError(28, "No space left on device")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["runs.json"]


def pages(folder: Path, names=None) -> int:
    """Bytes a tmpfs holds for `folder`'s files (those named, or all under it)."""
    files = [folder / n for n in names] if names else [p for p in folder.rglob("*") if p.is_file()]
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in files)


def on_a_small_disk(
    tmp_path: Path, size: int, args: list[str]
) -> tuple[subprocess.CompletedProcess, Path]:
    """`forgive ARGS --out DISK/results` on a tmpfs of `size` bytes mounted in a mount
    namespace of the test's own; what the folder then holds is copied to the returned path."""
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    forgive = f"{sys.executable} -m commands.forgive {' '.join(args)} --out {disk}/results"
    command = (
        f"mount -t tmpfs -o size={size} tmpfs {disk} && cd {native.ROOT} && "
        f"{{ {forgive}; status=$?; cp -a {disk}/results {kept}; exit $status; }}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", command], capture_output=True, text=True, timeout=300
    )
    if "mount:" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip().splitlines()[0]}")
    return done, kept


def the_line(done: subprocess.CompletedProcess) -> str:
    """The command's own lines on stderr (the progress lines and the fabric's left out)."""
    lines = [
        line for line in done.stderr.replace("\r", "\n").splitlines() if line.startswith("forgive:")
    ]
    assert len(lines) == 1, done.stderr
    return lines[0]


COMPARE = ["compare", *SIM, "--policies", "forgive", "--seeds", "1,2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The compare the small disks cannot hold, on a disk that can (the simulator is
    deterministic, so each run's records are byte for byte these)."""
    out = tmp_path_factory.mktemp("reference") / "results"
    done = subprocess.run(
        [sys.executable, "-m", "commands.forgive", *COMPARE, "--out", str(out)],
        cwd=native.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out


needs_unshare = pytest.mark.skipif(
    shutil.which("unshare") is None, reason="needs unshare (util-linux)"
)


@needs_unshare
def test_a_disk_that_fills_during_the_runs_ends_the_command_in_one_line(tmp_path, reference):
    first, second = reference / "forgive-seed1", reference / "forgive-seed2"
    size = pages(first) + pages(second) // 2
    done, kept = on_a_small_disk(tmp_path, size, COMPARE)
    assert done.returncode == 1, done.stderr
    line = the_line(done)
    assert line.startswith(
        f"forgive: results folder {tmp_path}/disk/results: No space left on device"
    )
    assert "during the runs; cut short (no complete.json)" in line
    assert snapshot_bytes(kept / "forgive-seed1") == snapshot_bytes(first)  # the finished run whole
    assert not {"runs.json", "complete.json"} & {p.name for p in kept.iterdir()}
    assert not [p for p in kept.rglob(".*")], "a temporary file left behind"


@needs_unshare
def test_a_disk_that_fills_writing_the_results_keeps_what_it_wrote_whole(tmp_path, reference):
    written = ["runs.json", "summary.json", "table.txt"]
    size = pages(reference / "forgive-seed1") + pages(reference / "forgive-seed2")
    size += pages(reference, written) + 2 * PAGE  # not the plots
    done, kept = on_a_small_disk(tmp_path, size, COMPARE)
    assert done.returncode == 1, done.stderr
    line = the_line(done)
    assert line.startswith(
        f"forgive: results folder {tmp_path}/disk/results: No space left on device"
    )
    assert line.endswith(
        "writing the results; cut short (no complete.json): the files written before are whole"
    )
    assert snapshot_bytes(kept) == {
        name: content
        for name, content in snapshot_bytes(reference).items()
        if (kept / name).exists()
    }
    for name in written:  # whole, byte for byte the reference's
        assert (kept / name).read_bytes() == (reference / name).read_bytes()
    assert not (kept / "complete.json").exists()
    assert not [p for p in kept.rglob(".*")], "a temporary file left behind"
    with pytest.raises(RecordError, match="cut short"):
        read_runs(kept)


def snapshot_bytes(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }
