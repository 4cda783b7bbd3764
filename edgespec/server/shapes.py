"""The JSON objects OpenAI clients expect, plus edgespec's own `edgespec` field with the speculative
statistics (drafted, accepted, acceptance rate, ...), and server-sent-event framing for streams.

The `openai` package keeps unknown fields, so `resp.model_extra["edgespec"]` (or `resp.edgespec`)
reaches the stats without any client change.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

from ..engine.results import GenerationResult, GenerationStats

# engine finish reasons -> OpenAI's; a full cache is a length limit from the client's point of view
FINISH = {"stop": "stop", "length": "length", "cache_full": "length"}

DONE = b"data: [DONE]\n\n"


def _clean(v: Any) -> Any:
    """JSON has no NaN/Infinity: a rate of 0/0 becomes null instead of breaking the client's parser."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def dumps(obj: Any) -> bytes:
    return json.dumps(_clean(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def sse(obj: Any) -> bytes:
    """One event. JSON never contains a raw newline, so `data:` on a single line is always enough."""
    return b"data: " + dumps(obj) + b"\n\n"


def stats_dict(stats: GenerationStats | None, *, finish_reason: str, queue_s: float | None) -> dict[str, Any]:
    d = dict(stats.to_dict()) if stats is not None else {}
    d["finish_reason"] = finish_reason
    d["queue_s"] = None if queue_s is None else round(queue_s, 4)
    return d


def edgespec_field(result: GenerationResult, queue_s: float | None) -> dict[str, Any]:
    """The response's `edgespec` field: the stats, and an answer from documents' sources and whether
    it declined (engine results' `docs`, docs/answer.py)."""
    d = stats_dict(result.stats, finish_reason=result.finish_reason, queue_s=queue_s)
    d.update(result.docs or {})
    return d


def usage(stats: GenerationStats) -> dict[str, int]:
    p, c = int(stats.prompt_tokens), int(stats.new_tokens)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def completion_body(kind: str, rid: str, model: str, text: str, result: GenerationResult, queue_s: float | None,
                    created: int | None = None) -> dict[str, Any]:
    created = int(time.time()) if created is None else created
    finish = FINISH.get(result.finish_reason, "stop")
    calls = result.tool_calls
    if kind == "chat" and calls:
        msg = {"role": "assistant", "content": None, "tool_calls": calls}
        choice = {"index": 0, "message": msg, "logprobs": None, "finish_reason": "tool_calls"}
        obj = "chat.completion"
    elif kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(result.stats),
        "edgespec": edgespec_field(result, queue_s),
    }


class ToolHold:
    """A streamed answer that may be a tool call: text is held while it could still be one (it
    starts like a call), and sent as it comes once it cannot; the call itself goes out at the end
    as tool-call deltas (ChunkWriter.tool_calls)."""

    STARTS = ("<tool_call>", "{", "```")  # what a call's text starts with (engine/structured.py)

    def __init__(self, active: bool):
        self.holding = active
        self.held = ""

    def push(self, delta: str) -> str:
        """The text to send now ("" while holding)."""
        if not self.holding:
            return delta
        self.held += delta
        head = self.held.lstrip()
        if not head or any(head.startswith(s) or s.startswith(head) for s in self.STARTS):
            return ""
        self.holding, out, self.held = False, self.held, ""
        return out


class ChunkWriter:
    """Builds the successive stream chunks of one response (same id, created and model in each)."""

    def __init__(self, kind: str, rid: str, model: str):
        self.kind = kind
        self.rid = rid
        self.model = model
        self.created = int(time.time())

    def _chunk(self, choice: dict | None, **extra: Any) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        d: dict[str, Any] = {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                             "choices": [choice] if choice is not None else []}
        d.update(extra)
        return d

    def first(self) -> bytes | None:
        """Chat streams open with the assistant role, as OpenAI's do; completions have no such chunk."""
        if self.kind != "chat":
            return None
        return sse(self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}))

    def delta(self, text: str) -> bytes:
        if self.kind == "chat":
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        return sse(self._chunk(choice))

    def tool_calls(self, calls: list[dict]) -> bytes:
        """A tool call as OpenAI streams one: its id, type and name first, then its arguments."""
        out = b""
        for i, c in enumerate(calls):
            head = {"index": i, "id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
                                                                                "arguments": ""}}
            args = {"index": i, "function": {"arguments": c["function"]["arguments"]}}
            for tc in (head, args):
                choice = {"index": 0, "delta": {"tool_calls": [tc]}, "logprobs": None, "finish_reason": None}
                out += sse(self._chunk(choice))
        return out

    def final(self, result: GenerationResult, queue_s: float | None, include_usage: bool) -> bytes:
        """The finishing chunk carries usage and the edgespec stats; with stream_options.include_usage
        OpenAI's extra usage-only chunk (empty choices) follows."""
        finish = FINISH.get(result.finish_reason, "stop")
        if result.tool_calls and self.kind == "chat":
            finish = "tool_calls"
        if self.kind == "chat":
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish}
        stats = edgespec_field(result, queue_s)
        out = sse(self._chunk(choice, usage=usage(result.stats), edgespec=stats))
        if include_usage:
            out += sse(self._chunk(None, usage=usage(result.stats)))
        return out

    def error(self, body: dict[str, Any]) -> bytes:
        """An error after the 200 header went out: the `openai` client raises APIError on it."""
        return sse(body)
