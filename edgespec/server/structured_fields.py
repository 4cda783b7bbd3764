"""The structured-output fields of a chat or completion body (response_format, tools, tool_choice, and
edgespec's `grammar`), checked for shape. The schema itself is compiled when the engine parses the
request: a schema the grammar library refuses is a 400 naming it from there (engine/structured.py)."""
from __future__ import annotations

import json
from typing import Any

from ..engine.structured import check_tool_choice, one_constraint
from ..errors import InvalidRequest
from .apierror import bad_request, clip


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def _show(v: Any) -> str:
    try:
        return clip(json.dumps(v), 40)
    except (ValueError, TypeError, RecursionError):
        return f"<{_type_name(v)}>"


def structured_fields(body: dict, kind: str) -> dict[str, Any]:
    """response_format, tools, tool_choice (and edgespec's `grammar`), checked for shape: GenRequest's
    json_schema, lenient, grammar, tools and tool_choice. Each bad value is a 400 naming its field."""
    out: dict[str, Any] = {}
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise bad_request(f"'response_format' must be an object, got {_type_name(rf)}", param="response_format")
        t = rf.get("type")
        if t == "json_object":
            out["json_schema"] = {"type": "object"}
        elif t == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
                raise bad_request("'response_format.json_schema' must be an object with a 'schema' object "
                                  "({'name': ..., 'schema': {...}, 'strict': true})", param="response_format.json_schema")
            strict = js.get("strict")
            if strict is not None and not isinstance(strict, bool):
                raise bad_request("'response_format.json_schema.strict' must be true or false",
                                  param="response_format.json_schema.strict")
            out["json_schema"] = js["schema"]
            out["lenient"] = strict is False
        elif t != "text":
            raise bad_request(f"'response_format.type' must be one of text, json_object, json_schema, got {_show(t)}",
                              param="response_format.type")
    g = body.get("grammar")
    if g is not None:  # a string; an empty one is the engine's to refuse (engine/structured.py)
        if not isinstance(g, str):
            raise bad_request(f"'grammar' must be a string (llguidance's Lark form), got {_type_name(g)}",
                              param="grammar")
        out["grammar"] = g
    tools = body.get("tools")
    if tools is not None and tools != []:
        if kind != "chat":
            raise bad_request("'tools' needs /v1/chat/completions", param="tools")
        if not isinstance(tools, list):
            raise bad_request(f"'tools' must be an array, got {_type_name(tools)}", param="tools")
        out["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        _engine_rule(check_tool_choice, choice, "tools" in out)
        out.update({"tool_choice": choice} if "tools" in out else {})
    ptc = body.get("parallel_tool_calls")  # one call per answer either way
    if ptc is not None and not isinstance(ptc, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    _engine_rule(one_constraint, "json_schema" in out, "grammar" in out,
                 "tools" in out and out.get("tool_choice") != "none", {"json_schema": "response_format"})
    return out


def _engine_rule(rule, *args) -> None:
    """A rule of engine/structured.py (the API's), its InvalidRequest as the 400 it is here."""
    try:
        rule(*args)
    except InvalidRequest as e:
        raise bad_request(str(e), param=e.param) from None


def tool_message(m: dict, i: int, content: str) -> dict[str, Any]:
    """An assistant message carrying tool_calls, or a tool message with a call's result, as the chat
    template gets them: the calls' arguments parsed back into objects (templates write them with
    tojson), a tool message's name looked up by the engine from its tool_call_id."""
    where = f"messages[{i}]"
    if m.get("role") == "tool":
        tid = m.get("tool_call_id")
        if tid is not None and not isinstance(tid, str):
            raise bad_request(f"{where}.tool_call_id must be a string", param=f"{where}.tool_call_id")
        return {"role": "tool", "content": content, **({"tool_call_id": tid} if tid else {})}
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        name, args = (f.get("name"), f.get("arguments")) if isinstance(f, dict) else (None, None)
        try:
            parsed = json.loads(args) if isinstance(args, str) else None
        except ValueError:
            parsed = None
        if not isinstance(name, str) or not isinstance(parsed, dict):
            raise bad_request(f"{where}.tool_calls[{j}] must be {{'type': 'function', 'function': {{'name': ..., "
                              "'arguments': <a JSON object as text>}}", param=f"{where}.tool_calls[{j}]")
        out.append({"id": c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{j}", "type": "function",
                    "function": {"name": name, "arguments": parsed}})
    return {"role": "assistant", "content": content, "tool_calls": out}
