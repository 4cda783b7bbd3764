"""Where a model comes from: a local Hugging Face folder, a `.gguf` file, or a hub id.

`resolve()` is cheap (it reads config and GGUF metadata, never weights) and does every check a user
can fail, so a bad source is refused in a second, not after minutes of loading. `load_model()` is the
expensive part: a float32 torch model, for the builder and as the parity reference.

GGUF files are dequantized tensor by tensor straight into an empty model (transformers' own GGUF path
first collects the whole dequantized state dict and then copies it into the model: about 1.5x the
model's size at its peak).
"""
from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import ExportError
from edgespec.models.hub import hub_timeout

from .progress import NullProgress, Progress

# HF `model_type` -> the architectures whose builder graph follows the runtime's contract
# (decoder-only, GroupQueryAttention, rotary positions). Each has a tiny-model test.
SUPPORTED_ARCHS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# GGUF `general.architecture` -> HF model_type (llama.cpp writes Mistral models as "llama")
GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral"}
GGUF_MAGIC = b"GGUF"
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model"]
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


class UnsupportedArchitecture(ExportError):
    pass


@dataclass
class Source:
    """A checked source. `path` is an HF folder (for hub ids: the downloaded snapshot) or a .gguf file."""

    spec: str  # what the user passed
    role: str  # "target" | "draft"
    kind: str  # "hf" | "gguf" | "hub"
    path: Path
    arch: str  # HF model_type
    params: int  # parameter count (from safetensors headers, GGUF shapes or the config)
    config: dict[str, Any] = field(default_factory=dict)  # HF config.json (empty for GGUF until loaded)
    gguf: dict[str, Any] = field(default_factory=dict)  # GGUF metadata the tokenizer writer needs

    @property
    def label(self) -> str:
        """What the manifest records as the source: the hub id, or the file/folder name."""
        return self.spec if self.kind == "hub" else self.path.name

    @property
    def vocab_rows(self) -> int:
        """Rows of the model's logits (may exceed the tokenizer: padding rows)."""
        if self.kind == "gguf":
            arch = self.gguf.get("general.architecture")
            return int(self.gguf.get(f"{arch}.vocab_size") or self.gguf.get("tokenizer.ggml.tokens.count") or 0)
        text = self.config.get("text_config", self.config)
        return int(text.get("vocab_size") or 0)

    @property
    def max_context(self) -> int:
        if self.kind == "gguf":
            arch = self.gguf.get("general.architecture")
            return int(self.gguf.get(f"{arch}.context_length") or 2048)
        text = self.config.get("text_config", self.config)
        return int(text.get("max_position_embeddings") or 2048)


# --- resolving ---------------------------------------------------------------------------------
def resolve(spec: str, role: str = "target", *, progress: Progress | None = None) -> Source:
    """Turns what the user typed into a checked Source, or raises ExportError saying what is wrong."""
    spec = str(spec)
    p = Path(spec).expanduser()
    if p.exists():
        if p.is_dir():
            return _hf_folder(p, spec, role)
        if p.name == "config.json":
            return _hf_folder(p.parent, spec, role)
        if p.suffix.lower() == ".gguf" or _has_gguf_magic(p):
            return _gguf_file(p, spec, role)
        raise ExportError(
            f"{role} source {spec}: a file that is neither a .gguf model nor a Hugging Face folder's config.json"
        )
    if _looks_like_path(spec):
        raise ExportError(f"{role} source {spec} does not exist")
    if HUB_ID.fullmatch(spec):
        return _hub(spec, role, progress or NullProgress())
    raise ExportError(
        f"{role} source {spec!r} does not exist here and is not a hub id (org/name): pass a Hugging Face "
        "folder, a .gguf file or a hub id"
    )


def _looks_like_path(spec: str) -> bool:
    return (
        spec.startswith(("/", "./", "../", "~", "."))
        or spec.lower().endswith(".gguf")
        or spec.count("/") > 1
        or "\\" in spec
    )


def _has_gguf_magic(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ExportError(f"cannot read {what} {path}: {e.strerror or e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{what} {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ExportError(f"{what} {path} is not a JSON object")
    return data


def check_arch(model_type: str | None, where: str, architectures: list | None = None) -> str:
    if model_type in SUPPORTED_ARCHS:
        return model_type
    named = f"{model_type!r}" + (f" ({', '.join(architectures)})" if architectures else "")
    raise UnsupportedArchitecture(
        f"{where}: architecture {named} is not supported; the exporter handles "
        + ", ".join(sorted(SUPPORTED_ARCHS))
    )


def _hf_folder(folder: Path, spec: str, role: str, kind: str = "hf") -> Source:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ExportError(
            f"{role} source {spec}: no config.json in {folder} (expected a Hugging Face model folder or a .gguf file)"
        )
    cfg = _read_json(cfg_path, "config")
    arch = check_arch(cfg.get("model_type"), f"{role} source {spec}", cfg.get("architectures"))
    if cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "?")
        raise ExportError(
            f"{role} source {spec}: pre-quantized ({method}) checkpoints are not supported; "
            "use the float checkpoint or a .gguf file"
        )
    weights = [w for g in WEIGHT_GLOBS for w in folder.glob(g)]
    if not weights:
        raise ExportError(f"{role} source {spec}: no weights (*.safetensors or pytorch_model*.bin) in {folder}")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer.model").is_file():
        raise ExportError(f"{role} source {spec}: no tokenizer.json (or tokenizer.model) in {folder}")
    params = _safetensors_params(folder) or estimate_params(cfg)
    return Source(spec=spec, role=role, kind=kind, path=folder, arch=arch, params=params, config=cfg)


def _safetensors_params(folder: Path) -> int:
    """Parameter count from the safetensors headers (8-byte length + JSON), without reading weights."""
    total = 0
    for f in folder.glob("*.safetensors"):
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                if not 0 < n < 100_000_000:
                    raise ValueError("bad header length")
                header = json.loads(fh.read(n))
        except (OSError, ValueError) as e:
            raise ExportError(f"cannot read weights {f}: {e}") from e
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t.get("shape", []):
                    count *= int(d)
                total += count
    return total


def estimate_params(cfg: dict) -> int:
    """Parameters of a llama-style decoder from its config (used when the weights cannot be counted)."""
    h, layers = cfg.get("hidden_size", 0), cfg.get("num_hidden_layers", 0)
    heads = cfg.get("num_attention_heads", 1) or 1
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    inter, vocab = cfg.get("intermediate_size", 4 * h), cfg.get("vocab_size", 0)
    per_layer = h * hd * (heads * 2 + kv * 2) + 3 * h * inter + 2 * h
    emb = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return per_layer * layers + emb + h


def _gguf_file(path: Path, spec: str, role: str) -> Source:
    import numpy as np

    try:
        from .gguf_file import GGUFFile
    except ImportError as e:  # pragma: no cover - part of the export's base install
        raise ExportError("reading .gguf files needs the `gguf` package: pip install ./export") from e
    if not _has_gguf_magic(path):
        raise ExportError(f"{role} source {spec}: not a GGUF file (it does not start with 'GGUF')")
    try:
        reader = GGUFFile(path)
    except Exception as e:  # a truncated or damaged file fails in many ways inside the reader
        raise ExportError(f"{role} source {spec}: cannot read the GGUF file ({type(e).__name__}: {e})") from e
    meta = gguf_metadata(reader)
    gguf_arch = meta.get("general.architecture")
    name = str(meta.get("general.name") or "")
    model_type = GGUF_ARCHS.get(gguf_arch)
    if gguf_arch == "llama" and "mistral" in name.lower():
        model_type = "mistral"
    if model_type is None:
        raise UnsupportedArchitecture(
            f"{role} source {spec}: GGUF architecture {gguf_arch!r} is not supported; the exporter handles "
            + ", ".join(sorted(GGUF_ARCHS))
        )
    check_gguf_tensor_types(reader, f"{role} source {spec}")
    params = sum(int(np.prod([int(d) for d in t.shape])) for t in reader.tensors)
    return Source(spec=spec, role=role, kind="gguf", path=path, arch=model_type, params=params, gguf=meta)


def gguf_metadata(reader) -> dict[str, Any]:
    """Scalar and short-list metadata as Python values (the token, merge and score arrays are left out).
    `reader`: a gguf_file.GGUFFile."""
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    out = {k: v for k, v in reader.fields.items() if k not in skip}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        out["tokenizer.ggml.tokens.count"] = len(tokens)
    return out


def check_gguf_tensor_types(reader, where: str) -> None:
    """Every tensor type must be one the installed `gguf` can dequantize: tried for real on one block."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    seen: dict[Any, str] = {}
    for t in reader.tensors:
        if t.tensor_type in plain or t.tensor_type in seen:
            continue
        seen[t.tensor_type] = t.name
    for qtype, tensor_name in seen.items():
        qname = getattr(qtype, "name", str(qtype))
        try:
            _block, type_size = GGML_QUANT_SIZES[qtype]
            tensor = next(t for t in reader.tensors if t.name == tensor_name)
            sample = np.asarray(tensor.data).reshape(-1).view(np.uint8)[:type_size].reshape(1, type_size)
            dequantize(sample, qtype)
        except (NotImplementedError, KeyError, ValueError, TypeError) as e:
            raise ExportError(
                f"{where}: tensor {tensor_name!r} has GGUF type {qname}, which cannot be loaded ({e or 'no dequantizer'}); "
                "re-export the GGUF with a common type (F16, Q8_0, Q4_K, ...)"
            ) from e


# --- the hub -----------------------------------------------------------------------------------
def _hub(spec: str, role: str, progress: Progress) -> Source:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError
    except ImportError as e:  # pragma: no cover - transformers depends on it
        raise ExportError("hub ids need huggingface_hub: pip install ./export") from e
    local = _cached_snapshot(spec)
    if local is not None:
        return _hf_folder(local, spec, role, kind="hub")
    how = (
        f"download it on a machine with network (`huggingface-cli download {spec} --local-dir DIR`) and pass "
        f"the folder (--{role} DIR), or pass a .gguf file"
    )
    if constants.HF_HUB_OFFLINE:
        raise ExportError(f"{role} source {spec!r} is a hub id, but HF_HUB_OFFLINE is set and it is not in the local cache: {how}")
    endpoint = constants.ENDPOINT.rstrip("/")
    problem = probe_hub(endpoint, spec, hub_timeout())
    if problem:
        raise ExportError(f"{role} source {spec!r} is a hub id, but the hub cannot be reached ({problem}): {how}")
    with progress.stage(f"download {role}", total=1, unit="snapshot") as bar:
        try:
            folder = Path(snapshot_download(spec, allow_patterns=HUB_FILES, etag_timeout=hub_timeout()))
        except (RepositoryNotFoundError, GatedRepoError) as e:
            raise ExportError(f"{role} source {spec!r}: the hub has no such model, or it needs a login ({type(e).__name__})") from e
        except Exception as e:  # network errors of every kind: say so in one line
            raise ExportError(f"{role} source {spec!r}: download failed ({type(e).__name__}: {e}); {how}") from e
        bar.update(1)
    return _hf_folder(folder, spec, role, kind="hub")


def _cached_snapshot(spec: str) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(spec, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:
        return None
    return folder if (folder / "config.json").is_file() else None


def probe_hub(endpoint: str, repo: str, timeout: float) -> str | None:
    """None if the hub answers within `timeout` seconds (any HTTP status counts as an answer), else
    the reason. Runs in a thread joined with a deadline, because a DNS lookup ignores socket timeouts."""
    result: list[str | None] = []

    def attempt() -> None:
        req = urllib.request.Request(f"{endpoint}/api/models/{repo}", method="HEAD")
        try:
            urllib.request.urlopen(req, timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError:
            result.append(None)
        except urllib.error.URLError as e:
            result.append(f"{endpoint}: {e.reason}")
        except OSError as e:  # timeouts, resets
            result.append(f"{endpoint}: {e or type(e).__name__}")

    t = threading.Thread(target=attempt, daemon=True, name="edgespec-hub-probe")
    t.start()
    t.join(timeout + 1.0)
    if not result:
        return f"{endpoint}: no answer in {timeout:g} s"
    return result[0]


# --- loading weights (expensive) ---------------------------------------------------------------
def load_model(src: Source, progress: Progress | None = None):
    """A float32 torch model in eval mode. For GGUF sources also fills `src.config`."""
    import torch

    progress = progress or NullProgress()
    _quiet_transformers()
    if src.kind == "gguf":
        model = _load_gguf(src, progress)
    else:
        from transformers import AutoModelForCausalLM

        with progress.stage(f"load {src.role}", total=1, unit="model") as bar:
            try:
                model = AutoModelForCausalLM.from_pretrained(src.path, dtype=torch.float32, low_cpu_mem_usage=True)
            except OSError as e:
                raise ExportError(f"{src.role} source {src.spec}: cannot load the weights: {e}") from e
            bar.update(1)
    model.eval()
    if not model.config.architectures:  # GGUF configs leave it out; the builder dispatches on it
        model.config.architectures = [SUPPORTED_ARCHS[src.arch]]
    src.config = model.config.to_dict()
    return model


def _load_gguf(src: Source, progress: Progress):
    import numpy as np
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import set_module_tensor_to_device
    from gguf import dequantize
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    from .gguf_file import GGUFFile

    config = AutoConfig.from_pretrained(src.path.parent, gguf_file=src.path.name)
    config.dtype = torch.float32
    key_length = src.gguf.get(f"{src.gguf.get('general.architecture')}.attention.key_length")
    if key_length and hasattr(config, "head_dim"):  # transformers leaves it at the class default (Qwen3: 128)
        config.head_dim = int(key_length)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    reader = GGUFFile(src.path)
    names = get_gguf_hf_weights_map(model)
    processor = TENSOR_PROCESSORS.get(src.gguf.get("general.architecture"), TensorProcessor)(config=config.to_dict())
    parsed: dict[str, Any] = {"config": config.to_dict(), "tensors": {}}
    loaded: set[str] = set()
    with progress.stage(f"load {src.role} (gguf)", total=len(reader.tensors), unit="tensor") as bar:
        for t in reader.tensors:
            weights = dequantize(t.data, t.tensor_type)
            res = processor.process(weights=weights, name=t.name, tensor_key_mapping=names, parsed_parameters=parsed)
            if res.name in names:
                hf_name = names[res.name]
                w = res.weights
                if w.dtype != np.float32 or not w.flags.writeable or not w.flags.c_contiguous or not w.flags.owndata:
                    w = np.array(w, dtype=np.float32)  # F32 tensors are views of the file: own them
                set_module_tensor_to_device(model, hf_name, "cpu", value=torch.from_numpy(w))
                loaded.add(hf_name)
            del weights, res
            reader.release(t)  # its pages of the mapped file leave our RSS (1.1 GB for the 1.5B otherwise)
            bar.update(1)
    del reader
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ExportError(f"{src.role} source {src.spec}: the GGUF file has no tensor for {', '.join(missing[:5])}")
    return model


def _quiet_transformers() -> None:
    import warnings

    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    warnings.filterwarnings("ignore", message=".*torch_dtype.*")
