"""Running `edgespec` commands in-process, as the CLI tests do."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

from edgespec.cli.main import main


def verify(path: Path, *args: str) -> tuple[int, list[str]]:
    """Runs `edgespec verify` in-process; returns (exit code, output lines)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["verify", str(path), *args])
    return rc, out.getvalue().strip().splitlines()
