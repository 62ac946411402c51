"""How fast the switch model forwards port to port, as a ratio to BMv2 in the same run.

Both targets run forgive.p4's pipeline (the model from the same P4Info) in one
network namespace, configured over P4Runtime alike: one route and a managed
egress port whose thresholds are out of reach, so every admission test runs
and nothing trims or marks. Each is offered full 4154-byte DATA frames and
58-byte trimmed headers from a raw socket faster than it can forward; the
figure is frames per second delivered on the egress veth (the load generator
and the measurement are benchmarks/bench_bmv2.py's, so both scripts measure
the same way). BMv2 runs with logging off, its fastest setting; without
`simple_switch_grpc` only the model is measured. Needs root.

    sudo .venv/bin/python benchmarks/bench_switch.py [--seconds 3] [--rounds 3]

Each round measures every target once; the table shows the median per target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_bmv2 import __file__ as MEASURE_SCRIPT  # noqa: E402

from ptf_tests.harness import AUX_PORT, GRPC_PORT, namespace  # noqa: E402
from ptf_tests.targets import Bmv2Target, Endpoint, ModelTarget, SwitchTarget  # noqa: E402


def measure(target: SwitchTarget, seconds: float) -> dict[str, float]:
    """Start `target`, run the shared measurement inside its namespace, stop it."""
    ep = target.endpoint
    cmd = ["ip", "netns", "exec", ep.netns, sys.executable, MEASURE_SCRIPT]
    cmd += ["--inner", "forgive", "--seconds", str(seconds)]
    target.start()
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    finally:
        target.stop()
    if result.returncode != 0:
        raise RuntimeError(f"{target.name}: measurement failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="offered load per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over both targets (median)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_switch: needs root for network namespaces", file=sys.stderr)
        return 2
    bmv2_missing = Bmv2Target.missing()
    rounds: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="forgive-bench-switch-") as tmp:
        netns = f"fgbsw{os.getpid()}"
        try:
            with namespace(netns) as ports:
                ep = Endpoint(netns, ports, GRPC_PORT, AUX_PORT, Path(tmp))
                for _ in range(args.rounds):
                    rounds.setdefault("model", []).append(measure(ModelTarget(ep), args.seconds))
                    if bmv2_missing is None:
                        bmv2 = Bmv2Target(ep, log_level="off")
                        rounds.setdefault("bmv2", []).append(measure(bmv2, args.seconds))
        except (RuntimeError, subprocess.CalledProcessError) as err:
            print(f"bench_switch: {err}", file=sys.stderr)
            return 1
    results = {
        target: {kind: statistics.median(r[kind] for r in runs) for kind in runs[0]}
        for target, runs in rounds.items()
    }
    print(f"median of {args.rounds} rounds, {args.seconds:g} s of offered load each")
    print(f"{'frame':<22} {'model frames/s':>15} {'BMv2 frames/s':>15} {'model/BMv2':>11}")
    for kind, model_fps in results["model"].items():
        if "bmv2" in results:
            bmv2_fps = results["bmv2"][kind]
            print(f"{kind:<22} {model_fps:>15.0f} {bmv2_fps:>15.0f} {model_fps / bmv2_fps:>11.2f}")
        else:
            print(f"{kind:<22} {model_fps:>15.0f} {'-':>15} {'-':>11}")
    if bmv2_missing:
        print(f"(BMv2 not measured: {bmv2_missing})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
