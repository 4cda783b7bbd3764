"""The bench's peer (bench/peer.py) against a fake llama-server on the loopback: what it is sent (the
target's prompt ids, greedy, no prompt cache), how its answer is read (tokens cut at an end token,
its timings), the bench lines it adds, and a clear error for each bad --peer."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgespec.bench import peer as pr
from edgespec.cli.main import main
from edgespec.errors import InvalidRequest


class FakeServer:
    """POST /completion -> {"tokens": answer, "timings": {...}}; keeps every request body."""

    def __init__(self, answer: dict):
        self.answer = answer
        self.bodies: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                n = int(self.headers["Content-Length"])
                fake.bodies.append(json.loads(self.rfile.read(n)))
                data = json.dumps(fake.answer if self.path == "/completion" else {}).encode()
                self.send_response(200 if self.path == "/completion" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeServer({"tokens": [5, 6, 7, 2, 9, 9], "timings": {"prompt_ms": 20.0, "predicted_ms": 100.0}})
    yield s
    s.close()


def test_llama_server_is_sent_the_ids_and_read_up_to_the_end_token(server):
    r = pr.LlamaServerPeer(server.url + "/").generate([1, 2, 3], 6, stop_ids={2})
    assert r.tokens == [5, 6, 7, 2]  # cut after the end token, as edgespec stops
    assert (r.ttft_s, r.decode_s) == (pytest.approx(0.02), pytest.approx(0.1))
    body = server.bodies[-1]
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 6 and body["top_k"] == 1
    assert body["cache_prompt"] is False and body["return_tokens"] is True


def test_an_answer_without_tokens_is_a_clear_error(server):
    server.answer = {"content": "hi"}
    with pytest.raises(InvalidRequest, match="the answer has no tokens or timings"):
        pr.LlamaServerPeer(server.url).generate([1], 4, stop_ids=set())


def test_a_server_that_does_not_answer_is_a_clear_error():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InvalidRequest, match=f"--peer http://127.0.0.1:{port}: llama-server did not answer"):
        pr.LlamaServerPeer(f"http://127.0.0.1:{port}").generate([1], 4, stop_ids=set())


@pytest.mark.parametrize("spec, gguf, message", [
    ("llamacpp", None, "'llamacpp' is neither llama-cpp, an http:// URL of a llama-server nor edgespec:BUNDLE"),
    ("llama-cpp", "/nonexistent/x.gguf", "no GGUF for the target"),
    ("llama-cpp", None, "no GGUF for the target (source 'some/hf-folder')"),
])
def test_a_bad_peer_is_refused_by_name(spec, gguf, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        pr.open_peer(spec, gguf=gguf, source="some/hf-folder", threads=2, n_ctx=512)


def test_llama_cpp_missing_is_a_clear_error(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(InvalidRequest, match="the llama_cpp module is not installed"):
        pr.open_peer("llama-cpp", gguf=str(gguf), source="x", threads=2, n_ctx=512)


def test_the_bench_runs_each_prompt_through_the_peer_and_prints_it_beside_the_modes(tiny_bundle, server, tmp_path,
                                                                                   capsys):
    from edgespec.models.bundle import Bundle

    server.answer["tokens"] = [40, 41, 42, 43, 44, 45]  # none of them an end token of the tiny vocabulary
    out_json = tmp_path / "run.json"
    argv = ["bench", str(tiny_bundle), "--prompts", "code", "--limit", "2", "--repeats", "1", "--max-new-tokens", "6",
            "--modes", "target,ngram", "--project", "none", "--quiet", "--peer", server.url, "--json", str(out_json)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 2 prompts: 5 decode tokens each in 0.1 s -> 50 tok/s
    assert f"peer: llama-server {server.url}, the same prompts as token ids" in out
    assert "  all: peer 50.0 tok/s; edgespec target " in out and "peer's tokens = target's in 0 of 2" in out
    assert len(server.bodies) == 2
    from edgespec.bench.prompts import load_prompts
    from edgespec.engine import Engine

    eng = Engine.open(Bundle.open(tiny_bundle, verify=False), draft="ngram")
    try:
        assert not set(server.answer["tokens"]) & set(eng.vocab.eos_ids)
        assert server.bodies[0]["prompt"] == eng.encode(**load_prompts("code")[0].request())
    finally:
        eng.close()
    (saved,) = json.loads(out_json.read_text())["meta"]["peers"]
    assert [s["new_tokens"] for s in saved["samples"]] == [6, 6]


def test_two_named_peers_each_get_every_prompt_and_their_own_lines(tiny_bundle, server, capsys):
    """llama.cpp's target alone and its speculative server side by side: each peer runs each prompt once,
    and the report names each by its label, with its own tok/s."""
    fast = FakeServer({"tokens": [40, 41, 42, 43, 44, 45], "timings": {"prompt_ms": 20.0, "predicted_ms": 50.0}})
    try:
        server.answer["tokens"] = [40, 41, 42, 43, 44, 45]
        argv = ["bench", str(tiny_bundle), "--prompts", "code", "--limit", "2", "--repeats", "1", "--max-new-tokens",
                "6", "--modes", "target,ngram", "--project", "none", "--quiet", "--peer", f"alone={server.url}",
                "--peer", f"ngram-mod={fast.url}"]
        assert main(argv) == 0
        out = capsys.readouterr().out
    finally:
        fast.close()
    assert len(server.bodies) == 2 and len(fast.bodies) == 2
    assert f"peer: alone (llama-server {server.url})" in out and "  all: peer 50.0 tok/s;" in out
    assert f"peer: ngram-mod (llama-server {fast.url})" in out and "  all: peer 100.0 tok/s;" in out


def test_another_bundle_runs_beside_as_a_peer_with_the_same_tokens(tiny_bundle, capsys):
    """`--peer edgespec:BUNDLE` (the exact form beside a tuned one): here the same bundle, so its tokens are
    the target's on every prompt; a request its tokenizer reads otherwise is refused by name."""
    argv = ["bench", str(tiny_bundle), "--prompts", "code", "--limit", "2", "--repeats", "1", "--max-new-tokens", "6",
            "--modes", "target,ngram", "--project", "none", "--quiet", "--peer", f"exact=edgespec:{tiny_bundle}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"peer: exact (edgespec {tiny_bundle.name}, target alone)" in out
    assert "peer's tokens = target's in 2 of 2" in out
    p = pr.EdgespecPeer(str(tiny_bundle), threads=1, n_ctx=256)
    try:
        with pytest.raises(InvalidRequest, match="its tokenizer reads the prompt as other ids"):
            p.generate([1, 2, 3], 4, set(), {"prompt": "def fib(n):"})
    finally:
        p.close()


@pytest.mark.parametrize("spec, want", [
    ("http://127.0.0.1:8080", (None, "http://127.0.0.1:8080")),
    ("spec=http://127.0.0.1:8080", ("spec", "http://127.0.0.1:8080")),
    ("http://h:1/x?a=b", (None, "http://h:1/x?a=b")),  # a URL's own '=' is no label
    ("mine=llama-cpp", ("mine", "llama-cpp")),
])
def test_a_peer_may_carry_a_name(spec, want):
    assert pr.split_label(spec) == want


@pytest.mark.parametrize("specs, message", [
    (["=http://127.0.0.1:1"], "give NAME=llama-cpp or NAME=http://HOST:PORT"),
    (["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"], "two peers are named 'a'"),
    (["http://127.0.0.1:1", "http://127.0.0.1:1"], "two peers are named 'llama-server http://127.0.0.1:1'"),
])
def test_peers_that_cannot_be_told_apart_are_refused(specs, message):
    with pytest.raises(InvalidRequest, match=message):
        pr.open_peers(specs, gguf=None, source="x", threads=2, n_ctx=512)


def test_peer_gguf_alone_is_refused(tiny_bundle, capsys):
    assert main(["bench", str(tiny_bundle), "--peer-gguf", "x.gguf", "--project", "none"]) != 0
    assert "--peer-gguf needs --peer llama-cpp" in capsys.readouterr().err
