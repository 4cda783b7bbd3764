"""Running `edgespec` commands: in-process, as the CLI tests do, or an export in its own process."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

from edgespec.cli.main import main


def verify(path: Path, *args: str) -> tuple[int, list[str]]:
    """Runs `edgespec verify` in-process; returns (exit code, output lines)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["verify", str(path), *args])
    return rc, out.getvalue().strip().splitlines()


def export_cli(*args: str) -> dict:
    """Runs `edgespec export ARGS --json` in a process of its own (as a user would: the exporter's
    children and memory go with it); returns the JSON report, or fails with the end of its stderr."""
    r = subprocess.run([sys.executable, "-m", "edgespec", "export", *args, "--json"], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)
