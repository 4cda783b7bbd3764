"""The front door as docs/server.md states it: a total header budget of 16 KiB however the headers arrive
(one big header, several of 8 KB, thousands of small ones), one Origin and one Host, a 400 for a request
without Host, and `stream_options.include_usage` typed. Raw sockets against the real stack with the fake
engine; every wait has a deadline that fails loudly."""
from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from helpers.fake_server import CHAT, assert_openai_error, chat_body, serve  # noqa: E402,F401

HEADERS_TOO_LARGE = "the request line and headers are over 16 KiB"


def _exchange(port: int, request: bytes, deadline_s: float = 15.0) -> tuple[int, dict]:
    """Sends one raw request, reads until the server closes, returns (status, JSON body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=deadline_s)
    try:
        try:
            sock.sendall(request)
        except OSError:
            pass  # the server may answer and close before a flood is all sent
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                pytest.fail(f"the server kept the connection open for {deadline_s:g} s; got {data[:200]!r}")
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head, "no answer at all"
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _get(port: int, *headers: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    return b"GET /health " + version + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"Connection: close\r\n\r\n"


@pytest.mark.parametrize("name, headers", [
    ("one 20,000-byte header", [b"X-Big: " + b"a" * 20_000]),
    ("three 8 KB headers", [b"X-Big-%d: " % i + b"a" * 8_000 for i in range(3)]),
    ("5,000 small headers", [b"X-%d: a" % i for i in range(5_000)]),
])
def test_the_header_budget_holds_however_the_headers_arrive(serve, name, headers):
    s = serve()
    status, body = _exchange(s.port, _get(s.port, b"Host: 127.0.0.1", *headers))
    err = assert_openai_error(status, body, 400)
    assert (err["code"], err["message"]) == ("headers_too_large", HEADERS_TOO_LARGE), name
    assert s.get("/health")[0] == 200  # the server goes on


def test_headers_under_the_budget_are_served_and_trickled_ones_over_it_are_not(serve):
    s = serve()
    status, body = _exchange(s.port, _get(s.port, b"Host: 127.0.0.1", b"X-Big: " + b"a" * 15_000))
    assert status == 200, body
    # unfinished headers past 16 KiB (h11's own limit, sent without the blank line) are the same 400
    status, body = _exchange(s.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000)
    assert (assert_openai_error(status, body, 400)["code"]) == "headers_too_large"


def test_two_origin_headers_are_refused_whichever_comes_first(serve):
    s = serve()
    own, foreign = f"Origin: http://127.0.0.1:{s.port}".encode(), b"Origin: http://evil.example"
    for first, second in ((own, foreign), (foreign, own), (own, own)):
        status, body = _exchange(s.port, _get(s.port, f"Host: 127.0.0.1:{s.port}".encode(), first, second))
        assert assert_openai_error(status, body, 400)["code"] == "invalid_origin", (first, second)
    status, _ = _exchange(s.port, _get(s.port, f"Host: 127.0.0.1:{s.port}".encode(), own))
    assert status == 200


def test_two_host_headers_are_refused(serve):
    s = serve()
    status, body = _exchange(s.port, _get(s.port, b"Host: 127.0.0.1", b"Host: evil.example"))
    assert assert_openai_error(status, body, 400)["code"] in ("invalid_http", "invalid_host")
    status, body = _exchange(s.port, _get(s.port, b"Host: 127.0.0.1", b"Host: 127.0.0.1", version=b"HTTP/1.0"))
    assert assert_openai_error(status, body, 400)["code"] in ("invalid_http", "invalid_host")


def test_no_host_is_a_400_in_http_1_0_as_in_1_1(serve):
    s = serve()
    status, body = _exchange(s.port, _get(s.port, version=b"HTTP/1.0"))
    assert assert_openai_error(status, body, 400)["code"] == "invalid_host"
    status, body = _exchange(s.port, _get(s.port))
    assert assert_openai_error(status, body, 400)["code"] == "invalid_http"
    assert _exchange(s.port, _get(s.port, b"Host: 127.0.0.1", version=b"HTTP/1.0"))[0] == 200


@pytest.mark.parametrize("value", ["x", 1, 0, [], {}, "true"])
def test_stream_options_include_usage_must_be_a_bool(serve, value):
    s = serve()
    status, _, body = s.post(CHAT, chat_body(stream=True, stream_options={"include_usage": value}))
    err = assert_openai_error(status, body, 400, param="stream_options.include_usage")
    assert "must be true or false" in err["message"]
    assert not s.engine.runs


@pytest.mark.parametrize("value", [True, False, None])
def test_stream_options_include_usage_true_false_or_null_is_served(serve, value):
    s = serve()
    status, _, _ = s.post(CHAT, chat_body(stream=True, stream_options={"include_usage": value}))
    assert status == 200


@pytest.mark.parametrize("path, body, param", [
    (CHAT, chat_body(model=None), "model"),
    ("/v1/completions", {"model": None, "prompt": "hi"}, "model"),
    (CHAT, {"messages": [{"role": "tool", "content": "42", "tool_call_id": "call_1"}]}, "messages[0].role"),
    ("/v1/completions", {"prompt": "hi", "top_logprobs": 3}, "top_logprobs"),
])
def test_what_openai_refuses_is_a_400_naming_the_field(serve, path, body, param):
    """`model` null, a conversation that is a lone tool result, chat's `top_logprobs` on completions."""
    s = serve()
    status, _, answer = s.post(path, body)
    assert_openai_error(status, answer, 400, param=param)
    assert not s.engine.runs
