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
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..limits import MODEL_QUANTS
from . import fieldrules
from .fieldrules import MAX_EOS_IDS, MAX_SPECIAL_TOKENS, MAX_TOKENIZER_FILES, at_most
from .schema import (all_of, between, check_object, ids_below, int_of, io_name, is_int, layer_pattern, listed_in,
                     not_empty, one_of, show, text)

FORMAT = "edgespec-bundle"
FORMAT_VERSION = 3
# Versions this edgespec reads. Version 2 is graph contract v2: every graph also takes per-token
# `position_ids` and an additive `attention_bias` (docs/graph-contract.md), which tree verification
# needs. A version-1 bundle's graphs lack them: it runs in chain-only mode (`--tree on` is refused
# with a line saying to re-export), so bundles exported before the bump keep working.
# Version 3 (graph contract v3): a cuda-flavored graph has no attention_bias (onnxruntime's CUDA
# GroupQueryAttention refuses one on every run, edgespec/models/kernels.py); cpu graphs are as in v2.
# A version-2 bundle with a cuda graph is refused with "re-export"; its cpu graphs would be fine, but
# the bundle is one unit (`verify` says what to do). A version-1 cuda graph had no attention_bias.
# Version 3 (graph contract v3) adds the `hidden_states` output (ModelFacts.hidden_states) and the
# optional draft heads trained at export (Manifest.heads); a version-2 bundle has neither.
READ_VERSIONS = (1, 2, 3)
TREE_FORMAT_VERSION = 2
CUDA_FORMAT_VERSION = 3  # the first version whose cuda-flavored graphs onnxruntime's CUDA kernels accept
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
    quant: str  # one of MODEL_QUANTS
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
            fields = {k: v for k, v in diff.items() if k != "flavor"}
            if flavor == "cuda":  # graph contract v3: a cuda graph takes no attention_bias
                fields["attention_bias"] = None
            out[flavor] = replace(self, flavor=flavor, flavors={}, **fields)
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
    # draft heads trained at export (`edgespec export --heads medusa|feature`), None without: {"method",
    # "path": "heads/model.onnx", "vocab_map": "heads/vocab_map.npy", "n_heads", "hidden_size", "kept",
    # "training": {data, split, steps, seconds, heldout_top1 per head, ...}} (export/edgespec_export/heads.py)
    heads: dict[str, Any] | None = None
    # sha256 of the manifest's own content (every field but this one, canonical JSON): an edited
    # manifest is caught like a damaged weight file. Integrity, not authenticity.
    digest: str = ""

    @property
    def draft_agreement(self) -> float | None:
        """The draft's top-1 agreement with the target on the export's parity text, measured on this
        very pair: the draft drafter's starting acceptance. None when absent or not a share in (0, 1)."""
        a = self.drafting.get("draft_agreement")
        ok = isinstance(a, (int, float)) and not isinstance(a, bool) and 0.0 < a < 1.0
        return float(a) if ok else None

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


# --- the ranges: one line per field (its type comes from the annotation above, models/schema.py) ---
MIN_CONTEXT, MAX_CONTEXT = 16, 1 << 24  # a context of a few tokens cannot hold a chat turn
# Graph inputs a format_version's graphs take beyond input_ids, attention_mask and the caches
# (docs/graph-contract.md): the manifest may not name them null, and graphfacts checks that the
# graph has every input the manifest names and names every input the graph has. A new contract
# version is one row.
# version -> flavor -> the fields; contract v3: a cuda graph takes no attention_bias.
CONTRACT_INPUTS: dict[int, dict[str, tuple[str, ...]]] = {
    1: {},
    2: {"cpu": ("position_ids", "attention_bias"), "cuda": ("position_ids",)},  # (v2 cuda: re-export, always)
    3: {"cpu": ("position_ids", "attention_bias"), "cuda": ("position_ids",)},
}


def _usable(obj, root):
    return int_of(obj, "usable_vocab")


def _target_vocab(obj, root):
    return int_of(root["models"].get("target"), "vocab_size")


def _self_draft(v, obj, root):
    skip, layers = v.get("skip", []), int_of(obj, "layers")
    if not isinstance(skip, list) or not all(is_int(i) and 1 <= i < (layers or 0) for i in skip):
        return f".skip must be a list of layer numbers from 1 to {(layers or 2) - 1}, got {show(skip)}"
    if len(set(skip)) != len(skip):
        return f".skip names a layer twice, got {show(skip)}"
    return None


def _at_most_target_vocab(v, obj, root):
    n = _target_vocab(obj, root)
    return None if n is None or v <= n else f"is {v}, more than the target model's {n} logits rows"


_positive = between(1, 1 << 40)
_listed = listed_in("files")
MODEL_RULES = {
    "path": _listed, "arch": text(), "layers": between(1, 4096), "kv_heads": between(1, 4096),
    "head_dim": between(1, 65536), "hidden_size": _positive, "vocab_size": between(1, 1 << 24),
    "quant": one_of(MODEL_QUANTS), "max_context": between(MIN_CONTEXT, MAX_CONTEXT), "params": between(0, 1 << 50),
    "block_size": between(1, 1 << 20), "accuracy_level": between(0, 4), "head_bits": between(1, 32),
    "kv_dtype": one_of(DTYPES), "logits_dtype": one_of(DTYPES), "activation_dtype": one_of(DTYPES),
    "flavor": one_of(FLAVORS),
    "input_ids": io_name, "attention_mask": io_name, "logits": io_name, "logits_to_keep": io_name,
    "position_ids": io_name, "attention_bias": io_name, "hidden_states": io_name,
    "past_key": layer_pattern, "past_value": layer_pattern, "present_key": layer_pattern,
    "present_value": layer_pattern,
    "self_draft": _self_draft, "vocab_map": fieldrules.vocab_map, "parity": fieldrules.parity,
}
TOKENIZER_RULES = {
    "usable_vocab": all_of(_positive, _at_most_target_vocab),
    "bos_id": ids_below(_usable),
    "eos_ids": all_of(not_empty("generation would never stop at an end token"), at_most(MAX_EOS_IDS, "ids"),
                      ids_below(_usable)),
    "pad_id": ids_below(_target_vocab),
    "special_tokens": all_of(at_most(MAX_SPECIAL_TOKENS, "tokens"), ids_below(_target_vocab)),
    "files": at_most(MAX_TOKENIZER_FILES, "files"),
}
HEADS_METHODS = ("medusa", "feature")  # export/edgespec_export/heads.py METHODS


def _heads(v, obj, root):
    """The optional draft-heads record (Manifest.heads, `export --heads`): the first problem, or None."""
    if v.get("method") not in HEADS_METHODS:
        return f".method {show(v.get('method'))} is not one of {', '.join(HEADS_METHODS)}"
    for f in ("path", "vocab_map"):
        if not isinstance(v.get(f), str) or v[f] not in root["files"]:
            return f".{f} {show(v.get(f))} is not listed in 'files'"
    if not v["vocab_map"].endswith(fieldrules.MAP_SUFFIX):
        return f".vocab_map {show(v['vocab_map'])} is not a numpy array file ({fieldrules.MAP_SUFFIX})"
    for f in ("n_heads", "hidden_size", "kept"):
        if not is_int(v.get(f)) or v[f] <= 0:
            return f".{f} must be a positive integer, got {show(v.get(f))}"
    return None


TOP_RULES = {"name": text(200), "heads": _heads, "drafting": fieldrules.drafting, "defaults": fieldrules.defaults}
_SHA256 = lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)  # noqa: E731


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
    """Every schema problem of a parsed manifest, one readable line each (empty list: fine): each
    field's type from its dataclass annotation and its range from the rule tables above."""
    if not isinstance(d, dict):
        return ["manifest.json: top level is not a JSON object"]
    problems: list[str] = []
    if d.get("format") != FORMAT:
        problems.append(f"manifest.json: 'format' is {show(d.get('format'))}, expected {FORMAT!r}")
    fv = d.get("format_version")
    if not is_int(fv) or fv not in READ_VERSIONS:
        problems.append(f"manifest.json: format_version {show(fv)} is not supported by this edgespec (reads "
                        f"{', '.join(map(str, READ_VERSIONS))})")
    for key, typ in (("name", str), ("models", dict), ("tokenizer", dict), ("files", dict)):
        if not isinstance(d.get(key), typ):
            problems.append(f"manifest.json: '{key}' is missing or not a {typ.__name__}")
    if problems:
        return problems
    for key in sorted(d.keys() - Manifest.__dataclass_fields__.keys()):
        problems.append(f"manifest.json: {show(key)} is not a known field (written by a newer edgespec, or edited)")
    top = {k: v for k, v in d.items() if k not in ("models", "tokenizer")}
    problems += check_object(top, Manifest, "manifest.json:", TOP_RULES, d)
    for rel, entry in d["files"].items():
        if not _safe_relpath(rel):
            problems.append(f"manifest.json: file path {show(rel)} leaves the bundle folder")
        if not (isinstance(entry, dict) and _SHA256(entry.get("sha256")) and is_int(entry.get("size"))
                and entry["size"] >= 0):
            problems.append(f"manifest.json: files[{show(rel)}] needs a 'sha256' (64 hex digits) and a 'size' "
                            "(bytes, an integer >= 0)")
    if "target" not in d["models"]:
        problems.append("manifest.json: models has no 'target'")
    for role, facts in d["models"].items():
        problems += _model_problems(role, facts, d)
    problems += _tokenizer_problems(d)
    if not problems:
        try:
            Manifest.from_dict(d)
        except (TypeError, ValueError, KeyError) as e:  # pragma: no cover - belt and braces
            problems.append(f"manifest.json: {e}")
    return problems


def _model_problems(role: str, facts: Any, d: dict) -> list[str]:
    where = f"manifest.json: models.{role}"
    if role not in ROLES:
        return [f"manifest.json: unknown model role {show(role)} (expected one of {', '.join(ROLES)})"]
    if not isinstance(facts, dict):
        return [f"{where} is not an object"]
    out = [f"{where}.{f} is missing" for f in sorted(_required_fields(ModelFacts) - facts.keys())]
    out += [f"{where}.{_key(f)} is not a known field" for f in sorted(facts.keys() - ModelFacts.__dataclass_fields__.keys())]
    out += check_object(facts, ModelFacts, where, MODEL_RULES, d)
    if out:  # the cross-field checks below read these fields
        return out
    flavor = facts.get("flavor") or ("cuda" if facts.get("kv_dtype") == "float16" else "cpu")  # graph_flavor()
    for name in CONTRACT_INPUTS.get(d["format_version"], {}).get(flavor, ()):
        if name in facts and facts[name] is None:
            out.append(f"{where}.{name} is null, but format_version {d['format_version']} graphs take it "
                       f"(docs/graph-contract.md)")
    return out + _flavor_problems(role, facts, d["files"])


def _tokenizer_problems(d: dict) -> list[str]:
    tok = d["tokenizer"]
    out = [f"manifest.json: tokenizer.{f} is missing" for f in sorted(_required_fields(TokenizerFacts) - tok.keys())]
    out += [f"manifest.json: tokenizer.{_key(f)} is not a known field"
            for f in sorted(tok.keys() - TokenizerFacts.__dataclass_fields__.keys())]
    out += check_object(tok, TokenizerFacts, "manifest.json: tokenizer", TOKENIZER_RULES, d)
    files = tok.get("files") if isinstance(tok.get("files"), list) else []
    for f in files:
        if isinstance(f, str) and f not in d["files"]:
            out.append(f"manifest.json: tokenizer file {show(f)} is not listed in 'files'")
    for f in RUNTIME_TOKENIZER_FILES:
        if f not in files or f not in d["files"]:
            out.append(f"manifest.json: {f!r} is not listed (the runtime loads the tokenizer from it)")
    return out


def _flavor_problems(role: str, facts: dict, files: dict) -> list[str]:
    """Checks of the optional flavor fields (flavor, activation_dtype, kv/logits dtype, flavors)."""
    out: list[str] = []
    where = f"manifest.json: models.{role}"
    fl = facts.get("flavor")
    if fl is not None and fl not in FLAVORS:
        out.append(f"{where}.flavor {show(fl)} is not one of {', '.join(FLAVORS)}")
    for f in ("kv_dtype", "logits_dtype", "activation_dtype"):
        v = facts.get(f)
        if v is not None and v not in DTYPES:
            out.append(f"{where}.{f} {show(v)} is not one of {', '.join(DTYPES)}")
    others = facts.get("flavors", {})
    if not isinstance(others, dict):
        return out + [f"{where}.flavors must be an object (flavor -> graph fields)"]
    primary = fl or ("cuda" if facts.get("kv_dtype") == "float16" else "cpu")
    for name, diff in others.items():
        w = f"{where}.flavors.{_key(name)}"
        if name not in FLAVORS:
            out.append(f"{w}: {show(name)} is not one of {', '.join(FLAVORS)}")
            continue
        if name == primary:
            out.append(f"{w}: the model's own graph is already the {name} flavor")
        if not isinstance(diff, dict) or not isinstance(diff.get("path"), str):
            out.append(f"{w} needs at least a 'path'")
            continue
        for k in sorted(diff.keys() - set(FLAVOR_FIELDS)):
            out.append(f"{w}.{_key(k)} is not a field a flavor may set ({', '.join(FLAVOR_FIELDS)})")
        if diff["path"] not in files:
            out.append(f"{w}.path {show(diff['path'])} is not listed in 'files'")
        for f in ("kv_dtype", "logits_dtype", "activation_dtype"):
            if diff.get(f) is not None and diff[f] not in DTYPES:
                out.append(f"{w}.{f} {show(diff[f])} is not one of {', '.join(DTYPES)}")
        said = fieldrules.parity(diff["parity"], diff, {}) if isinstance(diff.get("parity"), dict) else None
        if "parity" in diff and not isinstance(diff["parity"], dict):
            said = f" must be an object, got {show(diff['parity'])}"
        if said:
            out.append(f"{w}.parity{said}")
    return out



def _key(k: str) -> str:
    return k if k.isidentifier() and len(k) <= 60 else show(k)


def _required_fields(cls: type) -> set[str]:
    return {name for name, f in cls.__dataclass_fields__.items() if f.default is MISSING and f.default_factory is MISSING}


def _safe_relpath(rel: str) -> bool:
    p = Path(rel)
    return not p.is_absolute() and ".." not in p.parts and rel == p.as_posix() and rel not in ("", ".")
