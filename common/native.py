"""The hot modules compiled by mypyc from their own source, used only while they match it.

The simulator, the agent and the emulated switch spend their time in a hundred small
functions of the protocol core, the endpoint and the switch pipeline, where the
interpreter's per-call work is most of the cost. `make setup` compiles exactly those
modules (`COMPILED`), unchanged, with mypyc into `build/native/` beside this checkout's
packages (`common.native.build()`), and records each source file's SHA-256.
Importing `common`, `host_agent` or `switch_model` then puts a finder first on `sys.meta_path` that
loads the compiled module for each of those names, but only when every recorded hash still
matches the `.py` beside it: an edited source runs as plain Python (with one warning naming
the file) until `make setup` builds it again, never as stale machine code. There is one
code path, written once in Python; the build only changes how it runs.

`FORGIVE_PURE=1` in the environment forces the plain-Python path (the compiled and the
plain path are tested to give the same runs.json byte for byte, tests/test_native.py).
A checkout with no build (a fresh worktree) runs plain Python without a word.

What the compiled modules keep to, since mypyc runs anything else at the interpreter's
speed: module constants are `Final` (else each use is a lookup in the module's globals);
a class made per frame or per message is a plain class with its own `__init__` (mypyc
hands a dataclass to `dataclasses`, whose generated `__init__` stays interpreted); and what
`struct` unpacks is typed where it is unpacked, so that arithmetic on it is on machine
integers (docs/simulation.md, "The compiled build").
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

COMPILED = (
    "common.wire",
    "host_agent.acks",
    "host_agent.core.fields",
    "host_agent.core.scoreboard",
    "host_agent.core.detector",
    "host_agent.core.dcqcn",
    "host_agent.core.sender",
    "host_agent.core.receiver",
    "host_agent.endpoint",
    "host_agent.host",
    "switch_model.port",
    "switch_model.pipeline",
    "common.frames",
    "switch_model.crc16",
    "switch_model.counters",
    "simulator.engine",
    "switch_model.tables",
    "workload.rank",
)
"""The modules mypyc compiles: the ones the simulator's profile puts each frame through (the
outer headers, the ECMP hash and the port counters too: an interpreted callee of compiled
code costs it more than the interpreter would). The forwarding tables (`switch_model.tables`, a
lookup per frame at every switch) and the training rank (`workload.rank`, a turn per
message event) are in. Left out: host_agent.core.nscc (run only by `--cc nscc`);
workload.plan, whose config check reads its dataclass fields' annotations as strings,
which compiled become types; host_agent.events, whose classes' `kind` a compiled slotted
dataclass would make a field; and the agent's driver, which mostly calls sockets. The simulator's
engine is in: its event loop (`Clock`) and the glue between it and the compiled hosts and
switches run per event."""
PURE_ENV = "FORGIVE_PURE"
"""Set to 1 to run every module as plain Python although a current build exists."""
GROUP = "forgive_native"
"""mypyc's name for the one shared library holding the compiled modules' code."""
ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "native"
MANIFEST = BUILD_DIR / "manifest.json"


def source_path(module: str) -> Path:
    """The `.py` file of a module of this checkout."""
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_hashes() -> dict[str, str]:
    """Each compiled module's source SHA-256, as the build records it."""
    return {m: hashlib.sha256(source_path(m).read_bytes()).hexdigest() for m in COMPILED}


def _extension(module: str) -> Path:
    *package, name = module.split(".")
    return BUILD_DIR.joinpath(*package, name + importlib.machinery.EXTENSION_SUFFIXES[0])


def build_status() -> str:
    """'current', 'pure' (FORGIVE_PURE set), 'absent' (never built) or why the build is stale."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return "pure"
    if not MANIFEST.exists():
        return "absent"
    try:
        recorded = json.loads(MANIFEST.read_text())
    except (OSError, ValueError) as err:
        return f"unreadable manifest {MANIFEST}: {err}"
    if recorded.get("cache_tag") != sys.implementation.cache_tag:
        return f"built for {recorded.get('cache_tag')}, running {sys.implementation.cache_tag}"
    hashes = recorded.get("sources", {})
    if sorted(hashes) != sorted(COMPILED):
        return "built from another module list"
    changed = [m for m, digest in source_hashes().items() if hashes[m] != digest]
    if changed:
        return f"{source_path(changed[0]).relative_to(ROOT)} changed since the build"
    missing = [m for m in (*COMPILED, GROUP + "__mypyc") if not _extension(m).exists()]
    if missing:
        return f"{_extension(missing[0])} missing"
    return "current"


class _CompiledFinder:
    """Finds the compiled extension for each name in COMPILED (and mypyc's shared library);
    every other import goes on to the ordinary finders."""

    def __init__(self) -> None:
        self.modules = {m: _extension(m) for m in (*COMPILED, GROUP + "__mypyc")}

    def find_spec(self, fullname, path=None, target=None):  # the MetaPathFinder protocol
        location = self.modules.get(fullname)
        if location is None:
            return None
        return importlib.util.spec_from_file_location(fullname, location)


def install() -> bool:
    """Use the compiled modules if the build is current; True if they are in use. Called by
    the packages' __init__ before any of their modules is imported; the first call decides."""
    for finder in sys.meta_path:
        if isinstance(finder, _CompiledFinder):
            return True
    status = build_status()
    if status != "current":
        if status not in ("pure", "absent"):
            warnings.warn(
                f"compiled modules not used ({status}); running plain Python until `make setup`",
                RuntimeWarning,
                stacklevel=2,
            )
        return False
    loaded = [m for m in COMPILED if m in sys.modules]
    if loaded:
        warnings.warn(f"{loaded[0]} was imported before the compiled build", stacklevel=2)
        return False
    sys.meta_path.insert(0, _CompiledFinder())
    return True


def loaded() -> dict[str, bool]:
    """For each compiled module already imported: whether it runs compiled."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return {
        m: (sys.modules[m].__file__ or "").endswith(suffixes) for m in COMPILED if m in sys.modules
    }


CACHE_ENV = "FORGIVE_NATIVE_CACHE"
"""Where finished builds are kept by what they were built from (default
~/.cache/forgive/native; empty: no cache), as ccache keeps objects: a fresh clone of the same
sources on the same Python and mypyc takes the extensions from there instead of a minute of
compiling."""


def _cache_dir() -> Path | None:
    """This build's place in the cache, named by the sources, the Python and mypyc; None
    without a cache."""
    root = os.environ.get(CACHE_ENV, str(Path.home() / ".cache" / "forgive" / "native"))
    if not root:
        return None
    from mypy.version import __version__ as mypy_version

    key = json.dumps([sys.implementation.cache_tag, mypy_version, source_hashes()])
    return Path(root) / hashlib.sha256(key.encode()).hexdigest()[:24]


def _built_files(folder: Path) -> list[Path]:
    """A build's extensions, relative to `folder` (not its C sources and objects)."""
    return [
        p.relative_to(folder)
        for p in folder.rglob("*" + importlib.machinery.EXTENSION_SUFFIXES[0])
        if p.relative_to(folder).parts[0] not in ("c", "obj")
    ]


def _from_cache(cached: Path | None) -> bool:
    """Copy a cached build into BUILD_DIR; False if the cache has none (or an incomplete one)."""
    if cached is None or not (cached / "manifest.json").is_file():
        return False
    for rel in _built_files(cached):
        (BUILD_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cached / rel, BUILD_DIR / rel)
    shutil.copy2(cached / "manifest.json", MANIFEST)  # last: the build is current only now
    return build_status() == "current"


def _to_cache(cached: Path | None) -> None:
    """Keep the finished build in the cache (written aside, then renamed into place, so a
    half-written one is never taken); a cache that cannot be written is only not used."""
    if cached is None or cached.exists():
        return
    part = cached.with_name(f"{cached.name}.part{os.getpid()}")
    try:
        for rel in _built_files(BUILD_DIR):
            (part / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(BUILD_DIR / rel, part / rel)
        shutil.copy2(MANIFEST, part / "manifest.json")
        part.rename(cached)
    except OSError:
        shutil.rmtree(part, ignore_errors=True)


def build() -> None:
    """Compile COMPILED with mypyc into BUILD_DIR and record the sources' hashes; a no-op
    while the build is current, a copy where the cache (CACHE_ENV) has these sources' build.
    mypyc type-checks the modules first and fails on an error."""
    if build_status() == "current":
        return
    cached = _cache_dir()
    if _from_cache(cached):
        print(f"compiled modules taken from the build cache {cached}")
        return
    from mypyc.build import mypycify  # only the build needs mypy; running does not
    from setuptools import setup

    hashes = source_hashes()
    MANIFEST.unlink(missing_ok=True)
    options = [
        "--follow-imports=silent",  # type errors elsewhere do not stop the build
        "--ignore-missing-imports",  # grpc, p4runtime: untyped
        "--disable-error-code=func-returns-value",  # `return self.drop(...)`, the P4 style
    ]
    sources = [str(source_path(m).relative_to(ROOT)) for m in COMPILED]
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        extensions = mypycify(
            [*options, *sources],
            opt_level="1",  # -O1: 7 s less build than -O3 here, inside make test's five minutes
            multi_file=True,  # one C file per module: the two cores compile side by side
            group_name=GROUP,
            target_dir=str(BUILD_DIR / "c"),
        )
        setup(
            name=GROUP,
            ext_modules=extensions,
            script_args=[
                *("--quiet", "build_ext", "--build-lib", str(BUILD_DIR)),
                *("--build-temp", str(BUILD_DIR / "obj"), "--parallel", "2"),
            ],
        )
    finally:
        os.chdir(cwd)
    MANIFEST.write_text(
        json.dumps({"cache_tag": sys.implementation.cache_tag, "sources": hashes}, indent=1)
    )
    _to_cache(cached)
    print(f"compiled {len(COMPILED)} modules into {BUILD_DIR.relative_to(ROOT)}")
