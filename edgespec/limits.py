"""The numbers several layers must agree on, in one place.

A request's bounds are checked once, by the engine's request options, for Python callers and HTTP
clients alike; the prefill chunk sizes the engine's steps and the memory plan's activation estimate;
the default cache length is used by the engine and by the planner. Each lives here once, so they
cannot drift apart.
"""
from __future__ import annotations

# the drafting modes are a table of their own: drafters/modes.py (one row per drafter); their names are
# here too because the manifest's reader (models/, below drafters) checks a bundle's `drafting.mode`
# against them: drafters/modes.py refuses to import when its rows and these names differ
DRAFT_MODES = ("auto", "model", "suffix", "docs", "recycle", "ngram", "self", "heads", "grammar", "none")
TREE_MODES = ("auto", "on", "off")  # what a request's `tree` may name (tree verification)
K_LIMIT = 16  # largest k a request may ask for (each verify row costs a full-vocabulary logits row)
DEFAULT_K_CAP = 8  # adaptive k never proposes more than this per round
DEFAULT_MAX_LEN = 2048  # cache length when neither the caller, the bundle (export --max-context) nor a device profile sets one (edge/cache_length.py)
PREFILL_CHUNK = 512  # tokens per prefill step: bounds activation memory on long prompts
# tokens the suffix index keeps: the engine's shared history of finished requests (its requests
# read it in place, each beside an index of its own text, which the memory plan's slot cost counts)
SUFFIX_CAPACITY = 1 << 20
# host bytes the suffix index costs per token held: the int32 buffer plus its suffix automaton (measured
# ~120 bytes per token of real text, drafters/suffix_index.py), and the second automaton that briefly
# exists while the kept text's is rebuilt after an eviction: the memory plan counts a full index at this rate
SUFFIX_BYTES_PER_TOKEN = 4 + 2 * 120


def suffix_memory_text() -> str:
    """The suffix index's size in words, for every help text, the env file and the docs (one figure:
    what `plan` counts)."""
    mib = (SUFFIX_CAPACITY + 1) * SUFFIX_BYTES_PER_TOKEN / 2**20
    return (f"default {SUFFIX_CAPACITY}; counted at {SUFFIX_BYTES_PER_TOKEN} bytes a token held: 4 for the token, ~120 "
            f"for its suffix automaton, as much again while the automaton is rebuilt after an eviction; "
            f"{mib:.0f} MiB at the default")
QUANTS = ("int4", "int8", "fp16", "fp32")  # weight precisions an export may be asked for (--quant)
# ... and a bundle's model may have: "mixed" is a GGUF's own blocks carried over (export/edgespec_export/native),
# MatMulNBits of 4 and 8 bits side by side (Q4_K_M: 4-bit Q4_K, 8-bit Q6_K)
MODEL_QUANTS = QUANTS + ("mixed",)
# what one request may ask for, checked once where a request enters the engine (engine/requests.py
# Options, core/sampling.py SamplingParams, engine/settings.py check_k): the Python API and the server alike
PARALLEL_LIMIT = 64  # cache slots of the engine at most (--parallel)
STOP_LIMIT = 16  # stop strings per request
TOP_K_LIMIT = 1 << 31  # beyond any vocabulary; keeps the engine's integer arithmetic in range
SEED_LIMIT = 2**63 - 1  # largest seed (a seed is >= 0: numpy's generators refuse negative ones)
TEMPERATURE_LIMIT = 2.0  # largest temperature the OpenAI API accepts: the HTTP layer's own bound (Python samples hotter)
JSON_DEPTH_LIMIT = 32  # JSON nesting of a request body: OpenAI bodies need 5 (messages[i].content[j].text)
