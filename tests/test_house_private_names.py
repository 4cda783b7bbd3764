"""No module reads another's private name: a `_name` is its module's own business, so a module that
needs one from elsewhere asks for a public name instead (and the owner can change its private ones
without breaking a reader it never knew about).

The check, over every module under edgespec/ with `ast`: an attribute `x._name` (one leading
underscore, not a dunder) where `x` is not `self`, `cls` or `super()`, and `_name` is not defined in
the same module (a def or class, an assigned name, a `self._name = ...`, a class-body field), is
reported as file:line. So are `getattr(x, "_name")` (and hasattr, setattr, delattr) and
`from module import _name`. Writing `x._name = ...` on another module's object counts as reading: it
reaches past the same boundary.
"""
from __future__ import annotations

import ast
from pathlib import Path

import edgespec

PACKAGE = Path(edgespec.__file__).parent
SELF = {"self", "cls"}
REFLECTION = {"getattr", "hasattr", "setattr", "delattr"}
# underscore names that are public API of the standard library (namedtuple's methods, sys and os)
STDLIB_PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_getframe", "_exit"}

# Other libraries' private names with no public way to what they give; "path:name" -> why.
FOREIGN = {
    "edgespec/cli/commands/serve.py:_SubParsersAction": "argparse: the type add_subparsers() returns, "
                                                        "in an annotation (it has no public name)",
    "edgespec/edge/providers.py:_pybind_state": "onnxruntime: the shared thread pool is set only there",
    "edgespec/docs/readers.py:_p": "python-docx: a paragraph's XML, the only way to its list numbering",
    "edgespec/models/template.py:_PassArg": "jinja2: which context a filter takes, as jinja2 itself reads it",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.AST) -> set[str]:
    """The names this module defines: defs and classes at any depth, names bound by assignment,
    loops, imports, with/except targets, and attributes assigned on self/cls or in a class body."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _owner_is_self(node.value):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _owner_is_self(value: ast.AST) -> bool:
    if isinstance(value, ast.Name):
        return value.id in SELF
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def _reads(source: str, filename: str) -> list[tuple[int, str, str]]:
    """(line, name, what) for every read of another module's private name in `source`."""
    tree = ast.parse(source, filename)
    own = _defined(tree) | STDLIB_PUBLIC
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _owner_is_self(node.value):
            if node.attr not in own:
                found.append((node.lineno, node.attr, f"{ast.unparse(node.value)}.{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _owner_is_self(node.args[0])):
            if node.args[1].value not in own:
                found.append((node.lineno, node.args[1].value, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, alias.name,
                                  f"from {'.' * node.level}{node.module or ''} import {alias.name}"))
    return sorted(found)


def private_reads(source: str, filename: str = "<source>") -> list[str]:
    """Every read of another module's private name in `source`, as "filename:line: what"."""
    return [f"{filename}:{line}: {what}" for line, _name, what in _reads(source, filename)]


def _all_reads() -> list[tuple[str, str]]:
    """("path:name", "path:line: what") for every read under edgespec/ (paths from the repository root)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        out += [(f"{rel}:{name}", f"{rel}:{line}: {what}") for line, name, what in
                _reads(path.read_text(encoding="utf-8"), rel)]
    return out


def test_no_module_reads_another_modules_private_name():
    unexpected = [shown for key, shown in _all_reads() if key not in FOREIGN]
    assert not unexpected, "private names read across modules (give them a public name):\n" + "\n".join(unexpected)


def test_the_allowlist_holds_only_reads_that_still_exist():
    keys = {key for key, _shown in _all_reads()}
    assert set(FOREIGN) <= keys, f"allowed reads that are gone (remove them): {sorted(set(FOREIGN) - keys)}"


# --- the check itself can fail --------------------------------------------------------------------
def test_a_read_of_another_modules_private_attribute_is_reported_with_its_line():
    source = "from .engine import Engine\n\ndef f(eng):\n    x = 1\n    return eng._drafters\n"
    assert private_reads(source, "m.py") == ["m.py:5: eng._drafters"]


def test_a_private_import_a_getattr_and_a_write_on_another_object_are_reported():
    source = ("from .chat import _encoded\n\n"
              "def f(d, chat):\n"
              "    d._vars = {}\n"
              "    return getattr(chat, '_costs', None)\n")
    assert private_reads(source, "m.py") == ["m.py:1: from .chat import _encoded", "m.py:4: d._vars",
                                             "m.py:5: getattr(chat, '_costs', None)"]


def test_own_names_self_cls_super_and_dunders_are_not_reported():
    source = (
        "class A(B):\n"
        "    _limit = 3\n"
        "    def __init__(self):\n"
        "        self._seen = []\n"
        "        super()._setup()\n"
        "    def _step(self): return self.__class__.__name__, getattr(self, '_extra', None)\n"
        "    @classmethod\n"
        "    def make(cls): return cls._limit\n"
        "def g(a, other):\n"
        "    other._seen.append(a._step())\n"  # both defined here: the module's own business
        "    return a._replace(x=1), other.__dict__, getattr(other, '_limit')\n"
    )
    assert private_reads(source, "m.py") == []
