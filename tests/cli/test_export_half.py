"""The runtime reaches the export half through cli/export_half.py only, and without it says in one line
what to install."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import edgespec
from edgespec.cli.export_half import INSTALL, load
from edgespec.errors import ExportError


def test_an_absent_export_half_is_one_line_naming_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "edgespec_export.pipeline", None)  # import fails as if absent
    with pytest.raises(ExportError) as e:
        load("pipeline", "--export")
    msg = str(e.value)
    assert msg == f"--export needs the export half (edgespec_export.pipeline is missing): {INSTALL}"
    assert "\n" not in msg and "pip install ./export" in msg


def test_only_the_seam_imports_the_export_half():
    root = Path(edgespec.__file__).parent
    importers = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "edgespec_export" or n.startswith("edgespec_export.") for n in names):
                importers.append(str(path.relative_to(root)))
    assert importers == []  # export_half.py imports by name at run time (__import__), nothing imports it statically
