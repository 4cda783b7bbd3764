"""What the help texts, the env file and the docs say about defaults agrees with the code."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from edgespec import limits
from edgespec.cli.main import main
from edgespec.drafters import modes
from edgespec.edge import memory, providers

ROOT = Path(__file__).resolve().parents[2]


def help_of(*command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(out.getvalue().split())  # argparse wraps lines: compare words


def test_the_suffix_index_size_is_one_figure_everywhere():
    mib = memory.suffix_index_bytes() / 2**20
    assert round(mib) == 244 and limits.SUFFIX_BYTES_PER_TOKEN == 244  # the figure the texts below state
    text = limits.suffix_memory_text()
    assert "244 bytes a token" in text and "244 MiB at the default" in text
    for cmd in ("generate", "serve"):
        assert " ".join(text.split()) in help_of(cmd), cmd
    from edgespec.engine import Engine

    places = {
        "Engine.open": Engine.open.__doc__,
        "systemd/edgespec.env": (ROOT / "systemd" / "edgespec.env").read_text(),
        "docs/runtime.md": (ROOT / "docs" / "runtime.md").read_text(),
        "docs/server.md": (ROOT / "docs" / "server.md").read_text(),
        "docs/speed.md": (ROOT / "docs" / "speed.md").read_text(),
        "docs/edge.md": (ROOT / "docs" / "edge.md").read_text(),
    }
    for where, words in places.items():
        words = " ".join(words.split())
        assert "244 bytes" in words, where
        assert "4 bytes each" not in words and "= 4 MB" not in words and "~120 MB" not in words, where


def test_providers_help_states_the_default_order_the_code_uses():
    assert providers.TRT not in providers.DEFAULT_ORDER
    want = ",".join(providers.short_name(p) for p in providers.DEFAULT_ORDER)
    for cmd in ("generate", "serve"):
        h = help_of(cmd)
        assert f"else {want} where this onnxruntime has them; tensorrt only when named" in h, cmd
        assert "else tensorrt" not in h, cmd


def test_draft_help_marks_auto_as_the_default_not_none():
    h = help_of("generate")
    assert "drafting: auto (default): per round" in h
    assert "(default);" not in h and "none (default)" not in h
    assert modes.help_text().startswith("auto (default): ")
