"""Tiny office documents made by the tests themselves: a PDF with a text layer (written by hand: a few
objects and an xref table, Helvetica, WinAnsi text) and a .docx (python-docx)."""
from __future__ import annotations

from pathlib import Path


def _pdf_string(s: str) -> bytes:
    return b"(" + s.encode("cp1252").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def make_pdf(path: Path, pages: list[list[str]], title: str | None = None) -> Path:
    """One page per list of lines (an empty list: a page without text, as a scan has)."""
    objs: list[bytes] = []
    n_pages = len(pages)
    font = 3 + 2 * n_pages
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n_pages))
    objs.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode())
    for i, lines in enumerate(pages):
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 {font} 0 R >> >> "
                    f"/Contents {4 + 2 * i} 0 R >>".encode())
        body = b"BT /F1 12 Tf 50 800 Td 16 TL " + b" ".join(_pdf_string(ln) + b" Tj T*" for ln in lines) + b" ET"
        objs.append(b"<< /Length " + str(len(body)).encode() + b" >>\nstream\n" + body + b"\nendstream")
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    info = None
    if title is not None:
        objs.append(b"<< /Title " + _pdf_string(title) + b" >>")
        info = len(objs)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + o + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R{f' /Info {info} 0 R' if info else ''} >>\n".encode()
    out += f"startxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


def make_docx(path: Path, blocks: list, title: str | None = None) -> Path:
    """blocks: ("h1"|"h2"|"p"|"li", text) or ("table", [[cell, ...], ...])."""
    import docx

    d = docx.Document()
    if title:
        d.core_properties.title = title
    for kind, value in blocks:
        if kind == "table":
            t = d.add_table(rows=len(value), cols=len(value[0]))
            for r, row in enumerate(value):
                for c, cell in enumerate(row):
                    t.cell(r, c).text = cell
        elif kind.startswith("h"):
            d.add_heading(value, level=int(kind[1]))
        elif kind == "li":
            d.add_paragraph(value, style="List Bullet")
        else:
            d.add_paragraph(value)
    d.save(str(path))
    return path
