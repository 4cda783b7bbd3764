"""`edgespec index` and `chat --docs` as a kiosk owner runs them."""
from __future__ import annotations

import io
import json
import re

from edgespec.cli.commands.index import EXIT_SKIPPED
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
    assert rc == EXIT_SKIPPED, err
    assert out.startswith(f"indexed 6 document(s) into {tmp_path / 'v.idx'}: ") and "1 skipped" in out
    assert err.splitlines()[-1] == f"skipped {docs / 'menu.pdf'}: PDF: unreadable (PdfStreamError: Stream has " \
                                   "ended unexpectedly)"
    assert f"read {docs / 'floors.html'}: html, utf-8\n" in err and len(err.splitlines()) == 7
    assert json.loads((tmp_path / "v.idx" / "manifest.json").read_text())["tokenizer"]["from"] == tiny_bundle.name
    rc, out, err = run_cli(capsys, monkeypatch, "chat", tiny_bundle, "--docs", tmp_path / "v.idx", "--max-len", "1024",
                           "--max-new-tokens", "4", stdin="How much is a family ticket?\n")
    assert rc == 0, err
    assert re.search(rf"\n  \[1\] Tickets and prices[^\n]* \({re.escape(str(docs / 'tickets.md'))}, characters \d+-\d+\)\n", out), out


def test_index_errors_are_one_line(tiny_bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))  # no embedding model pulled, whatever ~/.cache holds
    (tmp_path / "empty").mkdir()
    rc, out, err = run_cli(capsys, monkeypatch, "index", tmp_path / "empty", "-o", tmp_path / "x", "--bundle", tiny_bundle)
    assert rc == 1 and err == f"edgespec index: error: {tmp_path / 'empty'}: an empty folder (no documents in it)\n"
    rc, out, err = run_cli(capsys, monkeypatch, "chat", tiny_bundle, "--docs", tmp_path / "x", stdin="hi\n")
    assert rc == 1 and err.startswith(f"edgespec chat: error: index {tmp_path / 'x'} does not exist: build it with")
    assert err.count("\n") == 1


def _venue_of_every_kind(root):
    """A folder as a venue has it: PDF, Word, HTML with a table, Markdown, and text in four encodings."""
    from helpers.docfiles import make_docx, make_pdf

    root.mkdir()
    make_pdf(root / "leaflet.pdf", [["Opening hours", "Daily 9:00 to 17:00, closed on Mondays."]], title="Leaflet")
    make_docx(root / "guide.docx", [("h1", "Guide"), ("table", [["Room", "Floor"], ["Textiles", "2"]])])
    (root / "prices.html").write_text("<nav>Home | Shop</nav><h1>Prices</h1><table><tr><td>Adult</td><td>£12.00</td>"
                                      "</tr><tr><td>Child</td><td>£6.00</td></tr></table>", encoding="utf-8")
    (root / "notes.md").write_text("# Notes\n\nThe lift is by the cloakroom.\n", encoding="utf-8")
    (root / "cafe.txt").write_bytes("Café: soupe du jour à 6 francs, tous les jours.\n".encode("latin-1"))
    (root / "fees.md").write_bytes("# 入場料\n\n大人は1200円です。子供は600円です。\n".encode("shift_jis"))
    (root / "lockers.txt").write_bytes("Lockers are by the entrance.\r\n".encode("utf-16"))
    return root


def test_every_kind_read_and_every_fate_one_line_never_a_traceback(tiny_bundle, tmp_path, capsys, monkeypatch):
    import os

    docs = _venue_of_every_kind(tmp_path / "docs")
    (tmp_path / "secret.txt").write_text("root:x:0:0\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "more.md").write_text("# Outside\n\nnot for visitors\n")
    os.symlink(tmp_path / "secret.txt", docs / "passwd.txt")
    os.symlink(tmp_path / "outside", docs / "linked")
    (docs / "locked.md").write_text("# Locked\n\nno one may read this\n")
    (docs / "locked").mkdir()
    (docs / "locked" / "inner.md").write_text("# Inner\n\nhidden by its folder\n")
    os.mkfifo(docs / "pipe.txt")
    (docs / "locked.md").chmod(0)
    (docs / "locked").chmod(0)
    real_open, real_scandir = os.open, os.scandir

    def no_open(path, *a, **k):  # root reads any file: refuse it as the kernel refuses everyone else
        if str(path).endswith("locked.md"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    def no_scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "open", no_open)
    monkeypatch.setattr(os, "scandir", no_scandir)
    try:
        rc, out, err = run_cli(capsys, monkeypatch, "index", docs, "-o", tmp_path / "v.idx", "--bundle", tiny_bundle,
                               "--embedder", "none")
    finally:
        (docs / "locked.md").chmod(0o644)
        (docs / "locked").chmod(0o755)
    assert rc == EXIT_SKIPPED, err
    assert "Traceback" not in err
    fate = dict(line.split(": ", 1) for line in err.splitlines())
    assert fate == {
        f"read {docs / 'cafe.txt'}": "text, latin-1",
        f"read {docs / 'fees.md'}": "markdown, cp932",
        f"read {docs / 'guide.docx'}": "docx",
        f"read {docs / 'leaflet.pdf'}": "pdf, 1 of 1 page(s) with text",
        f"read {docs / 'lockers.txt'}": "text, utf-16 with BOM",
        f"read {docs / 'notes.md'}": "markdown, utf-8",
        f"read {docs / 'prices.html'}": "html, utf-8",
        f"skipped {docs / 'linked'}": f"a link out of the given folders (to {tmp_path / 'outside'}): refused",
        f"skipped {docs / 'locked'}": "unreadable folder (Permission denied)",
        f"skipped {docs / 'locked.md'}": "unreadable (Permission denied)",
        f"skipped {docs / 'passwd.txt'}": f"a link out of the given folders (to {tmp_path / 'secret.txt'}): refused",
        f"skipped {docs / 'pipe.txt'}": "not a regular file (a device, FIFO or socket)",
    }
    assert len(err.splitlines()) == len(fate)
    assert out.startswith(f"indexed 7 document(s) into {tmp_path / 'v.idx'}: ") and "5 skipped" in out
    passages = (tmp_path / "v.idx" / "chunks.jsonl").read_text("utf-8")
    for quoted in ("Adult | £12.00", "Child | £6.00", "Room | Floor", "Textiles | 2", "大人は1200円", "soupe du jour à 6 francs",
                   "Lockers are by", "closed on Mondays"):
        assert quoted in passages, quoted
    for never in ("root:x", "not for visitors", "no one may read", "hidden by its folder", "Home | Shop"):
        assert never not in passages


def test_reindexing_after_one_page_changed_embeds_only_its_passages(tiny_bundle, tmp_path, capsys, monkeypatch):
    from helpers.venue import FakeEmbedder

    docs = tmp_path / "docs"
    docs.mkdir()
    for f in VENUE.iterdir():
        (docs / f.name).write_bytes(f.read_bytes())
    (docs / "access.md").write_text("# アクセス\n\n京都駅から（バス）２０５番：３５分。\n", encoding="utf-8")  # NFKC folds it
    emb = FakeEmbedder()
    seen: list[int] = []
    embed = emb.embed
    monkeypatch.setattr(emb, "embed", lambda texts: seen.append(len(texts)) or embed(texts))
    monkeypatch.setattr("edgespec.cli.commands.index._embedder", lambda spec: emb)
    argv = ("index", docs, "-o", tmp_path / "v.idx", "--bundle", tiny_bundle)
    rc, out, err = run_cli(capsys, monkeypatch, *argv)
    total = int(re.search(r": (\d+) passages", out).group(1))
    assert rc == 0 and f"{total} embedded (0 kept from the old index)" in out and seen == [total]
    first = (tmp_path / "v.idx" / "vectors.npy").read_bytes()
    rc, out, err = run_cli(capsys, monkeypatch, *argv)
    assert rc == 0 and f"0 embedded ({total} kept from the old index)" in out and seen == [total]
    assert (tmp_path / "v.idx" / "vectors.npy").read_bytes() == first
    hours = (docs / "hours.md").read_text("utf-8")
    (docs / "hours.md").write_text(hours.replace("10:00", "09:30"), encoding="utf-8")
    changed = sum(1 for line in (tmp_path / "v.idx" / "chunks.jsonl").read_text("utf-8").splitlines()
                  if json.loads(line)["source"].endswith("hours.md") and "10:00" in json.loads(line)["text"])
    rc, out, err = run_cli(capsys, monkeypatch, *argv)
    assert rc == 0 and changed > 0 and seen == [total, changed], (seen, changed)
    assert f"{changed} embedded ({total - changed} kept from the old index)" in out
    vectors = (tmp_path / "v.idx" / "vectors.npy")
    vectors.write_bytes(vectors.read_bytes()[:-4] + b"\0\0\0\0")  # the old index no longer matches its manifest
    rc, out, err = run_cli(capsys, monkeypatch, *argv)
    assert seen[-1] == total and "every passage embedded anew: the old index does not match its manifest" in err
