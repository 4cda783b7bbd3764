"""The template budget holds: every filter, method, operator and loop pays for the size of what it works
on before the work is done, so the slow filters a hostile probe found (urlize, wordwrap, title over long
strings) are refused by the budget, in the same short time as any other bomb; and the render runs in a
child process that is killed at the deadline, so nothing a template does can hold its caller longer."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgespec.models import template_process
from edgespec.models.template_process import _Child, probe, render
from helpers.manifests import rewrite_manifest

DEADLINE_S = 120  # a hang fails loudly (TimeoutExpired); the budgets answer in well under a second
WORK = "over the render budget of work (a very long value, or many of them)"

# the probe's cases (issue 47): a single slow filter per call, within the size limit, possibly in a loop
SLOW_FILTERS = {
    "{% for i in range(1000) %}{{ ('a.b ' * 2000000)|urlize|length }}{% endfor %}":
        "'*' would make a value of 8,000,000 characters or items (limit 2,097,152)",
    "{% for i in range(1000) %}{{ ('a.b ' * 500000)|urlize|length }}{% endfor %}": f"filter urlize: {WORK}",
    "{% for i in range(100000) %}{{ ('a.b ' * 20000)|urlize|length }}{% endfor %}": f"filter urlize: {WORK}",
    "{{ ('x ' * 4000000)|wordwrap(2) }}": "'*' would make a value of 8,000,000 characters or items (limit 2,097,152)",
    "{{ ('x ' * 1000000)|wordwrap(2)|length }}": f"filter wordwrap: {WORK}",
    "{{ ('ab ' * 600000)|title|length }}": f"filter title: {WORK}",
    "{% for i in range(100000) %}{{ ('ab ' * 30000)|title|length }}{% endfor %}": f"filter title: {WORK}",
    "{% for i in range(1000) %}{{ ('xy' * 50000)|sort|length }}{% endfor %}": f"filter sort: {WORK}",
    "{% for i in range(1000) %}{{ ('xy' * 500000)|map('upper')|list|length }}{% endfor %}": f"filter map: {WORK}",
    "{% for i in range(1000) %}{{ ('<a>' * 600000)|striptags|length }}{% endfor %}": f"filter striptags: {WORK}",
    "{% for i in range(1000) %}{% set x = ('a ' * 1000000).split() %}{% endfor %}": f"call: {WORK}",
    "{% for i in range(100000) %}{% set x = ('x' * 1000000) ~ ('y' * 1000000) %}{% endfor %}": f"'~': {WORK}",
    "{% for c in ('x' * 2000000) %}{% endfor %}": "loops or calls exceed the render budget (a template that never ends?)",
    "{% for i in range(100000) %}{% set x = 'x' * 2000000 %}{% endfor %}": f"'*': {WORK}",
    "{{ lipsum(1000000) }}": "fails on a short conversation: UndefinedError: 'lipsum' is undefined",
}


def test_each_slow_filter_is_refused_by_the_budget_not_the_clock():
    """Probed in one child process under a deadline: each answer must be the budget's own line (not
    'rendering took over ...', the kill), so each is refused as quickly as the budget allows."""
    code = ("import json, sys\n"
            "from edgespec.models.template_process import probe\n"
            "print(json.dumps([probe(t) for t in json.loads(sys.stdin.read())]))\n")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(SLOW_FILTERS)), capture_output=True,
                       text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr
    for (template, why), said in zip(SLOW_FILTERS.items(), json.loads(r.stdout)):
        assert said == why, (template, said)


@pytest.mark.parametrize("template", [t for t in SLOW_FILTERS if "urlize" in t or "wordwrap" in t or "title" in t][:4])
def test_verify_names_the_template_for_a_slow_filter(tiny_bundle, bundle_copy, template):
    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template=template))
    r = subprocess.run([sys.executable, "-m", "edgespec", "verify", "--fast", str(b)], capture_output=True,
                       text=True, timeout=DEADLINE_S)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines() == [f"{b}: manifest.json: tokenizer.chat_template {SLOW_FILTERS[template]}",
                                     f"{b}: NOT OK (1 problem(s))"]


def test_a_render_past_the_deadline_is_killed_and_the_next_gets_a_fresh_child():
    """A child that never answers (as one stuck in a long C call would not): the render is refused at the
    deadline, the child is killed (not left running), and the next render starts a new one."""
    child = _Child([sys.executable, "-c", "import time; time.sleep(600)"])
    kind, said, _, took = child.render("{{ 1 }}", 1, {}, seconds=0.2)
    assert (kind, said) == ("refused", "rendering took over 0.2 s (stopped)") and took >= 0.2
    assert child.proc is None and child.starts == 1
    kind, *_ = child.render("{{ 1 }}", 1, {}, seconds=0.2)
    assert kind == "refused" and child.starts == 2
    child.kill()


def test_a_child_that_cannot_start_leaves_renders_to_this_process(caplog):
    """No `exec` allowed, a broken install: the metered render still runs, here, and the log says so."""
    child = _Child([sys.executable, "-c", "raise SystemExit(3)"])
    assert child.render("{{ 1 + 1 }}", 1, {}, seconds=5)[:2] == ("ok", "2")
    assert child.unavailable == "it exited with 3 before its first answer"
    assert "chat templates render in this process" in caplog.text
    assert child.render("{{ 'x' * 10000000 }}", 1, {}, seconds=5)[0] == "refused"
    assert child.starts == 1  # not retried on every render


def test_the_child_is_reused_across_renders():
    """One child serves renders one after another (a start costs about a process; a render a pipe round trip)."""
    render("{{ messages[0].content }}", 1, messages=[{"role": "user", "content": "warm"}])
    starts = template_process._pool.starts
    for i in range(50):
        assert render("{{ messages[0].content }}!", 1, messages=[{"role": "user", "content": str(i)}]) == f"{i}!"
    assert template_process._pool.starts == starts


def test_a_child_that_died_between_renders_is_replaced():
    render("{{ 1 }}", 1)
    starts = template_process._pool.starts
    for child in template_process._pool.children:
        if child.proc is not None:
            child.proc.kill()  # as the kernel's OOM killer would
            child.proc.wait()
    assert render("{{ 3 }}", 1) == "3"
    assert template_process._pool.starts == starts + 1


def test_a_real_template_still_renders_and_the_probe_passes(tiny_bundle):
    d = json.loads((tiny_bundle / "manifest.json").read_text())
    template = d["tokenizer"]["chat_template"]
    assert probe(template) is None
    text = render(template, 2, messages=[{"role": "user", "content": "x" * 100_000},
                                         {"role": "assistant", "content": "ok"}], add_generation_prompt=True)
    assert text.count("x") >= 100_000


def test_a_child_that_maps_much_at_start_still_renders(tmp_path, monkeypatch):
    """A site hook that maps gigabytes before main() (gpu-check's venv preloads CUDA's libraries in every
    python it starts) must not leave the child without room: its limit is on top of what it maps at start.
    Here a sitecustomize maps 2 GiB (reserved, never touched), more than the whole budget."""
    (tmp_path / "sitecustomize.py").write_text(
        "import mmap\n_held = mmap.mmap(-1, 2 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n")
    import os
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    child = _Child()
    try:
        big = "x" * 1_000_000  # fresh memory in the child (a long turn and its copies)
        status, text, *_ = child.render("{% for m in messages %}{{ m.content }}|{% endfor %}", 2,
                                        {"messages": [{"role": "user", "content": big}, {"role": "user", "content": "yo"}]}, 5.0)
        assert (status, text) == ("ok", big + "|yo|"), (status, text[:80])
        assert child.unavailable is None
    finally:
        child.kill()
