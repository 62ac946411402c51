"""Where the Tofino architecture includes and compilers are on this machine.

The TNA include files (tna.p4, t2na.p4, tofino1_arch.p4 ...) come with the
open Tofino backend of p4c (backends/tofino/bf-p4c/p4include), which installs
them next to core.p4 in share/p4c/p4include. FORGIVE_TNA_INCLUDE names the
directory explicitly, e.g. a p4c source tree's backends/tofino/bf-p4c/p4include
when bf-p4c is not built; otherwise the usual install prefixes are searched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

INCLUDE_ENV = "FORGIVE_TNA_INCLUDE"
INSTALL_PREFIXES = ("/usr/local", "/usr")
TARGETS = {"tofino": 1, "tofino2": 2}
"""bf-p4c target name -> the __TARGET_TOFINO__ value the includes test for."""
ARCH_FILES = {"tofino": "tna.p4", "tofino2": "t2na.p4"}


def include_dir() -> tuple[Path | None, str]:
    """The TNA include directory, or None and a one-line reason."""
    named = os.environ.get(INCLUDE_ENV)
    if named:
        path = Path(named)
        if (path / "tna.p4").is_file():
            return path, ""
        return None, f"{INCLUDE_ENV}={named} holds no tna.p4"
    prefixes = list(INSTALL_PREFIXES)
    if os.environ.get("SDE_INSTALL"):
        prefixes.insert(0, os.environ["SDE_INSTALL"])
    for prefix in prefixes:
        path = Path(prefix) / "share" / "p4c" / "p4include"
        if (path / "tna.p4").is_file():
            return path, ""
    return None, (
        f"TNA include files not found (set {INCLUDE_ENV} or install bf-p4c under "
        f"{' or '.join(INSTALL_PREFIXES)})"
    )


def tool(name: str) -> str | None:
    """An installed compiler: on PATH, or under $SDE_INSTALL/bin."""
    found = shutil.which(name)
    if found is None and os.environ.get("SDE_INSTALL"):
        candidate = Path(os.environ["SDE_INSTALL"]) / "bin" / name
        if candidate.is_file():
            found = str(candidate)
    return found
