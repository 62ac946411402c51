"""No compiled class is copied, pickled, introspected or patched in a way mypyc does not
support (tests/native_guard.py names the ways and mypyc's documentation of them).

Three checks: what the compiled build really does (compiled build only: a test that the
guard's premise still holds), the guard refusing on either build (this module runs on both,
tests/test_both_builds.py), and the sources (the compiled modules use none of the unsupported
operations; no test patches a compiled module's names, which compiled code never reads)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import enum
import importlib
import pickle
import typing
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
from native_guard import NativeCopy, allow_copies, native_classes, refuse_copies
from switch_harness import p4info

from common import native
from common.wire import Opcode
from switch_model.surface import load_pipeline
from switch_model.tables import NextHop, TableStore


def _compiled_or_skip() -> None:
    if not any(native.loaded().values()):
        pytest.skip(f"this process runs plain Python ({native.build_status()})")


def test_the_guard_lists_exactly_the_classes_the_compiled_build_makes_native():
    """On the compiled build a native class's instances have no `__dict__`; a class mypyc
    left a Python class (`@mypyc_attr(native_class=False)`) has one. The guard, which must
    work out the same list on the plain build from the sources, agrees."""
    _compiled_or_skip()
    assert all(native.loaded().values()), native.loaded()
    native_here = set()
    for name in native.COMPILED:
        for value in vars(importlib.import_module(name)).values():
            if not isinstance(value, type) or value.__module__ != name:
                continue
            if issubclass(value, enum.Enum | BaseException) or typing.Protocol in value.__mro__:
                continue
            if "__dict__" not in dir(value):
                native_here.add(value)
    assert set(native_classes()) == native_here
    assert len(native_here) > 40


def test_the_compiled_build_cannot_copy_its_native_classes():
    """The guard's premise: a native class whose __init__ takes arguments cannot be rebuilt
    by copy (mypyc's documentation), nor can a frozen dataclass (found here). Should mypyc
    lift either, this fails, and the guard can be narrowed."""
    _compiled_or_skip()
    store = TableStore(load_pipeline(p4info()))
    hop = NextHop(b"\x02\x00\x00\x00\x00\x01", 3)
    guarded = (TableStore, NextHop)
    allow_copies(guarded)
    try:
        with pytest.raises(TypeError, match=r"__init__\(\) missing required argument 'pipe'"):
            copy.copy(store)
        with pytest.raises(dataclasses.FrozenInstanceError):
            pickle.loads(pickle.dumps(hop))
    finally:
        refuse_copies(guarded)


@pytest.mark.parametrize(
    "how",
    [copy.copy, copy.deepcopy, pickle.dumps, ForkingPickler.dumps],
    ids=["copy", "deepcopy", "pickle", "multiprocessing"],
)
def test_either_build_refuses_to_copy_a_native_instance(how):
    store = TableStore(load_pipeline(p4info()))
    with pytest.raises(NativeCopy, match=r"switch_model\.tables\.TableStore is compiled by mypyc"):
        how(store)
    hop = NextHop(b"\x02\x00\x00\x00\x00\x01", 3)
    with pytest.raises(NativeCopy, match="NextHop"):
        how(hop if how is copy.copy else {"route": [hop]})  # deep ones look inside others
    assert how(Opcode.DATA) is not None  # an enum stays a Python class and copies


def _sources(root: Path) -> list[Path]:
    skip = {".venv", "build", ".git", "node_modules"}
    return [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]


FORBIDDEN_IMPORTS = {"copy", "pickle", "copyreg", "inspect", "marshal", "shelve"}
"""Modules whose use on a native class mypyc does not support: copying and pickling
("Pickling and copying objects"), frame inspection ("Stack introspection")."""


def _unsupported(tree: ast.Module) -> list[str]:
    """Operations in a compiled module's source that mypyc's native classes do not support."""
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            found += [
                f"{where}: imports {n}" for n in names if n.split(".")[0] in FORBIDDEN_IMPORTS
            ]
        elif isinstance(node, ast.Attribute) and node.attr in ("__dict__", "_getframe"):
            found.append(f"{where}: .{node.attr}")  # "Other properties"; stack introspection
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("vars", "delattr"):
            found.append(f"{where}: {node.func.id}()")  # no __dict__; "Deleting attributes"
        elif isinstance(node, ast.Delete) and any(
            isinstance(t, ast.Attribute) for t in node.targets
        ):
            found.append(f"{where}: del of an attribute")  # "Deleting attributes"
    return found


def test_no_compiled_module_copies_pickles_or_introspects():
    found = {
        m: bad
        for m in native.COMPILED
        if (bad := _unsupported(ast.parse(native.source_path(m).read_text())))
    }
    assert not found, f"unsupported on mypyc's native classes: {found}"


def test_the_source_check_finds_the_copy_issue_39_made():
    """The check would have caught TableStore.clone's `copy.copy(self)`."""
    old = "import copy\n\nclass TableStore:\n    def clone(self):\n        twin = copy.copy(self)\n"
    assert _unsupported(ast.parse(old)) == ["line 1: imports copy"]
    assert _unsupported(ast.parse("def f(o):\n    del o.x\n    return vars(o), o.__dict__\n"))


PATCHERS = {"setattr", "delattr", "patch", "object"}
"""monkeypatch.setattr / delattr, unittest.mock.patch and patch.object."""


def _patched_compiled(tree: ast.Module) -> list[str]:
    """Patches of a compiled module's names: mypyc's "Monkey patching" (compiled code binds
    its functions and classes early, so a patched name is seen by plain code only)."""
    compiled = set(native.COMPILED)
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"

    def in_compiled(dotted: str) -> bool:
        return any(dotted == m or dotted.startswith(m + ".") for m in compiled)

    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in PATCHERS):
            continue
        target = node.args[0]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            dotted = target.value
        elif isinstance(target, ast.Name):
            dotted = alias.get(target.id, "")
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            dotted = f"{alias.get(target.value.id, '')}.{target.attr}"
        else:
            continue
        if in_compiled(dotted):
            found.append(f"line {node.lineno}: patches {dotted}")
    return found


def test_nothing_patches_a_compiled_modules_names():
    root = native.ROOT
    found = {
        str(p.relative_to(root)): bad
        for p in _sources(root)
        if (bad := _patched_compiled(ast.parse(p.read_text())))
    }
    assert not found, f"patched names a compiled module never reads: {found}"


def test_the_patch_check_finds_a_patch_of_a_compiled_module():
    source = (
        "from switch_model import tables\nimport host_agent.core.sender as tx\n"
        "from simulator.engine import Clock\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(tables, 'LPM_CACHE_LIMIT', 1)\n"
        "    monkeypatch.setattr(tx.ForgiveSender, 'pump', None)\n"
        "    monkeypatch.setattr(Clock, 'run', None)\n"
        "    monkeypatch.setattr('workload.rank.Rank', None)\n"
        "    monkeypatch.setattr(other, 'x', 1)\n"
    )
    assert [f.split(": ")[1] for f in _patched_compiled(ast.parse(source))] == [
        "patches switch_model.tables",
        "patches host_agent.core.sender.ForgiveSender",
        "patches simulator.engine.Clock",
        "patches workload.rank.Rank",
    ]
