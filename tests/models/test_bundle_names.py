"""A bundle is found by name the same way everywhere: `Engine.open("qwen-coder")` opens what
`edgespec generate qwen-coder` opens, and a name that is not there says where it was looked for and
how to make it (once, without repeating the name as a prefix)."""
from __future__ import annotations

import shutil

import pytest

from edgespec.engine import Engine
from edgespec.errors import BundleNotFound
from edgespec.models.bundle import Bundle, not_found_message, resolve_bundle
from helpers.cli import verify


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty $EDGESPEC_HOME, and a working directory with nothing in it."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "home"


def test_engine_open_resolves_a_name_under_the_bundles_folder(home, tiny_bundle):
    shutil.copytree(tiny_bundle, home / "bundles" / "my-pair")
    eng = Engine.open("my-pair", warmup=False)
    try:
        assert eng.bundle.root == home / "bundles" / "my-pair"
        assert eng.generate("hello", max_new_tokens=4).stats.new_tokens == 4
    finally:
        eng.close()
    assert Bundle.open("my-pair", verify=False).name == "qwen-agree"


def test_a_folder_in_the_working_directory_wins_over_the_bundles_folder(home, tiny_bundle, tiny_bundle_nodraft):
    shutil.copytree(tiny_bundle, home / "bundles" / "pair")
    shutil.copytree(tiny_bundle_nodraft, "pair")
    assert resolve_bundle("pair").resolve() == home.parent / "work" / "pair"
    assert Bundle.open("pair", verify=False).draft is None


def test_a_missing_default_name_says_where_it_looked_and_how_to_make_it(home):
    with pytest.raises(BundleNotFound) as e:
        Engine.open("qwen-coder")
    msg = str(e.value)
    assert f"no {home / 'bundles' / 'qwen-coder'}" in msg
    assert f"no folder {home.parent / 'work' / 'qwen-coder'}" in msg
    assert "`edgespec quickstart` exports the default pair there" in msg
    assert msg.count("qwen-coder") == 3  # the name once, and the two places it was looked for


def test_a_missing_other_name_points_at_export(home):
    msg = not_found_message("mine")
    assert f"`edgespec export --target MODEL -o {home / 'bundles' / 'mine'}` makes it" in msg
    assert "quickstart" not in msg


def test_a_missing_path_is_only_that_path(home, tmp_path):
    (home / "bundles" / "x").mkdir(parents=True)  # a name's bundle must not answer for a path
    msg = not_found_message(tmp_path / "elsewhere" / "x")
    assert msg.startswith(f"bundle {tmp_path / 'elsewhere' / 'x'} does not exist: make one with `edgespec export")
    with pytest.raises(BundleNotFound):
        Bundle.open(tmp_path / "elsewhere" / "x")


def test_verify_by_name_and_a_missing_name_in_one_line(home, tiny_bundle):
    shutil.copytree(tiny_bundle, home / "bundles" / "qwen-coder")
    rc, lines = verify("qwen-coder", "--fast")
    assert rc == 0 and "OK" in lines[0]
    rc, lines = verify("not-here")
    assert rc == 1 and lines == [not_found_message("not-here")]
    assert lines[0].startswith("bundle 'not-here' not found: no folder ")
