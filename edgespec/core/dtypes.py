"""The numpy dtype of a graph's K/V cache and of its logits, by the name its manifest gives it
(ModelFacts.kv_dtype, .logits_dtype): one table for the runners and the checks that allocate their
buffers, so a dtype a new export writes is added once."""
from __future__ import annotations

import numpy as np

NP_DTYPES = {"float32": np.float32, "float16": np.float16}
