"""Reading and chunking a venue's documents, and every bad input a reported skip or one line."""
from __future__ import annotations

import os

import pytest

from edgespec.docs.documents import (MAX_DOC_BYTES, IndexInputError, check_unchanged, chunk_all, html_text,
                                          read_documents)

from helpers.venue import VENUE


def test_venue_chunks_by_headings_with_offsets_into_the_text():
    r = read_documents([VENUE])
    assert {os.path.basename(d.source) for d in r.documents} == {"hours.md", "tickets.md", "floors.html", "cafes.md",
                                                                 "visiting.txt", "getting-here.md"}
    assert r.skipped == []
    chunks = chunk_all(r.documents, 700)
    texts = {d.source: d.text for d in r.documents}
    for c in chunks:
        assert texts[c.source][c.start:c.end] == c.text and len(c.text) <= 700
    titles = [c.title for c in chunks]
    assert "Cafés › Roof Café" in titles and "Floor plan › First floor" in titles
    roof = next(c for c in chunks if c.title == "Cafés › Roof Café")
    assert roof.text.startswith("## Roof Café") and "11:00" in roof.text and "Harbour" not in roof.text.split("\n")[0]


def test_html_keeps_headings_and_text_and_drops_script_and_style():
    text = html_text("<html><head><style>p{}</style><script>var x='no';</script></head><body><h2>Hall &amp; "
                     "Café</h2><p>Open <b>daily</b>.</p><ul><li>one</li><li>two</li></ul></body></html>")
    assert "## Hall & Café" in text and "Open daily." in text and "- one" in text
    assert "var x" not in text and "p{}" not in text


def test_a_long_paragraph_is_cut_at_sentence_ends(tmp_path):
    (tmp_path / "long.txt").write_text(" ".join(f"Sentence number {i} says something." for i in range(100)))
    d = read_documents([tmp_path]).documents
    chunks = chunk_all(d, 200)
    assert len(chunks) > 5 and all(len(c.text) <= 200 for c in chunks)
    assert all(c.text.endswith(".") for c in chunks[:-1])
    assert all(d[0].text[c.start:c.end] == c.text for c in chunks)


def test_bad_files_are_reported_skips_each_with_why(tmp_path):
    (tmp_path / "good.md").write_text("# Good\n\nText.\n")
    (tmp_path / "copy.md").write_text("# Good\n\nText.\n")
    (tmp_path / "image.txt").write_bytes(b"\x89PNG\r\n\x00\x00\x00")
    (tmp_path / "crlf.md").write_bytes(b"# Good\r\n\r\nText.\r\n")
    (tmp_path / "menu.pdf").write_bytes(b"%PDF-1.4")
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "old.doc").write_bytes(b"\xd0\xcf")
    (tmp_path / "empty.md").write_text("  \n")
    with open(tmp_path / "huge.txt", "wb") as f:  # 100 MB, sparse: never read
        f.truncate(100 << 20)
    r = read_documents([tmp_path])
    why = {os.path.basename(p): w for p, w in r.skipped}
    assert [os.path.basename(d.source) for d in r.documents] == ["copy.md"]  # sorted: copy.md comes first
    assert why["good.md"] == f"a duplicate of {tmp_path / 'copy.md'} (the same text)"
    assert why["crlf.md"] == f"a duplicate of {tmp_path / 'copy.md'} (the same text)"  # CRLF line ends: the same
    assert why["image.txt"] == "binary (NUL bytes and no byte-order mark): not a text document"
    assert why["menu.pdf"].startswith("PDF: unreadable (")
    assert why["photo.jpg"] == "type: not a document type read here (.docx, .htm, .html, .markdown, .md, .pdf, " \
                               ".text, .txt are)"
    assert why["old.doc"].startswith("type: a Word 97-2003 file: save it as .docx")
    assert why["empty.md"] == "empty (no text)"
    assert why["huge.txt"] == f"size: {100 << 20:,} bytes, over the {MAX_DOC_BYTES:,} a document may be"
    assert len(r.skipped) == 8


def test_nothing_to_index_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexInputError, match="an empty folder"):
        read_documents([tmp_path / "empty"])
    with pytest.raises(IndexInputError, match="no such file or folder"):
        read_documents([tmp_path / "absent"])
    (tmp_path / "x.pdf").write_bytes(b"%PDF")
    with pytest.raises(IndexInputError, match="no readable documents .*PDF: unreadable"):
        read_documents([tmp_path / "x.pdf"])


def test_a_file_changed_after_it_was_read_is_caught(tmp_path):
    f = tmp_path / "a.md"
    f.write_text("# A\n\nopen at 9\n")
    docs = read_documents([f]).documents
    check_unchanged(docs)
    f.write_text("# A\n\nopen at 10, not 9\n")
    with pytest.raises(IndexInputError, match="a.md changed while it was indexed"):
        check_unchanged(docs)


def test_links_inside_the_folders_are_read_once_and_links_out_refused(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "a.md").write_text("# A\n\nopen at 9\n")
    os.symlink(docs / "sub", docs / "again")  # a folder inside: read where it is, not twice
    os.symlink(docs / "sub" / "a.md", docs / "alias.md")  # a file inside: the same text, a duplicate
    (tmp_path / "elsewhere.md").write_text("# Elsewhere\n\nnot in the folder\n")
    os.symlink(tmp_path / "elsewhere.md", docs / "out.md")
    r = read_documents([docs])
    assert [d.source for d in r.documents] == [str(docs / "alias.md")]  # sorted: alias.md before sub/a.md
    assert r.skipped == [
        (str(docs / "again"), f"a link to a folder inside the given ones ({docs / 'sub'}): read there"),
        (str(docs / "out.md"), f"a link out of the given folders (to {tmp_path / 'elsewhere.md'}): refused"),
        (str(docs / "sub" / "a.md"), f"a duplicate of {docs / 'alias.md'} (the same text)"),
    ]
    # a file named on the command line is read wherever its link leads: the user named it
    assert [d.title for d in read_documents([docs / "out.md"]).documents] == ["Elsewhere"]
