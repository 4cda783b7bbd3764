"""POST /v1/embeddings in OpenAI's shape, answered by the embedder `serve --embedder` loaded (a sentence-
embedding model beside the LLM: its own small onnxruntime session, docs/onnx_embedder.py).

The model is `serve --embedder`'s, else the one the `--docs` index names (served_embedder).

Request:  {"model": the embedder's name or model id, "input": a string | [strings] | [token ids] | [[token ids]],
           "encoding_format": "float" (default) | "base64", "dimensions": its dim only, "user": ignored}
Response: {"object": "list", "model", "data": [{"object": "embedding", "index", "embedding"}],
           "usage": {"prompt_tokens", "total_tokens"}, "edgespec": {"max_tokens", "truncated": [indices]}}

Token ids are the embedding model's own vocabulary (not the LLM's); OpenAI's clients send their own ids only
when asked to. Inputs longer than the model's max_tokens are truncated to their head, not refused (OpenAI
refuses over 8192): the indices cut are listed under "edgespec".

Bounded like generation: a request waits in a queue of `embed_queue_size` (429 past it, before its body is
read), may hold `embed_max_tokens` tokens after truncation (413 naming the budget), and runs on the engine's
worker thread in slices between generation's rounds (slices.py), so a streaming chat keeps its pace.
"""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Generator

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from ..errors import InvalidRequest
from . import shapes
from .access import check_auth, check_ready, read_body
from .apierror import APIError, bad_request, echo
from .slices import SliceJob
from .state import ServerState
from .validate import parse_json

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request
SLICE_CHARS = 20_000  # characters tokenized per slice (~2-4 ms)
SLICE_TOKENS = 256  # padded tokens embedded per slice: one longest text of all-MiniLM-L6-v2
FIELDS = ("model", "input", "encoding_format", "dimensions", "user")


def _type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def parse_input(v: Any) -> tuple[str, list]:
    """("texts", [str]) or ("ids", [[int]]), as OpenAI reads `input`; a 400 naming what is wrong otherwise."""
    if isinstance(v, str):
        if not v:
            raise bad_request("'input' is an empty string; send text to embed", param="input")
        return "texts", [v]
    if not isinstance(v, list):
        raise bad_request(f"'input' must be a string, an array of strings or an array of token ids, got {_type(v)}",
                          param="input")
    if not v:
        raise bad_request("'input' is an empty array; send at least one text", param="input")
    if len(v) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(v)} items; at most {MAX_INPUTS} per request", param="input")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return "ids", [v]
    if all(isinstance(x, str) for x in v):
        for i, x in enumerate(v):
            if not x:
                raise bad_request(f"'input[{i}]' is an empty string; send text to embed", param="input")
        return "texts", v
    if all(isinstance(x, list) for x in v):
        for i, x in enumerate(v):
            if not x:
                raise bad_request(f"'input[{i}]' is an empty array of token ids", param="input")
        return "ids", v
    kinds = sorted({_type(x) for x in v})
    raise bad_request(f"'input' mixes {' and '.join(kinds)}: send all strings, or all token-id arrays", param="input")


def served_embedder(state: ServerState):
    """`serve --embedder`'s model, else the one a `--docs` index was built with (loaded to embed questions):
    the model /v1/embeddings answers with, or None."""
    if state.embedder is not None:
        return state.embedder
    emb = state.docs.embedder if state.docs is not None else None
    return emb if hasattr(emb, "encode_ids") else None


class EmbeddingsEndpoint:
    def __init__(self, state: ServerState):
        self.state = state

    async def __call__(self, request: Request) -> Response:
        state = self.state
        check_auth(state, request.headers, request.client.host if request.client else None)
        emb = served_embedder(state)
        if emb is None:
            raise APIError(404, "this server has no embedding model: start it with `serve --embedder NAME` "
                           "(e.g. all-minilm-l6-v2, after `edgespec pull minilm`)", code="model_not_found")
        check_ready(state)  # the engine's worker runs the embeddings (slices.py)
        queue = state.scheduler.embeddings
        queue.check_room()  # a full queue answers before the body is read
        cfg = state.config
        body = parse_json(await read_body(request.receive, request.headers, cfg.max_body_bytes, cfg.body_timeout))
        if not isinstance(body, dict):
            raise bad_request(f"request body must be a JSON object, got {_type(body)}", code="invalid_json")
        unknown = [k for k in body if k not in FIELDS]
        if unknown:
            raise bad_request(f"unknown field {echo(unknown[0])} for /v1/embeddings (fields: {', '.join(FIELDS)})",
                              param=unknown[0], code="unknown_parameter")
        names = (emb.manifest.name, emb.model_id)
        model = body.get("model")
        if not isinstance(model, str):
            raise bad_request("'model' is required: a string" if model is None else
                              f"'model' must be a string, got {_type(model)}", param="model")
        if model not in names:
            raise APIError(404, f"model {echo(model)} is not an embedding model served here; this server embeds with "
                           f"{' or '.join(repr(n) for n in names)}", param="model", code="model_not_found")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {echo(fmt)}", param="encoding_format")
        dims = body.get("dimensions")
        if dims is not None and (isinstance(dims, bool) or dims != emb.dim):
            raise bad_request(f"'dimensions' must be {emb.dim} (this model's; it cannot shorten its vectors), "
                              f"got {echo(dims)}", param="dimensions")
        kind, items = parse_input(body.get("input"))
        if kind == "ids":  # counted without the model: refused before it waits
            check_budget(sum(_held(emb, len(x)) for x in items), cfg.embed_max_tokens)
        loop = asyncio.get_running_loop()
        job = SliceJob(embed_work(emb, kind, items, fmt, model, cfg.embed_max_tokens), loop, loop.create_future())
        queue.submit(job)
        try:
            raw = await asyncio.wait_for(asyncio.shield(job.future), cfg.request_timeout)
        except asyncio.TimeoutError:
            raise APIError(504, f"the embeddings did not finish within the server's request timeout of "
                                f"{cfg.request_timeout:g} s; retry later", code="timeout") from None
        except InvalidRequest as e:
            raise bad_request(str(e), param="input") from None
        finally:
            job.cancelled = True  # done, or nobody waits for it any longer: its slices stop
        return Response(raw, media_type="application/json")


def check_budget(tokens: int, budget: int) -> None:
    if tokens > budget:
        raise APIError(413, f"'input' holds {tokens} tokens after truncation; at most {budget} per request "
                            "(the server's embeddings budget): split it into several requests",
                       param="input", code="too_many_tokens")


def _held(emb, n: int) -> int:
    """Tokens a text of n token ids is embedded with: its head within max_tokens, with the special tokens."""
    specials = sum(t is not None for t in getattr(emb, "specials", ()))
    return min(n, emb.max_tokens - specials) + specials


def embed_work(emb, kind: str, items: list, fmt: str, model: str, budget: int) -> Generator[None, None, bytes]:
    """The request's work in slices (slices.py), each a few ms to a few tens of ms on a 2-core board:
    counting texts' tokens (SLICE_CHARS characters a slice), the budget's check, then embedding (SLICE_TOKENS
    padded tokens a slice, inputs of like length together) and writing each vector's JSON at once. Texts go
    through the embedder's own `encode` (its passage prefix, E5's "passage: ", included), as before slicing.
    Returns the response body."""
    if kind == "texts":
        prefix = getattr(emb, "passage_prefix", "")
        held, done = [], 0
        for text in items:  # the tokens `encode` will embed: the prefixed text's head within max_tokens
            held.append(_held(emb, len(emb.tokenize(prefix + text))))
            done += len(text)
            if done >= SLICE_CHARS:
                done = 0
                yield
        yield
    else:
        held = [_held(emb, len(x)) for x in items]
    check_budget(sum(held), budget)
    pieces: list[bytes] = [b""] * len(items)
    truncated: list[int] = []
    order = sorted(range(len(items)), key=lambda i: held[i])
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * held[order[end]] <= SLICE_TOKENS:
            end += 1
        rows = order[start:end]
        batch = [items[i] for i in rows]
        out = emb.encode(batch) if kind == "texts" else emb.encode_ids(batch)
        for r, i in enumerate(rows):
            pieces[i] = shapes.dumps({"object": "embedding", "index": i, "embedding": _encode(out.vectors[r], fmt)})
            held[i] = int(out.tokens[r])
            if out.truncated[r]:
                truncated.append(i)
        start = end
        yield
    n = sum(held)
    head = shapes.dumps({"object": "list", "model": model})[:-1]
    tail = shapes.dumps({"usage": {"prompt_tokens": n, "total_tokens": n},
                         "edgespec": {"max_tokens": emb.max_tokens, "truncated": sorted(truncated)}})[1:]
    return head + b',"data":[' + b",".join(pieces) + b"]," + tail


def _encode(v: np.ndarray, fmt: str) -> Any:
    """float: a JSON array; base64: the little-endian float32 bytes, as OpenAI's clients decode them."""
    if fmt == "float":
        return v.tolist()
    le = v.astype("<f4", copy=False)
    return base64.b64encode(le.tobytes()).decode("ascii")

