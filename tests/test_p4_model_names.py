"""The switch model reads beside forgive.p4 block by block: its methods carry the P4
program's action and table names, and its ingress takes them in the apply block's order.

Both sides are read as text (the model's source through `ast`, since the module may run
compiled), so a renamed action, a table the model forgot or a step moved in either
fails here rather than in a packet test far from the cause.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
P4 = (ROOT / "p4src/forgive.p4").read_text()
MODEL = ast.parse((ROOT / "switch_model/pipeline.py").read_text())
TABLES = ast.parse((ROOT / "switch_model/tables.py").read_text())

PARAMETER_ACTIONS = {
    "set_ecmp_group",
    "set_thresholds",
    "set_switch_trimming",
    "disable_trim",
    "set_trim_queue_bytes",
    "queue_with_data",
}
"""Actions that only copy a table entry's parameters into metadata: in the model the table's
lookup (a `Forwarding` method) returns them instead."""


def _control(name: str) -> str:
    """The text of one P4 control, from its header to the next control's."""
    start = P4.index(f"control {name}(")
    end = P4.find("\ncontrol ", start + 1)
    return P4[start : end if end > 0 else None]


def _apply_block(control: str) -> str:
    """The last `apply { ... }` of a control: its own, after its actions and tables."""
    start = control.rindex("    apply {")
    depth, i = 0, control.index("{", start)
    for j in range(i, len(control)):
        depth += {"{": 1, "}": -1}.get(control[j], 0)
        if depth == 0:
            return control[i : j + 1]
    raise AssertionError("unbalanced apply block")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _calls(func: ast.FunctionDef, methods: dict[str, ast.FunctionDef], p4: set[str]) -> list[str]:
    """Names of `self.X(...)` and `fwd.X(...)` calls in source order; a helper that is not a
    P4 name stands for the calls it makes (`trim_disabled` applies two tables)."""
    found = []
    for node in sorted(
        (n for n in ast.walk(func) if isinstance(n, ast.Call)),
        key=lambda n: (n.lineno, n.col_offset),
    ):
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "self" and f.attr in methods and f.attr not in p4:
                found += _calls(methods[f.attr], methods, p4)
            elif f.value.id in ("self", "fwd"):
                found.append(f.attr)
    return found


def _first_seen(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


INGRESS = _control("ForgiveIngress")
ACTIONS = re.findall(r"^\s+action (\w+)\(", INGRESS, re.M)
APPLY = _apply_block(INGRESS)
P4_TABLES = re.findall(r"^\s+table (\w+) \{", INGRESS, re.M)
PIPELINE = _methods(_class(MODEL, "Pipeline"))
FORWARDING = _methods(_class(TABLES, "Forwarding"))


def test_every_action_with_an_effect_is_a_method_of_the_same_name():
    assert "trim" in ACTIONS and "admit_low" in ACTIONS  # the program was read
    effects = [a for a in ACTIONS if a not in PARAMETER_ACTIONS]
    assert set(PARAMETER_ACTIONS) <= set(ACTIONS), "a parameter action left the program"
    missing = [a for a in effects if a not in PIPELINE]
    assert not missing, f"forgive.p4 actions without a Pipeline method: {missing}"


def test_every_table_is_one_lookup_of_the_same_name():
    assert len(P4_TABLES) >= 8
    missing = [t for t in P4_TABLES if t not in FORWARDING]
    assert not missing, f"forgive.p4 tables without a Forwarding method: {missing}"


def test_the_model_takes_the_apply_blocks_steps_in_its_order():
    steps = _first_seen(re.findall(r"\b(\w+)(?:\.apply\(\)|\()", APPLY))
    p4 = [s for s in steps if s in ACTIONS or s in P4_TABLES]
    model = _first_seen(_calls(PIPELINE["ingress"], PIPELINE, {*ACTIONS, *P4_TABLES}))
    shared = [s for s in p4 if s in model]
    assert len(shared) >= 12, (p4, model)
    assert [s for s in model if s in shared] == shared
    assert set(p4) - set(shared) <= {"set_ecmp_group"}, set(p4) - set(shared)
