"""Structured output through the real `openai` client against `edgespec serve` on a tiny bundle:
response_format (json_schema, json_object), tools with each tool_choice, streamed tool calls, the
batched server, and one 400 naming the field for each bad input."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")
jsonschema = pytest.importorskip("jsonschema", reason="the test extra is not installed (pip install .[test])")

from edgespec.engine import Engine  # noqa: E402
from helpers.running import RunningServer  # noqa: E402

MESSAGES = [{"role": "user", "content": "Report the pump's state."}]
# bounded, so the tiny model's answers end inside max_tokens
SCHEMA = {"type": "object", "properties": {
    "device": {"type": "string", "maxLength": 8}, "status": {"enum": ["ok", "warning", "fault"]},
    "level": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["device", "status", "level"], "additionalProperties": False}
# small: the tiny tokenizer spends about a token per character, and the prompt shows the tools
TOOLS = [
    {"type": "function", "function": {"name": "valve", "description": "open a valve", "parameters": {
        "type": "object", "properties": {"v": {"type": "integer", "minimum": 1, "maximum": 9}, "on": {"type": "boolean"}},
        "required": ["v", "on"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "sensor", "parameters": {
        "type": "object", "properties": {"s": {"enum": ["temp", "bar"]}}, "required": ["s"],
        "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def json_format(schema=SCHEMA, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "report", "schema": schema, "strict": strict}}


@pytest.fixture(scope="module")
def server(tiny_bundle):
    r = RunningServer(tiny_bundle, max_len=512)  # the tools' descriptions take ~400 tiny tokens
    yield r
    r.stop()


@pytest.fixture(scope="module")
def alone(tiny_bundle):
    eng = Engine.open(tiny_bundle, max_len=512, draft="none", verify=False)
    yield eng
    eng.close()


@pytest.mark.parametrize("draft", ["none", "grammar", "model", "auto"])
def test_json_schema_answers_validate_and_equal_the_constrained_target_alone(server, alone, draft):
    ref = alone.generate(messages=MESSAGES, max_new_tokens=60, json_schema=SCHEMA)
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=60,
                                                 temperature=0, response_format=json_format(),
                                                 extra_body={"draft": draft})
    text = resp.choices[0].message.content
    assert text == ref.text
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)
    stats = resp.model_extra["edgespec"]
    if draft == "grammar":  # the forced keys, quotes and braces were drafted and accepted
        assert stats["accepted"] >= 5 and stats["target_passes"] < stats["new_tokens"]


def test_json_object_and_streamed_json(server):
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=60,
                                                 response_format={"type": "json_object"})
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(resp.choices[0].message.content), dict)
    else:
        assert resp.choices[0].message.content.startswith("{")
    chunks = list(server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=60,
                                                        response_format=json_format(), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "sensor"}}, "auto"])
def test_tools_return_tool_calls_whose_arguments_validate(server, choice):
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=90,
                                                 tools=TOOLS, tool_choice=choice)
    c = resp.choices[0]
    if choice == "auto" and not c.message.tool_calls:  # auto may answer in text: then it is not a call
        assert c.finish_reason in ("stop", "length") and not c.message.content.lstrip().startswith("{")
        return
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "sensor"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_streamed_tool_call_deltas_assemble_to_the_call(server):
    whole = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=90,
                                                  tools=TOOLS, tool_choice="required")
    chunks = list(server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=90,
                                                        tools=TOOLS, tool_choice="required", stream=True))
    name, args, content = "", "", ""
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            assert tc.index == 0
            name += (tc.function.name or "") if tc.function else ""
            args += (tc.function.arguments or "") if tc.function else ""
    assert content == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    want = whole.choices[0].message.tool_calls[0].function
    assert (name, json.loads(args)) == (want.name, json.loads(want.arguments))


def test_a_tool_result_sent_back_continues_the_conversation(server):
    """The agent loop: the call comes back as the assistant's message, its result as a tool message."""
    first = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=90,
                                                  tools=TOOLS, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    follow = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=follow, max_tokens=20)
    assert isinstance(resp.choices[0].message.content, str) and resp.choices[0].finish_reason in ("stop", "length")
    bad = [*MESSAGES, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "valve",
                                                                                           "arguments": "{oops"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model=server.bundle.name, messages=bad, max_tokens=5)
    assert e.value.body["param"] == "messages[1].tool_calls[0]"


def test_auto_reads_a_call_written_as_fenced_json_only_when_it_passes_the_tools_schema(alone):
    """A model may answer tool_choice auto with the call as ```json text: a listed tool with valid
    arguments is a call; an unknown tool, bad arguments or plain text stay text."""
    from edgespec.engine.structured import check_structured, tool_calls

    gs = alone.vocab.grammars
    st = check_structured(tools=TOOLS, tool_choice="auto", grammars=gs)
    fenced = '```json\n{\n  "name": "valve",\n  "arguments": {"v": 3, "on": true}\n}\n```'
    (call,) = tool_calls(fenced, st, gs)
    assert call["function"] == {"name": "valve", "arguments": '{"v": 3, "on": true}'}
    assert tool_calls(fenced.replace('"valve"', '"pump"'), st, gs) is None
    assert tool_calls(fenced.replace("3", "30"), st, gs) is None  # v is at most 9
    assert tool_calls("```python\nprint(1)\n```", st, gs) is None
    required = check_structured(tools=TOOLS, tool_choice="required", grammars=gs)
    assert tool_calls(fenced, required, gs) is None  # the grammar wrote required calls; no text is read as one


def test_tool_choice_none_answers_in_text(server):
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=20,
                                                 tools=TOOLS, tool_choice="none")
    assert resp.choices[0].message.tool_calls is None and isinstance(resp.choices[0].message.content, str)


@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "xml"}), "response_format.type"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format.json_schema"),
    (dict(response_format=json_format({"type": "object", "properties": {"a": {"type": "strin"}}})), "json_schema"),
    (dict(response_format=json_format({"type": "string", "format": "no-such-format"})), "json_schema"),
    (dict(response_format=json_format(), tools=TOOLS), "tools"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(extra_body={"grammar": "start: nope"}), "grammar"),
])
def test_bad_structured_requests_are_one_400_naming_the_field(server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=10, **kwargs)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body


def test_non_strict_schema_ignores_unknown_keywords(server):
    schema = {"type": "string", "format": "no-such-format", "maxLength": 5}
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=MESSAGES, max_tokens=20,
                                                 response_format=json_format(schema, strict=False))
    assert isinstance(json.loads(resp.choices[0].message.content), str)


def test_the_batched_server_honours_each_requests_constraint(tiny_bundle, alone):
    r = RunningServer(tiny_bundle, parallel=3, max_len=512)
    try:
        ref = alone.generate(messages=MESSAGES, max_new_tokens=60, json_schema=SCHEMA)
        resp = r.client.chat.completions.create(model=r.bundle.name, messages=MESSAGES, max_tokens=60,
                                                response_format=json_format(), extra_body={"draft": "auto"})
        assert resp.choices[0].message.content == ref.text
        tools = r.client.chat.completions.create(model=r.bundle.name, messages=MESSAGES, max_tokens=90,
                                                 tools=TOOLS, tool_choice="required")
        (call,) = tools.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    finally:
        r.stop()
