"""Ending the processes an emulation or a test harness starts, and telling a stalled one."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; reaps it either way.
    SIGCONT after the SIGTERM, so that a stopped process (SIGSTOP) acts on it at once."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    proc.send_signal(signal.SIGCONT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, SIGTSTP, a debugger): alive, but it will
    answer nothing until it is continued. False for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # the state follows the command name, which is in parentheses and may hold any character
    return stat[stat.rindex(")") + 2 :][:1] in ("T", "t")
