"""Training data for draft heads: the exported target's own hidden states and predictions on text the
export has offline, teacher-forced (`edgespec export --heads`).

Documents (each a list of token ids, in this order, all deterministic):
1. the shipped bench prompts of code.jsonl, chat.jsonl and multiturn.jsonl (never heldout.jsonl, which
   stays held out for the bench), in the bundle's chat template, the first `answers` of them followed
   by the target's own greedy answer (generated here through the exported graph: what decoding
   with the target really looks like);
2. the local corpus LOCAL_CORPUS: Python standard library source files of the exporting interpreter,
   sorted by path, spread over the whole library (every m-th file), the first DOC_TOKENS tokens each,
   until the token budget is reached.
Every HOLDOUT_EVERY-th document of each source (at least one of two or more) is held out: it is never trained on and gives the
held-out top-1 the manifest records.

Per position t of a document the target graph gives (one prefill pass per chunk, every row kept):
the final hidden state h_t [H] and its next-token distribution, kept as its argmax (what greedy
verification accepts) and its top SOFT_K probabilities (the soft target for sampling). Head i is then
trained on h_t to predict row t + 1 + i's distribution: the token at t + 2 + i.
"""
from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

LOCAL_CORPUS = "the Python standard library's .py files of the exporting interpreter (sorted, every m-th)"
PROMPT_SETS = ("code", "chat", "multiturn")  # heldout.jsonl is never trained on
DOC_TOKENS = 256  # tokens of one local-corpus file
CHUNK = 256  # tokens per teacher-forced step
SOFT_K = 16  # soft-target probabilities kept per position
HOLDOUT_EVERY = 5
ANSWER_TOKENS = 96


@dataclass
class Doc:
    name: str
    ids: list[int]
    heldout: bool = False


@dataclass
class Collected:
    """Teacher-forced rows of all documents, concatenated: row r is position pos[r] of document doc[r]."""

    hidden: np.ndarray  # [T, H] float32
    argmax: np.ndarray  # [T] int64: the target's prediction for the next position
    top_ids: np.ndarray  # [T, SOFT_K] int64
    top_p: np.ndarray  # [T, SOFT_K] float32 (renormalised over the kept top SOFT_K)
    doc: np.ndarray  # [T] int32
    heldout: np.ndarray  # [T] bool
    ids: np.ndarray | None = None  # [T] int64: the token at row r (its input; the feature drafter's x)
    docs: list[Doc] = field(default_factory=list)
    answer_tokens: int = 0


def prompt_messages() -> list[tuple[str, list[dict]]]:
    """(id, messages) of the shipped code, chat and multi-turn prompts, one user turn each."""
    out = []
    for name in PROMPT_SETS:
        text = resources.files("edgespec.bench").joinpath("prompts", f"{name}.jsonl").read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                d = json.loads(line)
                msgs = d.get("messages") or [{"role": "user", "content": d["prompt"]}]
                out.append((d.get("id", f"{name}-{len(out)}"), msgs))
    return out


def local_files(max_files: int) -> list[Path]:
    """Up to max_files standard-library .py files (tests excluded), spread evenly over the sorted list."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not {"test", "tests", "idle_test", "site-packages", "__pycache__"} & set(p.relative_to(root).parts))
    if not files or max_files <= 0:
        return []
    step = max(1, len(files) // max_files)
    return files[::step][:max_files]


def mark_heldout(docs: list[Doc]) -> None:
    """Every HOLDOUT_EVERY-th document, and at least the last of two or more."""
    for i, d in enumerate(docs):
        d.heldout = i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    if len(docs) >= 2 and not any(d.heldout for d in docs):
        docs[-1].heldout = True


def greedy_answer(runner, ids: list[int], n: int, usable: int, eos: set[int]) -> list[int]:
    """The target's greedy continuation of ids (at most n tokens, stops at an end token)."""
    runner.reset()
    row = None
    for i in range(0, len(ids), CHUNK):
        row = runner.step(ids[i:i + CHUNK], 1)[0]
    out: list[int] = []
    while len(out) < n and runner.length < runner.max_len:
        t = int(np.argmax(row[:usable]))
        out.append(t)
        if t in eos:
            break
        row = runner.step([t], 1)[0]
    return out


def build_docs(tokenizer, chat_template: str | None, bos: tuple[str, str], budget: int, answers: int,
               runner, usable: int, eos: set[int], max_len: int, progress) -> tuple[list[Doc], int]:
    """The documents (see the module docstring), at most `budget` tokens in all; and the tokens of
    the target's own answers among them."""
    from edgespec.core.chat import encode_chat

    prompts: list[Doc] = []
    for pid, msgs in prompt_messages():
        if chat_template:
            ids = encode_chat(tokenizer, chat_template, msgs, add_generation_prompt=True,
                              bos_token=bos[0], eos_token=bos[1])
        else:
            ids = tokenizer.encode(" ".join(m["content"] for m in msgs), add_special_tokens=False).ids
        prompts.append(Doc(f"prompt:{pid}", ids[: max_len - ANSWER_TOKENS - 1]))
    answered = 0
    with progress.stage("heads: target answers", total=answers, unit="answer") as bar:
        for d in (prompts[::max(1, len(prompts) // answers)][:answers] if answers else []):  # spread over the sets
            ans = greedy_answer(runner, d.ids, ANSWER_TOKENS, usable, eos)
            d.ids = d.ids + ans
            d.name += "+answer"
            answered += len(ans)
            bar.update(1)
    docs, used = [], 0
    for d in prompts:
        if used + len(d.ids) > budget:
            break
        docs.append(d)
        used += len(d.ids)
    local: list[Doc] = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for f in local_files(max(1, (budget - used) // DOC_TOKENS * 2)):
        if used >= budget:
            break
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tokenizer.encode(text, add_special_tokens=False).ids[: min(DOC_TOKENS, budget - used, max_len - 1)]
        if len(ids) < 16:
            continue
        local.append(Doc(f"stdlib:{f.relative_to(root).as_posix()}", ids))
        used += len(ids)
    mark_heldout(docs)
    mark_heldout(local)
    return docs + local, answered


def collect(runner, docs: list[Doc], usable: int, progress) -> Collected:
    """Teacher-forced passes of every document through the target runner (every row kept)."""
    hid, am, tid, tp, dn, ho, xs = [], [], [], [], [], [], []
    total = sum(len(d.ids) for d in docs)
    with progress.stage("heads: target hidden states", total=total, unit="tok") as bar:
        for i, d in enumerate(docs):
            runner.reset()
            for s in range(0, len(d.ids), CHUNK):
                chunk = d.ids[s:s + CHUNK]
                logits = np.asarray(runner.step(chunk, len(chunk))[:, :usable], dtype=np.float32)
                hid.append(np.array(runner.hidden, dtype=np.float32))
                am.append(logits.argmax(axis=1))
                k = min(SOFT_K, usable)
                # a copy of the [S, k] slice: a view would keep the whole [S, V] int64 partition alive
                # (310 MB a chunk for a 152k vocabulary; it was 10 GB of the first 1.5B export's 13.5 GB)
                top = np.argpartition(logits, -k, axis=1)[:, -k:].copy()
                m = logits.max(axis=1, keepdims=True)
                z = np.exp(np.take_along_axis(logits, top, axis=1) - m)
                p = z / np.exp(logits - m).sum(axis=1, keepdims=True)
                tid.append(top)
                tp.append((p / p.sum(axis=1, keepdims=True)).astype(np.float32))
                dn.append(np.full(len(chunk), i, dtype=np.int32))
                ho.append(np.full(len(chunk), d.heldout))
                xs.append(np.asarray(chunk, dtype=np.int64))
                bar.update(len(chunk))
    return Collected(np.concatenate(hid), np.concatenate(am).astype(np.int64), np.concatenate(tid).astype(np.int64),
                     np.concatenate(tp), np.concatenate(dn), np.concatenate(ho), np.concatenate(xs), docs)
