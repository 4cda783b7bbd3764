"""Draft vocabulary pruning (`edgespec export --draft-vocab N`): the draft's lm_head keeps only the rows
of N frequent tokens.

Why: the 0.5B draft's lm_head (151 936 x 896) is about a quarter of its weights and of its step's
compute, and a draft only proposes; the target verifies every proposal, so a draft that cannot name
a rare token costs a little acceptance, never correctness. The runtime maps logits row j back to
token id kept[j] (the bundle's draft/vocab_map.npy) and, when sampling, renormalises the draft's
q over the kept ids (ModelDrafter._pick), which keeps rejection sampling exact.

Which tokens (the frequency source, all offline, recorded in the manifest as CORPUS):
1. the special tokens (end of turn, end of text, chat markers): always kept;
2. every token of the export's parity text and of the shipped bench prompt sets code.jsonl and
   chat.jsonl (not the held-out or multi-turn sets);
3. then the lowest remaining ids: in a byte-level BPE vocabulary (Qwen2.5, Llama 3, GPT-2 style) a
   token's id is its merge rank, and merges were learned most-frequent-first on the tokenizer's
   own training corpus, so low ids are the frequent ones.

The edit (prune_head): the node producing the logits (MatMul [H, V] or MatMulNBits with N = V rows)
gets a new weight holding only the kept rows (a copy: a tied embedding keeps reading the full
tensor), and the logits output becomes [batch, n, N].
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Iterable

import numpy as np

CORPUS = ("special tokens; every token of the export's parity text and of edgespec's shipped bench prompt sets "
          "(code.jsonl, chat.jsonl); then the lowest remaining ids (byte-level BPE merge rank as the frequency "
          "order of the tokenizer's own training corpus)")
VOCAB_MAP = "vocab_map.npy"


def shipped_prompt_text() -> list[str]:
    """The prompts of the shipped code and chat sets (plain text, the JSON parsed)."""
    import json

    out = []
    for name in ("code", "chat"):
        text = resources.files("edgespec.bench").joinpath("prompts", f"{name}.jsonl").read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                d = json.loads(line)
                out.append(d.get("prompt") or " ".join(m["content"] for m in d.get("messages", [])))
    return out


def choose_kept(n: int, usable: int, *, corpus_ids: Iterable[int] = (), always: Iterable[int] = ()) -> np.ndarray:
    """The n ids to keep, sorted: `always` first, then the corpus's ids by how often they occur,
    then the lowest ids not kept yet. [n] int64, every id < usable."""
    if n <= 0 or n >= usable:
        raise ValueError(f"--draft-vocab {n}: must be between 1 and the usable vocabulary ({usable}) exclusive")
    kept: list[int] = []
    seen: set[int] = set()

    def add(i: int) -> None:
        if 0 <= i < usable and i not in seen and len(kept) < n:
            kept.append(i)
            seen.add(i)

    for i in always:
        add(int(i))
    ids = np.asarray(list(corpus_ids), dtype=np.int64)
    ids = ids[(ids >= 0) & (ids < usable)]
    if ids.size:
        counts = np.bincount(ids, minlength=usable)
        order = np.argsort(-counts, kind="stable")
        for i in order[: int((counts > 0).sum())]:
            add(int(i))
    i = 0
    while len(kept) < n:
        add(i)
        i += 1
    return np.array(sorted(kept), dtype=np.int64)


def read_external(t, base: Path) -> None:
    """Moves an initializer's bytes from the graph's external data file into the tensor, read here
    rather than by onnx's loader: onnx (1.19 on) refuses a data file with more than one hard link, and
    a bundle folder may well be hard-linked (a `cp -al` backup, a deduplicating store, a tool copying
    the export's work folder while it runs: measured, the 1.5B export with --heads failed so after
    16 minutes). The location must stay inside the graph's folder, as onnx's loader requires."""
    from onnx import TensorProto

    info = {e.key: e.value for e in t.external_data}
    folder = Path(base).resolve()
    path = (folder / info.get("location", "")).resolve()
    if folder not in path.parents:
        raise ValueError(f"initializer {t.name!r}: external data {info.get('location')!r} is outside {folder}")
    offset = int(info.get("offset", 0))
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(int(info["length"])) if "length" in info else f.read()
    if "length" in info and len(data) != int(info["length"]):
        raise ValueError(f"initializer {t.name!r}: {path.name} ends before its {info['length']} bytes")
    t.raw_data = data
    del t.external_data[:]
    t.data_location = TensorProto.DEFAULT


def prune_head(model_path: Path, kept: np.ndarray, logits_name: str = "logits") -> None:
    """Rewrites the model (graph and external weights) so that its logits are the kept rows only."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    for t in model.graph.initializer:
        if uses_external_data(t):
            read_external(t, model_path.parent)
    g = model.graph
    producers = [x for x in g.node if logits_name in x.output]
    if len(producers) != 1:
        raise ValueError(f"expected one node producing {logits_name!r}, found {len(producers)}")
    head = producers[0]
    inits = {t.name: t for t in g.initializer}
    kept = np.asarray(kept, dtype=np.int64)
    n = int(kept.size)

    def replace(slot: int, arr: np.ndarray) -> None:
        name = head.input[slot] + "/edgespec_pruned"
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        head.input[slot] = name

    def weight(slot: int) -> np.ndarray:
        name = head.input[slot]
        if name not in inits:
            raise ValueError(f"the lm_head's input {name!r} is not a weight of the graph")
        return numpy_helper.to_array(inits[name])

    if head.op_type == "MatMul":
        w = weight(1)  # [H, V]
        replace(1, w[:, kept])
    elif head.op_type == "MatMulNBits":
        attrs = {a.name: a for a in head.attribute}
        rows = attrs["N"].i
        replace(1, weight(1)[kept])  # [N, blocks, blob]
        for slot in (2, 3):  # scales, zero points: N rows of per-block values, flat or 2-D
            if len(head.input) > slot and head.input[slot]:
                w = weight(slot)
                replace(slot, w.reshape(rows, -1)[kept].reshape((n, *w.shape[1:]) if w.ndim > 1 else (-1,)))
        if len(head.input) > 4 and head.input[4]:
            raise ValueError("a MatMulNBits lm_head with g_idx is not supported by --draft-vocab")
        if len(head.input) > 5 and head.input[5]:
            replace(5, weight(5)[kept])  # bias [N]
        attrs["N"].i = n
    else:
        raise ValueError(f"the node producing {logits_name!r} is a {head.op_type}: --draft-vocab handles "
                         "MatMul and MatMulNBits lm_heads")
    for out in g.output:
        if out.name == logits_name:
            dims = out.type.tensor_type.shape.dim
            if len(dims):
                dims[len(dims) - 1].ClearField("dim_param")
                dims[len(dims) - 1].dim_value = n
    # weights no node reads any more (the full head, when untied) are dropped
    used = {i for node in g.node for i in node.input}
    for t in [t for t in g.initializer if t.name not in used]:
        g.initializer.remove(t)
    data = model_path.with_name(model_path.name + ".data")
    if data.exists():
        data.unlink()
    onnx.save_model(model, str(model_path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
