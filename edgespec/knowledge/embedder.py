"""The seam between the index and a sentence-embedding model.

The index (build and query) only needs texts in, unit vectors out, and a name that says which model made
them: an index built by one embedding model is refused when queried with another.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class Embedder(Protocol):
    """Texts -> L2-normalised float32 vectors, shape (len(texts), dim)."""

    model_id: str  # names the model and its form (e.g. "all-MiniLM-L6-v2/int8"); stored in an index's manifest
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...
