"""A GGUF's "gpt2" (byte-level BPE) tokenizer -> tokenizer.json with the `tokenizers` library alone.

It builds what transformers' GGUF converter builds for these architectures (checked equal, JSON for
JSON, on the catalog's Qwen2.5 and SmolLM2 files: tests/export/test_export_tokenizer.py), without
transformers and in seconds instead of the converter's minute or two (150k tokens). tokenizer_files.py
then applies the same repairs to either. Other tokenizer models (llama's SentencePiece "llama", ...)
still go through transformers.
"""
from __future__ import annotations

from typing import Any

# transformers' Qwen2Converter pre-tokenizer split (qwen2 and qwen3 GGUFs)
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CONTROL = 3  # gguf token type


def supported(arch: str | None, model: str | None) -> bool:
    return model == "gpt2" and arch in ("qwen2", "qwen3", "llama")


def convert(arch: str, tokens: list[str], merges: list[str], types: list[int], meta: dict[str, Any]) -> dict:
    """The tokenizer.json (parsed) transformers' converter would write for this GGUF."""
    import json

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    if arch in ("qwen2", "qwen3"):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, dropout=None, unk_token=None, continuing_subword_prefix="",
                                   end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN_SPECIALS])
        return json.loads(tok.to_str())
    # llama with a byte-level BPE (SmolLM2, Llama 3): transformers' GGUFLlamaConverter, llama-3 branch
    def tok_at(key: str) -> str | None:
        i = meta.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    unk, bos = tok_at("tokenizer.ggml.unknown_token_id"), tok_at("tokenizer.ggml.bos_token_id")
    tok = Tokenizer(models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    specials = [AddedToken(tokens[i], normalized=False, special=True) for i, t in enumerate(types) if t == CONTROL]
    if specials:
        tok.add_special_tokens(specials)
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    steps = [decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("\u2581", " "),
             decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    if bos is not None:
        bos_id = vocab[bos]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                                           special_tokens=[(bos, bos_id)])
    return json.loads(tok.to_str())
