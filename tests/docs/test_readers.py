"""What each format's reader makes of a file: PDF pages, Word headings/lists/tables, HTML tables and
page furniture, text encodings detected and named."""
from __future__ import annotations

import codecs

import pytest

from edgespec.docs.documents import Document, chunk_document
from edgespec.docs.readers import Unread, decode, html_text, read_bytes

from helpers.docfiles import make_docx, make_pdf


def _chunks(text: str, title: str = "Doc"):
    return chunk_document(Document("x", title, text, "0" * 64, len(text), 0), 700)


def test_pdf_pages_become_headings_and_a_scanned_page_is_left_out(tmp_path):
    f = make_pdf(tmp_path / "leaflet.pdf", [["Opening hours", "Daily 9:00 to 17:00"], [], ["Adult (16+) 12.00"]],
                 title="Museum leaflet")
    got = read_bytes("pdf", f.read_bytes())
    assert got.title == "Museum leaflet" and got.note == "pdf, 2 of 3 page(s) with text"
    assert got.text == "## page 1\n\nOpening hours\nDaily 9:00 to 17:00\n\n## page 3\n\nAdult (16+) 12.00\n"
    assert [c.title for c in _chunks(got.text, got.title)] == ["Museum leaflet › page 1", "Museum leaflet › page 3"]


def test_a_pdf_without_text_or_with_broken_bytes_is_unread_with_why(tmp_path):
    f = make_pdf(tmp_path / "scan.pdf", [[], []])
    with pytest.raises(Unread, match=r"PDF: no text layer in its 2 page\(s\) \(scanned\?\): OCR it first"):
        read_bytes("pdf", f.read_bytes())
    with pytest.raises(Unread, match=r"^PDF: unreadable \("):
        read_bytes("pdf", b"%PDF-1.7\n garbage")


def test_docx_headings_lists_and_table_rows_in_order(tmp_path):
    f = make_docx(tmp_path / "guide.docx", [("h1", "Visitor guide"), ("p", "Welcome."), ("h2", "Prices"),
                                            ("table", [["Ticket", "Price"], ["Adult", "£12.00"], ["Child (5 to 16)", "£6.00"]]),
                                            ("li", "Bring a photo ID")], title="Guide")
    got = read_bytes("docx", f.read_bytes())
    assert got.title == "Guide"
    assert got.text == ("# Visitor guide\n\nWelcome.\n\n## Prices\n\nTicket | Price\n\nAdult | £12.00\n\n"
                        "Child (5 to 16) | £6.00\n\n- Bring a photo ID\n")
    assert [c.title for c in _chunks(got.text, got.title)] == ["Guide › Visitor guide", "Guide › Visitor guide › Prices"]
    with pytest.raises(Unread, match=r"^Word: not a readable .docx \(BadZipFile"):
        read_bytes("docx", b"PK not really")


def test_html_table_cells_are_separated_and_page_furniture_dropped():
    page = ("<html><head><title>t</title><style>td{}</style></head><body>"
            "<nav><a>Home</a><a>Shop</a></nav><header><h1>Site banner</h1></header><div role='navigation'>Menu</div>"
            "<main><article><header><h1>Tickets</h1></header>"
            "<table><tr><th>Ticket</th><th>Price</th></tr><tr><td>Adult</td><td>£12.00</td></tr>"
            "<tr><td>Child (5 to 16)<br>with an adult</td><td>£6.00</td></tr></table>"
            "<ul><li>Free for members</li><li>Groups <b>10%</b> off</li></ul></article></main>"
            "<aside>Related: our shop</aside><footer>© 2026 Museum</footer><script>alert(1)</script></body></html>")
    assert html_text(page) == ("# Tickets\n\nTicket | Price\n\nAdult | £12.00\n\nChild (5 to 16) with an adult | £6.00\n\n"
                               "- Free for members\n\n- Groups 10% off\n")


def test_html_with_unclosed_rows_and_cells_still_separates_them():
    assert html_text("<table><tr><td>a<td>b<tr><td>c<td>d</table><p>after") == "a | b\n\nc | d\n\nafter\n"


@pytest.mark.parametrize("text,codec,name", [
    ("Café opening: 10h à 18h, à côté de la gare.\n", "latin-1", "latin-1"),
    ("The café’s “special” costs €5 – daily.\n", "cp1252", "cp1252"),
    ("Horário: a bilheteira abre às 9h. Preço: 5 €.\n", "cp1252", "cp1252"),
    ("大人は1200円です。子供は600円です。駐車場は一時間300円です。\n", "shift_jis", "cp932"),
    ("Музей открыт ежедневно с девяти утра до шести вечера.\n", "cp1251", "cp1251"),
    ("Lockers are by the entrance. ロッカーは入口にあります。\n", "utf-16", "utf-16 with BOM"),
    ("Plain UTF-8: 入場料\n", "utf-8", "utf-8"),
])
def test_encodings_are_detected_and_named(text, codec, name):
    raw = text.encode(codec)
    assert decode(raw) == (text, name)


def test_a_utf8_bom_is_named_and_dropped_and_nul_bytes_without_a_bom_are_binary():
    assert decode(codecs.BOM_UTF8 + "Hall\n".encode()) == ("Hall\n", "utf-8 with BOM")
    with pytest.raises(Unread, match=r"^binary \(NUL bytes and no byte-order mark\)"):
        decode(b"\x89PNG\r\n\x00\x00")
    with pytest.raises(Unread, match=r"^encoding: starts with a utf-16 byte-order mark but is not utf-16"):
        decode(codecs.BOM_UTF16_LE + b"\x00\xd8")  # a lone surrogate
