"""No bundle's chat template can make other visitors wait (issue 57): verify prices a message (a long chat
against a short one) and refuses a template that costs too much per message or ignores the conversation;
at request time a render priced over the deadline is refused before it starts, long renders take turns
on one child while short ones go on beside them, and a conversation counted by the handler is not
rendered again by the engine's worker."""
from __future__ import annotations

import re
import sys
import threading

import pytest

from edgespec.models import template_process as tp
from edgespec.models.bundle import Bundle
from edgespec.models.template import TemplateRefused
from helpers.cli import verify
from helpers.manifests import rewrite_manifest
from helpers.wait import wait_for

# the issue's template: the real one, after a loop of 450 empty steps per message
PER_MESSAGE = "{% for m in messages %}{% for i in range(450) %}{% endfor %}{% endfor %}"
# a Jinja scoping slip (a `set` inside a loop does not leave it): renders "ab" whatever is said
SCOPING_SLIP = "{% set said = '' %}{% for m in messages %}{% set said = said ~ m.content %}{% endfor %}a{{ said }}b"
CONSTANT_NUMBER = "{{ " + "7" * 78 + " }}"
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]  # a child that never answers


def _with_template(bundle_copy, tiny_bundle, edit):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template=edit(d["tokenizer"]["chat_template"])))
    return b


def test_verify_refuses_a_template_that_costs_too_much_per_message_with_the_number(tiny_bundle, bundle_copy):
    b = _with_template(bundle_copy, tiny_bundle, lambda t: PER_MESSAGE + t)
    rc, lines = verify(b, "--fast")
    assert rc == 1 and len(lines) == 2, lines
    m = re.fullmatch(r".*: manifest\.json: tokenizer\.chat_template costs ([\d,]+) operations per message \(limit 200; "
                     r"[\d,]+ ms per 1,000 messages here\): a long conversation would hold its render for seconds", lines[0])
    assert m, lines[0]
    assert 900 <= int(m[1].replace(",", "")) <= 1000  # 450 steps, each a loop item and a range item, and the real template's
    # served anyway (serve --no-verify): opened, and its renders are priced at request time (below)
    assert Bundle.open(b, verify=False).name == "qwen-agree"


@pytest.mark.parametrize("template", [SCOPING_SLIP, CONSTANT_NUMBER], ids=["scoping-slip", "78-digits"])
def test_verify_refuses_a_template_that_ignores_the_conversation(tiny_bundle, bundle_copy, template):
    b = _with_template(bundle_copy, tiny_bundle, lambda _: template)
    rc, lines = verify(b, "--fast")
    assert rc == 1 and len(lines) == 2, lines
    assert lines[0].endswith("manifest.json: tokenizer.chat_template ignores the conversation: its prompt for a short "
                             "chat does not hold the user's text (messages[2].content 'Thanks')"), lines[0]
    with pytest.raises(Exception, match="ignores the conversation"):  # not even with --no-verify
        Bundle.open(b, verify=False)


def test_a_template_that_holds_the_text_but_not_its_changes_is_refused():
    both = "{% for m in messages %}{{ m.role }}{% endfor %}Thanks Which bus?"
    assert tp.probe(both) == ("ignores the conversation: two chats that differ in messages[2].content render the "
                              "same prompt")


def test_a_real_template_is_priced_within_bounds():
    seen = tp.examine(CHATML)
    assert seen.problem is None and seen.cost is None
    assert 1 <= seen.ops_per_message <= 20 and seen.seconds_per_message > 0


def test_a_render_priced_over_the_deadline_is_refused_before_it_starts(monkeypatch):
    """The probe priced the template; 30,000 messages are refused with the price, and no child is asked
    (every child here would never answer: a render that reached one would be the deadline's refusal)."""
    template = PER_MESSAGE + CHATML
    assert tp.examine(template).cost is not None
    monkeypatch.setattr(tp, "_pool", tp._Pool(SLEEPER))
    messages = [{"role": "user", "content": ""}] * 30_000
    with pytest.raises(TemplateRefused) as e:
        tp.render(template, len(messages), messages=messages, add_generation_prompt=True)
    m = re.fullmatch(r"30,000 messages would take about ([\d,]+) s to render \(([\d,]+) ms per 1,000 messages; "
                     r"limit 2 s\)", str(e.value))
    assert m and int(m[1].replace(",", "")) > 2 * tp.SECONDS, str(e.value)
    assert tp._pool.starts == 0


def test_short_renders_go_on_beside_a_long_one_and_long_ones_take_turns(tmp_path):
    """A long render holds one child (here one that answers only once the test lets it); a short render
    gets another and answers while the long one still runs; a second long render waits for the first's
    turn instead of taking a child; past LONG_WAITING the next long one is refused at once."""
    pool = tp._Pool(size=3)
    go = tmp_path / "go"
    stuck = tp._Child([sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
                                             "from edgespec.models.template_process import main; main()"])
    pool.children.append(stuck)
    pool.idle.append(stuck)  # the next render takes it
    results: dict[str, tuple] = {}

    def long_render(name):
        results[name] = pool.render("{{ 1 }}", 1, {}, seconds=600, long=True)

    first = threading.Thread(target=long_render, args=("first",))
    first.start()
    try:
        wait_for("the long render to reach its child", lambda: stuck.lock.locked() and stuck.proc is not None)
        assert pool.render("{{ messages[0].content }}!", 1, {"messages": [{"role": "user", "content": "hi"}]},
                           seconds=60)[:2] == ("ok", "hi!")
        second = threading.Thread(target=long_render, args=("second",))
        second.start()
        wait_for("the second long render to wait for its turn", lambda: pool.long_waiting == 1)
        assert first.is_alive() and "first" not in results  # the short one did not wait for it
        pool.long_waiting = tp.LONG_WAITING  # as if the queue of long renders were full
        kind, said, _, _ = pool.render("{{ 2 }}", 1, {}, seconds=60, long=True)
        assert (kind, said) == ("refused", f"{tp.LONG_WAITING} long conversations are already waiting for their "
                                           "render; retry shortly, or send fewer messages")
        pool.long_waiting = 1
    finally:
        go.touch()  # the first long render is answered; the second gets its turn
        first.join(60)
        if "second" in locals():
            second.join(60)
        pool.kill()
    assert results["first"][:2] == results["second"][:2] == ("ok", "1")
    assert len(pool.children) <= 3


def test_a_prepared_conversation_is_not_rendered_again_by_the_worker(tiny_bundle, monkeypatch):
    """prepare (the request's own thread) renders; the engine runs the Prepared's ids (its worker)."""
    from edgespec.core import chat
    from edgespec.engine import Engine

    calls = []
    real = chat.render_isolated
    monkeypatch.setattr(chat, "render_isolated", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    engine = Engine.open(tiny_bundle, max_len=128, verify=False)
    messages = [{"role": "user", "content": "a conversation rendered once"}]
    prepared = engine.prepare(messages=messages, max_new_tokens=2)
    result = engine.generate(prepared)
    assert calls == [1] and result.stats.prompt_tokens == prepared.prompt_tokens
    engine.generate(messages=[{"role": "user", "content": "another"}], max_new_tokens=2)
    assert calls == [1, 1]


@pytest.mark.slow
def test_the_issue_s_flood_is_refused_before_rendering_and_a_normal_chat_is_served(tiny_bundle, bundle_copy):
    """Served anyway (--no-verify): four requests of 30,000 empty messages at once through the per-message
    template are each a 400 with the price, before any render (no child was killed at the deadline), and a
    normal chat sent beside them is answered."""
    import http.client
    import json

    from helpers.running import RunningServer, together

    b = _with_template(bundle_copy, tiny_bundle, lambda t: PER_MESSAGE + t)
    server = RunningServer(b)  # (Engine.open with verify=False, as serve --no-verify)
    starts = tp._pool.starts

    def post(messages):
        conn = http.client.HTTPConnection("127.0.0.1", server.service.port, timeout=120)
        conn.request("POST", "/v1/chat/completions", json.dumps({"messages": messages, "max_tokens": 2}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out = resp.status, json.loads(resp.read())
        conn.close()
        return out

    try:
        flood = [{"role": "user", "content": ""}] * 30_000
        answers = together([lambda: post(flood)] * 4 + [lambda: post([{"role": "user", "content": "hi"}])])
    finally:
        server.stop()
    for status, body in answers[:4]:
        assert status == 400 and re.search(r"30,000 messages would take about [\d,]+ s to render", body["error"]["message"])
    assert answers[4][0] == 200
    assert tp._pool.starts <= starts + 1  # no child killed at a deadline (at most the spare started)
