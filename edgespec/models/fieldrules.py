"""Range rules for the manifest's free-form records: `drafting`, `defaults`, each graph's `parity`, the
vocabulary maps and the bounded id lists (models/manifest.py's rule tables name them).

These records are typed `dict[str, Any]` in the dataclasses (the exporter adds notes to them), so the
annotation checks only that each is an object; the rules here give every key the runtime or a reader of
the manifest relies on a type and a range: a mode from the drafting table, a k a request could ask for,
a probability that is a probability, a cache length the graph can hold. A rule returns what is wrong,
worded to follow the field's name (".k must be ..."), or None (models/schema.py).
"""
from __future__ import annotations

import math
from typing import Any

from ..limits import DRAFT_MODES, K_LIMIT
from .schema import int_of, is_int, show

MIN_MAX_LEN = 16  # a cache of fewer positions cannot hold a chat template's turn markers and an answer
MAX_EOS_IDS = 256  # end tokens a model may have (real ones: 1 to 3); each is compared on every step
MAX_SPECIAL_TOKENS = 1 << 16  # named special tokens (Llama 3 reserves 256; none has tens of thousands)
MAX_TOKENIZER_FILES = 16  # tokenizer.json, tokenizer_config.json and a few more at most
MAP_SUFFIX = ".npy"  # a vocabulary map is an integer array saved by numpy (np.load, allow_pickle=False)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    try:
        return is_number(v) and math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _probability(v: Any) -> bool:
    return _finite(v) and 0 <= v <= 1


def _unknown(v: dict, known: tuple[str, ...]) -> str | None:
    extra = sorted(k for k in v if k not in known)
    return None if not extra else f".{show(extra[0], 40)} is not a known field (expected {', '.join(known)})"


# --- drafting: recommended settings (export/edgespec_export/pipeline.py recommend_drafting) ------------
DRAFTING_KEYS = ("mode", "k", "max_k", "draft_agreement", "draft_cost_ratio", "expected_speedup", "draft_vocab")


def drafting(v: dict, obj: dict, root: dict) -> str | None:
    said = _unknown(v, DRAFTING_KEYS)
    if said:
        return said
    if "mode" in v and v["mode"] not in DRAFT_MODES:
        return f".mode {show(v['mode'])} is not one of {', '.join(DRAFT_MODES)} (the drafting modes)"
    for key in ("k", "max_k"):
        if key in v and not (is_int(v[key]) and 1 <= v[key] <= K_LIMIT):
            return f".{key} must be an integer from 1 to {K_LIMIT}, got {show(v[key])}"
    if is_int(v.get("k")) and is_int(v.get("max_k")) and v["k"] > v["max_k"]:
        return f".k is {v['k']}, more than .max_k {v['max_k']}"
    if "draft_agreement" in v and not _probability(v["draft_agreement"]):
        return f".draft_agreement must be a number from 0 to 1 (a share of tokens), got {show(v['draft_agreement'])}"
    for key in ("draft_cost_ratio", "expected_speedup"):
        if key in v and not (_finite(v[key]) and v[key] >= 0):
            return f".{key} must be a finite number >= 0, got {show(v[key])}"
    if "draft_vocab" in v:
        return _draft_vocab(v["draft_vocab"], root)
    return None


def _draft_vocab(v: Any, root: dict) -> str | None:
    """The pruned draft head's record: its map is the draft model's vocab_map."""
    if not isinstance(v, dict):
        return f".draft_vocab must be an object, got {show(v)}"
    draft = root["models"].get("draft") if isinstance(root.get("models"), dict) else None
    want = draft.get("vocab_map") if isinstance(draft, dict) else None
    if v.get("map") != want:
        return f".draft_vocab.map is {show(v.get('map'))}, but models.draft.vocab_map is {show(want)}"
    for key in ("kept", "of", "corpus_tokens"):
        if key in v and not (is_int(v[key]) and 0 <= v[key] <= 1 << 40):
            return f".draft_vocab.{key} must be an integer >= 0, got {show(v[key])}"
    return None


# --- defaults: runtime defaults chosen at export ---------------------------------------------------
DEFAULTS_KEYS = ("max_len",)


def defaults(v: dict, obj: dict, root: dict) -> str | None:
    said = _unknown(v, DEFAULTS_KEYS)
    if said or "max_len" not in v:
        return said
    target = root["models"].get("target") if isinstance(root.get("models"), dict) else None
    top = int_of(target, "max_context")
    if top is not None and top < MIN_MAX_LEN:
        return None  # max_context is refused under its own name
    hi = top if top is not None else 1 << 24
    if not (is_int(v["max_len"]) and MIN_MAX_LEN <= v["max_len"] <= hi):
        bound = f"{hi:,} (models.target.max_context)" if top is not None else f"{hi:,}"
        return f".max_len must be an integer from {MIN_MAX_LEN} to {bound}, got {show(v['max_len'])}"
    return None


# --- parity: the export's measurement of a graph against its reference -----------------------------
PARITY_SHARES = ("top1", "top1_in_top5", "min_top1")  # shares of tokens: 0..1
PARITY_DIVERGENCES = ("mean_kl", "max_kl")  # KL divergences: >= 0


def parity(v: dict, obj: dict, root: dict) -> str | None:
    for key in PARITY_SHARES:
        if key in v and not _probability(v[key]):
            return f".{key} must be a number from 0 to 1, got {show(v[key])}"
    for key in PARITY_DIVERGENCES:
        if key in v and not (_finite(v[key]) and v[key] >= 0):
            return f".{key} must be a finite number >= 0, got {show(v[key])}"
    if "tokens" in v and not (is_int(v["tokens"]) and 0 <= v["tokens"] <= 1 << 40):
        return f".tokens must be an integer >= 0, got {show(v['tokens'])}"
    if "passed" in v and not isinstance(v["passed"], bool):
        return f".passed must be true or false, got {show(v['passed'])}"
    bad = next((k for k, x in v.items() if is_number(x) and not _finite(x)), None)
    return None if bad is None else f".{show(bad, 40)} must be a finite number, got {show(v[bad])}"


# --- maps and id lists -------------------------------------------------------------------------------
def vocab_map(v: str, obj: dict, root: dict) -> str | None:
    """models.<role>.vocab_map: only a draft's logits are pruned (the target scores every token), and
    the map is a listed numpy array (models/derived.py reads its header against the graph)."""
    role = next((r for r, f in root["models"].items() if f is obj), None)
    if role != "draft":
        return f"is {show(v)}, but only the draft model may have a pruned vocabulary (the {role} scores every token)"
    if v not in root["files"]:
        return f"{show(v)} is not listed in 'files'"
    if not v.endswith(MAP_SUFFIX):
        return f"{show(v)} is not a numpy array file ({MAP_SUFFIX}): a vocabulary map is one integer id per logits row"
    return None


def at_most(n: int, what: str):
    """A list or object of at most n entries."""
    return lambda v, obj, root: None if len(v) <= n else f"has {len(v):,} {what}, more than the {n:,} this edgespec reads"
