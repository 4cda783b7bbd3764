"""The README's front page holds: its first Python example runs as written (against a tiny bundle
put where the quickstart puts the real one), it stays a front page, and it tells no development
history."""
from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 250  # a front page: what it is, how to start, links; the rest lives in docs/


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_first_python_example_runs_as_written(tmp_path, monkeypatch, tiny_bundle):
    first = python_blocks(README.read_text())[0]
    assert 'Engine.open("qwen-coder")' in first  # the name the quickstart exports to, not a path
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_bundle, tmp_path / "home" / "bundles" / "qwen-coder")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(first, str(README), "exec"), {"__name__": "__readme__"})
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"\d+\.\d tokens/s, \d+% of proposals accepted", lines[-1]), lines[-1]


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert "./scripts/quickstart.sh" in text and "./scripts/test.sh" in text
    for history in ("Round ", "round six", "not shipped", "replayed", "Replayed"):
        assert history not in text, history


def test_every_doc_is_free_of_development_rounds():
    docs = sorted((README.parent / "docs").glob("*.md"))
    assert docs
    pattern = re.compile(r"\bRound (one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
                         r"fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty)\b|not shipped", re.I)
    found = [f"{d.name}:{i}: {line.strip()}" for d in docs for i, line in enumerate(d.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert found == []
