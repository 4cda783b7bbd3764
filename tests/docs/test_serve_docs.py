"""`serve --docs`: the `openai` client gets its answer's sources in the `edgespec` field; a rebuilt
index is read again on POST /v1/docs/reload or SIGHUP, and a broken one leaves the old in use."""
from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.docs.answer import DECLINE, tokenizer_sha256  # noqa: E402
from edgespec.docs.index import build_index  # noqa: E402
from helpers.running import RunningServer  # noqa: E402
from helpers.venue import VENUE  # noqa: E402


def _build(bundle, docs, out):
    from tokenizers import Tokenizer

    return build_index(docs, out, Tokenizer.from_file(str(bundle / "tokenizer.json")), tokenizer_sha256(bundle))


@pytest.fixture(scope="module")
def served(tiny_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    docs = root / "docs"
    shutil.copytree(VENUE, docs)
    _build(tiny_bundle, [docs], root / "venue.idx")
    r = RunningServer(tiny_bundle, max_len=1024, engine={"docs": str(root / "venue.idx")})
    yield r, root
    r.stop()


def _post(server, path):
    req = urllib.request.Request(f"http://127.0.0.1:{server.service.port}{path}", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_answer_carries_its_sources_plain_and_streamed(served):
    server, _ = served
    msgs = [{"role": "user", "content": "How much is a family ticket?"}]
    resp = server.client.chat.completions.create(model=server.bundle.name, messages=msgs, max_tokens=6)
    ex = resp.model_extra["edgespec"]
    src = ex["sources"][0]
    assert ex["declined"] is False and src["file"].endswith("tickets.md") and src["title"].startswith("Tickets")
    assert set(src) == {"id", "title", "file", "start", "end", "score", "text"} and src["id"] == 1
    chunks = list(server.client.chat.completions.create(model=server.bundle.name, messages=msgs, max_tokens=6,
                                                        stream=True))
    assert chunks[-1].model_extra["edgespec"]["sources"] == ex["sources"]


def test_a_declined_question_is_answered_without_the_model(served):
    server, _ = served
    kn = server.service.state.engine.docs
    kn.min_coverage, old = 1.01, kn.min_coverage
    try:
        resp = server.client.chat.completions.create(model=server.bundle.name, max_tokens=20,
                                                     messages=[{"role": "user", "content": "Is there a pool?"}])
    finally:
        kn.min_coverage = old
    assert resp.choices[0].message.content == DECLINE and resp.model_extra["edgespec"]["declined"] is True


def test_reload_reads_a_rebuilt_index_and_refuses_a_broken_one(served, tiny_bundle):
    server, root = served
    kn = server.service.state.engine.docs
    n, gen = len(kn.index.chunks), kn.generation
    (root / "docs" / "shop.md").write_text("# Shop\n\nThe museum shop sells brass compasses for 25 euros.\n")
    _build(tiny_bundle, [root / "docs"], root / "venue.idx")
    status, body = _post(server, "/v1/docs/reload")
    assert status == 200 and body["passages"] == n + 1 and body["generation"] == gen + 1
    (root / "venue.idx" / "chunks.jsonl").write_text("broken\n")
    status, body = _post(server, "/v1/docs/reload")
    assert status == 409 and "the one in use stays" in body["error"]["message"]
    assert "chunks.jsonl: " in body["error"]["message"] and len(kn.index.chunks) == n + 1
    _build(tiny_bundle, [root / "docs"], root / "venue.idx")  # SIGHUP's path: the same reload, off the loop
    server.service.reload_docs()
    assert kn.generation == gen + 2


def test_reload_on_a_server_without_documents_is_404(tiny_bundle):
    r = RunningServer(tiny_bundle)
    try:
        status, body = _post(r, "/v1/docs/reload")
        assert status == 404 and body["error"]["message"] == "this server has no documents: serve it with --docs INDEX"
    finally:
        r.stop()
