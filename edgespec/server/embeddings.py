"""POST /v1/embeddings in OpenAI's shape, answered by the embedder `serve --embedder` loaded (a sentence-
embedding model beside the LLM: its own small onnxruntime session, knowledge/onnx_embedder.py).

The model is `serve --embedder`'s, else the one the `--docs` index names (served_embedder).

Request:  {"model": the embedder's name or model id, "input": a string | [strings] | [token ids] | [[token ids]],
           "encoding_format": "float" (default) | "base64", "dimensions": its dim only, "user": ignored}
Response: {"object": "list", "model", "data": [{"object": "embedding", "index", "embedding"}],
           "usage": {"prompt_tokens", "total_tokens"}, "edgespec": {"max_tokens", "truncated": [indices]}}

Token ids are the embedding model's own vocabulary (not the LLM's); OpenAI's clients send their own ids only
when asked to. Inputs longer than the model's max_tokens are truncated to their head, not refused (OpenAI
refuses over 8192): the indices cut are listed under "edgespec".
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..errors import InvalidRequest
from .access import check_auth, read_body
from .apierror import APIError, bad_request, echo
from .responses import json_response
from .state import ServerState
from .validate import parse_json

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request
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
    emb = getattr(getattr(state.engine, "knowledge", None), "embedder", None)
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
        try:
            out = await run_in_threadpool(emb.encode if kind == "texts" else emb.encode_ids, items)
        except InvalidRequest as e:
            raise bad_request(str(e), param="input") from None
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, fmt)} for i, v in enumerate(out.vectors)]
        n = int(sum(out.tokens))
        return json_response({
            "object": "list", "model": model, "data": data, "usage": {"prompt_tokens": n, "total_tokens": n},
            "edgespec": {"max_tokens": emb.max_tokens, "truncated": [i for i, t in enumerate(out.truncated) if t]},
        })


def _encode(v: np.ndarray, fmt: str) -> Any:
    """float: a JSON array; base64: the little-endian float32 bytes, as OpenAI's clients decode them."""
    if fmt == "float":
        return [float(x) for x in v]
    le = v.astype("<f4", copy=False)
    return base64.b64encode(le.tobytes()).decode("ascii")

