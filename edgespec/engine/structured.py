"""Structured output of one request: what `json_schema=`, `grammar=`, `tools=` and `tool_choice=` ask
for, checked once into a `Structured`, compiled into the request's grammar, and the tool calls read
back from the answer.

Tool calls are JSON objects {"name": ..., "arguments": {...}}, the arguments following the tool's
`parameters` schema. Where the vocabulary has the "<tool_call>" and "</tool_call>" tokens (Qwen2.5,
Hermes-style templates), a call is written between them, as the chat template taught the model:

    tool_choice "required" / a name   the answer is one call (of those tools / of that one)
    tool_choice "auto"                the answer is one call, or text that does not start a call
    tool_choice "none"                plain text (the tools are still shown to the model)
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from ..core.constraint import Grammar, Grammars, JSON_OPTIONS, json_schema_text
from ..errors import InvalidRequest

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 64  # tools one request may list (each becomes a branch of its grammar)


@dataclass(frozen=True)
class Structured:
    """A request's structured-output options, checked (not yet compiled)."""

    grammar: Grammar | None = None  # the schema or grammar the answer follows (None: tool_choice none)
    tools: tuple[dict, ...] = ()  # the tools as the chat template gets them ({"type": "function", ...})
    tool_choice: str = "none"  # "auto" | "required" | "none" | "function:<name>"


def check_structured(json_schema=None, grammar=None, tools=None, tool_choice=None, *,
                     grammars: Grammars | None = None, lenient: bool = False) -> Structured | None:
    """The request's options -> a Structured (None: plain text). Each bad value is an InvalidRequest
    naming its parameter; at most one of json_schema, grammar and (tools with a tool_choice other
    than none) constrains an answer."""
    tool_list = _tools(tools)
    choice = _choice(tool_choice, tool_list)
    one_constraint(json_schema is not None, grammar is not None, bool(tool_list) and choice != "none")
    if json_schema is not None:
        return Structured(Grammar("json_schema", json_schema_text(json_schema), "json_schema", lenient))
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidRequest("grammar must be a non-empty string (llguidance's Lark form)", param="grammar")
        return Structured(Grammar("lark", grammar, "grammar"))
    if not tool_list:
        return None
    if choice == "none":
        return Structured(None, tool_list, "none")
    return Structured(Grammar("lark", tool_grammar(tool_list, choice, grammars), "tools"), tool_list, choice)


def one_constraint(json_schema: bool, grammar: bool, tools: bool, names: dict[str, str] | None = None) -> None:
    """At most one of a JSON schema, a grammar and tools (with a tool_choice other than none)
    constrains an answer: the rule for the API and the server alike. `names`: what the caller's
    fields are called where they differ (the server's body: response_format for json_schema)."""
    given = [n for n, v in (("json_schema", json_schema), ("grammar", grammar), ("tools", tools)) if v]
    if len(given) > 1:
        a, b = ((names or {}).get(g, g) for g in given[:2])
        raise InvalidRequest(f"'{a}' and '{b}' cannot be combined: one constraint per answer", param=b)


def check_tool_choice(choice, has_tools: bool) -> None:
    """tool_choice's rules, for the API and the server alike: 'auto', 'required', 'none' or
    {'type': 'function', 'function': {'name': ...}}, and any but 'none' needs tools."""
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and isinstance(
        choice.get("function"), dict) else None
    if not (choice in ("auto", "required", "none") or (isinstance(choice, dict) and choice.get("type") == "function"
                                                        and isinstance(name, str))):
        raise InvalidRequest("tool_choice must be 'auto', 'required', 'none' or {'type': 'function', 'function': "
                             f"{{'name': ...}}}}, got {choice!r:.40}", param="tool_choice")
    if choice != "none" and not has_tools:
        raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")


def _tools(tools) -> tuple[dict, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise InvalidRequest(f"tools must be a list of tools, got {type(tools).__name__}", param="tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"at most {MAX_TOOLS} tools per request, got {len(tools)}", param="tools")
    out, names = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise InvalidRequest(f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                                 "...}}}", param=where)
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
            raise InvalidRequest(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
                                 param=f"{where}.function.name")
        if name in names:
            raise InvalidRequest(f"{where}.function.name {name!r} is listed twice", param=f"{where}.function.name")
        names.add(name)
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise InvalidRequest(f"{where}.function.parameters must be a JSON schema object",
                                 param=f"{where}.function.parameters")
        d = f.get("description")
        if d is not None and not isinstance(d, str):
            raise InvalidRequest(f"{where}.function.description must be a string", param=f"{where}.function.description")
        fn = {"name": name, "parameters": params, **({"description": d} if d else {})}
        out.append({"type": "function", "function": fn})
    return tuple(out)


def _choice(choice, tools: tuple[dict, ...]) -> str:
    if choice is None:
        return "auto" if tools else "none"
    check_tool_choice(choice, bool(tools))
    if isinstance(choice, dict):
        names = [t["function"]["name"] for t in tools]
        name = choice["function"]["name"]
        if name not in names:
            raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools "
                                 f"({', '.join(names)})", param="tool_choice")
        return "function:" + name
    return choice


def tool_grammar(tools: tuple[dict, ...], choice: str, grammars: Grammars | None) -> str:
    """The Lark grammar (llguidance's form, JSON schemas embedded with %json) of the answer."""
    if choice.startswith("function:"):
        tools = tuple(t for t in tools if t["function"]["name"] == choice[len("function:"):])
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "arguments": t["function"]["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = dict(calls[0] if len(calls) == 1 else {"anyOf": calls}, **{"x-guidance": JSON_OPTIONS})
    ids = [grammars.special(TOOL_OPEN), grammars.special(TOOL_CLOSE)] if grammars is not None else [None, None]
    if None not in ids:
        call = f'<[{ids[0]}]> "\\n" %json {json.dumps(schema)} "\\n" <[{ids[1]}]>'
    else:
        call = f"%json {json.dumps(schema)}"
    if choice == "auto":  # text that does not start like a call
        return f"start: call | TEXT\ncall: {call}\nTEXT: /[^{{<][\\s\\S]*/\n"
    return f"start: {call}\n"


def tool_calls(text: str, s: Structured | None, grammars: Grammars | None = None) -> list[dict[str, Any]] | None:
    """The answer's tool call in OpenAI's shape, or None (a text answer, or one cut short). Under
    tool_choice "auto" a model may answer with the call as JSON text (bare or in a ``` fence) instead
    of the call form its grammar offers: that text is a call too when it names a listed tool and its
    arguments pass the tool's schema (checked by the grammar library, given `grammars`)."""
    if s is None or not s.tools or s.tool_choice == "none":
        return None
    body = text.strip()
    if body.startswith(TOOL_OPEN):
        body = body[len(TOOL_OPEN):]
    if body.endswith(TOOL_CLOSE):
        body = body[: -len(TOOL_CLOSE)]
    call = _json(body)
    if call is None and s.tool_choice == "auto" and grammars is not None and body.startswith("```"):
        call = _json(body.strip("`").removeprefix("json"))
        if call is not None and not _valid_call(call, s, grammars):
            call = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return None
    return [{"id": "call_" + secrets.token_hex(12), "type": "function",
             "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}]


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _valid_call(call, s: Structured, grammars: Grammars) -> bool:
    """A call written as text: a listed tool, and arguments its parameters schema accepts (their JSON,
    as the grammar writes it, runs through that schema's grammar to the end of text)."""
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return False
    params = next((t["function"]["parameters"] for t in s.tools if t["function"]["name"] == call["name"]), None)
    if params is None or not isinstance(call["arguments"], dict):
        return False
    try:
        c = grammars.compile(Grammar("json_schema", json.dumps(params), "tools"))
    except InvalidRequest:
        return False
    args = json.dumps(call["arguments"], ensure_ascii=False, separators=(JSON_OPTIONS["item_separator"],
                                                                         JSON_OPTIONS["key_separator"]))
    ids = grammars.tokenizer.encode(args, add_special_tokens=False).ids
    end = grammars.eos_ids[:1]
    return c.check(ids + end) == len(ids) + len(end)


def tools_prompt(tools: tuple[dict, ...]) -> str:
    """A system message that shows the tools to a model whose chat template takes none."""
    lines = [json.dumps(t["function"], ensure_ascii=False, separators=(",", ":")) for t in tools]
    return ("You can call these functions:\n" + "\n".join(lines) + "\nTo call one, answer with only a JSON "
            'object {"name": <function name>, "arguments": <its arguments>}.')


def plain_tool_turns(messages):
    """Earlier tool calls and their results for a chat template that knows neither: a call becomes the
    assistant's JSON, a result a user turn that says it is one. Messages without them pass unchanged."""
    if not isinstance(messages, (list, tuple)):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "tool":
            out.append({"role": "user", "content": f"Tool result: {m.get('content', '')}"})
        elif isinstance(m, dict) and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]
                     if isinstance(c, dict) and isinstance(c.get("function"), dict)]
            text = "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + text).strip()})
        else:
            out.append(m)
    return out
