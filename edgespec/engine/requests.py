"""A request checked and tokenized before anything runs: bad input raises InvalidRequest naming the
parameter, and nothing has been touched yet."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.sampling import SamplingParams
from ..errors import InvalidRequest
from ..limits import DRAFT_MODES, K_LIMIT, STOP_LIMIT, TREE_MODES


@dataclass
class Request:
    ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop: list[str]
    draft: str
    k: int | None
    cancel: Callable[[], bool]
    tree: str = "off"  # "auto" | "on" | "off": tree verification (engine/tree_round.py)


class Encoder:
    """Text or chat messages -> the token ids a request starts from (the bundle's chat template,
    its BOS rule)."""

    def __init__(self, tokenizer, tokenizer_facts, *, bos_text: str, eos_text: str):
        self.tokenizer = tokenizer
        self.facts = tokenizer_facts
        self.bos_text = bos_text
        self.eos_text = eos_text

    def __call__(self, prompt, messages) -> list[int]:
        if prompt is not None and messages is not None:
            raise InvalidRequest("pass either a prompt or messages, not both", param="prompt")
        from ..core.chat import check_text, encode_chat

        if messages is not None:  # message text never becomes control tokens (core.chat.encode_chat)
            ids = encode_chat(self.tokenizer, self.facts.chat_template, messages,
                              bos_token=self.bos_text, eos_token=self.eos_text)
        elif prompt is None:
            raise InvalidRequest("a prompt or messages are required", param="prompt")
        elif not isinstance(prompt, str):
            raise InvalidRequest(f"prompt must be a string, got {type(prompt).__name__}", param="prompt")
        elif not prompt:
            raise InvalidRequest("prompt is empty", param="prompt")
        else:
            check_text(prompt, "prompt")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        tf = self.facts
        if tf.add_bos and tf.bos_id is not None and (not ids or ids[0] != tf.bos_id):
            ids = [tf.bos_id, *ids]
        if not ids:
            raise InvalidRequest("prompt is empty after tokenization", param="prompt")
        return ids


def check_max_new_tokens(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise InvalidRequest(f"max_new_tokens must be an integer >= 1, got {n!r}", param="max_new_tokens")
    return n


def check_draft_mode(mode) -> None:
    if mode not in DRAFT_MODES:
        raise InvalidRequest(f"unknown drafter {mode!r}: choose one of {', '.join(DRAFT_MODES)}", param="draft")


def check_tree_mode(mode) -> None:
    if mode not in TREE_MODES:
        raise InvalidRequest(f"unknown tree mode {mode!r}: choose one of {', '.join(TREE_MODES)}", param="tree")


def check_k(k) -> None:
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= K_LIMIT:
        raise InvalidRequest(f"k must be an integer from 1 to {K_LIMIT} (or None: chosen each round), got {k!r}",
                             param="k")


def check_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    if len(stop) > STOP_LIMIT:
        raise InvalidRequest(f"at most {STOP_LIMIT} stop strings, got {len(stop)}", param="stop")
    if any(s == "" for s in stop):
        raise InvalidRequest("stop strings must not be empty", param="stop")
    return list(stop)


def cancel_fn(cancel) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return lambda: bool(cancel())
    raise InvalidRequest("cancel must be a threading.Event or a callable returning bool", param="cancel")
