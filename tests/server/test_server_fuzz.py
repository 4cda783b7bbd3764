"""The hostile-client probe kept as a test: malformed and random requests against the real HTTP stack
(uvicorn + the app, a fake engine). Every answer must be a 4xx OpenAI-style JSON error (or a 200
when the random value happens to be valid), never a 5xx, and the next normal request must still
answer exactly as before.

Cases: the probe's table (ISSUE_CASES) plus, for every field a request may carry, a fixed set of JSON
values of every type (VALUES) and a seeded random sample of nested values: deterministic, so a
failure names the field and the value and reproduces.
"""
from __future__ import annotations

import json
import random
import socket

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from helpers.fake_server import CHAT, COMP, FakeEngine, Server, chat_body, wait_until  # noqa: E402

BASELINE = " w0 w1 w2 w3"
HUGE = int("9" * 400)  # the probe's 400-digit integer

# (path, raw body bytes) from the probe, each once answered 500
ISSUE_CASES = [
    (CHAT, json.dumps(chat_body(temperature=HUGE)).encode()),
    (CHAT, json.dumps(chat_body(top_p=HUGE)).encode()),
    (CHAT, json.dumps(chat_body(presence_penalty=HUGE)).encode()),
    (CHAT, json.dumps(chat_body(frequency_penalty=-HUGE)).encode()),
    (CHAT, json.dumps(chat_body(top_k=HUGE)).encode()),
    (CHAT, b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    (CHAT, b"[" * 100_000 + b"]" * 100_000),
    (CHAT, b'{"messages":' + b"[" * 5_000 + b"]" * 5_000 + b"}"),
    (CHAT, b'{"messages":[{"role":["user"],"content":"x"}]}'),
    (CHAT, b'{"messages":[{"role":{"a":1},"content":"x"}]}'),
    (COMP, b'{"prompt":"a\\ud800b"}'),
    (CHAT, b'{"messages":[{"role":"user","content":"a\\ud800b"}]}'),
    (CHAT, b'{"messages":[{"role":"user","content":[{"type":"text","text":"\\udfff"}]}]}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"stop":["\\ud800"]}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"model":"\\ud800"}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"\\ud800":1}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"draft":["model"]}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"draft":{"a":1}}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"max_tokens":1e400}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"seed":' + b"9" * 4000 + b"}"),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"max_tokens":' + b"9" * 5000 + b"}"),
    (CHAT, b"\xff\xfe{}"),
    (CHAT, b"null"),
    (CHAT, b'"just a string"'),
]

FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
          "stop", "stream", "stream_options", "n", "best_of", "presence_penalty", "frequency_penalty",
          "logit_bias", "tools", "functions", "tool_choice", "response_format", "draft", "draft_k", "logprobs",
          "top_logprobs", "user", "tree", "messages[0]", "messages[0].role", "messages[0].content",
          "messages[0].content[0]", "messages[0].content[0].text"]
COMP_FIELDS = ["prompt", "echo", "suffix", "logprobs", "max_tokens", "stop"]

# JSON values of every type, the awkward ones in particular
VALUES = [
    None, True, False, 0, 1, -1, 2, 7, 2**31, 2**63, -(2**63) - 1, HUGE, -HUGE, 0.5, -0.0, 1e-320, 1e308, -1e308,
    3.0, "", " ", "x", "auto", "user", "text", "a\ud800b", "\udfff", "<|im_end|>", "\x00", "é" * 3, "9" * 50,
    [], [None], [1, 2], ["a", "b"], [[[]]], [{"type": "text", "text": "hi"}], [{"type": "image_url"}],
    {}, {"a": 1}, {"type": "text"}, {"include_usage": True}, {"role": "user", "content": "x"},
    {"a": {"b": {"c": {"d": {}}}}},
]


def random_value(rng: random.Random, depth: int = 0):
    """A random JSON value of any type, nested up to a few levels."""
    kinds = ["null", "bool", "int", "bigint", "float", "str", "list", "dict"] if depth < 4 else \
        ["null", "bool", "int", "float", "str"]
    k = rng.choice(kinds)
    if k == "null":
        return None
    if k == "bool":
        return rng.random() < 0.5
    if k == "int":
        return rng.randint(-5, 5000)
    if k == "bigint":
        return rng.choice([1, -1]) * rng.randint(2**62, 10**rng.randint(20, 300))
    if k == "float":
        return rng.choice([rng.uniform(-3, 3), rng.uniform(-1e300, 1e300), rng.random() * 1e-300])
    if k == "str":
        alphabet = "ab <|>\n\\\"'\x01é\ud800\udfff漢"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    if k == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "type", "text", "role", "content"]): random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


RANDOM_PER_FIELD = 12


def values_for(field: str) -> list:
    rng = random.Random(f"edgespec-fuzz-{field}")
    return VALUES + [random_value(rng) for _ in range(RANDOM_PER_FIELD)]


def with_value(body: dict, field: str, value) -> dict:
    """`body` with `field` (a path such as messages[0].content[0].text) set to `value`."""
    body = json.loads(json.dumps(body))
    if field.startswith("messages[0].content[0]"):
        body["messages"][0]["content"] = [{"type": "text", "text": "hello there"}]
    if field == "messages[0]":
        body["messages"][0] = value
    elif field.startswith("messages[0]."):
        rest = field[len("messages[0]."):]
        msg = body["messages"][0]
        if rest == "content[0]":
            msg["content"][0] = value
        elif rest == "content[0].text":
            msg["content"][0]["text"] = value
        else:
            msg[rest] = value
    else:
        body[field] = value
    return body


@pytest.fixture(scope="module")
def server():
    s = Server(FakeEngine())
    yield s
    s.stop()


def check_answer(status: int, headers, raw: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {raw[:300]!r}"
    if status == 200:
        return
    assert 400 <= status < 500, f"{what}: {status}"
    assert headers["content-type"] == "application/json", f"{what}: {headers['content-type']}"
    body = json.loads(raw)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, what
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], what


def check_still_serving(s: Server, what: str) -> None:
    status, _, ok = s.post(CHAT, chat_body())
    assert status == 200 and ok["choices"][0]["message"]["content"] == BASELINE, f"after {what}: {status} {ok}"


CASES_RUN: dict[str, int] = {}  # case -> requests of it that went over the wire and were answered


@pytest.mark.parametrize("i", range(len(ISSUE_CASES)))
def test_probe_cases_are_4xx(server, i):
    path, raw = ISSUE_CASES[i]
    status, headers, body = server.request("POST", path, raw, {"Content-Type": "application/json"})
    check_answer(status, headers, body, f"case {i} {raw[:80]!r}")
    assert status == 400, (status, body[:200])
    check_still_serving(server, f"case {i}")
    CASES_RUN[f"probe {i}"] = 1


def test_surrogate_errors_name_the_field(server):
    status, _, body = server.request("POST", CHAT, b'{"messages":[{"role":"user","content":"a\\ud800b"}]}',
                                     {"Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["error"]["param"] == "messages[0].content"
    status, _, body = server.request("POST", COMP, b'{"prompt":"a\\ud800b"}', {"Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["error"]["param"] == "prompt"


@pytest.mark.parametrize("path, field", [(CHAT, f) for f in FIELDS] + [(COMP, f) for f in COMP_FIELDS])
def test_every_field_with_every_kind_of_value(server, path, field):
    base = chat_body() if path == CHAT else {"model": "fake", "prompt": "hello there", "max_tokens": 4}
    for value in values_for(field):
        raw = json.dumps(with_value(base, field, value)).encode()
        what = f"{path} {field}={value!r:.80}"
        status, headers, body = server.request("POST", path, raw)
        check_answer(status, headers, body, what)
        check_still_serving(server, what)
        CASES_RUN[f"{path} {field}"] = CASES_RUN.get(f"{path} {field}", 0) + 1


def test_a_client_hanging_up_mid_body_is_not_a_500(server):
    before = server.service.state.metrics.requests.copy()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"messages\": [")
    sock.close()
    m = server.service.state.metrics
    wait_until(lambda: m.requests[("chat", 499)] > before.get(("chat", 499), 0), what="the 499 to be counted")
    assert m.requests[("chat", 500)] == before.get(("chat", 500), 0)
    check_still_serving(server, "a hang-up mid-body")


def test_case_count_is_reported(server):
    """Runs last in this module: every case that started went over the wire in full (each field with
    every one of its values), and a whole-module run sent them all (at least 1500)."""
    want = {f"probe {i}": 1 for i in range(len(ISSUE_CASES))}
    want |= {f"{path} {f}": len(VALUES) + RANDOM_PER_FIELD for path, fields in ((CHAT, FIELDS), (COMP, COMP_FIELDS))
             for f in fields}
    if not CASES_RUN:
        pytest.skip("no fuzz case ran in this session (run the module, not this test alone)")
    assert CASES_RUN == {k: want[k] for k in CASES_RUN}
    run = sum(CASES_RUN.values())
    if len(CASES_RUN) == len(want):
        assert run == sum(want.values()) >= 1500
    print(f"\nfuzz cases: {run} of {sum(want.values())} run in this session")
