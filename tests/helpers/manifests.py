"""Editing a bundle's manifest in tests: the facts changed and the digest recomputed, so the
manifest is consistent, signed, and wrong (what a tampered or badly hand-edited bundle looks like)."""
from __future__ import annotations

import json
from pathlib import Path

from edgespec.models.manifest import content_digest


def rewrite_manifest(bundle: Path, edit) -> None:
    """Applies edit(dict) to manifest.json and re-signs its digest."""
    p = bundle / "manifest.json"
    d = json.loads(p.read_text())
    edit(d)
    d["digest"] = content_digest(d)
    p.write_text(json.dumps(d, indent=2))
