"""The pinned prefix (engine/pinned.py, `serve --system-prompt`): the first visitor after start reuses
the system prompt's prefill, also after a request that shares nothing with it; a saved prefix makes a
restart warm; a corrupt or stale saved file is ignored with one log line; bad options are refused."""
from __future__ import annotations

import logging
import types

import numpy as np
import pytest

from edgespec.cli.commands.serve import system_prompt
from edgespec.engine import Engine
from edgespec.engine.pinned import cache_key, pin_system_prompt, prefix_tokens
from edgespec.server.config import ConfigError

SYSTEM = "You are the museum's guide. Answer in two short sentences, in plain words, about the exhibits. " * 3


def visitor(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def eng(tiny_bundle):
    return Engine.open(tiny_bundle, max_len=256, warmup=False)


def test_the_first_visitor_reuses_the_pinned_prefix_after_an_unrelated_request(eng):
    eng.pinned = None
    eng.reset_cache()
    ref = eng.generate(messages=visitor("Where is the map?"), max_new_tokens=12, draft="none")
    assert ref.stats.cached_tokens == 0  # nothing pinned, nothing cached: the whole prompt prefilled
    eng.reset_cache()
    pin = pin_system_prompt(eng, SYSTEM)
    n = len(pin.tokens)
    assert n > 40 and pin.tokens == eng.encode(messages=visitor("x"))[:n] and pin.source == "prefill"
    eng.generate(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=2)  # the server's warm-up
    first = eng.generate(messages=visitor("Where is the map?"), max_new_tokens=12, draft="none")
    assert first.stats.cached_tokens == n  # the pinned rows came back: only the question was prefilled
    assert first.token_ids == ref.token_ids  # restored rows are the rows a prefill writes
    second = eng.generate(messages=visitor("When do you open?"), max_new_tokens=12, draft="auto")
    assert second.stats.cached_tokens >= n
    other = eng.generate(prompt="def add(a, b):", max_new_tokens=4)  # not a conversation with the prompt
    assert other.stats.cached_tokens < n
    eng.pinned = None


@pytest.mark.parametrize("host_rows", [True, False], ids=["cpu-copy-kept", "gpu-no-copy"])
def test_the_servers_warm_up_leaves_the_pinned_prompt_for_the_first_visitor(eng, monkeypatch, host_rows):
    """The warm-up (server/service.py) is a visitor's conversation: at READY the cache holds the
    pinned rows, so the first visitor reuses them with no copy back, and on a provider whose cache
    is not on the host (no copy kept: rows None) it reuses them at all. Negative control: the old
    warm-up, a "Hi" that shares nothing with the prompt, leaves the GPU case's first visitor
    prefilling the whole prompt."""
    from edgespec.server.service import warm_up

    eng.pinned = None
    eng.reset_cache()
    pin = pin_system_prompt(eng, SYSTEM)
    n = len(pin.tokens)
    if not host_rows:
        pin.rows = None
    copies = []
    real_restore = eng.target.restore
    monkeypatch.setattr(eng.target, "restore", lambda rows: (copies.append(len(rows)), real_restore(rows))[1])
    warm_up(eng)
    assert eng.cached()[:n] == pin.tokens
    first = eng.generate(messages=visitor("Where is the map?"), max_new_tokens=12, draft="none")
    assert first.stats.cached_tokens == n and copies == []
    if not host_rows:  # the negative control
        eng.reset_cache()
        pin_system_prompt(eng, SYSTEM).rows = None
        eng.generate(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=2)
        again = eng.generate(messages=visitor("Where is the map?"), max_new_tokens=12, draft="none")
        assert again.stats.cached_tokens < n // 4
    eng.pinned = None


def test_a_saved_prefix_starts_a_restart_warm_and_a_corrupt_one_is_ignored(eng, tmp_path, caplog):
    eng.reset_cache()
    a = pin_system_prompt(eng, SYSTEM, save_dir=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and files[0].stem == cache_key(eng, a.tokens) and a.source == "prefill"
    eng.reset_cache()
    b = pin_system_prompt(eng, SYSTEM, save_dir=tmp_path)  # a restart: loaded, not prefilled
    assert b.source == "file" and b.tokens == a.tokens
    for x, y in zip(a.rows, b.rows):
        np.testing.assert_array_equal(x, y)
    first = eng.generate(messages=visitor("Where is the map?"), max_new_tokens=6, draft="none")
    assert first.stats.cached_tokens == len(a.tokens)

    raw = bytearray(files[0].read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the saved rows
    files[0].write_bytes(bytes(raw))
    eng.reset_cache()
    with caplog.at_level(logging.WARNING, logger="edgespec.engine"):
        c = pin_system_prompt(eng, SYSTEM, save_dir=tmp_path)
    lines = [r.getMessage() for r in caplog.records if "pinned prefix" in r.getMessage()]
    assert len(lines) == 1 and "ignoring" in lines[0] and str(files[0]) in lines[0]
    assert c.source == "prefill"  # prefilled again, and the file replaced by a good one
    eng.reset_cache()
    assert pin_system_prompt(eng, SYSTEM, save_dir=tmp_path).source == "file"
    eng.pinned = None


def test_a_batch_pins_by_the_same_flow_and_shares_the_saved_rows(eng, tiny_bundle, tmp_path):
    """--parallel 2: pin_system_prompt fills every slot from one snapshot, saved under the serial
    engine's key, so either engine's restart loads what the other saved."""

    eng.reset_cache()
    serial = pin_system_prompt(eng, SYSTEM, save_dir=tmp_path)
    batch = Engine.open(tiny_bundle, parallel=2, max_len=256, warmup=False, draft="none")
    try:
        pin = pin_system_prompt(batch, SYSTEM, save_dir=tmp_path)
        n = len(pin.tokens)
        assert pin.source == "file" and pin.tokens == serial.tokens and batch.pinned is pin
        assert batch.runner.lengths == [n, n]
        for x, y in zip(serial.rows, pin.rows):
            np.testing.assert_array_equal(x, y)
        want = eng.generate(messages=visitor("Where is the map?"), max_new_tokens=6, draft="none")
        got = batch.generate(messages=visitor("Where is the map?"), max_new_tokens=6)
        assert got.token_ids == want.token_ids and got.stats.cached_tokens == n
    finally:
        batch.close()
    eng.pinned = None


def test_a_stale_saved_prefix_is_ignored(eng, tmp_path, caplog):
    eng.reset_cache()
    other = pin_system_prompt(eng, "Answer in German.", save_dir=tmp_path)
    stale = tmp_path / f"{cache_key(eng, prefix_tokens(eng, SYSTEM)[0])}.npz"
    (tmp_path / f"{cache_key(eng, other.tokens)}.npz").rename(stale)  # another prompt's rows under this key
    with caplog.at_level(logging.WARNING, logger="edgespec.engine"):
        pin = pin_system_prompt(eng, SYSTEM, save_dir=tmp_path)
    assert pin.source == "prefill"
    assert [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    eng.pinned = None


def test_system_prompt_option_is_checked_before_loading(tmp_path):
    f = tmp_path / "system.txt"
    f.write_text("  Be brief.\n", encoding="utf-8")
    assert system_prompt(str(f)) == "Be brief."
    assert system_prompt(None) is None
    (tmp_path / "empty.txt").write_text(" \n", encoding="utf-8")
    with pytest.raises(ConfigError, match="empty"):
        system_prompt(str(tmp_path / "empty.txt"))
    with pytest.raises(ConfigError, match="cannot be read"):
        system_prompt(str(tmp_path / "missing.txt"))


def test_serve_pins_the_prompt_file_before_the_service_is_ready(tiny_bundle, tmp_path, monkeypatch, capsys):
    """`serve --system-prompt FILE` (or EDGESPEC_SYSTEM_PROMPT): the engine the service gets has the
    prompt pinned and saved under $EDGESPEC_HOME/pinned; a bad file is one line and exit 78."""
    import edgespec.server.service as service_mod
    from edgespec.cli.main import main

    opened = {}

    class FakeService:
        def __init__(self, config, open_engine, default_name):
            self.open_engine = open_engine
            self.state = types.SimpleNamespace()  # serve sets state.embedder, as on the real Service

        def run(self):
            eng = opened["engine"] = self.open_engine()
            eng.close()
            return 0

    monkeypatch.setattr(service_mod, "Service", FakeService)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    f = tmp_path / "guide.txt"
    f.write_text(SYSTEM + "\n", encoding="utf-8")
    assert main(["serve", str(tiny_bundle), "--no-warmup", "--system-prompt", str(f)]) == 0
    pin = opened["engine"].pinned
    assert pin.text == SYSTEM.strip() and pin.source == "prefill" and len(pin.tokens) > 40
    assert len(list((tmp_path / "home" / "pinned").glob("*.npz"))) == 1
    monkeypatch.setenv("EDGESPEC_SYSTEM_PROMPT", str(f))
    assert main(["serve", str(tiny_bundle), "--no-warmup"]) == 0
    assert opened["engine"].pinned.source == "file"  # the restart loads what the first start saved
    capsys.readouterr()
    monkeypatch.setenv("EDGESPEC_SYSTEM_PROMPT", str(tmp_path / "missing.txt"))
    assert main(["serve", str(tiny_bundle), "--no-warmup"]) == 78
    assert "--system-prompt" in capsys.readouterr().err


def test_a_prompt_longer_than_the_cache_is_not_pinned(eng, caplog):
    with caplog.at_level(logging.WARNING, logger="edgespec.engine"):
        assert pin_system_prompt(eng, SYSTEM * 8) is None
    assert eng.pinned is None
    assert any("do not fit the cache" in r.getMessage() for r in caplog.records)
