"""Turns an untrusted OpenAI-style JSON body into a `GenRequest`, or a 400 that names the bad field.

Here: the body's shape and types (JSON gave a number where one is due, an array of strings ...) and
what only the OpenAI API has (the served model's names, n, best_of, penalties, logprobs, OpenAI's
temperature bound, this server's --max-tokens-limit). A value's range is the engine's to check, once,
for Python callers and clients alike: the handler has the engine prepare the request before it is
queued (generation.py), so a value out of range is still a 400 that costs no engine time, its
option turned back into the client's field by `GenRequest.client_error` (ENGINE_NAMES). Unknown
fields are ignored (OpenAI clients send `user`, `metadata`, ...), but a known feature we do not
implement with a non-default value (n > 1, logprobs, penalties ...) is refused rather than silently
ignored: a client relying on it must find out. Structured output (`response_format`, `tools`,
`tool_choice`) is checked for shape here; the engine compiles the schema (engine/structured.py).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidRequest
from ..limits import JSON_DEPTH_LIMIT, TEMPERATURE_LIMIT
from .apierror import APIError, bad_request, clip, echo
from .structured_fields import structured_fields, tool_message

log = logging.getLogger("edgespec.server")

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# GenRequest's fields (the client's names) that the engine's request options (engine/requests.py
# Options) call otherwise; every other field passed on keeps its name. engine_kwargs maps a request
# through it, client_error maps an engine refusal back (chat's max_completion_tokens is max_tokens here).
ENGINE_NAMES = {"max_tokens": "max_new_tokens", "draft_k": "k"}
CLIENT_NAMES = {engine: client for client, engine in ENGINE_NAMES.items()}
PASSED = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "draft", "draft_k", "tree",
          "json_schema", "grammar", "tools", "tool_choice")  # GenRequest's fields the engine gets (when set)


@dataclass(frozen=True)
class Limits:
    """What the server allows; filled from the serve options and the loaded engine."""

    model_names: tuple[str, ...] = ()  # empty: any model name is accepted
    max_tokens_limit: int = 4096
    default_max_tokens: int = 512
    default_temperature: float = 0.0


@dataclass
class GenRequest:
    kind: Literal["chat", "completion"]
    model: str
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | None = None
    stream: bool = False
    include_usage: bool = False
    draft: str | None = None
    draft_k: int | None = None
    tree: str | None = None  # "auto" | "on" | "off" (None: the engine's default)
    json_schema: Any = None  # response_format json_schema / json_object: the schema the answer follows
    lenient: bool = False  # response_format json_schema with strict=false: unknown schema keywords ignored
    grammar: str | None = None  # edgespec's own: an llguidance Lark grammar (docs/structured-output.md)
    tools: list[dict] | None = None
    tool_choice: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    max_tokens_field: str = "max_tokens"  # the name the client gave it (chat's newer max_completion_tokens)

    def engine_kwargs(self) -> dict[str, Any]:
        """OpenAI's names mapped onto the engine's options: keyword arguments for Engine.prepare
        (without `cancel`)."""
        kw = {ENGINE_NAMES.get(f, f): getattr(self, f) for f in PASSED if getattr(self, f) is not None}
        if self.kind == "chat":
            kw["messages"] = self.messages
        else:
            kw["prompt"] = self.prompt
        if self.lenient:
            kw["strict"] = False
        return kw

    def client_error(self, e: InvalidRequest) -> APIError:
        """The engine's refusal of this request as the 400 its client reads: the option it names
        turned back into the field the client sent (the engine's k is draft_k), in the message too
        when the message starts with it, clipped to a line (the engine repeats the value)."""
        param = e.param
        name = CLIENT_NAMES.get(param, param) if param is not None else None
        if name == "max_tokens":
            name = self.max_tokens_field
        message = str(e)
        if param is not None and message.startswith(param + " "):
            message = f"'{name}'{message[len(param):]}"
        return bad_request(clip(message), param=name)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json(raw: bytes) -> Any:
    """Strict JSON: Python's json module would accept NaN and Infinity, which no OpenAI client sends.
    Nesting deeper than JSON_DEPTH_LIMIT and strings that are not valid Unicode (a lone surrogate written as
    a \\ud800 escape) are refused here, so nothing after this point can recurse without bound or hand
    the tokenizer a string it cannot encode."""
    if not raw.strip():
        raise bad_request("request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not UTF-8 ({e.reason} at byte {e.start})", code="invalid_json") from None
    try:
        body = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise bad_request(f"request body is nested too deeply (at most {JSON_DEPTH_LIMIT} levels)", code="invalid_json") from None
    except ValueError as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    check_structure(body, text)
    return body


# a \\ud800-\\udfff escape: the only way a UTF-8 body can carry a surrogate (decoded text never holds one)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_structure(body: Any, text: str | None = None) -> None:
    """Walks the parsed body without recursion: depth <= JSON_DEPTH_LIMIT, every string (keys included)
    encodable as UTF-8. The error names the field as a path, e.g. messages[0].content. Given the
    body's `text`, strings are checked only when it holds a surrogate escape (the walk then costs a
    third as much: 30,000 messages are checked in tens of milliseconds)."""
    strings = text is None or _SURROGATE_ESCAPE.search(text) is not None
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > JSON_DEPTH_LIMIT:
            raise bad_request(f"request body is nested too deeply (at most {JSON_DEPTH_LIMIT} levels)",
                              param=path or None, code="invalid_json")
        if isinstance(v, dict):
            for k, x in v.items():
                if strings:
                    _check_text(k, f"{path}.{k!a}" if path else f"{k!a}")
                if strings or isinstance(x, (dict, list)):
                    stack.append((x, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v) if strings or isinstance(x, (dict, list)))
        elif strings and isinstance(v, str):
            _check_text(v, path)


def _check_text(s: str, path: str) -> None:
    path = clip(path)  # it holds the client's keys
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"'{path or 'body'}' is not valid Unicode text (a lone surrogate \\u{ord(s[e.start]):04x} "
                          f"at character {e.start})", param=path or None, code="invalid_text") from None


# --- field checks: each raises a 400 naming the field -------------------------------------------------
def _show(v: Any) -> str:
    """A short, safe rendering of a client value for an error message (ints of any size: str() of a
    5000-digit int raises ValueError in Python >= 3.11)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"{'-' if v < 0 else ''}<{v.bit_length()}-bit integer>"
    try:
        return clip(json.dumps(v), 40)
    except (ValueError, TypeError, RecursionError):
        return f"<{_type_name(v)}>"


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__
    )


def _int(body: dict, name: str, *, lo: int | None = None, default: Any = None) -> Any:
    """A JSON integer (16.0 too); lo: an OpenAI-only bound (the engine checks its options' ranges)."""
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # 16.0 is what some JavaScript clients send for 16
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(v)} {_show(v)}", param=name)
    if lo is not None and v < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {_show(v)}", param=name)
    return v


def _number(body: dict, name: str, *, lo: float | None = None, hi: float, default: Any = None) -> Any:
    """A JSON number as a float, within an OpenAI-only bound: at most `hi` (and at least `lo`)."""
    v = _float(body, name, default)
    if v is not None and (v > hi or (lo is not None and v < lo)):  # JSON's 1e400 is inf: above any bound
        bound = f"in [{lo:g}, {hi:g}]" if lo is not None else f"at most {hi:g}"
        raise bad_request(f"'{name}' must be {bound}, got {v:g}", param=name)
    return v


def _float(body: dict, name: str, default: Any = None) -> Any:
    """A JSON number as a float (its range is the engine's to check)."""
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{name}' must be a number, got {_type_name(v)} {_show(v)}", param=name)
    try:
        return float(v)
    except OverflowError:  # a 400-digit integer
        raise bad_request(f"'{name}' is too large a number, got {_show(v)}", param=name) from None


def _bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be true or false, got {_type_name(v)}", param=name)
    return v


def _unsupported(body: dict, name: str, default_ok, what: str) -> None:
    """Refuse a feature we do not implement unless the client sent its no-op value."""
    if name in body and body[name] is not None and not default_ok(body[name]):
        raise bad_request(f"'{name}' is not supported by this server ({what})", param=name, code="unsupported_parameter")


def _model(body: dict, limits: Limits) -> str:
    """The model asked for: left out, the served one; when present a string (null too is refused: OpenAI
    requires the field, and a client that sends null meant some name)."""
    if "model" not in body:
        return limits.model_names[0] if limits.model_names else ""
    v = body["model"]
    if not isinstance(v, str):
        raise bad_request(f"'model' must be a string, got {_type_name(v)}", param="model")
    if limits.model_names and v not in limits.model_names:
        served = ", ".join(repr(n) for n in limits.model_names)
        raise bad_request(
            f"model {echo(v)} is not served here; this server serves {served} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    return v


def _stop(body: dict) -> list[str] | None:
    """A string or an array of strings (how many, and empty ones, are the engine's to refuse)."""
    v = body.get("stop")
    if v is None:
        return None
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad_request("'stop' must be a string or an array of strings", param="stop")
    return v or None


def _name(body: dict, name: str) -> str | None:
    """A name (draft, tree): a string, which the engine looks up in its table."""
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"'{name}' must be a string, got {_type_name(v)} {_show(v)}", param=name)
    return v


def _max_tokens(body: dict, limits: Limits) -> tuple[int, str]:
    """(new tokens at most, the field that said so): this server's --max-tokens-limit is checked here,
    the engine refuses fewer than 1."""
    # chat clients may send the newer name; both mean "new tokens to generate at most"
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    v = _int(body, name, default=None)
    if v is None:
        return min(limits.default_max_tokens, limits.max_tokens_limit), name
    if v > limits.max_tokens_limit:
        raise bad_request(
            f"'{name}' is {v} but this server allows at most {limits.max_tokens_limit} new tokens per request",
            param=name,
        )
    return v, name


def _common(body: Any, kind: str, limits: Limits) -> GenRequest:
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {_type_name(body)}", code="invalid_json")
    n = _int(body, "n", lo=1, default=1)
    if n != 1:
        raise bad_request("'n' must be 1: this server generates one choice per request", param="n", code="unsupported_parameter")
    best_of = _int(body, "best_of", lo=1, default=1)
    if best_of != 1:
        raise bad_request("'best_of' must be 1 on this server", param="best_of", code="unsupported_parameter")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, lo=-2.0, hi=2.0, default=0.0) != 0.0:
            raise bad_request(f"'{name}' is not supported by this server (only 0)", param=name, code="unsupported_parameter")
    _unsupported(body, "logit_bias", lambda v: v == {}, "only {}")
    _unsupported(body, "functions", lambda v: v == [], "the older function calling: use tools")
    stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    include_usage = _bool({"stream_options.include_usage": (so or {}).get("include_usage")}, "stream_options.include_usage")
    max_tokens, max_tokens_field = _max_tokens(body, limits)
    return GenRequest(
        kind=kind,  # type: ignore[arg-type]
        model=_model(body, limits),
        max_tokens=max_tokens,
        max_tokens_field=max_tokens_field,
        # OpenAI's bound on temperature is this API's own (the Python API samples hotter); >= 0 is the engine's
        temperature=_number(body, "temperature", hi=TEMPERATURE_LIMIT, default=limits.default_temperature),
        top_p=_float(body, "top_p", default=1.0),
        top_k=_int(body, "top_k", default=0),
        seed=_int(body, "seed"),
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage and stream,
        draft=_name(body, "draft"),
        draft_k=_int(body, "draft_k"),
        tree=_name(body, "tree"),
        **structured_fields(body, kind),
    )


def _content(msg: dict, i: int) -> str:
    c = msg.get("content")
    where = f"messages[{i}].content"
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts: only text can be given to a text model
        parts = []
        for j, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _type_name(part)
                raise bad_request(f"{where}[{j}] must be a text part ({{'type': 'text', 'text': ...}}), got {echo(kind)}", param=where)
            parts.append(part["text"])
        return "".join(parts)
    if c is None:
        raise bad_request(f"{where} is missing (a string is required)", param=where)
    raise bad_request(f"{where} must be a string or an array of text parts, got {_type_name(c)}", param=where)


def parse_chat(body: Any, limits: Limits) -> GenRequest:
    req = _common(body, "chat", limits)
    _unsupported(body, "logprobs", lambda v: v is False, "no log-probabilities")
    _unsupported(body, "top_logprobs", lambda v: v == 0, "no log-probabilities")
    msgs = body.get("messages")
    if msgs is None:
        raise bad_request("'messages' is required: an array of {role, content} objects", param="messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty array of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object, got {_type_name(m)}", param=f"messages[{i}]")
        role = m.get("role")
        if role == "tool" or (role == "assistant" and m.get("tool_calls")):  # a tool call and its result
            out.append(tool_message(m, i, _content(m, i) if m.get("content") is not None else ""))
            continue
        if not isinstance(role, str) or role not in ROLES:
            if role == "function":
                raise bad_request(f"messages[{i}]: function messages are the older function calling: send tool "
                                  "messages", param=f"messages[{i}].role")
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {_show(role)}",
                param=f"messages[{i}].role",
            )
        out.append({"role": ROLES[role], "content": _content(m, i)})
    _check_turns(msgs)
    req.messages = out
    return req


def _check_turns(msgs: list[dict]) -> None:
    """What OpenAI's API refuses in the order of turns, refused the same way (its message, the field
    named): a `tool` message answers a call, so it must follow an assistant message with `tool_calls`
    (or another tool message answering the same one) - a conversation that is a lone tool result
    asks nothing. A conversation of system or assistant turns only is accepted, as OpenAI does."""
    answering = False  # the messages before this one are an assistant's tool calls and their results
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "tool" and not answering:
            raise bad_request(f"messages[{i}]: a message with role 'tool' must be a response to a preceding "
                              "message with 'tool_calls'", param=f"messages[{i}].role")
        answering = role == "tool" and answering or (role == "assistant" and bool(m.get("tool_calls")))


def parse_completion(body: Any, limits: Limits) -> GenRequest:
    req = _common(body, "completion", limits)
    _unsupported(body, "logprobs", lambda v: v == 0, "no log-probabilities")
    # not a field of the completions API (its `logprobs` is the count of top tokens), but chat's name for
    # it: a client sending it wants log-probabilities and must learn there are none, as on chat
    _unsupported(body, "top_logprobs", lambda v: v == 0, "no log-probabilities")
    _unsupported(body, "echo", lambda v: v is False, "the prompt is not echoed")
    _unsupported(body, "suffix", lambda v: v == "", "no insertion")
    p = body.get("prompt")
    if p is None:
        raise bad_request("'prompt' is required: a string", param="prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, list):
        raise bad_request(
            "'prompt' must be one string (arrays of several prompts or of token ids are not supported)", param="prompt"
        )
    if not isinstance(p, str):
        raise bad_request(f"'prompt' must be a string, got {_type_name(p)}", param="prompt")
    req.prompt = p
    return req


def too_long(prompt_tokens: int, capacity: int, param: str = "messages") -> APIError:
    """OpenAI's wording and code for a prompt the context cannot hold, with our numbers."""
    return bad_request(
        f"the prompt is {prompt_tokens} tokens but this server's cache holds {capacity} "
        f"(prompt + at least 1 new token must fit); shorten the prompt",
        param=param,
        code="context_length_exceeded",
    )


def parse_request(kind: str, raw: bytes, limits: Limits) -> GenRequest:
    """The one entry point for a request body: a GenRequest or an APIError with status 400, never
    anything else. The checks above are meant to catch every bad input by name; this net turns a
    case they missed into a 400 (and a log line that says which), not a 500 with a traceback."""
    parse = parse_chat if kind == "chat" else parse_completion
    try:
        return parse(parse_json(raw), limits)
    except APIError:
        raise
    except Exception as e:  # noqa: BLE001 - see the docstring: the caller's input, so the caller's error
        log.warning("request body refused by the validation net (%s: %s); a specific check is missing",
                    type(e).__name__, clip(str(e)))
        raise bad_request(f"the request body could not be validated ({type(e).__name__})",
                          code="invalid_request") from None
