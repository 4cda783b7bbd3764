"""A venue's documents read from disk and cut into passages.

    docs = read_documents(["pages/", "menu.pdf"])   # -> Reading: documents, skipped (each with why)
    chunks = chunk_all(docs.documents, max_chars=900)

Text (.txt), Markdown (.md), HTML, PDF (its text layer) and Word (.docx) are read (readers.py: which
library reads what, and text encodings detected, not refused); anything else is a reported skip. The
folders given are walked without ever leaving them: a link (to a file or a folder) that resolves
outside every folder and file given is refused, as are files that are not regular files (a FIFO
would block the build). Every problem with one file or folder is a skip that says why (unreadable,
link out, encoding, size, type, empty, hidden, a duplicate of another file's text once line endings
are normalised); problems with the whole set raise one line (nothing to index, a file that changed
while it was read).

A chunk is a run of whole paragraphs under one heading, at most `max_chars` characters (a paragraph
longer than that is cut at line or sentence ends, then at spaces). Its offsets are character offsets
into the document's text as read (HTML, PDF, Word: into the extracted text, headings as `#` lines), so
a source can be shown and found again. Its title is the document's title and the path of headings
above it ("Museum › Tickets › Groups"; a PDF's page is a heading: "Leaflet › page 2").
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidRequest
from .readers import KINDS, REFUSED, Unread, html_text, normalise_newlines, read_bytes

MAX_DOC_BYTES = 8 << 20  # a page of a venue is kB, a leaflet PDF a few MB; past this is a skip, not a memory spike
__all__ = ["MAX_DOC_BYTES", "IndexInputError", "Document", "Chunk", "Reading", "read_documents", "check_unchanged",
           "chunk_document", "chunk_all", "html_text"]


class IndexInputError(InvalidRequest):
    """The documents cannot make an index (nothing readable, a file changed while read)."""

    def __init__(self, message: str):
        super().__init__(message, param="docs")


@dataclass(frozen=True)
class Document:
    source: str  # the path as given or found (shown to visitors as the passage's file)
    title: str  # the document's own title, else its first heading, else the file name without its suffix
    text: str  # what chunks' offsets index (the extracted text for HTML, PDF, Word)
    sha256: str  # of the file's bytes
    size: int  # bytes
    mtime_ns: int
    note: str = ""  # what was read: format and encoding, or pages ("markdown, utf-8", "pdf, 3 of 3 page(s) with text")


@dataclass(frozen=True)
class Chunk:
    source: str
    title: str  # "document title › heading › subheading" (the document's title alone before its first heading)
    start: int  # character offsets into the document's text: text[start:end] is the passage
    end: int
    text: str


@dataclass
class Reading:
    documents: list[Document] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why), in the order met


def _inside(real: str, roots: list[str]) -> bool:
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _walk(folder: Path, roots: list[str], found: list[Path], skipped: list[tuple[str, str]]) -> None:
    """Files under `folder`, sorted, depth first; links followed only where they stay inside `roots`
    (a link to a folder inside them is not followed: that folder is read where it is)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        skipped.append((str(folder), f"unreadable folder ({e.strerror or type(e).__name__})"))
        return
    for e in entries:
        path = Path(e.path)
        if e.name.startswith("."):
            skipped.append((str(path), "hidden (its name starts with '.'): left out"))
            continue
        try:
            if e.is_symlink():
                real = os.path.realpath(path)
                if not _inside(real, roots):
                    skipped.append((str(path), f"a link out of the given folders (to {real}): refused"))
                elif os.path.isdir(real):
                    skipped.append((str(path), f"a link to a folder inside the given ones ({real}): read there"))
                else:
                    found.append(path)
            elif e.is_dir():
                _walk(path, roots, found, skipped)
            else:
                found.append(path)
        except OSError as err:
            skipped.append((str(path), f"unreadable ({err.strerror or type(err).__name__})"))


def _files(paths) -> tuple[list[Path], list[tuple[str, str]]]:
    """(files named and found under the folders named, skips met while walking); see the module docstring."""
    paths = [Path(p) for p in paths]
    for p in paths:
        if not os.path.lexists(p):
            raise IndexInputError(f"{p}: no such file or folder")
    roots = [os.path.realpath(p) for p in paths]
    out: list[Path] = []
    skipped: list[tuple[str, str]] = []
    for p in paths:
        if p.is_dir():
            before = len(out) + len(skipped)
            _walk(p, roots, out, skipped)
            if len(out) + len(skipped) == before:
                raise IndexInputError(f"{p}: an empty folder (no documents in it)")
        else:
            out.append(p)
    return out, skipped


def _read(path: Path, roots: list[str]) -> tuple[bytes, os.stat_result]:
    """The file's bytes, opened without following a link swapped in since the walk (O_NOFOLLOW on the
    resolved path, checked inside the roots again) and only when it is a regular file under MAX_DOC_BYTES."""
    real = os.path.realpath(path)
    if not _inside(real, roots):
        raise Unread(f"a link out of the given folders (to {real}): refused")
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise Unread(f"unreadable ({e.strerror or type(e).__name__})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Unread("not a regular file (a device, FIFO or socket)")
        if st.st_size > MAX_DOC_BYTES:
            raise Unread(f"size: {st.st_size:,} bytes, over the {MAX_DOC_BYTES:,} a document may be")
        try:
            return f.read(MAX_DOC_BYTES + 1), st
        except OSError as e:
            raise Unread(f"unreadable ({e.strerror or type(e).__name__})") from None


def read_documents(paths) -> Reading:
    """Reads every file (see the module docstring). Raises IndexInputError when none is usable."""
    if not paths:
        raise IndexInputError("no documents given: `edgespec index DOCS... -o INDEX`")
    files, skipped = _files(paths)
    roots = [os.path.realpath(p) for p in paths]
    r = Reading(skipped=skipped)
    seen: dict[str, str] = {}  # sha256 of the text, line endings normalised -> the first file with it
    for f in files:
        name = str(f)
        suffix = f.suffix.lower()
        kind = KINDS.get(suffix)
        if kind is None:
            r.skipped.append((name, f"type: {REFUSED.get(suffix) or 'not a document type read here'} "
                                    f"({', '.join(sorted(KINDS))} are)"))
            continue
        try:
            raw, st = _read(f, roots)
            got = read_bytes(kind, raw)
        except Unread as e:
            r.skipped.append((name, str(e)))
            continue
        if not got.text.strip():
            r.skipped.append((name, "empty (no text)"))
            continue
        same = hashlib.sha256(normalise_newlines(got.text).encode("utf-8")).hexdigest()
        if same in seen:
            r.skipped.append((name, f"a duplicate of {seen[same]} (the same text)"))
            continue
        seen[same] = name
        r.documents.append(Document(name, got.title or _title(got.text, f), got.text, hashlib.sha256(raw).hexdigest(),
                                    len(raw), st.st_mtime_ns, got.note))
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
        cut = max(window.rfind("\n"), window.rfind(". "), window.rfind("。"), window.rfind("! "), window.rfind("? "))
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
    path: list[tuple[int, str]] = []  # (level, heading) of the headings above, outermost first
    cur: list[tuple[int, int]] = []

    def flush():
        if cur:
            s, e = cur[0][0], cur[-1][1]
            names = [h for _, h in path if h]
            if names and names[0] == doc.title:
                names = names[1:]
            chunks.append(Chunk(doc.source, " › ".join([doc.title, *names]), s, e, doc.text[s:e]))
            cur.clear()

    for s, e in _paragraphs(doc.text):
        m = _HEADING.match(doc.text[s:e].split("\n", 1)[0])
        if m:
            flush()
            level = len(m.group(1))
            path[:] = [x for x in path if x[0] < level] + [(level, m.group(2))]
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
