"""A progress line while a bundle loads: on a terminal's stderr, never on a pipe, never with --quiet,
and stdout stays the generated text alone."""
from __future__ import annotations

import io
import sys

import pytest

from edgespec.cli import main as cli
from edgespec.cli.loading import LoadProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stages_are_drawn_in_place_then_one_line_says_it_loaded():
    out, now = Terminal(), iter([0.0, 0.5, 2.0, 9.75])
    with LoadProgress("qwen-coder", stream=out, tick=0, clock=lambda: next(now)) as p:
        p.stage("checking the bundle")
        p.stage("loading the models")
    text = out.getvalue()
    assert text == ("\r[loading qwen-coder] checking the bundle 0 s\x1b[K"
                    "\r[loading qwen-coder] loading the models 2 s\x1b[K"
                    "\r\x1b[Kloaded qwen-coder in 9.8 s\n")


def test_an_error_leaves_a_clean_line_for_its_message():
    out = Terminal()
    with pytest.raises(RuntimeError), LoadProgress("b", stream=out, tick=0) as p:
        p.stage("checking the bundle")
        raise RuntimeError("bad")
    assert out.getvalue().endswith("\r\x1b[K") and "loaded" not in out.getvalue()


@pytest.mark.parametrize("stream, quiet", [(io.StringIO(), False), (Terminal(), True)])
def test_nothing_on_a_pipe_or_when_quiet(stream, quiet):
    with LoadProgress("b", stream=stream, quiet=quiet) as p:
        p.stage("checking the bundle")
    assert stream.getvalue() == ""


def test_the_ticker_thread_stops_with_the_block():
    out = Terminal()
    with LoadProgress("b", stream=out, tick=0.01) as p:
        p.stage("loading")
        thread = p._thread
    assert thread is not None and not thread.is_alive()
    assert out.getvalue().endswith("s\n") and "loaded b in " in out.getvalue()


@pytest.mark.parametrize("quiet", [False, True])
def test_generate_shows_it_on_a_terminal_unless_quiet(tiny_bundle, capsys, monkeypatch, quiet):
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    argv = ["generate", str(tiny_bundle), "-p", "hello", "--max-new-tokens", "3", "--device", "generic-x86_64"]
    assert cli.main(argv + (["--quiet"] if quiet else [])) == 0
    text = err.getvalue()
    shown = ("checking the bundle (sha256 of every file)" in text and "loading the models (" in text
             and f"loaded {tiny_bundle} in " in text)
    assert shown is not quiet
    assert "[loading" not in capsys.readouterr().out  # stdout: the text alone
