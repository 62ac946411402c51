"""One emulated fabric per machine at a time, and what a killed one leaves behind.

Mininet's switches live in the root namespace, so a run that is killed outright
(SIGKILL, a lost session, a machine-wide `kill`) gets no chance to tear down:
its switch-to-switch veths and its switch processes outlive it, and the next
run's `addLink` fails with "RTNETLINK answers: File exists". Every run holds
one machine-wide lock for as long as its network exists. Whoever holds it knows
that any interface or process of ours still present belongs to a run that is
gone, and removes it, as `mn -c` does for Mininet's own.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

LOCK_PATH = Path("/run/forgive-emulation.lock")
INTERFACE = re.compile(r"(?:leaf|spine)\d+-eth\d+")
"""Every switch port of every fabric of ours (runplan.fabric names switches so)."""
SWITCH_PORT_ARG = re.compile(rf"^\d+[=@]{INTERFACE.pattern}$")
"""How a switch process of ours is told its ports: `-i 1=leaf1-eth1` or `-i 1@leaf1-eth1`."""
TRAINER = "commands.train"


class FabricBusy(RuntimeError):
    """Another live run holds the fabric lock."""


def _holder(lock_file) -> str:
    lock_file.seek(0)
    pid = lock_file.read().strip()
    return f"pid {pid}" if pid else "a process"


@contextmanager
def fabric_lock(say: Callable[[str], None] | None = None, wait: bool = True) -> Iterator[None]:
    """Hold the machine's fabric lock; wait for another run to end (saying so once), or
    with wait=False raise FabricBusy naming its holder."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "a+") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(lock_file)
            if not wait:
                raise FabricBusy(f"another forgive emulation ({holder}) is running") from None
            if say is not None:
                say(f"waiting for another forgive emulation ({holder}) to finish")
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        lock_file.truncate(0)
        lock_file.write(str(os.getpid()))
        lock_file.flush()
        try:
            yield
        finally:
            lock_file.truncate(0)
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def our_interfaces() -> dict[str, str]:
    """Switch ports of ours present in the root namespace, each with its veth peer ("" if
    the peer is in another namespace)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    found = {}
    for line in links.stdout.splitlines():
        # "7: leaf1-eth3@spine1-eth1: <...>": the name, then '@' and the peer if it is here
        name, _, peer = line.split(":", 2)[1].strip().partition("@")
        if INTERFACE.fullmatch(name):
            found[name] = "" if re.fullmatch(r"if\d+", peer) else peer
    return dict(sorted(found.items()))


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _outside_root_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/1/ns/net")
    except OSError:
        return False


def our_processes() -> dict[int, str]:
    """Processes of ours a run starts: switches bound to our switch ports, and trainers
    inside a Mininet host's namespace. Keyed by pid, valued by their command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        argv = _argv(pid)
        switch = any(SWITCH_PORT_ARG.match(arg) for arg in argv)
        trainer = TRAINER in argv and _outside_root_namespace(pid)
        if switch or trainer:
            found[pid] = " ".join(argv)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie has ended already


def _end(pids: list[int], grace_s: float = 3.0) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def clear_leftovers() -> list[str]:
    """Remove what dead runs left (call holding the fabric lock): their processes first,
    then their interfaces. Returns one description per thing removed."""
    removed = []
    processes = our_processes()
    _end(list(processes))
    removed += [f"process {pid} ({argv[:60]})" for pid, argv in processes.items()]
    deleted: set[str] = set()
    for name, peer in our_interfaces().items():
        if name in deleted:
            continue  # went with its peer
        gone = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True)
        if gone.returncode != 0:
            # A host namespace whose last process just ended takes its veths, and their
            # switch-side peers, with it: listed a moment ago, not there now.
            if (Path("/sys/class/net") / name).exists():
                raise RuntimeError(f"cannot remove {name}: {gone.stderr.strip()}")
            continue
        deleted |= {name, peer}
        removed.append(f"veth {name}" + (f" and its peer {peer}" if peer else ""))
    return removed
