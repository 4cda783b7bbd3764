"""The one door from the runtime's CLI to the export half (`edgespec_export`, installed from ./export).

The runtime never imports the export half, with one exception: a few CLI commands export what they
have just fetched, so a user runs one command instead of two. `pull --export` (a GGUF pair into a
bundle), `pull` of an embedding model (always exported once fetched) and `quickstart` (the default
pair, exported once) come through here, and nothing else does. The import happens when such a
command runs, never when edgespec is imported, so a board with only the runtime installed runs every
other command; without the export half these commands stop with one line saying what to install.
"""
from __future__ import annotations

from types import ModuleType

from ..errors import ExportError

INSTALL = "pip install ./export (no torch: GGUF files and embedding models export natively; from the edgespec source tree)"


def load(module: str, what: str) -> ModuleType:
    """`edgespec_export.<module>`, imported now. ExportError naming `what` needed it and what to install
    when the export half (or a package it needs) is absent."""
    try:
        return __import__(f"edgespec_export.{module}", fromlist=["_"])
    except ImportError as e:
        raise ExportError(f"{what} needs the export half ({e.name} is missing): {INSTALL}") from None
