"""POST /v1/embeddings: OpenAI's shape (the real `openai` client, float and base64), the embedder beside a
fake engine, and each bad request answered with one OpenAI error naming its field."""
from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.docs.embedder import load_embedder  # noqa: E402
from helpers.fake_server import assert_openai_error, serve  # noqa: E402,F401

EMB = "/v1/embeddings"


@pytest.fixture
def server(serve, tiny_embedder_dir):  # noqa: F811
    s = serve()
    s.service.state.embedder = load_embedder(tiny_embedder_dir)
    return s


def test_the_openai_client_gets_the_embedders_vectors(server, tiny_embedder_dir):
    openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)
    want = load_embedder(tiny_embedder_dir).embed(["the museum opens at nine", "where is the lift?"])
    got = client.embeddings.create(model="tiny-bert", input=["the museum opens at nine", "where is the lift?"])
    assert [d.index for d in got.data] == [0, 1]
    assert np.allclose(np.array([d.embedding for d in got.data]), want, atol=1e-6)  # the client asked for base64
    assert got.usage.prompt_tokens == got.usage.total_tokens == 14  # (5 words + [CLS] + [SEP]) and (4 words + "?" + both)
    floats = client.embeddings.create(model="tiny-BERT/int8", input="the museum opens at nine", encoding_format="float")
    assert np.allclose(floats.data[0].embedding, want[0], atol=1e-6) and floats.model == "tiny-BERT/int8"
    assert "tiny-bert" in [m.id for m in client.models.list()]
    with pytest.raises(openai.NotFoundError, match="is not an embedding model served here"):
        client.embeddings.create(model="text-embedding-3-small", input="hi")


def test_token_arrays_base64_and_truncation_are_reported(server, tiny_embedder_dir):
    e = load_embedder(tiny_embedder_dir)
    ids = e.tokenize("the museum opens at nine")
    status, _, body = server.post(EMB, {"model": "tiny-bert", "input": ids, "encoding_format": "base64"})
    assert status == 200, body
    v = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(v, e.embed(["the museum opens at nine"])[0], atol=1e-6)
    status, _, body = server.post(EMB, {"model": "tiny-bert", "input": [ids, ids[:2]]})
    assert status == 200 and len(body["data"]) == 2
    status, _, body = server.post(EMB, {"model": "tiny-bert", "input": ["museum " * 100, "museum"]})
    assert body["edgespec"] == {"max_tokens": 64, "truncated": [0]} and body["usage"]["prompt_tokens"] == 64 + 3


@pytest.mark.parametrize("body, param, match", [
    ({"model": "tiny-bert"}, "input", "'input' must be a string, an array of strings or an array of token ids, got null"),
    ({"model": "tiny-bert", "input": ""}, "input", "'input' is an empty string"),
    ({"model": "tiny-bert", "input": []}, "input", "'input' is an empty array"),
    ({"model": "tiny-bert", "input": ["a", ""]}, "input", r"'input\[1\]' is an empty string"),
    ({"model": "tiny-bert", "input": ["a", 3]}, "input", "'input' mixes number and string"),
    ({"model": "tiny-bert", "input": [[1], []]}, "input", r"'input\[1\]' is an empty array of token ids"),
    ({"model": "tiny-bert", "input": [1, 10**9]}, "input", r"input\[0\]\[1\] is 1000000000: token ids are integers"),
    ({"model": "tiny-bert", "input": ["a"] * 2049}, "input", "'input' has 2049 items; at most 2048"),
    ({"model": "tiny-bert", "input": {"text": "a"}}, "input", "got object"),
    ({"input": "a"}, "model", "'model' is required"),
    ({"model": 3, "input": "a"}, "model", "'model' must be a string, got number"),
    ({"model": "tiny-bert", "input": "a", "encoding_format": "int8"}, "encoding_format", "must be 'float' or 'base64'"),
    ({"model": "tiny-bert", "input": "a", "dimensions": 16}, "dimensions", "'dimensions' must be 32"),
    ({"model": "tiny-bert", "input": "a", "temperature": 1}, "temperature", "unknown field 'temperature'"),
])
def test_bad_requests_are_one_openai_error_each(server, body, param, match):
    status, _, got = server.post(EMB, body)
    err = assert_openai_error(status, got, 400, param=param)
    assert __import__("re").search(match, err["message"]), err["message"]


def test_a_body_that_is_not_an_object_and_a_wrong_model(server):
    status, _, got = server.post(EMB, ["a"])
    assert "must be a JSON object, got array" in assert_openai_error(status, got, 400)["message"]
    status, _, got = server.post(EMB, {"model": "fake", "input": "a"})  # the LLM's name is not the embedder's
    assert assert_openai_error(status, got, 404, param="model")["code"] == "model_not_found"


def test_a_server_without_an_embedder_says_how_to_add_one(serve):  # noqa: F811
    s = serve()
    status, _, got = s.post(EMB, {"model": "x", "input": "a"})
    assert "start it with `serve --embedder NAME`" in assert_openai_error(status, got, 404)["message"]


def test_the_embedder_of_the_docs_index_answers_when_none_was_given(serve, tiny_embedder_dir):  # noqa: F811
    s = serve()
    s.service.state.engine.docs = type("K", (), {"embedder": load_embedder(tiny_embedder_dir)})()
    status, _, body = s.post(EMB, {"model": "tiny-bert", "input": "the museum"})
    assert status == 200 and len(body["data"][0]["embedding"]) == 32


def test_texts_are_embedded_as_the_embedders_own_encode_embeds_them(server, tiny_embedder_dir):
    """In slices, texts still go through the embedder's encode (its passage prefix: E5's "passage: "), one
    request's texts across several slices of unlike lengths, each vector at its own index."""
    e = load_embedder(tiny_embedder_dir)
    texts = ["museum " * n + "opens" for n in (1, 40, 3, 90, 2, 17)]  # 90 words: cut at the model's 64 tokens
    want = e.encode(texts)
    status, _, body = server.post(EMB, {"model": "tiny-bert", "input": texts})
    assert status == 200 and [d["index"] for d in body["data"]] == list(range(6))
    assert np.allclose(np.array([d["embedding"] for d in body["data"]]), want.vectors, atol=1e-6)
    assert body["usage"]["prompt_tokens"] == sum(want.tokens) and body["edgespec"]["truncated"] == [3]
