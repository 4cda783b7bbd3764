"""The kiosk page in a real headless Chromium against the stand-in server (tests/kiosk/fake_server.py),
which can be told to fail, refuse, hang up or restart on cue. Each test is a few seconds; the
end-to-end run against the real `edgespec serve` with the network cut is test_kiosk_offline.py.
"""
from __future__ import annotations

import json
import re

import pytest

from kiosk.browser import RequestLog, launch, require_browser
from kiosk.fake_server import FakeServer

# "slow" as the project defines it (a real browser); each test takes a few seconds
pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TOUCH = {"width": 800, "height": 480}  # the Raspberry Pi 7" touch display


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with launch() as b:
        yield b


@pytest.fixture
def server():
    s = FakeServer().start()
    yield s
    s.stop()


@pytest.fixture
def open_page(browser, server):
    """open_page(query="", viewport=TOUCH) -> (page, request log), the page loaded and ready."""
    contexts = []

    def open_(query: str = "", viewport: dict = TOUCH, wait_ready: bool = True):
        ctx = browser.new_context(viewport=viewport, has_touch=True)
        contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(20_000)  # generous: the machine is shared
        log = RequestLog(page, server.url)
        page.goto(server.url + query)
        if wait_ready:
            wait_js(page, "document.body.dataset.server === 'ready'")
        return page, log

    yield open_
    for ctx in contexts:
        ctx.close()


def wait_js(page, expression: str, timeout: float | None = None) -> None:
    """Waits until a JS expression is truthy. Written as a function: the page's Content Security
    Policy forbids eval, which Playwright would use for a bare expression (the CSP stays on)."""
    page.wait_for_function(f"() => ({expression})", timeout=timeout)


def ask(page, question: str) -> None:
    page.fill("#input", question)
    page.press("#input", "Enter")


def answer_text(page, n: int = -1) -> str:
    return page.locator(".turn .assistant .text").nth(n).inner_text()


def wait_turn_state(page, state: str, n: int = -1) -> None:
    index = "turns.length - 1" if n == -1 else str(n)
    wait_js(
        page,
        f"(() => {{ const turns = document.querySelectorAll('.turn'); const t = turns[{index}];"
        f" return t && t.dataset.state === '{state}'; }})()"
    )


# ------------------------------------------------------------------------------ the happy path
def test_answer_streams_in_and_status_shows_stats(open_page, server):
    server.behaviour.pieces = [f" word{i}" for i in range(30)]
    server.behaviour.delay_s = 0.05
    page, log = open_page()
    assert page.inner_text("#model") == "fake-model"
    ask(page, "What is speculative decoding?")
    # Mid-answer: some text is on screen, more is coming, Stop replaces Send.
    wait_turn_state(page, "streaming")
    wait_js(page, "document.querySelector('.turn .assistant .text').textContent.includes('word3')")
    partial = answer_text(page)
    assert "word29" not in partial
    assert page.is_visible("#stop") and not page.is_visible("#send")
    assert page.get_attribute(".turn .assistant", "aria-busy") == "true"
    wait_turn_state(page, "done")
    assert answer_text(page).strip() == "".join(server.behaviour.pieces).strip()
    assert page.get_attribute(".turn .assistant", "aria-busy") == "false"
    status = page.inner_text("#status")
    assert "42.5 tokens/s" in status and "acceptance 75%" in status and "30 tokens" in status
    assert page.is_visible("#send") and not page.is_visible("#stop")
    # the request is the documented API usage
    body = server.requests[-1].body
    assert body["stream"] is True and body["model"] == "fake-model"
    assert body["messages"] == [{"role": "user", "content": "What is speculative decoding?"}]
    assert body["max_tokens"] == 512 and body["temperature"] == 0
    assert log.foreign() == [] and log.errors() == []


def test_an_answer_from_documents_lists_its_sources_under_it(open_page, server):
    """`serve --docs`: the last chunk's edgespec field carries the passages; the page lists them under
    the answer, numbered as cited, with the page's file name, as text (a title is never HTML)."""
    from kiosk.browser import save_screenshot

    server.behaviour.pieces = ["Adults pay ", "£12 ", "[1]."]
    server.behaviour.stats = {**server.behaviour.stats, "declined": False, "sources": [
        {"id": 1, "title": "Tickets › Day tickets", "file": "/srv/venue/pages/tickets.html", "start": 10, "end": 200,
         "score": 1.0, "text": "Adult day ticket: £12.00\nChild: £6.00"},
        {"id": 2, "title": "<b>Cafe</b>", "file": "pages/cafe.md", "start": 0, "end": 90, "score": 0.5,
         "text": "<i>Open</i> " + "daily " * 100}]}
    page, log = open_page()
    ask(page, "How much is an adult ticket?")
    wait_turn_state(page, "done")
    items = page.locator(".turn .assistant .sources li > span")
    assert items.all_inner_texts() == ["[1] Tickets › Day tickets — tickets.html", "[2] <b>Cafe</b> — cafe.md"]
    quotes = page.locator(".turn .assistant .sources .source-text")  # each passage's words, shown, as text
    assert quotes.all_inner_texts()[0] == "Adult day ticket: £12.00\nChild: £6.00"
    assert quotes.all_inner_texts()[1].startswith("<i>Open</i> daily") and quotes.all_inner_texts()[1].endswith("…")
    assert len(quotes.all_inner_texts()[1]) == 401 and page.is_visible(".turn .assistant .source-text >> nth=0")
    assert page.locator(".turn .assistant .sources b, .turn .assistant .sources i").count() == 0
    assert page.get_attribute(".turn .assistant .sources li >> nth=0", "title") == \
        "/srv/venue/pages/tickets.html, characters 10–200"
    assert page.is_visible(".turn .assistant .sources")
    save_screenshot(page, "kiosk-sources.png")
    server.behaviour.stats = {k: v for k, v in server.behaviour.stats.items() if k != "sources"}
    ask(page, "And without documents?")
    wait_turn_state(page, "done")
    assert page.locator(".turn >> nth=1").locator(".sources").count() == 0  # an answer without sources lists none
    assert log.foreign() == [] and log.errors() == []


def test_each_turn_sends_the_whole_conversation(open_page, server):
    server.behaviour.pieces = ["Answer", " {n}"]
    page, _ = open_page("?system=Be%20brief.&max_tokens=64&temperature=0.7")
    ask(page, "first?")
    wait_turn_state(page, "done")
    ask(page, "second?")
    wait_js(page, "document.querySelectorAll('.turn[data-state=done]').length === 2")
    body = server.requests[-1].body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first?"},
        {"role": "assistant", "content": "Answer 1"},
        {"role": "user", "content": "second?"},
    ]
    assert body["max_tokens"] == 64 and body["temperature"] == 0.7


def test_an_empty_question_is_not_sent(open_page, server):
    page, _ = open_page()
    page.fill("#input", "   \n  ")
    page.press("#input", "Enter")
    page.click("#send")
    assert page.locator(".turn").count() == 0 and page.is_visible("#welcome")
    # a real question afterwards is the first and only request the server sees: the blank one was never sent
    ask(page, "real?")
    wait_turn_state(page, "done")
    assert [r.body["messages"][-1]["content"] for r in server.requests] == ["real?"]


def test_model_output_is_shown_as_text_never_html(open_page, server):
    server.behaviour.pieces = ['<img src=x onerror="window.pwned=1">', " & <b>bold</b>"]
    page, _ = open_page()
    ask(page, "inject")
    wait_turn_state(page, "done")
    assert page.locator(".turn .assistant img, .turn .assistant b").count() == 0
    assert "<img src=x" in answer_text(page)
    assert page.evaluate("window.pwned") is None


def test_code_fences_render_as_code_blocks(open_page, server):
    server.behaviour.pieces = ["Use this:\n```python\n", "print('hi')\n", "```\nThat's all."]
    page, _ = open_page()
    ask(page, "code please")
    wait_turn_state(page, "done")
    assert page.locator(".turn .assistant pre code").inner_text() == "print('hi')"
    assert "That's all." in answer_text(page)


@pytest.mark.parametrize("openai_reason,edgespec_reason,expected", [
    ("length", "length", "cut at the length limit"),
    ("length", "cache_full", "filled the model's memory"),
])
def test_cut_answers_say_why(open_page, server, openai_reason, edgespec_reason, expected):
    server.behaviour.pieces = ["cut"]
    server.behaviour.finish_reason = openai_reason
    server.behaviour.stats = {**server.behaviour.stats, "finish_reason": edgespec_reason}
    page, _ = open_page()
    ask(page, "q")
    wait_turn_state(page, "done")
    assert expected in page.inner_text(".turn .note")


def test_status_without_drafting(open_page, server):
    server.behaviour.stats = {"decode_tokens_per_second": 9.87, "drafter": "none", "drafted": 0, "accepted": 0,
                              "acceptance_rate": None, "ttft_s": 1.5}
    page, _ = open_page()
    ask(page, "q")
    wait_turn_state(page, "done")
    assert page.inner_text("#status") == "9.9 tokens/s · no drafting · 6 tokens · first token 1.50 s"


# ------------------------------------------------------------------------------ stop, new conversation
def test_stop_button_stops_mid_answer_and_keeps_the_partial_text(open_page, server):
    server.behaviour.pieces = [f" w{i}" for i in range(200)]
    server.behaviour.delay_s = 0.05
    page, _ = open_page()
    ask(page, "Tell me a long story")
    wait_js(page, "document.querySelector('.turn .assistant .text').textContent.includes('w2')")
    page.click("#stop")
    wait_turn_state(page, "stopped")
    stopped_text = answer_text(page)
    assert "w2" in stopped_text and "w199" not in stopped_text
    # the server sees the client go (that is how the real server cancels generation)
    server.wait_for(lambda: server.requests[-1].disconnected, what="the stream to be dropped")
    assert "Stopped" in page.inner_text(".turn .note") and "Stopped" in page.inner_text("#status")
    assert page.is_visible("#send")
    # A stopped answer is part of the conversation: the next turn sends what the user saw.
    server.behaviour.pieces = ["ok"]
    server.behaviour.delay_s = 0.01
    ask(page, "next")
    wait_js(page, "document.querySelectorAll('.turn')[1]?.dataset.state === 'done'")
    msgs = server.requests[-1].body["messages"]
    assert msgs[1]["role"] == "assistant" and msgs[1]["content"] == stopped_text
    assert answer_text(page, 0) == stopped_text  # nothing more arrived, even after a whole later turn


def test_keyboard_only_enter_sends_shift_enter_breaks_escape_stops(open_page, server):
    server.behaviour.pieces = [f" k{i}" for i in range(200)]
    server.behaviour.delay_s = 0.05
    page, _ = open_page()
    # the question box has the focus from the start
    assert page.evaluate("document.activeElement.id") == "input"
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    assert page.input_value("#input") == "line one\nline two"
    page.keyboard.press("Enter")
    wait_js(page, "document.querySelector('.turn .assistant .text').textContent.includes('k2')")
    assert server.requests[-1].body["messages"][-1]["content"] == "line one\nline two"
    page.keyboard.press("Escape")
    wait_turn_state(page, "stopped")
    order = []
    page.focus("#new")
    for _ in range(4):
        order.append(page.evaluate("document.activeElement.id"))
        page.keyboard.press("Tab")
    assert order == ["new", "log", "input", "send"]
    # New conversation from the keyboard: focus it and press Enter
    page.focus("#new")
    page.keyboard.press("Enter")
    assert page.locator(".turn").count() == 0
    assert page.is_visible("#welcome")
    assert page.evaluate("document.activeElement.id") == "input"


def test_new_conversation_during_an_answer_stops_it_and_clears(open_page, server):
    server.behaviour.pieces = [f" n{i}" for i in range(200)]
    server.behaviour.delay_s = 0.05
    page, _ = open_page()
    ask(page, "long")
    wait_js(page, "document.querySelector('.turn .assistant .text')?.textContent.includes('n1')")
    page.click("#new")
    assert page.locator(".turn").count() == 0
    server.wait_for(lambda: server.requests[-1].disconnected, what="the stream to be dropped")
    wait_js(page, "document.body.dataset.busy === 'no'")
    server.behaviour.pieces = ["fresh"]
    ask(page, "again")
    wait_turn_state(page, "done")
    assert server.requests[-1].body["messages"] == [{"role": "user", "content": "again"}]


# ------------------------------------------------------------------------------ failures keep the conversation
def test_server_error_shows_friendly_message_and_keeps_conversation(open_page, server):
    server.behaviour.pieces = ["first answer"]
    page, _ = open_page()
    ask(page, "one")
    wait_turn_state(page, "done")
    server.behaviour.status = 500
    ask(page, "two")
    wait_turn_state(page, "error")
    note = page.inner_text(".turn:nth-of-type(2) .note")
    assert "went wrong" in note and "500" in note
    assert answer_text(page, 0) == "first answer"  # the earlier turn is untouched
    assert page.locator(".turn").count() == 2
    # Try again, now that the server works: the failed turn is answered in place.
    server.behaviour.status = 200
    server.behaviour.pieces = ["second answer"]
    page.click(".turn button.retry")
    wait_js(page, "document.querySelectorAll('.turn[data-state=done]').length === 2")
    assert answer_text(page, 1) == "second answer"
    assert page.locator("button.retry").count() == 0
    msgs = server.requests[-1].body["messages"]
    assert [m["content"] for m in msgs] == ["one", "first answer", "two"]


def test_failed_turn_is_not_sent_as_context(open_page, server):
    server.behaviour.status = 500
    page, _ = open_page()
    ask(page, "lost question")
    wait_turn_state(page, "error")
    server.behaviour.status = 200
    server.behaviour.pieces = ["ok"]
    ask(page, "new question")
    wait_turn_state(page, "done")
    assert server.requests[-1].body["messages"] == [{"role": "user", "content": "new question"}]
    assert page.locator(".turn").count() == 2  # still shown


def test_busy_server_429_says_when_to_retry(open_page, server):
    server.behaviour.status = 429
    server.behaviour.retry_after = "3"
    server.behaviour.error = {"message": "queue full", "type": "rate_limit_error"}
    page, _ = open_page()
    ask(page, "hello")
    wait_turn_state(page, "error")
    assert "busy" in page.inner_text(".turn .note") and "3 s" in page.inner_text(".turn .note")
    assert page.get_attribute("#banner", "hidden") is not None  # a 429 is not a lost connection


def test_bad_request_shows_the_servers_reason(open_page, server):
    server.behaviour.status = 400
    server.behaviour.error = {"message": "temperature must be between 0 and 2", "type": "invalid_request_error",
                              "param": "temperature"}
    page, _ = open_page()
    ask(page, "hello")
    wait_turn_state(page, "error")
    assert "temperature must be between 0 and 2" in page.inner_text(".turn .note")


@pytest.mark.parametrize("status,code,expected", [
    (401, "invalid_api_key", "asks for an API key"),
    (503, "model_loading", "starting up or restarting"),
    (502, None, "error 502"),
])
def test_other_statuses_get_their_own_sentence(open_page, server, status, code, expected):
    server.behaviour.status = status
    server.behaviour.error = {"message": "x", "type": "error", "code": code}
    page, _ = open_page()
    ask(page, "hello")
    wait_turn_state(page, "error")
    assert expected in page.inner_text(".turn .note")
    assert page.locator(".turn button.retry").is_visible()


def test_too_long_for_the_cache_drops_oldest_turns_and_retries(open_page, server):
    server.behaviour.pieces = ["x" * 40]
    page, _ = open_page()
    for q in ("q1", "q2", "q3"):
        ask(page, q)
        wait_js(page, f"document.querySelectorAll('.turn[data-state=done]').length === {int(q[1])}")
    # now only about two turns fit: the page drops the oldest until the request is accepted
    server.behaviour.max_prompt_chars = 100
    ask(page, "q4")
    wait_js(page, "document.querySelectorAll('.turn')[document.querySelectorAll('.turn').length-1]"
                           ".dataset.state === 'done'")
    msgs = server.requests[-1].body["messages"]
    assert sum(len(m["content"]) for m in msgs) <= 100
    assert msgs[-1] == {"role": "user", "content": "q4"}
    assert page.locator(".turn .msg.user").all_inner_texts()[0] != "q1"
    assert page.is_visible(".trimmed")
    # a single question too long on its own: a friendly message, nothing dropped silently
    server.behaviour.max_prompt_chars = 5
    page.click("#new")
    ask(page, "this question is far too long")
    wait_turn_state(page, "error")
    assert "too long" in page.inner_text(".turn .note")


def test_error_event_inside_the_stream_is_reported(open_page, server):
    # e.g. the server's per-request timeout firing mid-answer: an error chunk instead of [DONE]
    server.behaviour.pieces = [f" e{i}" for i in range(10)]
    server.behaviour.error_after = 3
    server.behaviour.error = {"message": "request timed out after 60 s", "type": "timeout"}
    page, _ = open_page()
    ask(page, "x")
    wait_turn_state(page, "error")
    assert answer_text(page).split() == ["e0", "e1", "e2"]
    assert "request timed out after 60 s" in page.inner_text(".turn .note")


# ------------------------------------------------------------------------------ unattended: restarts
def test_server_restart_shows_reconnecting_and_recovers(open_page, server):
    server.behaviour.pieces = ["before"]
    page, _ = open_page()
    ask(page, "one")
    wait_turn_state(page, "done")
    port = server.port
    server.stop()
    wait_js(page, "document.body.dataset.server === 'down'", timeout=15_000)
    assert "Reconnecting" in page.inner_text("#banner")
    assert page.is_disabled("#send")
    # typing while the server is away is kept
    page.fill("#input", "typed while down")
    restarted = FakeServer(port=port).start()
    try:
        restarted.behaviour.ready = False  # loading the model first
        wait_js(page, "document.body.dataset.server === 'loading'", timeout=15_000)
        assert "starting up" in page.inner_text("#banner")
        restarted.behaviour.ready = True
        wait_js(page, "document.body.dataset.server === 'ready'", timeout=15_000)
        assert not page.is_visible("#banner")
        assert "Reconnected" in page.inner_text("#status")
        assert page.input_value("#input") == "typed while down"
        restarted.behaviour.pieces = ["after"]
        page.press("#input", "Enter")
        wait_turn_state(page, "done")
        assert answer_text(page) == "after"
        assert answer_text(page, 0) == "before"
        assert [m["content"] for m in restarted.requests[-1].body["messages"]] == ["one", "before", "typed while down"]
    finally:
        restarted.stop()


def test_page_opened_while_the_model_loads_waits_then_says_ready(open_page, server):
    server.behaviour.ready = False
    page, _ = open_page(wait_ready=False)
    wait_js(page, "document.body.dataset.server === 'loading'")
    assert "starting up" in page.inner_text("#banner")
    assert page.is_disabled("#send")
    server.behaviour.ready = True
    wait_js(page, "document.body.dataset.server === 'ready'", timeout=15_000)
    assert page.inner_text("#status") == "Ready."  # not "Reconnected": it was never connected


def test_connection_lost_mid_answer_keeps_partial_text_and_recovers(open_page, server):
    server.behaviour.pieces = [f" p{i}" for i in range(50)]
    server.behaviour.drop_after = 5
    page, _ = open_page()
    ask(page, "crash please")
    wait_turn_state(page, "error")
    assert "p4" in answer_text(page)
    note = page.inner_text(".turn .note")
    assert "interrupted" in note or "lost" in note
    # the page checks the server right away and finds it still up
    wait_js(page, "document.body.dataset.server === 'ready'", timeout=15_000)
    server.behaviour.drop_after = None
    server.behaviour.pieces = ["whole"]
    page.click(".turn button.retry")
    wait_turn_state(page, "done")
    assert answer_text(page) == "whole"


# ------------------------------------------------------------------------------ bounded memory, long answers
def test_conversation_is_capped_at_max_turns(open_page, server):
    server.behaviour.pieces = ["a{n}"]
    page, _ = open_page("?max_turns=2")
    for i in range(1, 5):
        ask(page, f"q{i}")
        wait_js(page, f"document.querySelector('.turn:last-of-type')?.dataset.state === 'done' &&"
                               f" document.querySelector('.turn:last-of-type .msg.user').textContent.includes('q{i}')")
    assert page.locator(".turn").count() == 2
    assert page.locator(".turn .msg.user .text").all_inner_texts() == ["q3", "q4"]
    assert page.is_visible(".trimmed")
    msgs = server.requests[-1].body["messages"]
    assert [m["content"] for m in msgs] == ["q3", "a3", "q4"]


def test_long_answer_scrolls_and_follows_the_end(open_page, server):
    server.behaviour.pieces = [f"line {i}\n" for i in range(120)]
    server.behaviour.delay_s = 0.005
    page, _ = open_page()
    ask(page, "long")
    wait_turn_state(page, "done")
    m = page.evaluate("(() => { const l = document.getElementById('log');"
                      " return {sh: l.scrollHeight, ch: l.clientHeight, top: l.scrollTop,"
                      " page: document.documentElement.scrollHeight, vh: innerHeight}; })()")
    assert m["sh"] > 3 * m["ch"]  # the answer is far longer than the view...
    assert m["sh"] - m["top"] - m["ch"] < 50  # ...and the view is at its end
    assert m["page"] <= m["vh"]  # the conversation scrolls, not the page: input stays on screen
    assert page.is_visible("#input")


def test_idle_reset_clears_the_conversation_for_the_next_visitor(open_page, server):
    server.behaviour.pieces = ["hi"]
    page, _ = open_page("?idle_reset=2")
    ask(page, "hello")
    wait_turn_state(page, "done")
    wait_js(page, "document.querySelectorAll('.turn').length === 0", timeout=8000)
    assert page.is_visible("#welcome")


@pytest.mark.parametrize("query,message", [
    ("?max_turns=abc", "Ignored max_turns=abc: expected a whole number from 1 to 500; using 20."),
    ("?max_tokens=0", "Ignored max_tokens=0: expected a whole number from 1 to 32768; using 512."),
    ("?temperature=9", "Ignored temperature=9: expected a number from 0 to 2; using 0."),
    ("?idle_reset=-5", "Ignored idle_reset=-5: expected a whole number from 0 to 86400; using 0."),
])
def test_bad_page_settings_are_reported_on_the_page(open_page, server, query, message):
    page, _ = open_page(query)
    assert page.inner_text(".setting-problem") == message
    server.behaviour.pieces = ["fine"]
    ask(page, "still works?")
    wait_turn_state(page, "done")


def test_title_setting(open_page):
    page, _ = open_page("?title=Museum%20guide")
    assert page.inner_text("h1") == "Museum guide"
    assert page.title() == "Museum guide"


# ------------------------------------------------------------------------------ touch screens
@pytest.mark.parametrize("viewport", [TOUCH, {"width": 480, "height": 800}, {"width": 1280, "height": 720}])
def test_touch_targets_are_large_and_nothing_overflows(open_page, server, viewport):
    server.behaviour.pieces = ["x" * 300]  # one unbroken long word must wrap, not widen the page
    page, _ = open_page(viewport=viewport)
    ask(page, "y" * 200)
    wait_js(page, "document.querySelector('.turn button.retry, .turn[data-state=done]')")
    for sel in ("#new", "#send", "#input"):
        box = page.locator(sel).bounding_box()
        assert box["height"] >= 48 and box["width"] >= 48, (sel, box)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"]
    font = page.evaluate("parseFloat(getComputedStyle(document.querySelector('.msg .text')).fontSize)")
    assert font >= 16


def test_stop_is_a_large_target_while_answering(open_page, server):
    server.behaviour.pieces = [f" s{i}" for i in range(100)]
    server.behaviour.delay_s = 0.05
    page, _ = open_page()
    ask(page, "go")
    wait_turn_state(page, "streaming")
    box = page.locator("#stop").bounding_box()
    assert box["height"] >= 48 and box["width"] >= 48
    page.tap("#stop")  # a finger, not a mouse
    wait_turn_state(page, "stopped")


# ------------------------------------------------------------------------------ with an API key
def test_the_page_works_with_an_api_key_by_its_session_and_renews_it(browser, tmp_path):
    """`serve --ui` with an API key, the real server (fake engine): the page never sees the key; the
    session cookie set with the page admits it, and when the session changes (a restarted server
    makes a new one) the next question renews it and is answered."""
    from helpers.fake_server import FakeEngine, Server

    key = tmp_path / "key"
    key.write_text("browser-key-0123456789abcdef")
    key.chmod(0o600)
    s = Server(FakeEngine(), ui=True, api_key_file=str(key))
    ctx = browser.new_context(viewport=TOUCH, has_touch=True)
    try:
        page = ctx.new_page()
        page.set_default_timeout(20_000)
        url = f"http://127.0.0.1:{s.port}/?max_tokens=3"
        log = RequestLog(page, url)
        page.goto(url)
        wait_js(page, "document.body.dataset.server === 'ready'")
        assert page.inner_text("#model") == "fake"  # GET /v1/models was admitted
        ask(page, "first question")
        wait_turn_state(page, "done")
        assert answer_text(page).strip() == "w0 w1 w2"
        s.service.state.session = "a-new-session-as-after-a-restart-000000000"
        ask(page, "second question")
        wait_turn_state(page, "done")
        assert answer_text(page).strip() == "w0 w1 w2"
        assert len(s.engine.runs) == 2 and log.errors() == [] and log.foreign() == []
        assert not any("Authorization" in c or "browser-key" in c for c in log.console)
    finally:
        ctx.close()
        s.stop()
