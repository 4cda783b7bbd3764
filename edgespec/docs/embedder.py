"""The seam between the index and a sentence-embedding model.

The index (build and query) only needs texts in, unit vectors out, and a name that says which model made
them: an index built by one embedding model is refused when queried with another.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from .onnx_embedder import OnnxEmbedder


class Embedder(Protocol):
    """Texts -> L2-normalised float32 vectors, shape (len(texts), dim)."""

    model_id: str  # names the model and its form (e.g. "all-MiniLM-L6-v2/int8"); stored in an index's manifest
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...  # passages (and any text: the server's /v1/embeddings)

    # optional: `embed_query(texts)` for questions, where the model embeds them differently (E5's "query: "
    # against "passage: "); the index's search calls it when there, else embed


def load_embedder(spec: "str | Path | None" = None, *, threads: int | None = None) -> "OnnxEmbedder":
    """The embedder an index is built and queried with: a folder, or a name `edgespec pull` exported into
    $EDGESPEC_HOME/embedders (None: catalog.DEFAULT_EMBEDDER, all-MiniLM-L6-v2). Checked like a bundle:
    a folder whose files do not match its manifest is an EmbedderError of one line."""
    from .onnx_embedder import OnnxEmbedder

    return OnnxEmbedder.open(spec, threads=threads)
