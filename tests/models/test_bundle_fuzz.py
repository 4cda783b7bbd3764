"""The manifest fuzz: every field x every JSON type x out-of-range values, digests recomputed, seeded.

Each case is read exactly as `verify` and Bundle.open read it (models.bundle.read_bundle). The
property: zero tracebacks. A case either loads (no problems) or is refused with lines that are each
one line naming a field or a file. The cases that load are then opened and run by the engine, so a
lie the reader lets through cannot crash later either.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
from edgespec.models.bundle import read_bundle
from edgespec.models.manifest import check_schema, content_digest

SEED = 23
ENGINE_RUNS = 60  # accepted cases opened and run by the engine (a seeded sample; each costs a model load)
# every JSON type, and the values that break naive readers
VALUES = [None, True, False, 0, -1, 1, 7, 2**31, 2**63, 10**30, 1.5, -0.0, float("nan"), "", "x", "%d",
          "%s%d", "../x", "/etc/passwd", "past_key_values.%d.key%s", [], [1], [-1], ["x"], [2.5], [None], {},
          {"a": 1}, {"skip": "abc"}, [[[]]], {"a": json.loads("[" * 800 + "]" * 800)}]


def _paths(d: dict) -> list[tuple[str, ...]]:
    """Every field of the manifest down to the facts of each model and the tokenizer."""
    out = [(k,) for k in d]
    for record in ("drafting", "defaults"):  # free-form records: each key the reader knows, and one it does not
        out += [(record, k) for k in d[record]] + [(record, "unknown")]
    for role, facts in d["models"].items():
        out += [("models", role, k) for k in facts]
        out.append(("models", role, "self_draft", "skip"))
        out += [("models", role, "parity", k) for k in facts["parity"]]
    out += [("tokenizer", k) for k in d["tokenizer"]]
    rel = next(iter(d["files"]))
    out += [("files", rel, "size"), ("files", rel, "sha256")]
    return out


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def _set(d, path, value):
    for k in path[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    if value is _DELETE:
        d.pop(path[-1], None)
    else:
        d[path[-1]] = value


_DELETE = object()


def _near(v, rng: random.Random) -> list:
    """Out-of-range neighbours of a value actually in the manifest."""
    if isinstance(v, bool):
        return [not v]
    if isinstance(v, int):
        return [v + 1, v - 1, -v, v * 1000 + rng.randrange(1000), 0, rng.randrange(-2**40, 2**40)]
    if isinstance(v, list) and v and all(isinstance(i, int) for i in v):
        return [[i + 1000000 for i in v], [-1], v * 3, [str(i) for i in v], [float(i) + 0.5 for i in v]]
    if isinstance(v, str):
        return [v + "x", v.upper(), v * 50, v[:-1]]
    return []


# cross-field lies a hostile probe found passing (issue: every field against the graph): each must be refused
FIXED_LIES = [
    (("defaults", "max_len"), 3), (("defaults", "max_len"), -1), (("defaults", "max_len"), "x"),
    (("defaults", "max_len"), 1e40), (("tokenizer", "usable_vocab"), 10),
    (("drafting",), {"mode": "bogus", "k": -5}), (("drafting",), {"k": 1e40}),
    (("drafting",), {"k": 1e308, "max_k": -1}), (("drafting",), {"draft_agreement": "x"}),
    (("models", "target", "activation_dtype"), "float16"), (("models", "target", "block_size"), 7),
    (("models", "target", "vocab_map"), "tokenizer.json"), (("models", "target", "parity", "top1"), float("nan")),
    (("tokenizer", "eos_ids"), [2] * 100_000),
]


def _cases(d: dict) -> list[tuple[tuple[str, ...], object]]:
    rng = random.Random(SEED)
    cases = list(FIXED_LIES)
    for path in _paths(d):
        try:
            current = _get(d, path)
        except (KeyError, TypeError):
            current = None
        cases += [(path, v) for v in [*VALUES, *_near(current, rng), _DELETE]]
    return cases


@pytest.fixture(scope="module")
def scratch(tiny_bundle, tmp_path_factory):
    """One copy of the tiny bundle for the whole module: each case rewrites only its manifest."""
    b = tmp_path_factory.mktemp("fuzz") / "b"
    shutil.copytree(tiny_bundle, b)
    return b


def _named(line: str, files: set[str]) -> bool:
    """A refusal names a field of manifest.json or one of the bundle's files."""
    head = line.split(":", 1)[0]
    return head in ("manifest.json", "tokenizer.json", "tokenizer_config.json") or head in files or \
        line.startswith(("target model scores", "draft model scores"))


def test_fuzzed_manifests_load_or_are_one_line_each(scratch):
    mpath = scratch / "manifest.json"
    original = json.loads(mpath.read_text())
    files = set(original["files"])
    base = json.dumps(original)
    loaded, refused = [], 0
    for i, (path, value) in enumerate(_cases(original)):  # the FIXED_LIES first
        d = json.loads(base)  # a fresh copy (faster than deepcopy)
        _set(d, path, value)
        d["digest"] = content_digest(d)
        text = json.dumps(d)
        case = f"{'.'.join(path)} = {value!r}"[:200]
        # read_bundle reads the file, then stops at the schema when it has problems: that first
        # step is run in memory (the filesystem is the slow part of this test), the rest for real
        problems = check_schema(json.loads(text))
        if not problems:
            mpath.write_text(text)
            reading = read_bundle(scratch, checksums=False)  # any exception fails the test
            problems = reading.problems + reading.mismatches
        for line in problems:
            assert "\n" not in line and len(line) < 400, (case, line)
            assert _named(line, files), (case, line)
        assert problems or i >= len(FIXED_LIES), f"{case}: a lie the probe found is accepted"
        if problems:
            refused += 1
        elif path[0] not in _NOT_READ and path[-1] not in _NOT_READ:
            loaded.append((case, d))
    mpath.write_text(json.dumps(original, indent=2))
    assert refused > 2000  # the fuzz really ran its cases (about 3,000 of them)
    _run_what_loads(scratch, loaded, original)


# fields nothing at runtime reads (notes for people): a case that only changes one is not run
_NOT_READ = {"created_by", "created_at", "extra", "drafting", "digest", "parity", "source", "arch"}


def _run_what_loads(b: Path, loaded: list, original: dict) -> None:
    """A manifest the reader accepts must also open and generate (or refuse with our own error)."""
    from edgespec.engine import Engine

    mpath = b / "manifest.json"
    rng = random.Random(SEED)
    for case, d in rng.sample(loaded, min(len(loaded), ENGINE_RUNS)):
        mpath.write_text(json.dumps(d))
        try:  # the draft model is loaded only when the case edits its facts (half the cost otherwise)
            draft = "auto" if case.startswith("models.draft") else "none"
            eng = Engine.open(b, verify=False, warmup=False, max_len=64, draft=draft)
        except EdgespecError:
            continue
        try:
            out = eng.generate(prompt="Hello", max_new_tokens=3)
            assert isinstance(out.text, str), case
        except EdgespecError:
            pass
        finally:
            eng.close()
    mpath.write_text(json.dumps(original, indent=2))


# the records only some bundles have: a pruned draft's map and drafting.draft_vocab, the draft heads'
# record, a second flavor's fields; each fuzzed on a bundle that has it
RECORD_BUNDLES = {
    "tiny_pruned_bundle": lambda d: [("models", "draft", "vocab_map"), *[("drafting", "draft_vocab", k)
                                                                         for k in d["drafting"]["draft_vocab"]]],
    "tiny_heads_bundle": lambda d: [("heads", k) for k in d["heads"] if k != "training"] + [("heads", "training")],
    "tiny_both_flavors_bundle": lambda d: [("models", r, "flavors", "cuda", k) for r in d["models"]
                                           for k in d["models"][r]["flavors"]["cuda"]]
                                          + [("models", r, "flavors", "cuda", "parity", "top1") for r in d["models"]]
                                          + [("models", "target", "flavors", "f" * 500),  # keys as long as values
                                             ("models", "target", "flavors", "cuda", "f" * 500)],
}


@pytest.mark.parametrize("fixture", list(RECORD_BUNDLES))
def test_fuzzed_records_load_or_are_one_line_each(request, fixture, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(request.getfixturevalue(fixture), b)
    mpath = b / "manifest.json"
    original = json.loads(mpath.read_text())
    files, base = set(original["files"]), json.dumps(original)
    rng = random.Random(SEED)
    refused = 0
    for path in RECORD_BUNDLES[fixture](original):
        try:
            current = _get(original, path) if path[-1] != "training" else None
        except KeyError:  # a key the bundle does not have
            current = None
        for value in [*VALUES, *_near(current, rng), _DELETE]:
            d = json.loads(base)
            _set(d, path, value)
            d["digest"] = content_digest(d)
            case = f"{'.'.join(path)} = {value!r}"[:200]
            problems = check_schema(json.loads(json.dumps(d)))
            if not problems:
                mpath.write_text(json.dumps(d))
                reading = read_bundle(b, checksums=False)  # any exception fails the test
                problems = reading.problems + reading.mismatches
            for line in problems:
                assert "\n" not in line and len(line) < 400, (case, line)
                assert _named(line, files), (case, line)
            refused += bool(problems)
    assert refused > 100  # the cases really ran (and most of them are lies)
