"""An embedder folder on disk: a sentence-embedding model exported to ONNX, its tokenizer and a manifest
with checksums, read as untrusted exactly like a bundle (models/bundlefiles.py).

Both halves use this module: the export half (export/edgespec_export/embedder.py) writes the manifest, the
runtime (onnx_embedder.py) reads and checks it before any byte of the graph is handed to onnxruntime.

    $EDGESPEC_HOME/embedders/<name>/
        manifest.json     what the model is (model_id, dim, max_tokens, pooling), its parity, every file's sha256
        model.onnx        input_ids, attention_mask int64 [batch, tokens] -> sentence_embedding float32 [batch, dim]
                          (mean pooling over the mask and L2 normalisation are inside the graph)
        tokenizer.json    the model's own tokenizer (truncation and padding are set by the runtime, not read from it)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdgespecError
from ..models.bundlefiles import file_problems, read_json, stray_problems
from ..models.files import edgespec_home, sha256_file

FORMAT = "edgespec-embedder"
VERSION = 1
MANIFEST_NAME = "manifest.json"
FILES = ("model.onnx", "tokenizer.json")  # exactly these, beside the manifest
FORMS = ("float32", "int8")
MAX_TOKENS_CAP = 512  # BERT's position table; a manifest asking for more is lying about its model


class EmbedderError(EdgespecError):
    """An embedder folder is missing, lies about its files, or cannot embed what was asked. One line."""


@dataclass(frozen=True)
class EmbedderManifest:
    name: str  # the folder's short name, as `edgespec pull` knows it ("all-minilm-l6-v2")
    model_id: str  # model and form, e.g. "all-MiniLM-L6-v2/int8": what an index records and checks
    dim: int
    max_tokens: int  # longer texts are truncated to this many tokens (their head is kept)
    form: str  # one of FORMS: the weights' form in model.onnx
    pad_id: int
    source_sha256: str  # of what it was exported from (the catalog's model.zip), so a re-export is traceable
    parity: dict[str, Any] = field(default_factory=dict)  # {"min_cosine", "mean_cosine", "sentences", ...}
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # {rel: {"size", "sha256"}}
    format: str = FORMAT
    version: int = VERSION
    pooling: str = "mean"
    created_by: str = ""

    def to_json(self) -> str:
        import json

        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


_TYPES = {"name": str, "model_id": str, "dim": int, "max_tokens": int, "form": str, "pad_id": int,
          "source_sha256": str, "parity": dict, "files": dict, "format": str, "version": int, "pooling": str,
          "created_by": str}


def _schema_problems(d: Any) -> list[str]:
    if not isinstance(d, dict):
        return ["manifest.json: top level is not a JSON object"]
    if d.get("format") != FORMAT:
        return [f"manifest.json: format is {d.get('format')!r}, not {FORMAT!r}: not an embedder folder"]
    out = []
    for key, typ in _TYPES.items():
        if key not in d:
            out.append(f"manifest.json: {key} is missing")
        elif not isinstance(d[key], typ) or (typ is int and isinstance(d[key], bool)):
            out.append(f"manifest.json: {key} is {type(d[key]).__name__}, expected {typ.__name__}")
    if out:
        return out
    unknown = sorted(set(d) - set(_TYPES))
    if unknown:
        out.append(f"manifest.json: unknown field(s) {', '.join(unknown)}")
    if d["version"] != VERSION:
        out.append(f"manifest.json: version {d['version']}, this edgespec reads {VERSION}")
    if d["form"] not in FORMS:
        out.append(f"manifest.json: form {d['form']!r} is not one of {', '.join(FORMS)}")
    if d["pooling"] != "mean":
        out.append(f"manifest.json: pooling {d['pooling']!r}: only mean pooling is exported")
    if not 1 <= d["dim"] <= 8192:
        out.append(f"manifest.json: dim {d['dim']} is outside 1..8192")
    if not 8 <= d["max_tokens"] <= MAX_TOKENS_CAP:
        out.append(f"manifest.json: max_tokens {d['max_tokens']} is outside 8..{MAX_TOKENS_CAP}")
    if sorted(d["files"]) != sorted(FILES):
        out.append(f"manifest.json: files lists {sorted(d['files'])}, expected exactly {list(FILES)}")
    for rel, e in d["files"].items():
        if not (isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)):
            out.append(f"manifest.json: files[{rel!r}] needs an integer size and a sha256 string")
    return out


def check_folder(root: Path, *, checksums: bool = True) -> tuple[EmbedderManifest | None, list[str]]:
    """(manifest, []) for a folder that is what it says, else (None or manifest, one line per problem):
    the schema, every listed file inside the folder at its size and sha256, nothing unlisted beside them."""
    root = Path(root)
    if not root.is_dir():
        return None, [f"{root}: no such folder"]
    d, why = read_json(root / MANIFEST_NAME)
    if why is not None:
        return None, [why if (root / MANIFEST_NAME).exists() else f"{MANIFEST_NAME}: missing"]
    problems = _schema_problems(d)
    if problems:
        return None, problems
    m = EmbedderManifest(**d)
    problems = file_problems(root, m.files, checksums, sha256_file)
    problems += stray_problems(root, {MANIFEST_NAME, *m.files})
    return m, problems


def open_folder(root: Path, *, checksums: bool = True) -> EmbedderManifest:
    """The checked manifest of an embedder folder, or EmbedderError naming the folder and its first problem
    (and how many more): one line a kiosk owner can act on."""
    m, problems = check_folder(root, checksums=checksums)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise EmbedderError(f"embedder {root} refused: {problems[0]}{more}")
    assert m is not None
    return m


def embedders_dir() -> Path:
    """Where `edgespec pull` puts exported embedding models: $EDGESPEC_HOME/embedders/<name>."""
    return edgespec_home() / "embedders"


def resolve(spec: str | Path | None) -> Path:
    """A folder path, or a name under embedders_dir() (None: the default embedder). The answer when it is
    absent says the one command that makes it."""
    from ..models.catalog import DEFAULT_EMBEDDER, MODELS

    spec = DEFAULT_EMBEDDER if spec is None else spec
    p = Path(spec).expanduser()
    if p.is_dir():
        return p
    name = str(spec)
    m = MODELS.get(name) or next((x for x in MODELS.values() if name in x.aliases), None)
    if m is not None and m.role == "embedding":
        path = embedders_dir() / m.name
        if path.is_dir():
            return path
        raise EmbedderError(f"embedder {m.name} is not in {embedders_dir()}: `edgespec pull {m.name}` fetches and exports it")
    if "/" in name or p.suffix:
        raise EmbedderError(f"embedder {spec}: no such folder")
    names = ", ".join(sorted(n for n, x in MODELS.items() if x.role == "embedding"))
    raise EmbedderError(f"embedder {spec!r}: not a folder and not a known embedding model ({names})")


def locate(spec: str | Path) -> Path:
    """The folder of an embedder named by a folder path, a pulled model's name, or the model_id an index
    records ("all-MiniLM-L6-v2/int8", looked for among the folders under embedders_dir()). Nothing is loaded."""
    try:
        return resolve(spec)
    except EmbedderError:
        text = str(spec)
        if "/" not in text or text.startswith(("/", ".", "~")) or Path(spec).exists():  # a path, not a model id
            raise
    root = embedders_dir()
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        m, _ = check_folder(folder, checksums=False)
        if m is not None and m.model_id == spec:
            return folder
    raise EmbedderError(f"no embedder folder under {root} holds {spec}: `edgespec pull minilm` exports "
                        "all-MiniLM-L6-v2 (int8 by default; --embedder-form float32 for the float form)")


def files_bytes(embedder: str | Path | None = None, docs: str | Path | None = None) -> tuple[int, int]:
    """(bytes of the embedder's files, bytes of the index folder's files) for the memory plan; the embedder is
    the one given, else the one the `docs` index names (0 when it names none, or none is found: loading
    the index then says why)."""
    index = 0
    if docs is not None and Path(docs).is_dir():
        index = sum(p.stat().st_size for p in Path(docs).rglob("*") if p.is_file())
        if embedder is None:
            d, _ = read_json(Path(docs) / MANIFEST_NAME)
            named = d.get("embedder") if isinstance(d, dict) else None
            embedder = named.get("model_id") if isinstance(named, dict) else None
    if embedder is None:
        return 0, index
    try:
        m = open_folder(locate(embedder), checksums=False)
    except EmbedderError:
        if docs is None:
            raise
        return 0, index
    return sum(e["size"] for e in m.files.values()), index
