"""Tokenizer compatibility between target and draft, and the repair of GGUF-converted tokenizers."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

from tokenizers import Tokenizer  # noqa: E402

from edgespec.errors import TokenizerMismatch  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.sources import resolve  # noqa: E402
from edgespec_export.tokcheck import check_tokenizers  # noqa: E402
from edgespec_export.tokenizer_files import repair_gguf_tokenizer_json, write_tokenizer  # noqa: E402
from edgespec_export.tiny import make_tiny_gguf, make_tiny_model, make_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tok") / "qwen", arch="qwen2")


def _swap_ids(tokenizer_json: Path, a: str, b: str) -> None:
    """Rewrites tokenizer.json so tokens a and b trade ids: same tokens, different numbering."""
    d = json.loads(tokenizer_json.read_text())
    v = d["model"]["vocab"]
    v[a], v[b] = v[b], v[a]
    tokenizer_json.write_text(json.dumps(d))


def test_identical_tokenizers_pass_and_padding_rows_are_not_tokens(tiny):
    check = check_tokenizers({"target": tiny / "tokenizer.json", "draft": tiny / "tokenizer.json"},
                             {"target": 512, "draft": 600})
    assert check.usable_vocab == 400  # 400 real tokens; rows 400..511 (and ..599) are padding
    assert check.warnings == []


def test_mismatch_names_the_first_differing_tokens(tmp_path, tiny):
    other = tmp_path / "tokenizer.json"
    shutil.copy(tiny / "tokenizer.json", other)
    vocab = json.loads(other.read_text())["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300], sorted(vocab, key=vocab.get)[310]
    _swap_ids(other, a, b)
    with pytest.raises(TokenizerMismatch) as e:
        check_tokenizers({"target": tiny / "tokenizer.json", "draft": other}, {"target": 512, "draft": 512})
    msg = str(e.value)
    assert f"id {vocab[a]}: {a!r} vs {b!r}" in msg and "differ at 2 of the first 400 ids" in msg


def test_a_larger_tokenizer_that_extends_the_same_ids_is_compatible(tmp_path, tiny):
    """BPE trained further on the same text keeps the first 400 ids: usable, with a warning."""
    other = make_tokenizer(tmp_path / "other", vocab_size=450)
    check = check_tokenizers({"target": tiny / "tokenizer.json", "draft": other}, {"target": 512, "draft": 512})
    assert check.usable_vocab == 400
    assert "target tokenizer has 400 tokens, draft 450" in check.warnings[0]


def test_a_tokenizer_trained_on_other_text_is_refused(tmp_path, tiny):
    from tokenizers import Tokenizer as Tok, decoders, models, pre_tokenizers, trainers

    tok = Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["SELECT name, price FROM items WHERE price > 10 ORDER BY name;\n" * 50], trainer=trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerMismatch, match=r"tokenizers differ at \d+ of the first \d+ ids \(id 259: .ĠĠ. vs .ER."):
        check_tokenizers({"target": tiny / "tokenizer.json", "draft": tmp_path / "tokenizer.json"},
                         {"target": 512, "draft": 512})


def test_special_flag_mismatch_is_refused(tmp_path, tiny):
    other = tmp_path / "tokenizer.json"
    d = json.loads((tiny / "tokenizer.json").read_text())
    d["added_tokens"][2]["special"] = False
    other.write_text(json.dumps(d))
    with pytest.raises(TokenizerMismatch, match="disagree on which tokens are special"):
        check_tokenizers({"target": tiny / "tokenizer.json", "draft": other}, {"target": 512, "draft": 512})


def test_model_with_fewer_rows_than_its_tokenizer_is_refused(tiny):
    with pytest.raises(TokenizerMismatch, match="draft model scores 300 tokens but its tokenizer has 400"):
        check_tokenizers({"target": tiny / "tokenizer.json", "draft": tiny / "tokenizer.json"},
                         {"target": 512, "draft": 300})


def test_export_refuses_a_mismatched_draft_before_building(tmp_path, tiny):
    draft = tmp_path / "draft"
    shutil.copytree(tiny, draft)
    vocab = json.loads((draft / "tokenizer.json").read_text())["model"]["vocab"]
    order = sorted(vocab, key=vocab.get)
    _swap_ids(draft / "tokenizer.json", order[100], order[101])
    with pytest.raises(TokenizerMismatch, match="the draft must share the target's tokenizer"):
        run_export(str(tiny), tmp_path / "b", draft=str(draft), options=ExportOptions(quant="fp32", isolate=False))
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


# --- GGUF-converted tokenizers --------------------------------------------------------------------
def test_gguf_tokenizer_matches_the_original(tmp_path, tiny):
    """Written from a GGUF, the tokenizer encodes like the HF original: padding dropped, special
    tokens whole, no BOS added, the same special ids and chat template."""
    gguf = make_tiny_gguf(tiny, tmp_path / "t.gguf")
    info = write_tokenizer(resolve(str(gguf)), tmp_path / "from-gguf")
    orig = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    conv = Tokenizer.from_file(str(tmp_path / "from-gguf" / "tokenizer.json"))
    assert conv.get_vocab_size(True) == orig.get_vocab_size(True) == 400 == info.vocab
    text = "<|im_start|>user\ndef add(a, b): return a + b  # Grüße 東京 🙂<|im_end|>\n"
    assert conv.encode(text).ids == orig.encode(text, add_special_tokens=False).ids
    assert conv.encode("<|im_end|>").ids == [2]
    assert info.eos_ids[0] == 2 and info.add_bos is False
    assert info.chat_template and "<|im_start|>" in info.chat_template
    assert set(info.special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert any("padding tokens" in n for n in info.notes)


def test_repair_makes_control_tokens_whole_and_drops_only_trailing_padding():
    tj = {
        "added_tokens": [],
        "model": {"type": "BPE", "vocab": {"a": 0, "<|fim|>": 1, "<tool>": 2, "[PAD3]": 3, "[PAD4]": 4}},
        "post_processor": {"type": "TemplateProcessing"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
    }
    notes: list[str] = []
    out = repair_gguf_tokenizer_json(tj, ["a", "<|fim|>", "<tool>", "[PAD3]", "[PAD4]"], [1, 3, 4, 5, 5],
                                     add_bos=False, pre="smollm", notes=notes)
    assert out["model"]["vocab"] == {"a": 0, "<|fim|>": 1, "<tool>": 2}
    assert [(a["content"], a["special"]) for a in out["added_tokens"]] == [("<|fim|>", True), ("<tool>", False)]
    assert out["post_processor"] is None
    assert out["pre_tokenizer"]["pretokenizers"][0] == {"type": "Digits", "individual_digits": True}
    assert len(notes) == 4
