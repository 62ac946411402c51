"""P4Runtime controller for FORGIVE switches."""

from pathlib import Path

BUILD_DIR = Path(__file__).resolve().parents[1] / "p4src" / "build"
"""The committed compiler output (`make p4` rebuilds it)."""
P4INFO = BUILD_DIR / "forgive.p4info.txtpb"
DEVICE_CONFIG = BUILD_DIR / "forgive.json"
