"""Run the PTF suite against one switch target inside a private network namespace.

The switch and PTF share one namespace: veth pairs `swN`/`ptN` connect switch
port N to PTF port N, and both reach the switch's gRPC and management ports on
that namespace's loopback. The namespace (and with it every veth) and the
switch process are removed on success, failure, Ctrl-C and SIGTERM.

    python -m ptf_tests.harness --target bmv2 [forgive_switch.TrimTest ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ptf_tests.targets import TARGETS, Endpoint

REPO = Path(__file__).resolve().parent.parent
TEST_DIR = Path(__file__).resolve().parent
SWITCH_PORTS = (1, 2, 3, 4)
MTU = 9000
GRPC_PORT = 9559
AUX_PORT = 9090


@dataclass(frozen=True)
class RunResult:
    returncode: int
    output: str
    log_dir: Path
    netns: str


def missing_prerequisite(target: str) -> str | None:
    """One line saying why the suite cannot run here, or None."""
    if target not in TARGETS:
        return f"unknown target {target!r} (known: {', '.join(sorted(TARGETS))})"
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "ss"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not (Path(sys.executable).parent / "ptf").exists():
        return "ptf not installed in this Python environment"
    reason = TARGETS[target].missing()
    if reason:
        return reason
    for artifact in TARGETS[target].pipeline():
        if not artifact.exists():
            return f"{artifact.relative_to(REPO)} missing (make p4, p4-nic or p4-tna builds it)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def namespace(name: str) -> Iterator[dict[int, str]]:
    """A namespace holding veth pairs swN/ptN; yields switch port -> switch-side name."""
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for key in ("all", "default"):
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    name,
                    "sysctl",
                    "-qw",
                    f"net.ipv6.conf.{key}.disable_ipv6=1",
                ],
                check=True,
            )
        for port in SWITCH_PORTS:
            sw, pt = f"sw{port}", f"pt{port}"
            _ip("-n", name, "link", "add", sw, "mtu", str(MTU), "type", "veth", "peer", "name", pt)
            _ip("-n", name, "link", "set", pt, "mtu", str(MTU))
            for ifname in (sw, pt):
                _ip("-n", name, "link", "set", ifname, "up")
        yield {port: f"sw{port}" for port in SWITCH_PORTS}
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def run(target: str, tests: Sequence[str] = (), log_dir: Path | None = None) -> RunResult:
    """Start `target`, run the PTF suite (or the named tests) against it, tear down."""
    reason = missing_prerequisite(target)
    if reason:
        raise RuntimeError(reason)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"forgive-ptf-{target}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    netns = f"fgptf{os.getpid()}"
    with _sigterm_as_interrupt(), namespace(netns) as ports:
        endpoint = Endpoint(netns, ports, GRPC_PORT, AUX_PORT, log_dir)
        switch = TARGETS[target](endpoint)
        try:
            switch.start()
            p4info, device_config = TARGETS[target].pipeline()
            params = {
                "target": target,
                "netns": netns,
                "grpc_port": GRPC_PORT,
                "aux_port": AUX_PORT,
                "p4info": str(p4info),
                "device_config": str(device_config),
                "log_dir": str(log_dir),
            }
            cmd = ["ip", "netns", "exec", netns, str(Path(sys.executable).parent / "ptf")]
            cmd += ["--test-dir", str(TEST_DIR), "--log-file", str(log_dir / "ptf.log")]
            cmd += ["--socket-recv-size", str(MTU + 1000), "--disable-ipv6"]
            cmd += ["--test-params", ";".join(f"{k}={v!r}" for k, v in params.items())]
            for port in SWITCH_PORTS:
                cmd += ["--interface", f"{port}@pt{port}"]
            cmd += list(tests) or list(TARGETS[target].ptf_specs)
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            return RunResult(proc.returncode, proc.stdout + proc.stderr, log_dir, netns)
        finally:
            switch.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="bmv2", help="switch target (default: bmv2)")
    parser.add_argument("--log-dir", type=Path, help="keep switch and PTF logs here")
    parser.add_argument("tests", nargs="*", help="PTF test names, e.g. forgive_switch.TrimTest")
    args = parser.parse_args(argv)
    try:
        result = run(args.target, args.tests, args.log_dir)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"ptf harness: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ptf harness: interrupted, switch stopped and namespace removed", file=sys.stderr)
        return 130
    print(result.output, end="")
    print(f"logs in {result.log_dir}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
