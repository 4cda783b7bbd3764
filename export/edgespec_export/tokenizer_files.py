"""The bundle's tokenizer: `tokenizer.json` (for the `tokenizers` library) and a small, normalised
`tokenizer_config.json` (special tokens, add_bos, chat template), written from either kind of source.

From a GGUF file, transformers' converter gives a tokenizer.json that is close but not right, so it is
repaired from the GGUF metadata:
- llama.cpp pads the vocabulary to the lm_head's rows with UNUSED tokens ("[PAD151935]"): they are not
  real tokens and are dropped, so a GGUF and the original HF tokenizer have the same usable range;
- CONTROL and USER_DEFINED tokens (`<|fim_prefix|>`, `<tool_call>`, ...) become added tokens, or the
  converter leaves them as plain vocabulary entries that the BPE splits into pieces;
- the post-processor follows `tokenizer.ggml.add_bos_token` (the converter may add a BOS regardless);
- the `smollm` pre-tokenizer splits digits one by one, as llama.cpp does.
The special ids and chat template come from the GGUF metadata, not from the converted config (which for
SmolLM2 names `<|im_start|>` as the EOS).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import ExportError

from .sources import Source

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# gguf token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# control tokens that end a turn in the chat formats we know, stopped on in addition to the declared EOS
EXTRA_STOP_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@dataclass
class TokenizerInfo:
    """What the manifest needs, read back from the files written (so it describes exactly them)."""

    vocab: int  # real tokens (ids 0..vocab-1)
    bos_id: int | None
    eos_ids: list[int]
    pad_id: int | None
    add_bos: bool
    chat_template: str | None
    special_tokens: dict[str, int]
    notes: list[str] = field(default_factory=list)


def write_tokenizer(src: Source, dst: Path) -> TokenizerInfo:
    """Writes dst/tokenizer.json and dst/tokenizer_config.json for `src`; returns their facts."""
    dst.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    if src.kind == "gguf":
        cfg = _from_gguf(src, dst, notes)
    else:
        cfg = _from_hf(src, dst, notes)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return read_info(dst, notes=notes)


def write_tokenizers(jobs: dict[str, tuple[Source, Path]], progress=None) -> dict[str, TokenizerInfo]:
    """write_tokenizer for each role -> (source, folder): one call, so the pipeline can run it in one
    child process (converting a GGUF tokenizer imports transformers and takes ~1 GB for a while)."""
    from .progress import NullProgress

    progress = progress or NullProgress()
    out = {}
    with progress.stage("tokenizers", total=len(jobs), unit="model") as bar:
        for role, (src, dst) in jobs.items():
            out[role] = write_tokenizer(src, dst)
            bar.update(1)
    return out


def read_info(folder: Path, *, notes: list[str] | None = None) -> TokenizerInfo:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:
        raise ExportError(f"tokenizer {folder / 'tokenizer.json'} cannot be loaded: {e}") from e
    cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))

    def tid(name: str | None) -> int | None:
        return tok.token_to_id(name) if name else None

    eos = [i for i in (tid(n) for n in cfg.get("eos_tokens", [])) if i is not None]
    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return TokenizerInfo(
        vocab=tok.get_vocab_size(with_added_tokens=True),
        bos_id=tid(cfg.get("bos_token")),
        eos_ids=eos,
        pad_id=tid(cfg.get("pad_token")),
        add_bos=bool(cfg.get("add_bos_token")) and tid(cfg.get("bos_token")) is not None,
        chat_template=cfg.get("chat_template"),
        special_tokens=specials,
        notes=list(notes or []),
    )


def _config(bos, eos: list[str], pad, unk, add_bos: bool, template: str | None, max_len: int | None) -> dict:
    """The normalised tokenizer_config.json: transformers can read it, and so can our runtime."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos[0] if eos else None,
        "eos_tokens": eos,  # every token that ends generation (the first is the declared EOS)
        "pad_token": pad,
        "unk_token": unk,
        "add_bos_token": bool(add_bos),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "chat_template": template,
    }


# --- Hugging Face folders ------------------------------------------------------------------------
def _from_hf(src: Source, dst: Path, notes: list[str]) -> dict:
    folder = src.path
    if (folder / "tokenizer.json").is_file():
        shutil.copyfile(folder / "tokenizer.json", dst / "tokenizer.json")
    else:  # a slow (sentencepiece) tokenizer only: let transformers convert it
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(folder, use_fast=True)
            with tempfile.TemporaryDirectory() as tmp:
                tok.save_pretrained(tmp)
                shutil.copyfile(Path(tmp) / "tokenizer.json", dst / "tokenizer.json")
        except Exception as e:
            raise ExportError(f"{src.role} source {src.spec}: cannot build a tokenizer.json: {e}") from e
        notes.append("tokenizer.json converted from the slow tokenizer by transformers")
    tcfg = _maybe_json(folder / "tokenizer_config.json")
    gen = _maybe_json(folder / "generation_config.json")
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates: keep the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (folder / "chat_template.json").is_file():
        template = _maybe_json(folder / "chat_template.json").get("chat_template")

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))

    def name(v) -> str | None:
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) else None

    def id_name(i) -> str | None:
        return tok.id_to_token(i) if isinstance(i, int) else None

    eos: list[str] = []
    for cand in [name(tcfg.get("eos_token"))] + [id_name(i) for i in _as_list(gen.get("eos_token_id"))] + [
        id_name(i) for i in _as_list(src.config.get("eos_token_id"))
    ]:
        if cand and cand not in eos and tok.token_to_id(cand) is not None:
            eos.append(cand)
    _add_turn_enders(tok, eos)
    bos = name(tcfg.get("bos_token")) or id_name(gen.get("bos_token_id"))
    add_bos = bool(tcfg.get("add_bos_token", False))
    return _config(
        bos, eos, name(tcfg.get("pad_token")), name(tcfg.get("unk_token")), add_bos, template,
        src.config.get("max_position_embeddings"),
    )


def _maybe_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(f"{path} is not readable JSON: {e}") from e
    return d if isinstance(d, dict) else {}


def _as_list(v) -> list:
    return v if isinstance(v, list) else ([] if v is None else [v])


def _add_turn_enders(tok, eos: list[str]) -> None:
    """Adds the chat formats' end-of-turn tokens that exist as special tokens in this vocabulary."""
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    for t in EXTRA_STOP_TOKENS:
        if t in specials and t not in eos:
            eos.append(t)


# --- GGUF ----------------------------------------------------------------------------------------
def _from_gguf(src: Source, dst: Path, notes: list[str]) -> dict:
    from .gguf_file import GGUFFile

    reader = GGUFFile(src.path)
    tokens = _field_strings(reader, "tokenizer.ggml.tokens")
    types = _field_ints(reader, "tokenizer.ggml.token_type")
    if not tokens:
        raise ExportError(f"{src.role} source {src.spec}: the GGUF file has no tokenizer (tokenizer.ggml.tokens)")
    key = _tokenizer_key(reader, tokens, types, src.gguf)
    if key in _CONVERTED:  # a draft from the same family: the conversion takes ~50 s for 150k tokens
        tj = json.loads(_CONVERTED[key])
    else:
        tj = _convert_gguf_tokenizer(src, reader, tokens, types)
        _CONVERTED[key] = json.dumps(tj)
    meta = src.gguf
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    tj = repair_gguf_tokenizer_json(tj, tokens, types, add_bos=add_bos, pre=meta.get("tokenizer.ggml.pre"), notes=notes)
    (dst / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")

    def tok_name(key: str) -> str | None:
        i = meta.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    eos = [t for t in (tok_name("tokenizer.ggml.eos_token_id"), tok_name("tokenizer.ggml.eot_token_id"),
                       tok_name("tokenizer.ggml.eom_token_id")) if t]
    eos = list(dict.fromkeys(eos))
    from tokenizers import Tokenizer

    _add_turn_enders(Tokenizer.from_file(str(dst / "tokenizer.json")), eos)
    arch = meta.get("general.architecture")
    return _config(
        tok_name("tokenizer.ggml.bos_token_id"), eos, tok_name("tokenizer.ggml.padding_token_id"),
        tok_name("tokenizer.ggml.unknown_token_id"), add_bos, meta.get("tokenizer.chat_template"),
        meta.get(f"{arch}.context_length"),
    )


_CONVERTED: dict[str, str] = {}  # tokenizer key -> converted tokenizer.json, for this process


def _tokenizer_key(reader, tokens: list[str], types: list[int], meta: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for part in (tokens, _field_strings(reader, "tokenizer.ggml.merges"), [str(t) for t in types],
                 [str(meta.get("tokenizer.ggml.model")), str(meta.get("tokenizer.ggml.pre"))]):
        h.update("\x00".join(part).encode("utf-8", errors="replace"))
        h.update(b"\x01")
    return h.hexdigest()


def _convert_gguf_tokenizer(src: Source, reader=None, tokens=None, types=None) -> dict:
    """transformers' GGUF tokenizer converter, as a parsed tokenizer.json: for a byte-level BPE of the
    architectures gguf_tokenizer.py knows, its equal built without transformers."""
    from . import gguf_tokenizer

    arch, model = src.gguf.get("general.architecture"), src.gguf.get("tokenizer.ggml.model")
    if reader is not None and gguf_tokenizer.supported(arch, model):
        return gguf_tokenizer.convert(arch, tokens, _field_strings(reader, "tokenizer.ggml.merges"), types, src.gguf)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            from transformers import AutoTokenizer

            from .sources import _quiet_transformers

            _quiet_transformers()
            hf_tok = AutoTokenizer.from_pretrained(src.path.parent, gguf_file=src.path.name)
            hf_tok.save_pretrained(tmp)
        except Exception as e:
            raise ExportError(
                f"{src.role} source {src.spec}: cannot convert the GGUF tokenizer "
                f"({src.gguf.get('tokenizer.ggml.model')!r}): {type(e).__name__}: {e}"
            ) from e
        return json.loads((Path(tmp) / "tokenizer.json").read_text(encoding="utf-8"))


def _field_strings(reader, key: str) -> list[str]:
    """A string-array field of a gguf_file.GGUFFile ([] when absent)."""
    return [str(v) for v in reader.fields.get(key) or []]


def _field_ints(reader, key: str) -> list[int]:
    return [int(v) for v in reader.fields.get(key) or []]


def repair_gguf_tokenizer_json(
    tj: dict[str, Any], tokens: list[str], types: list[int], *, add_bos: bool, pre: str | None, notes: list[str]
) -> dict[str, Any]:
    """Applies the repairs in the module docstring to a converted tokenizer.json (a parsed dict)."""
    n = len(tokens)
    types = types or [NORMAL] * n
    # 1. trailing UNUSED padding tokens are not real tokens
    real = n
    while real > 0 and types[real - 1] == UNUSED:
        real -= 1
    if real < n:
        vocab = tj.get("model", {}).get("vocab")
        if isinstance(vocab, dict):
            tj["model"]["vocab"] = {t: i for t, i in vocab.items() if i < real}
        tj["added_tokens"] = [a for a in tj.get("added_tokens", []) if a["id"] < real]
        notes.append(f"dropped {n - real} padding tokens (ids {real}..{n - 1}) that llama.cpp adds to fill the lm_head rows")
    # 2. control and user-defined tokens are matched whole, before the BPE
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    newly = 0
    for i in range(real):
        if types[i] in (CONTROL, USER_DEFINED) and i not in added:
            added[i] = {
                "id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": types[i] == CONTROL,
            }
            newly += 1
        elif types[i] == CONTROL:
            added[i]["special"] = True
    tj["added_tokens"] = [added[i] for i in sorted(added)]
    if newly:
        notes.append(f"{newly} control/user-defined tokens made whole-match added tokens")
    # 3. the post-processor adds a BOS only if the GGUF says so
    pp = tj.get("post_processor")
    if not add_bos and isinstance(pp, dict) and pp.get("type") == "TemplateProcessing":
        tj["post_processor"] = None
        notes.append("post-processor that prepended a BOS removed (GGUF add_bos_token is false)")
    # 4. llama.cpp's `smollm` pre-tokenizer: digits one by one, then GPT-2's ByteLevel regex
    pt = tj.get("pre_tokenizer")
    if pre == "smollm" and isinstance(pt, dict) and pt.get("type") == "ByteLevel":
        tj["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, pt],
        }
        notes.append("digits split one by one (llama.cpp 'smollm' pre-tokenizer)")
    return tj
