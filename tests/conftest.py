"""Shared fixtures: tiny bundles built once per test session through the real export path."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny_bundles  # noqa: E402

# fixtures shared by several modules (tests never import from each other)
pytest_plugins = ["helpers.registry"]

IN_CI = bool(os.environ.get("CI"))


@pytest.fixture(scope="session")
def bundle_root(tmp_path_factory) -> Path:
    pre = os.environ.get("EDGESPEC_TEST_BUNDLES")
    if pre:
        return Path(pre)
    pytest.importorskip("torch", reason="building test bundles needs the export extra (pip install ./export)")
    return tmp_path_factory.mktemp("bundles")


def _bundle(bundle_root: Path, name: str) -> Path:
    path = bundle_root / name
    if not (path / "manifest.json").exists():
        if os.environ.get("EDGESPEC_TEST_BUNDLES"):
            pytest.fail(f"prebuilt bundle {path} missing (run tests/tiny_bundles.py {bundle_root})")
        tiny_bundles.build(name, bundle_root)
    return path


@pytest.fixture(scope="session")
def tiny_pruned_bundle(bundle_root) -> Path:
    """qwen-agree with the draft's lm_head pruned to 200 of 400 ids (export --draft-vocab 200)."""
    return _bundle(bundle_root, "qwen-pruned")


@pytest.fixture(scope="session")
def tiny_heads_bundle(bundle_root) -> Path:
    """fp32 Qwen2-shaped target, no draft, Medusa heads trained at export (a few hundred tokens)."""
    return _bundle(bundle_root, "qwen-heads")


@pytest.fixture(scope="session")
def tiny_feature_bundle(bundle_root) -> Path:
    """fp32 Qwen2-shaped target, no draft, the feature drafter trained at export (a few hundred tokens)."""
    return _bundle(bundle_root, "qwen-feature")


@pytest.fixture(scope="session")
def tiny_cuda_heads_bundle(bundle_root) -> Path:
    """The same over the cuda flavor (8-bit MatMulNBits lm_head, float16 activations)."""
    return _bundle(bundle_root, "qwen-cuda-heads")


@pytest.fixture(scope="session")
def tiny_bundle(bundle_root) -> Path:
    """fp32 Qwen2-shaped target + a draft that agrees often (target weights + 5 % noise)."""
    return _bundle(bundle_root, "qwen-agree")


@pytest.fixture(scope="session")
def tiny_deep_bundle(bundle_root) -> Path:
    """fp32 Qwen2-shaped 6-layer target without a draft (self-speculative drafting skips layers)."""
    return _bundle(bundle_root, "qwen-deep")


@pytest.fixture(scope="session")
def tiny_int8_bundle(bundle_root) -> Path:
    """qwen-agree's shapes with int8 weights (MatMulNBits, accuracy level 4), cpu flavor, with a draft."""
    return _bundle(bundle_root, "qwen-int8")


@pytest.fixture(scope="session")
def tiny_int4_bundle(bundle_root) -> Path:
    """The same with int4 weights (8-bit lm_head)."""
    return _bundle(bundle_root, "qwen-int4")


@pytest.fixture(scope="session")
def tiny_bundle_disagree(bundle_root) -> Path:
    return _bundle(bundle_root, "qwen-disagree")


@pytest.fixture(scope="session")
def tiny_bundle_nodraft(bundle_root) -> Path:
    return _bundle(bundle_root, "qwen-nodraft")


@pytest.fixture(scope="session")
def tiny_llama_bundle(bundle_root) -> Path:
    return _bundle(bundle_root, "llama-agree")


@pytest.fixture(scope="session")
def tiny_cuda_bundle(bundle_root) -> Path:
    """The cuda flavor only (float16 activations and KV, int8 MatMulNBits), run by the CPU provider."""
    return _bundle(bundle_root, "qwen-cuda-agree")


@pytest.fixture(scope="session")
def tiny_cuda_bundle_disagree(bundle_root) -> Path:
    return _bundle(bundle_root, "qwen-cuda-disagree")


@pytest.fixture(scope="session")
def tiny_both_flavors_bundle(bundle_root) -> Path:
    """One bundle with both flavors: target/model.onnx (cpu) and target/model.cuda.onnx (cuda)."""
    return _bundle(bundle_root, "qwen-both")


@pytest.fixture(scope="session")
def tiny_embedder_dir(tmp_path_factory) -> Path:
    """An embedder folder (int8) exported from a tiny random BERT (32 wide, 2 layers, 64 tokens at most)
    by the export half's numpy + onnx path; skips without the export half."""
    pytest.importorskip("onnx", reason="exporting the test embedder needs the export half (pip install ./export)")
    from edgespec_export.embedder import export_embedder
    from edgespec_export.embedder_tiny import make_tiny_bert

    root = tmp_path_factory.mktemp("embedder")
    texts = ["the museum opens at nine", "tickets for children are free", "where is the lift?", "", "a"]
    export_embedder(make_tiny_bert(root / "model.zip"), root / "tiny", name="tiny-bert", model_id="tiny-BERT",
                    sentences=texts)
    return root / "tiny"


@pytest.fixture(scope="session")
def real_gguf():
    """Returns a function name -> path of a real GGUF model (see edgespec.models.catalog for the names).

    In CI (`CI` set) it fetches the model if needed with `edgespec.models.store.ensure_model`; elsewhere it
    uses the file if it is already under ~/.cache/edgespec/models ($EDGESPEC_HOME/models) and skips
    the test, saying how to get it, if not. Nothing is downloaded at import or collection time."""
    from edgespec.models import files, store

    def get(name: str) -> Path:
        if IN_CI:
            return Path(store.ensure_model(name, progress=False))
        found = store.find_model(name)
        if found is not None:
            return Path(found)
        pytest.skip(f"real model {name} is not in the cache ({files.model_path(name)}); "
                    f"fetch it with `edgespec pull {name}`")

    return get


@pytest.fixture(scope="session")
def smollm2_export(tmp_path_factory, real_gguf) -> tuple[Path, dict]:
    """A real SmolLM2-135M bundle, exported once per session through `edgespec export` (int8, cpu
    flavor; ~1 minute on 2 cores), and the export's JSON report: (bundle folder named "smollm2", report).

    Why here and not from ~/.cache/edgespec/bundles: nothing else makes that bundle (neither `pull` nor
    the quickstart), so on a fresh CI machine the tests that need a real model skipped and checked
    nothing. The GGUF comes from real_gguf (fetched by the project's own store in CI)."""
    pytest.importorskip("torch", reason="the exporter needs the export extra")
    from helpers.cli import export_cli

    gguf = real_gguf("smollm2-135m-instruct")
    out = tmp_path_factory.mktemp("real") / "smollm2"
    # SmolLM2's GGUF is Q4_1: re-quantizing it to int4 keeps only ~71 % top-1 (74 % with --head-bits 8);
    # int8 keeps ~96 % (measured with onnxruntime 1.32 / transformers 4.57.6)
    return out, export_cli(str(gguf), "-o", str(out), "--quant", "int8", "--min-top1", "0.9")


@pytest.fixture
def bundle_copy(tmp_path):
    """Returns a function that copies a bundle into tmp_path, for tests that damage it."""

    def copy(src: Path, name: str = "copy") -> Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst

    return copy
