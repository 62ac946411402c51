"""What a Tofino switch is given over P4Runtime, built from bf-p4c's output.

bf_switchd's P4Runtime server (`bf_switchd --p4rt-server=ADDR`) is the SDE's
PI implementation. Its SetForwardingPipelineConfig takes, in
`p4_device_config`, one blob: the program name, the compiled binary
(pipe/tofino.bin or pipe/tofino2.bin), the context JSON (pipe/context.json),
the pipe name and the BF-RT schema (bf-rt.json), each after its length as a
host-order (little-endian) 32-bit integer (bf-drivers src/pi/pi_imp.c,
`_pi_update_device_start`). `make p4-tna` writes that blob next to the
compiler's output so that every P4Runtime client (the controller, the PTF
suite) pushes it as it would a BMv2 JSON:

    python -m controller.tofino_pipeline p4src/tna/build tofino
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from controller.topology import TOFINO_TARGETS

TNA_BUILD_DIR = Path(__file__).resolve().parents[1] / "p4src" / "tna" / "build"
"""Per target: the committed P4Info and resource summaries; `compiler/` (untracked)
holds bf-p4c's full output and the device config built from it."""
PROGRAM = "forgive"
"""The program name in the blob. Its length byte (7) is not a valid protobuf tag,
so the server cannot mistake the blob for the deprecated p4.tmp.P4DeviceConfig."""
PIPE = "pipe"
"""The Pipeline instance in p4src/tna/forgive.p4, and bf-p4c's output folder for it."""
DEVICE_CONFIG = "device_config.bin"


@dataclass(frozen=True)
class Chip:
    """What differs between the Tofino generations for the controller."""

    name: str
    """bf-p4c --target, and the fabric description's switch target."""
    cell_bytes: int
    """The TM buffer cell: queue depths and buffer sizes are counted in these."""
    bfrt_prefix: str
    """BF-RT names the fixed-function TM tables tf1.tm.* or tf2.tm.*."""
    binary: str
    """bf-p4c's binary in the pipe folder."""


CHIPS = {
    chip.name: chip
    for chip in (
        Chip("tofino", 80, "tf1", "tofino.bin"),
        Chip("tofino2", 176, "tf2", "tofino2.bin"),
    )
}
assert tuple(CHIPS) == TOFINO_TARGETS


class BuildMissing(FileNotFoundError):
    """bf-p4c's output is not there: `make p4-tna` has not run on this machine."""


def p4info_path(target: str, build_dir: Path = TNA_BUILD_DIR) -> Path:
    return build_dir / target / "forgive.p4info.txtpb"


def device_config_path(target: str, build_dir: Path = TNA_BUILD_DIR) -> Path:
    return build_dir / target / "compiler" / DEVICE_CONFIG


def device_data(binary: bytes, context: bytes, bfrt: bytes) -> bytes:
    """The blob bf_switchd's PI target unpacks."""
    chunks = (PROGRAM.encode(), binary, context, PIPE.encode(), bfrt)
    return b"".join(struct.pack("<I", len(chunk)) + chunk for chunk in chunks)


def write_device_config(target: str, build_dir: Path = TNA_BUILD_DIR) -> Path:
    """Pack bf-p4c's output for `target` into its device config file."""
    chip = CHIPS[target]
    compiler = build_dir / target / "compiler"
    parts = (
        compiler / PIPE / chip.binary,
        compiler / PIPE / "context.json",
        compiler / "bf-rt.json",
    )
    for part in parts:
        if not part.is_file():
            raise BuildMissing(f"{part} missing: run `make p4-tna` (needs bf-p4c)")
    out = device_config_path(target, build_dir)
    out.write_bytes(device_data(*(part.read_bytes() for part in parts)))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[1] not in CHIPS:
        print(f"usage: tofino_pipeline BUILD_DIR {{{','.join(CHIPS)}}}", file=sys.stderr)
        return 2
    try:
        print(write_device_config(args[1], Path(args[0])))
    except BuildMissing as err:
        print(f"tofino_pipeline: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
