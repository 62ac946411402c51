"""What the compiled build cannot do to its classes, refused on the plain build too.

mypyc compiles every class of the modules in `common.native.COMPILED` to a *native class*
(a C extension type), which the standard library's copying and pickling cannot take apart
the way they take apart a Python object. mypyc's documentation says so in two places:

- "Differences from Python", *Pickling and copying objects*: mypyc constructs a native
  class's instance through `__init__` even when `pickle`, `copy.copy` or `copy.deepcopy`
  constructs it, so an instance of a class whose `__init__` needs arguments cannot be
  copied or pickled (a `TypeError` about `__init__`'s missing arguments) unless the class
  is marked `@mypyc_attr(serializable=True)`;
- "Native classes", *Other properties*: instances of native classes don't usually have a
  `__dict__`, so `vars()` and `obj.__dict__` fail on them.

(https://mypyc.readthedocs.io/en/latest/differences_from_python.html and
https://mypyc.readthedocs.io/en/latest/native_classes.html; python/mypy,
mypyc/doc/differences_from_python.rst and native_classes.rst.) The compiled build here
goes further than the documentation: a frozen dataclass is rebuilt through attribute
assignment, which the dataclass refuses (`FrozenInstanceError`), so no frozen dataclass of
a compiled module can be copied or pickled either (tests/test_native_guard.py shows both).

The plain build does all of this without complaint, so a copy that works in every plain test
fails only on the build `make setup` makes: issue 39's ROLLBACK_ON_ERROR Write, which
copied the switch's TableStore. `refuse_copies` makes the plain build refuse what the
compiled build cannot do, with the same kind of error, so a test of either build finds it.
"""

from __future__ import annotations

import ast
import copyreg
import enum
import importlib
import typing

from common import native

MYPYC_DOCS = "https://mypyc.readthedocs.io/en/latest/differences_from_python.html"
"""mypyc's *Pickling and copying objects*, named in the refusal."""


def _left_python(module: str) -> set[str]:
    """The classes of a compiled module's source that mypyc leaves Python classes or makes
    copyable on request: those decorated `@mypyc_attr(native_class=False)` or
    `@mypyc_attr(serializable=True)` (the decorator does nothing at run time, so the plain
    build can tell them only from the source)."""
    tree = ast.parse(native.source_path(module).read_text())
    left = set()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and getattr(decorator.func, "id", "") == "mypyc_attr"
            ):
                flags = {k.arg: getattr(k.value, "value", None) for k in decorator.keywords}
                if flags.get("native_class") is False or flags.get("serializable") is True:
                    left.add(node.name)
    return left


def native_classes() -> tuple[type, ...]:
    """The classes the compiled modules define that mypyc makes native classes whose instances
    copy and pickle cannot take apart. Left out: classes mypyc is told to leave Python
    classes or to make serializable (`_left_python`), enums (mypyc does not compile
    EnumMeta, so an Enum stays a Python class, and copies by value), exceptions (pickled
    through BaseException's own reduce, from their args, the same on both builds), and
    protocols (traits, which are never instantiated)."""
    found: list[type] = []
    for name in native.COMPILED:
        module = importlib.import_module(name)
        left = _left_python(name)
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != name or value.__name__ in left:
                continue
            if issubclass(value, enum.Enum | BaseException):
                continue
            if getattr(value, "_is_protocol", False) and typing.Protocol in value.__mro__:
                continue
            found.append(value)
    return tuple(found)


class NativeCopy(TypeError):
    """A copy or pickle of a compiled class's instance, refused as the compiled build would."""


def _refuse(obj: object) -> typing.NoReturn:
    cls = type(obj)
    raise NativeCopy(
        f"{cls.__module__}.{cls.__qualname__} is compiled by mypyc into a native class: its "
        f"instances cannot be copied or pickled on the compiled build ({MYPYC_DOCS}, "
        '"Pickling and copying objects"); build a new one through its constructor'
    )


def refuse_copies(classes: tuple[type, ...] | None = None) -> tuple[type, ...]:
    """Register, for every native class (or those given), a reducer that refuses: copy.copy,
    copy.deepcopy, pickle and multiprocessing's pickler all ask `copyreg.dispatch_table` by
    the object's exact type before anything else. Returns the classes guarded."""
    classes = native_classes() if classes is None else classes
    for cls in classes:
        copyreg.dispatch_table[cls] = _refuse
    return classes


def allow_copies(classes: tuple[type, ...]) -> None:
    """Undo `refuse_copies` for `classes` (to show what the compiled build itself does)."""
    for cls in classes:
        if copyreg.dispatch_table.get(cls) is _refuse:
            del copyreg.dispatch_table[cls]
