"""The board software edgespec knows, read from one table (devices/_releases.json): JetPack releases by L4T
version (Ubuntu, Python, CUDA, which boards, where its onnxruntime-gpu comes from, which power-mode sets it can
have) and Raspberry Pi OS releases (Python, glibc, how swap is set up). `edgespec doctor` reads it through this
module, scripts/setup-env.sh runs this very file with the system python3 before any venv exists (so: standard
library only, no package imports), and tests/edge/test_releases.py checks the docs' tables against it.

    python3 edgespec/edge/releases.py setup 36.5.0   ->  JETPACK<TAB>SOURCE<TAB>INDEX<TAB>REQUIREMENT<TAB>WHAT
    (JETPACK "6.2.2", "6.2.2+" for a later release read as that row, "unknown"; INDEX, REQUIREMENT "-" if none)
"""
from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path

DATA = "_releases.json"  # in devices/, beside the board profiles (the leading "_": not a profile)


@lru_cache(maxsize=1)
def table() -> dict:
    """The whole table. Read through importlib.resources in the package, by path when run as a script."""
    if __package__:
        from importlib import resources

        return json.loads((resources.files("edgespec") / "devices" / DATA).read_text(encoding="utf-8"))
    return json.loads((Path(__file__).resolve().parent.parent / "devices" / DATA).read_text(encoding="utf-8"))


def l4t_parts(l4t: str) -> tuple[int, ...]:
    """"36.4.4" -> (36, 4, 4); "R36 (release), REVISION: 5.0" is not this function's job (read_board does it)."""
    return tuple(int(x) for x in re.findall(r"\d+", l4t)[:3])


def _key(parts: tuple[int, ...]) -> tuple[int, int, int]:
    return tuple(list(parts) + [0] * (3 - len(parts)))[:3]  # type: ignore[return-value]


def jetpack_row(l4t: str | None) -> dict | None:
    """The row for an L4T release: the newest row of the same major release that is not newer than it ("36.4.7"
    -> 36.4.4's, "36.6" -> 36.5.0's, "35.6.1" -> JetPack 5's), with "exact": False where the release itself is not
    in the table; None for a major release the table does not know or one older than its first row."""
    parts = l4t_parts(l4t or "")
    if not parts:
        return None
    rows = [r for r in table()["jetpack"] if l4t_parts(r["l4t"])[0] == parts[0]
            and _key(l4t_parts(r["l4t"])) <= _key(parts)]
    if not rows:
        return None
    row = max(rows, key=lambda r: _key(l4t_parts(r["l4t"])))
    rp = l4t_parts(row["l4t"])
    return {**row, "exact": parts[:len(rp)] == rp and (len(rp) < 3 or len(parts) >= 3)}


def jetpack_name(l4t: str | None) -> str | None:
    """"JetPack 6.2.2" for L4T 36.5.0; a release newer than the table's row is "JetPack 6.2.2 or later"."""
    row = jetpack_row(l4t)
    if row is None:
        return None
    return f"JetPack {row['jetpack']}" + ("" if row["exact"] else " or later")


def onnxruntime_source(l4t: str | None) -> tuple[str, dict]:
    """(source id, its entry) for a Jetson's release; an unknown release is "none"."""
    row = jetpack_row(l4t)
    sid = row["onnxruntime"] if row else "none"
    return sid, table()["onnxruntime"][sid]


def gpu_install_line(source: dict) -> str:
    """The shell line that fetches NVIDIA's wheel alone (never through pip's resolver, which could take PyPI's
    SBSA build) and installs it."""
    return (f"pip download --no-deps -d /tmp/ort-gpu '{source['requirement']}' --index-url {source['index']}"
            " && pip install /tmp/ort-gpu/onnxruntime_gpu-*.whl")


def pi_os(codename: str | None) -> dict | None:
    """The Raspberry Pi OS row for a Debian codename ("bookworm", "trixie"), None for another."""
    return next((r for r in table()["raspberry_pi_os"] if r["codename"] == (codename or "").lower()), None)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "setup":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    row = jetpack_row(argv[1])
    sid, src = onnxruntime_source(argv[1])
    fields = [(row["jetpack"] + ("" if row["exact"] else "+")) if row else "unknown", sid, src.get("index", "-"), src.get("requirement", "-"),
              src["what"]]
    print("\t".join(f.replace("\t", " ") for f in fields))
    return 0 if row is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
