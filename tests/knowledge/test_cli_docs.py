"""`edgespec index` and `chat --docs` as a kiosk owner runs them."""
from __future__ import annotations

import io
import json
import re

from edgespec.cli.main import main

from helpers.venue import VENUE


def run_cli(capsys, monkeypatch, *argv, stdin=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_index_then_chat_with_the_sources_shown(tiny_bundle, tmp_path, capsys, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    for f in VENUE.iterdir():
        (docs / f.name).write_bytes(f.read_bytes())
    (docs / "menu.pdf").write_bytes(b"%PDF-1.4")
    rc, out, err = run_cli(capsys, monkeypatch, "index", docs, "-o", tmp_path / "v.idx", "--bundle", tiny_bundle,
                           "--embedder", "none")
    assert rc == 0, err
    assert out.startswith(f"indexed 6 document(s) into {tmp_path / 'v.idx'}: ") and "1 skipped" in out
    assert err == f"skipped {docs / 'menu.pdf'}: PDF is not read: convert it to text first (`pdftotext FILE " \
                  "FILE.txt`, poppler-utils) and index that\n"
    assert json.loads((tmp_path / "v.idx" / "manifest.json").read_text())["tokenizer"]["from"] == tiny_bundle.name
    rc, out, err = run_cli(capsys, monkeypatch, "chat", tiny_bundle, "--docs", tmp_path / "v.idx", "--max-len", "1024",
                           "--max-new-tokens", "4", stdin="How much is a family ticket?\n")
    assert rc == 0, err
    assert re.search(rf"\n  \[1\] Tickets and prices[^\n]* \({re.escape(str(docs / 'tickets.md'))}, characters \d+-\d+\)\n", out), out


def test_index_errors_are_one_line(tiny_bundle, tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    rc, out, err = run_cli(capsys, monkeypatch, "index", tmp_path / "empty", "-o", tmp_path / "x", "--bundle", tiny_bundle)
    assert rc == 1 and err == f"edgespec index: error: {tmp_path / 'empty'}: an empty folder (no documents in it)\n"
    rc, out, err = run_cli(capsys, monkeypatch, "chat", tiny_bundle, "--docs", tmp_path / "x", stdin="hi\n")
    assert rc == 1 and err.startswith(f"edgespec chat: error: index {tmp_path / 'x'} does not exist: build it with")
    assert err.count("\n") == 1
