"""A venue's documents read from disk and cut into passages.

    docs = read_documents(["pages/", "menu.html"])   # -> Reading: documents, skipped (each with why)
    chunks = chunk_all(docs.documents, max_chars=900)

Plain text (.txt), Markdown (.md, .markdown) and HTML (.html, .htm) are read; anything else is a
reported skip. PDF is refused with the line that converts it (no PDF library is carried: a kiosk's
pages are usually web pages or text). Every problem with one file is a skip that says why (binary,
not UTF-8 text with the byte, over MAX_DOC_BYTES, empty, a duplicate of another file); problems
with the whole set raise one line (nothing to index, a file that changed while it was read).

A chunk is a run of whole paragraphs under one heading, at most `max_chars` characters (a paragraph
longer than that is cut at sentence ends, then at spaces). Its offsets are character offsets into
the document's text as read (for HTML: into its extracted text, headings as `#` lines), so a source
can be shown and found again.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from ..errors import InvalidRequest

MAX_DOC_BYTES = 8 << 20  # a page of a venue is kB; a file past this is a skip, not a memory spike
TEXT_SUFFIXES = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown",
                 ".html": "html", ".htm": "html"}
PDF_LINE = "PDF is not read: convert it to text first (`pdftotext FILE FILE.txt`, poppler-utils) and index that"


class IndexInputError(InvalidRequest):
    """The documents cannot make an index (nothing readable, a file changed while read)."""

    def __init__(self, message: str):
        super().__init__(message, param="docs")


@dataclass(frozen=True)
class Document:
    source: str  # the path as given or found (shown to visitors as the passage's file)
    title: str  # the first heading, else the file name without its suffix
    text: str  # what chunks' offsets index (HTML: its extracted text)
    sha256: str  # of the file's bytes
    size: int  # bytes
    mtime_ns: int


@dataclass(frozen=True)
class Chunk:
    source: str
    title: str  # "document title › section heading" (the document's title alone before its first heading)
    start: int  # character offsets into the document's text: text[start:end] is the passage
    end: int
    text: str


@dataclass
class Reading:
    documents: list[Document] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why), in the order met


def _files(paths) -> list[Path]:
    """Files named, and the files under folders named (sorted, hidden ones and links out left out)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and not any(x.startswith(".") for x in
                                                                              f.relative_to(p).parts))
            if not found:
                raise IndexInputError(f"{p}: an empty folder (no documents in it)")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise IndexInputError(f"{p}: no such file or folder")
    return out


def read_documents(paths) -> Reading:
    """Reads every file (see the module docstring). Raises IndexInputError when none is usable."""
    if not paths:
        raise IndexInputError("no documents given: `edgespec index DOCS... -o INDEX`")
    r = Reading()
    seen: dict[str, str] = {}  # sha256 -> the first file with those bytes
    for f in _files(paths):
        name = str(f)
        kind = TEXT_SUFFIXES.get(f.suffix.lower())
        if f.suffix.lower() == ".pdf":
            r.skipped.append((name, PDF_LINE))
            continue
        if kind is None:
            r.skipped.append((name, f"not a document type read here ({', '.join(sorted(TEXT_SUFFIXES))})"))
            continue
        st = f.stat()
        if st.st_size > MAX_DOC_BYTES:
            r.skipped.append((name, f"{st.st_size:,} bytes, over the {MAX_DOC_BYTES:,} a document may be"))
            continue
        raw = f.read_bytes()
        if b"\0" in raw[:8192]:
            r.skipped.append((name, "binary (NUL bytes): not a text document"))
            continue
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            r.skipped.append((name, f"not UTF-8 text (byte {e.start}): save it as UTF-8"))
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            r.skipped.append((name, f"a duplicate of {seen[digest]} (same bytes)"))
            continue
        text = html_text(text) if kind == "html" else text.replace("\r\n", "\n")
        if not text.strip():
            r.skipped.append((name, "empty (no text)"))
            continue
        seen[digest] = name
        r.documents.append(Document(name, _title(text, f), text, digest, len(raw), st.st_mtime_ns))
    if not r.documents:
        why = "; ".join(f"{p}: {w}" for p, w in r.skipped[:3])
        raise IndexInputError(f"no readable documents{f' ({why})' if why else ''}")
    return r


def check_unchanged(docs: list[Document]) -> None:
    """After indexing: every document still has the bytes it was read with (a file edited while the
    index was built would leave passages that quote text no longer there)."""
    for d in docs:
        try:
            st = os.stat(d.source)
            same = st.st_size == d.size and (st.st_mtime_ns == d.mtime_ns or
                                             hashlib.sha256(Path(d.source).read_bytes()).hexdigest() == d.sha256)
        except OSError:
            same = False
        if not same:
            raise IndexInputError(f"{d.source} changed while it was indexed: run `edgespec index` again "
                                  "once the documents are written")


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _title(text: str, path: Path) -> str:
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m and m.group(2):
            return m.group(2)
    return path.stem


class _HTMLText(HTMLParser):
    """HTML -> text: headings as `#` lines, block elements as paragraphs, script/style dropped."""

    BLOCKS = {"p", "div", "section", "article", "li", "tr", "br", "table", "ul", "ol", "dl", "dt", "dd",
              "blockquote", "pre", "header", "footer", "main", "nav", "aside", "figure", "figcaption"}
    SKIP = {"script", "style", "head", "template", "noscript"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0
        self.heading = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.heading = int(tag[1])
            self.out.append("\n\n" + "#" * self.heading + " ")
        elif tag in self.BLOCKS:
            self.out.append("\n\n" if tag != "li" else "\n\n- ")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif re.fullmatch(r"h[1-6]", tag):
            self.heading = 0
            self.out.append("\n\n")
        elif tag in self.BLOCKS:
            self.out.append("\n\n")

    def handle_data(self, data):
        if self.skip:
            return
        data = re.sub(r"\s+", " ", data)
        self.out.append(data)


def html_text(html: str) -> str:
    p = _HTMLText()
    p.feed(html)
    p.close()
    text = "".join(p.out)
    lines = [ln.strip() for ln in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


# -- chunking ----------------------------------------------------------------------------------------
_PARA = re.compile(r"\n\s*\n")


def _paragraphs(text: str) -> list[tuple[int, int]]:
    """(start, end) of each paragraph (blank-line separated), whitespace trimmed."""
    out, pos = [], 0
    for m in [*_PARA.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        seg = text[pos:end]
        s = pos + (len(seg) - len(seg.lstrip()))
        e = pos + len(seg.rstrip())
        if e > s:
            out.append((s, e))
        if m is not None:
            pos = m.end()
    return out


def _split_long(text: str, s: int, e: int, max_chars: int) -> list[tuple[int, int]]:
    """A paragraph longer than max_chars, cut after sentence ends (else spaces) into parts <= max_chars."""
    out = []
    while e - s > max_chars:
        window = text[s : s + max_chars]
        cut = max(window.rfind(". "), window.rfind("。"), window.rfind("! "), window.rfind("? "))
        if cut < max_chars // 3:
            cut = window.rfind(" ")
        cut = cut + 1 if cut >= max_chars // 3 else max_chars
        out.append((s, s + cut))
        s += cut
        while s < e and text[s].isspace():
            s += 1
    if e > s:
        out.append((s, e))
    return out


def chunk_document(doc: Document, max_chars: int) -> list[Chunk]:
    """Runs of whole paragraphs under one heading, each at most max_chars (see the module docstring)."""
    chunks: list[Chunk] = []
    heading = ""
    cur: list[tuple[int, int]] = []

    def flush():
        if cur:
            s, e = cur[0][0], cur[-1][1]
            title = f"{doc.title} › {heading}" if heading and heading != doc.title else doc.title
            chunks.append(Chunk(doc.source, title, s, e, doc.text[s:e]))
            cur.clear()

    for s, e in _paragraphs(doc.text):
        m = _HEADING.match(doc.text[s:e].split("\n", 1)[0])
        if m:
            flush()
            heading = m.group(2)
            if "\n" not in doc.text[s:e]:  # a heading alone: it starts the next chunk's text
                cur.append((s, e))
                continue
        for ps, pe in _split_long(doc.text, s, e, max_chars):
            if cur and pe - cur[0][0] > max_chars:
                only_heading = len(cur) == 1 and _HEADING.match(doc.text[cur[0][0]:cur[0][1]])
                if not only_heading:
                    flush()
            cur.append((ps, pe))
    flush()
    return chunks


def chunk_all(docs: list[Document], max_chars: int) -> list[Chunk]:
    return [c for d in docs for c in chunk_document(d, max_chars)]
