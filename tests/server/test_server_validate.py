"""Request validation: every bad field gets a 400 that names it; good bodies map to engine arguments.
The HTTP layer checks a body's shape and types and the OpenAI-only rules; a value's range is the
engine's request options' (engine/requests.py Options) to check, once, its refusal answered in the
client's names (GenRequest.client_error): `refusal` below takes a body down the same two steps."""
from __future__ import annotations

import json

import pytest

from edgespec.engine.requests import Options
from edgespec.errors import InvalidRequest
from edgespec.limits import JSON_DEPTH_LIMIT, K_LIMIT, SEED_LIMIT, STOP_LIMIT, TEMPERATURE_LIMIT, TOP_K_LIMIT
from edgespec.server.apierror import APIError
from edgespec.server.validate import Limits, parse_chat, parse_completion, parse_json

LIMITS = Limits(model_names=("tiny", "alias"), max_tokens_limit=100, default_max_tokens=20, default_temperature=0.0)
MSG = [{"role": "user", "content": "hi"}]
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def chat(**kw):
    body = {"model": "tiny", "messages": MSG}
    body.update(kw)
    return body


def bad(fn, body, param=None, code=None, contains=None):
    with pytest.raises(APIError) as ei:
        fn(body, LIMITS)
    e = ei.value
    assert e.status == 400
    assert e.body()["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert e.param == param, e.message
    if code is not None:
        assert e.code == code
    if contains is not None:
        assert contains in e.message
    return e


def refusal(body, fn=parse_chat) -> APIError:
    """The 400 the server answers `body` with before queueing it: the HTTP layer's, else the engine's
    (its request options made from the body, as prepare() makes them first) in the client's names."""
    req = fn(body, LIMITS)
    with pytest.raises(InvalidRequest) as e:
        Options(**req.engine_kwargs())
    err = req.client_error(e.value)
    assert err.status == 400 and err.body()["error"]["type"] == "invalid_request_error"
    return err


def test_good_chat_maps_to_engine_arguments():
    r = parse_chat(chat(max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop="\n\n",
                        stream=True, stream_options={"include_usage": True}, draft="ngram", draft_k=3,
                        user="someone", metadata={"x": 1}), LIMITS)
    kw = r.engine_kwargs()
    assert kw == dict(max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop=["\n\n"],
                      messages=[{"role": "user", "content": "hi"}], draft="ngram", k=3)
    assert r.stream and r.include_usage and r.model == "tiny"


def test_tree_is_passed_to_the_engine():
    assert parse_chat(chat(tree="on"), LIMITS).engine_kwargs()["tree"] == "on"
    assert "tree" not in parse_chat(chat(), LIMITS).engine_kwargs()


def test_defaults_come_from_the_server_limits():
    r = parse_chat({"messages": MSG}, LIMITS)
    assert r.model == "tiny" and r.max_tokens == 20 and r.temperature == 0.0 and r.top_p == 1.0
    assert "draft" not in r.engine_kwargs() and "k" not in r.engine_kwargs()
    assert not r.include_usage


def test_content_parts_developer_role_and_newer_token_field():
    r = parse_chat(chat(messages=[{"role": "developer", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                        max_completion_tokens=9), LIMITS)
    assert r.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert r.max_tokens == 9


def test_good_completion():
    r = parse_completion({"model": "alias", "prompt": ["def f():"], "max_tokens": 5}, LIMITS)
    assert r.engine_kwargs()["prompt"] == "def f():" and r.kind == "completion"


@pytest.mark.parametrize("raw, contains", [
    (b"", "empty"),
    (b"   ", "empty"),
    (b"{", "not valid JSON"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": Infinity}', "Infinity"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_malformed_json(raw, contains):
    with pytest.raises(APIError) as ei:
        parse_json(raw)
    assert ei.value.status == 400 and contains in ei.value.message and ei.value.code == "invalid_json"


@pytest.mark.parametrize("body, param, contains", [
    ([], None, "JSON object"),
    ("hi", None, "JSON object"),
    ({"model": "tiny"}, "messages", "required"),
    (chat(messages=[]), "messages", "non-empty"),
    (chat(messages="hi"), "messages", "non-empty"),
    (chat(messages=["hi"]), "messages[0]", "object"),
    (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role", "one of"),
    (chat(messages=[{"content": "x"}]), "messages[0].role", "one of"),
    (chat(messages=[{"role": "function", "content": "x"}]), "messages[0].role", "older function calling"),
    (chat(messages=[{"role": "tool", "content": "x", "tool_call_id": 3}]), "messages[0].tool_call_id", "a string"),
    (chat(messages=[{"role": "assistant", "tool_calls": {"a": 1}}]), "messages[0].tool_calls", "an array"),
    (chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]),
     "messages[0].tool_calls[0]", "a JSON object as text"),
    (chat(messages=[{"role": "user"}]), "messages[0].content", "missing"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", "string"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), "messages[0].content", "text part"),
    (chat(model=5), "model", "string"),
    (chat(model=None), "model", "must be a string, got null"),
    (chat(messages=[{"role": "tool", "content": "42", "tool_call_id": "call_1"}]), "messages[0].role",
     "a message with role 'tool' must be a response to a preceding message with 'tool_calls'"),
    (chat(messages=[*MSG, {"role": "assistant", "content": "let me see"}, {"role": "tool", "content": "42"}]),
     "messages[2].role", "must be a response to a preceding message with 'tool_calls'"),
    (chat(messages=[*MSG, CALL, {"role": "tool", "content": "42"}, *MSG, {"role": "tool", "content": "43"}]),
     "messages[4].role", "must be a response to a preceding message with 'tool_calls'"),
    (chat(model="gpt-4"), "model", "not served"),
    (chat(max_tokens=101), "max_tokens", "at most 100"),
    (chat(max_tokens="10"), "max_tokens", "integer"),
    (chat(max_tokens=1.5), "max_tokens", "integer"),
    (chat(max_tokens=True), "max_tokens", "integer"),
    (chat(temperature=2.5), "temperature", "must be at most 2, got 2.5"),  # OpenAI's bound, the HTTP layer's own
    (chat(draft=["model"]), "draft", "must be a string, got array"),
    (chat(tree=1), "tree", "must be a string, got number"),
    (chat(draft_k="4"), "draft_k", "must be an integer"),
    (chat(top_p="all"), "top_p", "must be a number"),
    (chat(temperature="hot"), "temperature", "number"),
    (chat(top_k=2.5), "top_k", "integer"),
    (chat(seed="x"), "seed", "integer"),
    (chat(stop=5), "stop", "string"),
    (chat(stop=["a", 1]), "stop", "string"),
    (chat(stream="yes"), "stream", "true or false"),
    (chat(stream_options=3), "stream_options", "object"),
    (chat(n=2), "n", "1"),
    (chat(n=0), "n", ">= 1"),
    (chat(presence_penalty=0.5), "presence_penalty", "not supported"),
    (chat(frequency_penalty=3), "frequency_penalty", "[-2, 2]"),
    (chat(logprobs=True), "logprobs", "not supported"),
    (chat(tools={"type": "function"}), "tools", "must be an array"),
    (chat(response_format={"type": "xml"}), "response_format.type", "must be one of text, json_object"),
    (chat(response_format="json"), "response_format", "must be an object"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
     "response_format.json_schema.strict", "true or false"),
    (chat(tool_choice="required"), "tool_choice", "needs 'tools'"),
    (chat(tools=[{"type": "function"}], tool_choice="sometimes"), "tool_choice", "must be 'auto'"),
    (chat(response_format={"type": "json_object"}, grammar="start: \"x\""), "grammar", "cannot be combined"),
    (chat(grammar=5), "grammar", "must be a string (llguidance's Lark form), got number"),
    (chat(parallel_tool_calls="yes"), "parallel_tool_calls", "true or false"),
    (chat(logit_bias={"5": 1}), "logit_bias", "not supported"),
])
def test_bad_chat_fields(body, param, contains):
    bad(parse_chat, body, param, contains=contains)


# a value out of the engine's range: the HTTP layer passes it on as sent (one check, the engine's), and
# the 400 is the engine's message in the client's names (draft_k, not the engine's k)
NAMES = "auto, model, suffix, docs, recycle, ngram, self, heads, grammar, none"
ENGINE_REFUSED = [
    (chat(max_tokens=0), "max_tokens", "'max_tokens' must be an integer >= 1, got 0"),
    (chat(max_tokens=-3), "max_tokens", "'max_tokens' must be an integer >= 1, got -3"),
    (chat(max_completion_tokens=0), "max_completion_tokens", "'max_completion_tokens' must be an integer >= 1, got 0"),
    (chat(temperature=-0.1), "temperature", "'temperature' must be a number >= 0 (0 = greedy), got -0.1"),
    (chat(top_p=0), "top_p", "'top_p' must be in (0, 1], got 0.0"),
    (chat(top_p=1.5), "top_p", "'top_p' must be in (0, 1], got 1.5"),
    (chat(top_k=-1), "top_k", f"'top_k' must be an integer from 0 (off) to {TOP_K_LIMIT}, got -1"),
    (chat(seed=-1), "seed", f"'seed' must be an integer from 0 to {SEED_LIMIT}, got -1"),
    (chat(stop=["a"] * (STOP_LIMIT + 1)), "stop", f"at most {STOP_LIMIT} stop strings, got {STOP_LIMIT + 1}"),
    (chat(stop=[""]), "stop", "'stop' strings must not be empty"),
    (chat(draft="magic"), "draft", f"unknown drafter 'magic': choose one of {NAMES}"),
    (chat(draft_k=0), "draft_k", f"'draft_k' must be an integer from 1 to {K_LIMIT} (or left out: chosen each round), got 0"),
    (chat(draft_k=99), "draft_k", f"'draft_k' must be an integer from 1 to {K_LIMIT} (or left out: chosen each round), got 99"),
    (chat(tree="wide"), "tree", "unknown tree mode 'wide': choose one of auto, on, off"),
]


@pytest.mark.parametrize("body, param, message", ENGINE_REFUSED)
def test_a_value_out_of_range_is_the_engines_refusal_in_the_clients_names(body, param, message):
    field = next(k for k in body if k not in ("model", "messages"))
    sent = body[field]
    kw = parse_chat(body, LIMITS).engine_kwargs()  # the HTTP layer does not check the range ...
    assert kw[{"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "draft_k": "k"}.get(
        field, field)] == sent
    e = refusal(body)  # ... the engine does, once
    assert (e.param, e.message) == (param, message)


# every limit is edgespec/limits.py's (or this server's --max-tokens-limit), checked once: at the bound a
# request passes both layers with the value the client sent; one past it is a 400 naming the client's
# field, from the layer that owns the limit
@pytest.mark.parametrize("field, at, past, kwarg, owner", [
    ("stop", ["x"] * STOP_LIMIT, ["x"] * (STOP_LIMIT + 1), "stop", "engine"),
    ("top_k", TOP_K_LIMIT, TOP_K_LIMIT + 1, "top_k", "engine"),
    ("seed", SEED_LIMIT, SEED_LIMIT + 1, "seed", "engine"),
    ("draft_k", K_LIMIT, K_LIMIT + 1, "k", "engine"),
    ("temperature", TEMPERATURE_LIMIT, TEMPERATURE_LIMIT + 0.01, "temperature", "http"),  # OpenAI's bound
    ("max_tokens", LIMITS.max_tokens_limit, LIMITS.max_tokens_limit + 1, "max_new_tokens", "http"),
    ("max_completion_tokens", LIMITS.max_tokens_limit, LIMITS.max_tokens_limit + 1, "max_new_tokens", "http"),
])
def test_each_limit_at_its_bound_and_one_past(field, at, past, kwarg, owner):
    kw = parse_chat(chat(**{field: at}), LIMITS).engine_kwargs()
    assert kw[kwarg] == at
    Options(**kw)  # the engine takes it
    e = bad(parse_chat, chat(**{field: past}), field) if owner == "http" else refusal(chat(**{field: past}))
    assert e.param == field


def test_an_engine_refusal_of_an_option_the_client_did_not_name_keeps_its_message():
    req = parse_chat(chat(), LIMITS)
    e = req.client_error(InvalidRequest("draft='model' is not possible: the bundle has no draft model", param="draft"))
    assert (e.param, e.message) == ("draft", "draft='model' is not possible: the bundle has no draft model")
    e = req.client_error(InvalidRequest("prompt is " + "x" * 5000, param="prompt"))
    assert e.param == "prompt" and e.message.startswith("'prompt' is xxx") and len(e.message) < 300


@pytest.mark.parametrize("body, param, contains", [
    ({"model": "tiny"}, "prompt", "required"),
    ({"prompt": 5}, "prompt", "string"),
    ({"prompt": ["a", "b"]}, "prompt", "one string"),
    ({"prompt": [1, 2, 3]}, "prompt", "token ids"),
    ({"prompt": "x", "echo": True}, "echo", "not supported"),
    ({"prompt": "x", "best_of": 3}, "best_of", "1"),
    ({"prompt": "x", "logprobs": 2}, "logprobs", "not supported"),
    ({"prompt": "x", "top_logprobs": 2}, "top_logprobs", "not supported by this server (no log-probabilities)"),
    ({"prompt": "x", "model": None}, "model", "must be a string, got null"),
    ({"prompt": "x", "suffix": "end"}, "suffix", "not supported"),
])
def test_bad_completion_fields(body, param, contains):
    bad(parse_completion, body, param, contains=contains)


def test_the_turn_orders_openai_accepts_are_accepted():
    """Tool results after the call (several in a row), and conversations without a user turn (a system
    prompt alone, an assistant's words to continue), which OpenAI's API answers too."""
    for messages in ([*MSG, CALL, {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}],
                     [{"role": "system", "content": "Greet the visitor."}],
                     [{"role": "assistant", "content": "Welcome"}]):
        assert len(parse_chat(chat(messages=messages), LIMITS).messages) == len(messages)


def test_model_left_out_is_the_served_one_and_no_op_top_logprobs_is_accepted():
    assert parse_chat({"messages": MSG}, LIMITS).model == "tiny"
    assert parse_completion({"prompt": "x", "top_logprobs": 0, "logprobs": 0}, LIMITS).model == "tiny"


def test_unknown_model_error_names_the_served_one():
    e = bad(parse_chat, chat(model="llama"), "model", code="model_not_found")
    assert "'tiny'" in e.message and "/v1/models" in e.message


def test_no_op_values_of_unsupported_features_are_accepted():
    r = parse_chat(chat(n=1, logprobs=False, tools=[], presence_penalty=0, frequency_penalty=0.0,
                        response_format={"type": "text"}, logit_bias={}, tool_choice="none"), LIMITS)
    assert r.max_tokens == 20


def test_whole_number_floats_are_integers():
    assert parse_chat(chat(max_tokens=16.0), LIMITS).max_tokens == 16


# --- the validation layer raises nothing but a 400 ---------------------------------------------------
def test_nesting_is_limited_without_recursion():
    ok = {"a": 1}
    for _ in range(JSON_DEPTH_LIMIT):  # the limit's levels below the top-level object
        ok = {"a": ok}
    parse_json(json.dumps(ok).encode())
    with pytest.raises(APIError, match=f"at most {JSON_DEPTH_LIMIT} levels"):
        parse_json(json.dumps({"a": ok}).encode())  # one level past the limit
    too_deep = b"[" * (JSON_DEPTH_LIMIT + 2) + b"]" * (JSON_DEPTH_LIMIT + 2)
    with pytest.raises(APIError, match="nested too deeply") as e:
        parse_json(too_deep)
    assert e.value.status == 400
    with pytest.raises(APIError, match="nested too deeply"):
        parse_json(b"[" * 200_000 + b"]" * 200_000)  # beyond the interpreter's recursion limit


def test_lone_surrogates_are_refused_naming_the_field():
    with pytest.raises(APIError) as e:
        parse_json(b'{"messages":[{"role":"user","content":"a\\ud800b"}]}')
    assert e.value.status == 400 and e.value.param == "messages[0].content" and "surrogate" in e.value.message
    parse_json('{"prompt":"\\ud83d\\ude00 a real pair"}'.encode())  # an escaped surrogate pair is one character


def test_huge_numbers_are_400s():
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        bad(parse_chat, chat(**{name: 10**400}), name)  # no float holds it
    for name in ("top_k", "seed"):  # an integer: the engine compares it without converting
        e = refusal(chat(**{name: 10**400}))
        assert e.param == name and e.message.startswith(f"'{name}' must be an integer from 0") and len(e.message) < 300


def test_a_missed_case_is_still_a_400(monkeypatch, caplog):
    from edgespec.server import validate

    def broken(body, limits):
        raise KeyError("a check that forgot a type")

    monkeypatch.setattr(validate, "parse_chat", broken)
    with pytest.raises(APIError) as e:
        validate.parse_request("chat", b'{"messages": []}', LIMITS)
    assert e.value.status == 400 and "KeyError" in e.value.message
    assert "a specific check is missing" in caplog.text


def test_role_of_any_type_is_a_400():
    for role in (["user"], {"a": 1}, 1, None, True):
        bad(parse_chat, chat(messages=[{"role": role, "content": "x"}]), "messages[0].role")


# --- the same refusals from a running server, serial and batched ---------------------------------
@pytest.fixture(scope="module", params=[1, 2], ids=["parallel-1", "parallel-2"])
def served(request, tiny_bundle):
    """A real server on the tiny bundle (each engine's own prepare), at --parallel 1 and 2."""
    pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")
    from helpers.running import RunningServer

    r = RunningServer(tiny_bundle, parallel=request.param)
    yield r
    r.stop()


def _post(server, path, body):
    import http.client

    from helpers.running import DEADLINE

    conn = http.client.HTTPConnection("127.0.0.1", server.service.port, timeout=DEADLINE)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("path, body, param, message", [
    *(("/v1/chat/completions", {k: v for k, v in body.items() if k != "model"}, param, message)
      for body, param, message in ENGINE_REFUSED),
    ("/v1/completions", {"prompt": ""}, "prompt", "'prompt' is empty"),
    ("/v1/chat/completions", {"messages": MSG, "grammar": " "}, "grammar",
     "'grammar' must be a non-empty string (llguidance's Lark form)"),
])
def test_both_servers_refuse_a_value_the_engine_checks_the_same_way_before_queueing_it(served, path, body, param, message):
    sched = served.service.state.scheduler
    submitted = []
    real_submit = sched.submit
    sched.submit = lambda job: submitted.append(job.id) or real_submit(job)
    try:
        status, answer = _post(served, path, {"max_tokens": 2, **body})
    finally:
        sched.submit = real_submit
    assert (status, answer["error"]["param"], answer["error"]["message"]) == (400, param, message), answer
    assert submitted == [] and sched.depth == 0  # refused by the handler: no engine time
