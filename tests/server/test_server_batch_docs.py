"""`edgespec serve BUNDLE --parallel 3 --docs INDEX --system-prompt FILE --deterministic`: three streamed
chat clients at once through the real `openai` client, each with its sources, each reply the one the
same request gets served alone (the serial engine with the same documents and system prompt)."""
from __future__ import annotations

import json
import signal
import threading
import urllib.request

import pytest

pytest.importorskip("openai", reason="the test extra is not installed (pip install .[test])")
pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

import openai  # noqa: E402

from edgespec.engine import Engine  # noqa: E402
from edgespec.docs.answer import DECLINE, tokenizer_sha256  # noqa: E402
from edgespec.docs.index import build_index  # noqa: E402
from helpers.running import DEADLINE, together  # noqa: E402
from helpers.venue import VENUE  # noqa: E402
from helpers.wait import wait_for  # noqa: E402

SYSTEM = "You are the museum's kiosk. Answer in one short sentence."
ASKS = ["How much is a family ticket?", "What time does the Roof Café open?", "What is the Wi-Fi password?"]
N = 48  # tokens each answer may take


@pytest.fixture(scope="module")
def venue(tiny_bundle, tmp_path_factory):
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("batch_docs")
    build_index([VENUE], root / "venue.idx", Tokenizer.from_file(str(tiny_bundle / "tokenizer.json")),
                tokenizer_sha256(tiny_bundle))
    (root / "system.txt").write_text(SYSTEM + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def served(tiny_bundle, venue):
    """The real `serve` command (its flags, its engine opener) on a free port, in a thread."""
    import edgespec.server.service as service_mod
    from edgespec.cli.main import main
    from edgespec.server.sdnotify import Notifier

    box, rc = {}, {}

    class Captured(service_mod.Service):
        def __init__(self, config, open_engine, default_name):
            super().__init__(config, open_engine, default_name=default_name, notifier=Notifier(environ={}),
                             hooks=service_mod.Hooks())
            box["service"] = self

    argv = ["serve", str(tiny_bundle), "--port", "0", "--parallel", "3", "--docs", str(venue / "venue.idx"),
            "--system-prompt", str(venue / "system.txt"), "--deterministic", "--max-len", "1024", "--no-verify",
            "--ui"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(service_mod, "Service", Captured)
        mp.setenv("EDGESPEC_HOME", str(venue / "home"))
        thread = threading.Thread(target=lambda: rc.setdefault("rc", main(argv)), daemon=True)
        thread.start()

        def ready():
            assert "rc" not in rc, f"serve exited with {rc.get('rc')}"
            s = box.get("service")
            if s is None:
                return False
            assert s.state.phase in ("loading", "ready"), f"the server did not start: {s.state.failure}"
            return s.state.phase == "ready"

        wait_for("the server to be ready", ready, timeout=DEADLINE, every=0.05)
        service = box["service"]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{service.port}/v1", api_key="unused", max_retries=0,
                               timeout=DEADLINE)
        yield service, client
        service.on_signal(signal.SIGTERM)
        thread.join(DEADLINE)
        assert not thread.is_alive() and rc["rc"] == 0


@pytest.fixture(scope="module")
def alone(tiny_bundle, venue):
    eng = Engine.open(tiny_bundle, docs=str(venue / "venue.idx"), max_len=1024, draft="none", deterministic=True,
                      warmup=False, verify=False)
    yield eng
    eng.close()


def _msgs(question):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _sources(docs):
    """The sources and the decision, without the retrieval's time (a measurement)."""
    return {k: v for k, v in docs.items() if k in ("sources", "declined", "match", "cosine", "passage_tokens")}


def test_three_streamed_clients_at_once_get_what_each_gets_alone(served, alone, tiny_bundle):
    service, client = served
    engine, sched = service.state.engine, service.scheduler
    assert engine.slots == 3 and engine.pinned.text == SYSTEM  # the prompt pinned in the batched engine
    # the worker admits nothing until all three requests are queued: they start together, whatever the timing
    released = threading.Event()
    original = sched._admit_locked

    def admit_together():
        if sched.depth and not released.is_set():
            assert sched._cv.wait_for(lambda: sched.depth >= len(ASKS), DEADLINE), "three requests never queued"
            released.set()
        original()

    sched._admit_locked = admit_together

    def client_call(i):
        stream = client.chat.completions.create(model=tiny_bundle.name, messages=_msgs(ASKS[i]), max_tokens=N,
                                                stream=True)
        text, last = [], None
        for c in stream:
            if c.choices:
                text.append(c.choices[0].delta.content or "")
            extra = (c.model_extra or {}).get("edgespec")
            last = extra if extra is not None else last
        return "".join(text), last

    try:
        got = together([lambda i=i: client_call(i) for i in range(len(ASKS))])
    finally:
        del sched._admit_locked
    assert released.is_set()
    for i, (text, extra) in enumerate(got):
        alone.reset_cache()
        want = alone.generate(messages=_msgs(ASKS[i]), max_new_tokens=N)
        assert text == want.text, i
        assert _sources(extra) == _sources(want.docs), i
    assert got[2][0] == DECLINE and got[2][1]["declined"] is True and got[2][1]["sources"] == []
    assert got[0][1]["sources"][0]["file"].endswith("tickets.md")
    # the two answered ones shared passes: admitted in one round, the second's prompt read in chunks of 128
    # while the first generates its N tokens (at least N / 9 rounds at k <= 8)
    assert got[0][1]["batch_size_mean"] > 1.0 and got[1][1]["batch_size_mean"] > 1.0
    resp = client.chat.completions.create(model=tiny_bundle.name, messages=_msgs(ASKS[0]), max_tokens=N)
    assert resp.model_extra["edgespec"]["cached_tokens"] >= len(engine.pinned.tokens)  # the pinned prefix reused


def test_ready_names_the_pinned_prompt_for_the_kiosk_page(served):
    service, _ = served
    with urllib.request.urlopen(f"http://127.0.0.1:{service.port}/ready", timeout=DEADLINE) as r:
        body = json.loads(r.read())
    assert body["status"] == "ready" and body["system_prompt"] == SYSTEM


def test_bad_documents_or_prompt_are_refused_before_loading_at_any_parallel(tiny_bundle, tmp_path, capsys):
    from edgespec.cli.main import main

    empty = tmp_path / "empty.txt"
    empty.write_text(" \n", encoding="utf-8")
    for parallel in ("1", "3"):
        assert main(["serve", str(tiny_bundle), "--parallel", parallel, "--system-prompt", str(empty)]) == 78
        assert f"--system-prompt {empty} is empty" in capsys.readouterr().err
        assert main(["serve", str(tiny_bundle), "--parallel", parallel, "--docs", str(tmp_path / "none.idx")]) == 78
        assert "none.idx does not exist: build it" in capsys.readouterr().err
