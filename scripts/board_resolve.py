"""What pip would install on a board, resolved here: its Python, its glibc's manylinux tags, binary wheels only.

pip matches each --platform exactly, so a board with glibc 2.35 (JetPack 6) takes manylinux_2_35 down to
manylinux_2_17 (and manylinux2014, the same tag's old name): passing only manylinux_2_28 would resolve an older
release of a package whose newer wheels need a newer glibc (llguidance 1.6.1 instead of 1.9 on the boards).
Used by scripts/ci-ort.sh and tests/install/test_board_installs.py; nothing is installed (pip --dry-run --report).

    python scripts/board_resolve.py PYTHON_VERSION GLIBC_MINOR REQUIREMENT...   ->  name==version, one a line
    python scripts/board_resolve.py 3.10 35 'dist/edgespec-0.1.0-py3-none-any.whl[server]'
    python scripts/board_resolve.py --boards   ->  PYTHON GLIBC_MINOR NAME, one board system a line
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def boards() -> tuple[tuple[str, str, int], ...]:
    """The board systems edgespec is installed on, (name, Python, glibc minor), one per Python: the supported
    JetPack releases and Raspberry Pi OS releases of devices/_releases.json (edgespec/edge/releases.py, read as a
    plain module: no install needed), oldest Python first."""
    sys.path.insert(0, str(ROOT / "edgespec" / "edge"))
    try:
        import releases
    finally:
        sys.path.pop(0)
    t = releases.table()
    found: dict[tuple[str, int], list[str]] = {}
    for r in t["jetpack"]:
        if r["onnxruntime"] != "unsupported":
            found.setdefault((r["python"], int(r["glibc"].split(".")[1])), []).append(f"JetPack {r['jetpack']}")
    for r in t["raspberry_pi_os"]:
        found.setdefault((r["python"], int(r["glibc"].split(".")[1])), []).append(f"Raspberry Pi OS {r['codename']}")
    key = lambda item: tuple(int(x) for x in item[0][0].split("."))  # noqa: E731
    return tuple((f"{names[0]}..{names[-1].removeprefix('JetPack ')}" if len(names) > 1 else names[0], py, glibc)
                 for (py, glibc), names in sorted(found.items(), key=key))


BOARDS = boards()


def platforms(glibc_minor: int, arch: str = "aarch64") -> list[str]:
    """Every manylinux tag a glibc 2.<minor> system accepts, newest first (pip's --platform is exact)."""
    tags = [f"manylinux_2_{m}_{arch}" for m in range(glibc_minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}"]


class ResolveError(RuntimeError):
    """pip found no set of binary wheels for the requirements (its own message attached)."""


def resolve(python_version: str, glibc_minor: int, requirements: list[str], *, python: str = sys.executable,
            extra_args: tuple[str, ...] = ()) -> dict[str, str]:
    """{name: version} pip would install for these requirements on that board (lower-case names)."""
    cmd = [python, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--only-binary", ":all:",
           "--python-version", python_version]
    for tag in platforms(glibc_minor):
        cmd += ["--platform", tag]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        r = subprocess.run(cmd + ["--report", str(report), *extra_args, *requirements], capture_output=True, text=True)
        if r.returncode != 0:
            raise ResolveError("\n".join(line for line in r.stderr.splitlines() if not line.startswith("WARNING")))
        items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


def build_wheels(root: Path, out: Path, *, python: str = sys.executable) -> dict[str, Path]:
    """The runtime's and the export half's wheels, built from a copy of the tracked tree (a build writes
    build/ and *.egg-info next to the sources): {"edgespec": path, "edgespec-export": path}."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for f in filter(None, files):
            rel = f.decode()
            dst = src / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if (root / rel).is_symlink():
                dst.symlink_to((root / rel).readlink())
            elif (root / rel).is_file():
                shutil.copy2(root / rel, dst)
        for sub in (src, src / "export"):
            subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(sub)], check=True,
                           capture_output=True, text=True)
    return {"edgespec": next(out.glob("edgespec-[0-9]*.whl")), "edgespec-export": next(out.glob("edgespec_export-*.whl"))}


def main(argv: list[str]) -> int:
    if argv == ["--boards"]:
        for name, py, glibc in BOARDS:
            print(py, glibc, name.replace(" ", "-"))
        return 0
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        return 2
    try:
        found = resolve(argv[0], int(argv[1]), argv[2:])
    except ResolveError as e:
        print(e, file=sys.stderr)
        return 1
    for name, version in sorted(found.items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
