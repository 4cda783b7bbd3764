"""One file's bytes -> the text a venue's passages are cut from, by what the file is.

    read_bytes("menu.pdf", raw) -> Extracted(text, title, note)     # or raises Unread(why)

Each format is read by a kept library, not by parsing of our own: PDF's text layer by pypdf, Word's
.docx by python-docx, a text file's encoding by charset-normalizer; HTML by the standard library's
parser, of which only the structure a passage needs is kept (headings, paragraphs, list items, table
rows as "cell | cell" lines) and the parts every page of a site repeats are dropped (nav, the page's own
header and footer, aside, script, style). What comes out is Markdown-like text: headings are `#` lines,
which is what chunking (documents.py) cuts at and names passages by, so a PDF's page ("## page 3")
and a page's heading path end up in a passage's source line.
"""
from __future__ import annotations

import codecs
import io
import re
from dataclasses import dataclass
from html.parser import HTMLParser

KINDS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
         ".htm": "html", ".pdf": "pdf", ".docx": "docx"}
REFUSED = {".doc": "a Word 97-2003 file: save it as .docx",
           ".odt": "an OpenDocument file: save it as .docx or PDF"}


class Unread(Exception):
    """This file is skipped; the message says why (one line)."""


@dataclass(frozen=True)
class Extracted:
    text: str  # Markdown-like: headings as `#` lines, paragraphs split by blank lines, "\n" line ends
    title: str | None  # the document's own title when it carries one (PDF metadata, Word properties)
    note: str  # what was read, for the file's line on stderr ("html, cp1252", "pdf, 4 pages")


def read_bytes(kind: str, raw: bytes) -> Extracted:
    """Dispatches on `kind` (a KINDS value). Raises Unread for a file that gives no text."""
    if kind == "pdf":
        return _pdf(raw)
    if kind == "docx":
        return _docx(raw)
    text, encoding = decode(raw)
    if kind == "html":
        return Extracted(html_text(text), None, f"html, {encoding}")
    return Extracted(normalise_newlines(text), None, f"{kind}, {encoding}")


def normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


# -- text encodings ---------------------------------------------------------------------------------
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode(raw: bytes) -> tuple[str, str]:
    """(text, encoding name): a BOM says it, else UTF-8 when the bytes are valid UTF-8, else what
    charset-normalizer finds most likely (latin-1, cp1252, Shift-JIS, ...). Text with NUL bytes and no
    BOM, or bytes no encoding explains, is Unread."""
    for bom, name in _BOMS:
        if raw.startswith(bom):
            try:
                return raw.decode(name), f"{name.removesuffix('-sig')} with BOM"
            except UnicodeDecodeError as e:
                raise Unread(f"encoding: starts with a {name} byte-order mark but is not {name} (byte {e.start})") from None
    if b"\0" in raw[:8192]:
        raise Unread("binary (NUL bytes and no byte-order mark): not a text document")
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(raw).best()
    if best is None:
        raise Unread("encoding: not text in any encoding charset-normalizer knows")
    western = from_bytes(raw, cp_isolation=["cp1252"]).best()
    if western is not None and western.chaos <= best.chaos + WESTERN_SLACK:
        return raw.decode("cp1252"), "cp1252" if any(0x80 <= b < 0xA0 for b in raw) else "latin-1"
    return str(best), best.encoding


# A few lines of French or Portuguese decode cleanly in a dozen single-byte code pages, and charset-normalizer
# then ranks cp1250 or cp850 first ("à" read as "ŕ"); Windows' Western page is what such a file is, unless
# it reads clearly worse: its curly quotes cost 0.05 of charset-normalizer's "chaos", Cyrillic in cp1251
# does not decode as cp1252 at all (measured on the sentences in tests/docs/test_readers.py).
WESTERN_SLACK = 0.1


# -- PDF ---------------------------------------------------------------------------------------------
def _pdf(raw: bytes) -> Extracted:
    """Each page's text layer under a `## page N` heading (pages without text are left out). A scanned
    PDF has no text layer and is Unread with the way to give it one."""
    import logging

    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd but readable files are noise here
    try:
        pdf = PdfReader(io.BytesIO(raw))
        if pdf.is_encrypted and not pdf.decrypt(""):
            raise Unread("PDF: encrypted with a password")
        pages = [normalise_newlines(p.extract_text() or "") for p in pdf.pages]
        meta = pdf.metadata
        title = (meta.title or "").strip() if meta is not None else ""
    except Unread:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError) as e:
        raise Unread(f"PDF: unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else 'no detail'})") from None
    parts = [f"## page {i}\n\n{_pdf_page(t)}" for i, t in enumerate(pages, 1) if t.strip()]
    if not parts:
        raise Unread(f"PDF: no text layer in its {len(pages)} page(s) (scanned?): OCR it first, "
                     "e.g. `ocrmypdf IN.pdf OUT.pdf`, and index OUT.pdf")
    return Extracted("\n\n".join(parts) + "\n", title or None, f"pdf, {len(parts)} of {len(pages)} page(s) with text")


def _pdf_page(text: str) -> str:
    """A page's lines, trailing spaces off, runs of blank lines one (a `#` at a line's start escaped so the
    page's own text never reads as a heading)."""
    lines = [re.sub(r"^(#+)", r"\\\1", ln.rstrip()) for ln in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


# -- Word --------------------------------------------------------------------------------------------
def _docx(raw: bytes) -> Extracted:
    """Paragraphs and tables in document order: Heading N and Title styles as `#` lines, list paragraphs
    as "- " items, each table row as one "cell | cell" line."""
    import zipfile

    import docx
    from docx.table import Table

    try:
        d = docx.Document(io.BytesIO(raw))
        blocks = []
        for item in d.iter_inner_content():
            if isinstance(item, Table):
                blocks.extend(_row_line(c.text for c in row.cells) for row in item.rows)
                continue
            text = " ".join(item.text.split())
            if not text:
                continue
            style = (item.style.name if item.style is not None else "") or ""
            level = 1 if style == "Title" else int(m.group(1)) if (m := re.fullmatch(r"Heading (\d)", style)) else 0
            listed = style.startswith("List") or item._p.pPr is not None and item._p.pPr.numPr is not None
            blocks.append("#" * level + " " + text if level else ("- " + text if listed else text))
        title = (d.core_properties.title or "").strip()
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, OSError) as e:
        raise Unread(f"Word: not a readable .docx ({type(e).__name__}: {str(e)[:120]})") from None
    blocks = [b for b in blocks if b.strip(" |")]
    if not blocks:
        raise Unread("empty (no text)")
    return Extracted("\n\n".join(blocks) + "\n", title or None, "docx")


def _row_line(cells) -> str:
    """A table row as "cell | cell" (a merged cell, which python-docx repeats, once)."""
    out: list[str] = []
    for c in cells:
        c = " ".join(c.split())
        if not out or c != out[-1]:
            out.append(c)
    return " | ".join(out)


# -- HTML --------------------------------------------------------------------------------------------
class _HTMLText(HTMLParser):
    """HTML -> text: headings as `#` lines, blocks as paragraphs, li as "- " items, each table row one
    "cell | cell" paragraph; script/style/nav/aside dropped, and header/footer unless inside an article,
    main or section (a page's own banner and footer repeat on every page; an article's header holds its title)."""

    BLOCKS = {"p", "div", "section", "article", "main", "ul", "ol", "dl", "dt", "dd", "blockquote", "pre", "figure",
              "figcaption", "table", "address", "details", "summary", "header", "footer"}
    SKIP = {"script", "style", "head", "template", "noscript", "nav", "aside", "svg", "button", "select"}
    VOID = {"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip: list[str] = []  # open elements whose content is dropped
        self.content = 0  # open article/main/section elements
        self.row: list[str] | None = None  # cells of the open table row
        self.cell: list[str] | None = None  # text of the open cell

    def _dropped(self, tag: str, attrs) -> bool:
        role = dict(attrs).get("role") or ""
        return (tag in self.SKIP or role in ("navigation", "banner", "contentinfo", "complementary")
                or (tag in ("header", "footer") and not self.content))

    def handle_starttag(self, tag, attrs):
        if self.skip:
            if tag not in self.VOID:
                self.skip.append(tag)
            return
        if self._dropped(tag, attrs):
            if tag not in self.VOID:
                self.skip.append(tag)
            return
        if tag in ("article", "main", "section"):
            self.content += 1
        if tag == "tr":
            self._end_row()
            self.row = []
        elif tag in ("td", "th"):
            self._end_cell()
            if self.row is None:
                self.row = []
            self.cell = []
        elif self.cell is not None:
            if tag == "br" or tag in self.BLOCKS or tag == "li":
                self.cell.append(" ")
        elif re.fullmatch(r"h[1-6]", tag):
            self.out.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag == "li":
            self.out.append("\n\n- ")
        elif tag == "br":
            self.out.append("\n")
        elif tag in self.BLOCKS:
            self.out.append("\n\n")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.skip:
            if tag in self.skip:  # closes the innermost open element of that name (and any left unclosed in it)
                del self.skip[len(self.skip) - 1 - self.skip[::-1].index(tag):]
            return
        if tag in ("article", "main", "section"):
            self.content = max(0, self.content - 1)
        if tag in ("td", "th"):
            self._end_cell()
        elif tag in ("tr", "table"):
            self._end_row()
            if tag == "table":
                self.out.append("\n\n")
        elif self.cell is not None:
            return
        elif re.fullmatch(r"h[1-6]", tag) or tag in self.BLOCKS or tag == "li":
            self.out.append("\n\n")

    def handle_data(self, data):
        if self.skip:
            return
        data = re.sub(r"\s+", " ", data)
        (self.cell if self.cell is not None else self.out).append(data)

    def _end_cell(self):
        if self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell))
        self.cell = None

    def _end_row(self):
        self._end_cell()
        if self.row:
            line = _row_line(self.row)
            if line.strip(" |"):
                self.out.append(f"\n\n{line}\n\n")
        self.row = None


def html_text(html: str) -> str:
    p = _HTMLText()
    p.feed(html)
    p.close()
    p._end_row()
    text = "".join(p.out)
    lines = [ln.strip() for ln in text.split("\n")]
    lines = [ln for ln in lines if ln not in ("-", "#", "##", "###", "####", "#####", "######")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"
