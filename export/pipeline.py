"""`edgespec export`: sources -> graphs -> checks -> bundle, in that order, one direction."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from edgespec.manifest import Manifest, ModelFacts, TokenizerFacts

from . import writer
from .build import build_graph

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_facts(hf_dir: Path) -> TokenizerFacts:
    """Reads ids, eos tokens and the chat template from a Hugging Face folder's tokenizer files."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    cfg_path = hf_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    gen_path = hf_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}

    def token_id(value) -> int | None:
        if isinstance(value, dict):
            value = value.get("content")
        return tok.token_to_id(value) if isinstance(value, str) else None

    eos: list[int] = []
    for v in (token_id(cfg.get("eos_token")), gen.get("eos_token_id")):
        for i in v if isinstance(v, list) else [v]:
            if isinstance(i, int) and i not in eos:
                eos.append(i)
    template = cfg.get("chat_template")
    jinja = hf_dir / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    bos = token_id(cfg.get("bos_token"))
    return TokenizerFacts(
        files=list(TOKENIZER_FILES),
        usable_vocab=tok.get_vocab_size(with_added_tokens=True),
        bos_id=bos,
        eos_ids=eos,
        pad_id=token_id(cfg.get("pad_token")),
        add_bos=bool(cfg.get("add_bos_token", False)) and bos is not None,
        chat_template=template,
        special_tokens=specials,
    )


def export_bundle(
    target: Path,
    out: Path,
    *,
    draft: Path | None = None,
    quant: str = "int4",
    draft_quant: str | None = None,
    block_size: int = 32,
    accuracy_level: int = 4,
    overwrite: bool = False,
    name: str | None = None,
) -> Path:
    """Builds a bundle from Hugging Face folders (sources are resolved to folders before this)."""
    tmp = writer.start(out, overwrite=overwrite)
    try:
        models: dict[str, ModelFacts] = {}
        models["target"] = build_graph(target, tmp / "target", quant=quant, block_size=block_size, accuracy_level=accuracy_level)
        if draft is not None:
            models["draft"] = build_graph(
                draft, tmp / "draft", quant=draft_quant or quant, block_size=block_size, accuracy_level=accuracy_level
            )
        for f in TOKENIZER_FILES:
            shutil.copy2(target / f, tmp / f)
        manifest = Manifest(
            name=name or out.name,
            models=models,
            tokenizer=tokenizer_facts(target),
            files={},
            drafting={"mode": "auto", "k": 4, "max_k": 8},
        )
        return writer.finish(manifest, tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
