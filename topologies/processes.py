"""Ending the processes an emulation or a test harness starts."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; reaps it either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
