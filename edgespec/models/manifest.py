"""The bundle's manifest: one JSON file that describes and checksums everything else in the bundle.

Both halves use this module: `export/edgespec_export/` writes a manifest, the device runtime reads and checks it.
Keeping the schema in one place means a bundle the exporter writes is, by construction, one the
runtime can read, and `verify` and `Bundle.open` run the very same checks.

Layout (format_version 3; versions 1 and 2 are still read, see READ_VERSIONS):

    bundle/
      manifest.json
      target/model.onnx  target/model.onnx.data
      draft/model.onnx   draft/model.onnx.data        (optional)
      heads/model.onnx   heads/vocab_map.npy          (optional: `export --heads`)
      tokenizer.json     tokenizer_config.json
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..limits import QUANTS

FORMAT = "edgespec-bundle"
FORMAT_VERSION = 3
# Versions this edgespec reads. Version 2 is graph contract v2: every graph also takes per-token
# `position_ids` and an additive `attention_bias` (docs/graph-contract.md), which tree verification
# needs. A version-1 bundle's graphs lack them: it runs in chain-only mode (`--tree on` is refused
# with a line saying to re-export), so bundles exported before the bump keep working.
# Version 3 (graph contract v3) adds the `hidden_states` output (ModelFacts.hidden_states) and the
# optional draft heads trained at export (Manifest.heads); a version-2 bundle has neither.
READ_VERSIONS = (1, 2, 3)
TREE_FORMAT_VERSION = 2
MANIFEST_NAME = "manifest.json"
ROLES = ("target", "draft")
FLAVORS = ("cpu", "cuda")  # graph flavors (ModelFacts.flavor)
FLAVOR_FIELDS = ("path", "kv_dtype", "activation_dtype", "logits_dtype", "parity")  # what ModelFacts.flavors may set
DTYPES = ("float32", "float16", "bfloat16")
RUNTIME_TOKENIZER_FILES = ("tokenizer.json",)  # Bundle.load_tokenizer reads it


@dataclass
class ModelFacts:
    """What the runtime needs to know to drive one exported graph without opening it first."""

    path: str  # relative to the bundle root, e.g. "target/model.onnx"
    arch: str  # "qwen2", "llama", ...
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int  # rows of the logits (may include padding rows past the tokenizer's vocabulary)
    quant: str  # one of QUANTS
    max_context: int  # the model's own context limit; the runtime picks its cache length below this
    params: int = 0  # parameter count of the source model
    block_size: int | None = None  # int4/int8 block size
    accuracy_level: int | None = None  # MatMulNBits accuracy level (1 fp32, 2 fp16, 3 bf16, 4 int8)
    head_bits: int | None = None  # bits of the lm_head and embedding when quantized (may exceed the body's)
    kv_dtype: str = "float32"  # dtype of past/present buffers
    logits_dtype: str = "float32"
    source: str = ""  # where the weights came from (path, hub id or gguf file name)
    # graph I/O names; the defaults are what onnxruntime-genai's builder emits plus our edit
    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"
    logits: str = "logits"
    logits_to_keep: str | None = "num_logits_to_keep"  # int64 [1]: only the last n rows of logits
    # contract v2 (None in a version-1 bundle): int64 [1, S] rotary position of each input token,
    # and the attention's float type [1, 1, S, L+S], added to the scores (0 = attend, -inf-ish = not)
    position_ids: str | None = "position_ids"
    attention_bias: str | None = "attention_bias"
    # contract v3 (None before it): float32 [1, n, hidden] output, the final normed hidden state of
    # the n logits rows; draft heads (`export --heads`) read it
    hidden_states: str | None = None
    parity: dict[str, Any] = field(default_factory=dict)  # {"top1": 0.945, "mean_kl": ..., ...}
    # Flavor of the graph at `path` (docs/export.md, "Flavors"): "cpu" (float32 activations and KV) or
    # "cuda" (float16 activations, GroupQueryAttention and KV). Optional: a bundle written before
    # flavors has None, read as "cpu" for a float32 KV cache and "cuda" for a float16 one (the
    # builder's cuda flavor is the only one with a float16 cache). activation_dtype None: kv_dtype.
    flavor: str | None = None
    activation_dtype: str | None = None
    # Other flavors of the same weights in this bundle (`export --ep cpu,cuda`): flavor -> the fields
    # that differ, {"path", "kv_dtype", "activation_dtype", "logits_dtype", "parity"}. Empty: one graph.
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)

    # target only, optional: the layers `draft="self"` skips, chosen at export by a measured search
    # ({"skip": [7, 9, ...], "acceptance": 0.61, "cost_ratio": 0.74, ...}, export/edgespec_export/self_search.py).
    # Absent (bundles from before it existed): the runtime uses drafters/self.py default_skip.
    self_draft: dict[str, Any] | None = None

    def graph_flavor(self) -> str:
        """This graph's flavor, with the documented default for bundles written before flavors."""
        if self.flavor:
            return self.flavor
        return "cuda" if self.kv_dtype == "float16" else "cpu"

    def graphs(self) -> dict[str, "ModelFacts"]:
        """Every graph of this model by flavor, each as complete facts (the primary one is self)."""
        from dataclasses import replace

        out = {self.graph_flavor(): self}
        for flavor, diff in self.flavors.items():
            out[flavor] = replace(self, flavor=flavor, flavors={}, **{k: v for k, v in diff.items() if k != "flavor"})
        return out
    # a pruned lm_head (`export --draft-vocab`): an int32 .npy [vocab_size], logits row j -> token id
    vocab_map: str | None = None

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one position costs: 2 (k and v) x layers x kv_heads x head_dim x dtype."""
        item = {"float32": 4, "float16": 2, "bfloat16": 2}[self.kv_dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * item


@dataclass
class TokenizerFacts:
    files: list[str]  # relative paths, e.g. ["tokenizer.json", "tokenizer_config.json"]
    usable_vocab: int  # ids below this are real tokens in every model of the bundle
    bos_id: int | None
    eos_ids: list[int]
    pad_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    special_tokens: dict[str, int] = field(default_factory=dict)


@dataclass
class Manifest:
    name: str
    models: dict[str, ModelFacts]  # role ("target" | "draft") -> facts
    tokenizer: TokenizerFacts
    files: dict[str, dict[str, Any]]  # relative path -> {"sha256": str, "size": int}
    drafting: dict[str, Any] = field(default_factory=dict)  # recommended settings, e.g. {"mode": "auto", "k": 4}
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    created_by: str = ""
    created_at: str = ""
    # runtime defaults chosen at export, e.g. {"max_len": 4096} (`edgespec export --max-context`)
    defaults: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # exporter's notes: peak memory, timings, versions
    # draft heads trained at export (`edgespec export --heads medusa`), None without: {"method": "medusa",
    # "path": "heads/model.onnx", "vocab_map": "heads/vocab_map.npy", "n_heads", "hidden_size", "kept",
    # "training": {data, split, steps, seconds, heldout_top1 per head, ...}} (export/edgespec_export/heads.py)
    heads: dict[str, Any] | None = None
    # sha256 of the manifest's own content (every field but this one, canonical JSON): an edited
    # manifest is caught like a damaged weight file. Integrity, not authenticity.
    digest: str = ""

    # -- (de)serialisation --------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    def compute_digest(self) -> str:
        return content_digest(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        """Builds a Manifest from parsed JSON. Raises ValueError/KeyError/TypeError on a bad schema;
        `check_schema` turns those into readable problem lines first."""
        models = {role: ModelFacts(**facts) for role, facts in d["models"].items()}
        if d.get("format_version", FORMAT_VERSION) < TREE_FORMAT_VERSION:
            for facts in models.values():  # graph contract v1: the graphs have no such inputs
                facts.position_ids = facts.attention_bias = None
        tok = TokenizerFacts(**d["tokenizer"])
        rest = {k: v for k, v in d.items() if k not in ("models", "tokenizer")}
        return cls(models=models, tokenizer=tok, **rest)


def content_digest(d: dict[str, Any]) -> str:
    """sha256 of a parsed manifest without its 'digest' field, as canonical JSON (sorted keys, no
    whitespace), so re-indenting the file does not change it but editing any value does."""
    body = {k: v for k, v in d.items() if k != "digest"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "size": path.stat().st_size}


def check_schema(d: Any) -> list[str]:
    """Every schema problem of a parsed manifest, one readable line each (empty list: fine)."""
    problems: list[str] = []
    if not isinstance(d, dict):
        return ["manifest.json: top level is not a JSON object"]
    if d.get("format") != FORMAT:
        problems.append(f"manifest.json: 'format' is {d.get('format')!r}, expected {FORMAT!r}")
    fv = d.get("format_version")
    if fv not in READ_VERSIONS:
        problems.append(
            f"manifest.json: format_version {fv!r} is not supported by this edgespec (reads "
            f"{', '.join(map(str, READ_VERSIONS))})"
        )
    for key, typ in (("name", str), ("models", dict), ("tokenizer", dict), ("files", dict)):
        if not isinstance(d.get(key), typ):
            problems.append(f"manifest.json: '{key}' is missing or not a {typ.__name__}")
    if problems:
        return problems
    for key in sorted(d.keys() - Manifest.__dataclass_fields__.keys()):
        problems.append(f"manifest.json: '{key}' is not a known field (written by a newer edgespec, or edited)")
    if "target" not in d["models"]:
        problems.append("manifest.json: models has no 'target'")
    required = _required_fields(ModelFacts)
    for role, facts in d["models"].items():
        if role not in ROLES:
            problems.append(f"manifest.json: unknown model role {role!r} (expected one of {', '.join(ROLES)})")
            continue
        if not isinstance(facts, dict):
            problems.append(f"manifest.json: models.{role} is not an object")
            continue
        for f in sorted(required - facts.keys()):
            problems.append(f"manifest.json: models.{role}.{f} is missing")
        unknown = facts.keys() - ModelFacts.__dataclass_fields__.keys()
        for f in sorted(unknown):
            problems.append(f"manifest.json: models.{role}.{f} is not a known field")
        for f in ("layers", "kv_heads", "head_dim", "hidden_size", "vocab_size", "max_context"):
            v = facts.get(f)
            if f in facts and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                problems.append(f"manifest.json: models.{role}.{f} must be a positive integer, got {v!r}")
        if "quant" in facts and facts["quant"] not in QUANTS:
            problems.append(f"manifest.json: models.{role}.quant {facts['quant']!r} is not one of {QUANTS}")
        p = facts.get("path")
        if isinstance(p, str) and p not in d["files"]:
            problems.append(f"manifest.json: models.{role}.path {p!r} is not listed in 'files'")
        problems += _flavor_problems(role, facts, d["files"])
        vm = facts.get("vocab_map")
        if vm is not None and (not isinstance(vm, str) or vm not in d["files"]):
            problems.append(f"manifest.json: models.{role}.vocab_map {vm!r} is not listed in 'files'")
    problems += _heads_problems(d.get("heads"), d["files"])
    tok_required = _required_fields(TokenizerFacts)
    for f in sorted(tok_required - d["tokenizer"].keys()):
        problems.append(f"manifest.json: tokenizer.{f} is missing")
    tok_files = d["tokenizer"].get("files", []) or []
    for f in tok_files:
        if f not in d["files"]:
            problems.append(f"manifest.json: tokenizer file {f!r} is not listed in 'files'")
    for f in RUNTIME_TOKENIZER_FILES:
        if f not in tok_files or f not in d["files"]:
            problems.append(f"manifest.json: {f!r} is not listed (the runtime loads the tokenizer from it)")
    for rel, entry in d["files"].items():
        if not _safe_relpath(rel):
            problems.append(f"manifest.json: file path {rel!r} leaves the bundle folder")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("size"), int):
            problems.append(f"manifest.json: files[{rel!r}] needs a 'sha256' string and a 'size' integer")
    if not problems:
        try:
            Manifest.from_dict(d)
        except (TypeError, ValueError, KeyError) as e:  # pragma: no cover - belt and braces
            problems.append(f"manifest.json: {e}")
    return problems


HEADS_METHODS = ("medusa",)


def _heads_problems(heads: Any, files: dict) -> list[str]:
    """Checks of the optional draft-heads record (Manifest.heads)."""
    if heads is None:
        return []
    if not isinstance(heads, dict):
        return ["manifest.json: 'heads' must be an object"]
    out = []
    if heads.get("method") not in HEADS_METHODS:
        out.append(f"manifest.json: heads.method {heads.get('method')!r} is not one of {', '.join(HEADS_METHODS)}")
    for f in ("path", "vocab_map"):
        if not isinstance(heads.get(f), str) or heads[f] not in files:
            out.append(f"manifest.json: heads.{f} {heads.get(f)!r} is not listed in 'files'")
    for f in ("n_heads", "hidden_size"):
        v = heads.get(f)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            out.append(f"manifest.json: heads.{f} must be a positive integer, got {v!r}")
    return out


def _flavor_problems(role: str, facts: dict, files: dict) -> list[str]:
    """Checks of the optional flavor fields (flavor, activation_dtype, kv/logits dtype, flavors)."""
    out: list[str] = []
    where = f"manifest.json: models.{role}"
    fl = facts.get("flavor")
    if fl is not None and fl not in FLAVORS:
        out.append(f"{where}.flavor {fl!r} is not one of {', '.join(FLAVORS)}")
    for f in ("kv_dtype", "logits_dtype", "activation_dtype"):
        v = facts.get(f)
        if v is not None and v not in DTYPES:
            out.append(f"{where}.{f} {v!r} is not one of {', '.join(DTYPES)}")
    others = facts.get("flavors", {})
    if not isinstance(others, dict):
        return out + [f"{where}.flavors must be an object (flavor -> graph fields)"]
    primary = fl or ("cuda" if facts.get("kv_dtype") == "float16" else "cpu")
    for name, diff in others.items():
        w = f"{where}.flavors.{name}"
        if name not in FLAVORS:
            out.append(f"{w}: {name!r} is not one of {', '.join(FLAVORS)}")
            continue
        if name == primary:
            out.append(f"{w}: the model's own graph is already the {name} flavor")
        if not isinstance(diff, dict) or not isinstance(diff.get("path"), str):
            out.append(f"{w} needs at least a 'path'")
            continue
        for k in sorted(diff.keys() - set(FLAVOR_FIELDS)):
            out.append(f"{w}.{k} is not a field a flavor may set ({', '.join(FLAVOR_FIELDS)})")
        if diff["path"] not in files:
            out.append(f"{w}.path {diff['path']!r} is not listed in 'files'")
        for f in ("kv_dtype", "logits_dtype", "activation_dtype"):
            if diff.get(f) is not None and diff[f] not in DTYPES:
                out.append(f"{w}.{f} {diff[f]!r} is not one of {', '.join(DTYPES)}")
    return out


def _required_fields(cls: type) -> set[str]:
    return {name for name, f in cls.__dataclass_fields__.items() if f.default is MISSING and f.default_factory is MISSING}


def _safe_relpath(rel: str) -> bool:
    p = Path(rel)
    return not p.is_absolute() and ".." not in p.parts and rel == p.as_posix() and rel not in ("", ".")


def verify_bundle(root: str | os.PathLike, *, checksums: bool = True) -> tuple[Manifest | None, list[str]]:
    """Reads `root/manifest.json` and checks the schema, that every listed file exists with its size
    and sha256, and that no unlisted file sits in the bundle. Returns (manifest or None, problems).

    `checksums=False` skips hashing (sizes are still checked) for callers that accept that trade."""
    root = Path(root)
    problems: list[str] = []
    if not root.is_dir():
        return None, [f"{root}: not a folder"]
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        hint = " (a '.partial' folder is an export that did not finish)" if root.name.endswith(".partial") else ""
        return None, [f"{mpath}: missing: not a bundle, or an unfinished export{hint}"]
    try:
        d = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, [f"{mpath}: unreadable JSON: {e}"]
    problems += check_schema(d)
    if problems:
        return None, problems
    if not d.get("digest"):
        problems.append("manifest.json: no digest: not written by `edgespec export`, or edited")
    elif d["digest"] != content_digest(d):
        problems.append("manifest.json: edited after export (its content does not match its digest)")
    manifest = Manifest.from_dict(d)
    for rel, entry in manifest.files.items():
        f = root / rel
        if not f.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = f.stat().st_size
        if size != entry["size"]:
            problems.append(f"{rel}: size {size} bytes, manifest says {entry['size']}")
            continue
        if checksums:
            got = sha256_file(f)
            if got != entry["sha256"]:
                problems.append(f"{rel}: sha256 {got[:16]}… does not match the manifest's {entry['sha256'][:16]}…")
    if not problems:  # the facts against the graphs themselves (a digest can be recomputed after an edit)
        from .graphfacts import model_problems

        for role, facts in manifest.models.items():
            for graph in facts.graphs().values():  # each flavor's graph (export --ep cpu,cuda)
                problems += model_problems(root, role, graph, set(manifest.files))
    listed = set(manifest.files) | {MANIFEST_NAME}
    for f in sorted(root.rglob("*")):
        if f.is_file():
            rel = f.relative_to(root).as_posix()
            if rel not in listed:
                problems.append(f"{rel}: present but not listed in the manifest")
    return manifest, problems
