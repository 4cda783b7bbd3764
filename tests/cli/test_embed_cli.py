"""`edgespec embed`: JSON lines from the embedder folder, stdin's lines, and each bad input one line."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from edgespec.cli.main import main
from edgespec.docs.embedder import load_embedder


def test_embeds_arguments_as_json_lines(tiny_embedder_dir, capsys):
    assert main(["embed", "--embedder", str(tiny_embedder_dir), "the museum opens at nine", "museum " * 100]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["index"], r["model"], r["tokens"], r["truncated"]) for r in rows] == [
        (0, "tiny-BERT/int8", 7, False), (1, "tiny-BERT/int8", 64, True)]
    want = load_embedder(tiny_embedder_dir).embed(["the museum opens at nine"])[0]
    assert np.allclose(rows[0]["embedding"], want, atol=1e-6)


def test_reads_stdin_lines_without_arguments(tiny_embedder_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("the museum\nwhere is the lift?\n"))
    assert main(["embed", "--embedder", str(tiny_embedder_dir), "--no-vector"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows == [{"index": 0, "model": "tiny-BERT/int8", "tokens": 4, "truncated": False},
                    {"index": 1, "model": "tiny-BERT/int8", "tokens": 7, "truncated": False}]


@pytest.mark.parametrize("argv, stdin, match", [
    (["embed"], "", "nothing to embed: give TEXT arguments or lines on stdin"),
    (["embed", "--threads", "0", "x"], "", "--threads must be >= 1, got 0"),
    (["embed", "--embedder", "/nowhere/emb", "x"], "", "embedder /nowhere/emb: no such folder"),
    (["embed", "--embedder", "llama", "x"], "", "embedder 'llama': not a folder and not a known embedding model"),
])
def test_bad_inputs_are_one_line(argv, stdin, match, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_serve_refuses_a_bad_embedder_before_loading_anything(tiny_bundle, tmp_path, capsys):
    (tmp_path / "emb").mkdir()
    rc = main(["serve", str(tiny_bundle), "--port", "0", "--embedder", str(tmp_path / "emb")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and err == f"edgespec serve: error: embedder {tmp_path / 'emb'} refused: manifest.json: missing"
