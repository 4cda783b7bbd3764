"""Why passages' rows computed once answer differently from the same passages prefilled: each question of a
venue answered, greedy, from four caches that hold the same tokens (the pinned base, the turn's passages,
the question) and differ only in how the passages' rows were computed:

    prefilled  the turn's passages prefilled together, after the base (what the quoted reading computes)
    turn       each passage after the base and the turn's passages before it, at the venue's positions
    alone      each passage after the base alone (what --cached-passages stores)
    alone+     each passage after the base alone, at the positions it has in the turn (no gaps)
    venue      each passage after the base and every passage before it in the venue's order

    python tests/helpers/venue_rows_probe.py INDEX QUESTIONS.jsonl [ID,ID,...] [--bundle qwen-coder]

INDEX: built with `edgespec index PAGES -o INDEX --cached-passages`. docs/kiosk.md reports what it printed.
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    from edgespec.engine import Engine
    from edgespec.engine.pinned import pin_system_prompt
    from edgespec.models.files import edgespec_home

    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("questions")
    ap.add_argument("ids", nargs="?", default=None)
    ap.add_argument("--bundle", default="qwen-coder")
    ap.add_argument("--max-len", type=int, default=8192, help="holds the whole venue (the 'venue' rows)")
    a = ap.parse_args()
    qs = [json.loads(line) for line in open(a.questions, encoding="utf-8") if line.strip()]
    if a.ids:
        qs = [q for q in qs if q["id"] in a.ids.split(",")]
    eng = Engine.open(a.bundle, docs=a.index, draft="none", warmup=False, max_len=a.max_len)
    pin_system_prompt(eng, None, save_dir=edgespec_home() / "pinned")
    rows, t = eng.venue_rows, eng.target
    if rows is None:
        raise SystemExit(f"{a.index}: no venue rows (build it with --cached-passages)")
    n0, base = len(rows.base), eng.pinned.rows
    layout = rows.layout()

    def fresh() -> None:
        t.restore(base)

    def prefill(tokens, position=None) -> None:
        for i in range(0, len(tokens), 256):
            t.step(tokens[i : i + 256], 1, position=position if i == 0 else None)

    fresh()  # the venue in its order, once: the 'venue' rows
    prefill([x for c in sorted(rows.blocks) for x in rows.blocks[c]])
    venue, at = {}, n0
    for c in sorted(rows.blocks):
        venue[c] = t.rows(at, at + len(rows.blocks[c]))
        at += len(rows.blocks[c])

    def answer(tail) -> str:
        out, logits = [], t.step(tail, 1)
        for _ in range(40):
            tok = int(np.argmax(logits[-1][: eng.vocab.usable]))
            if tok in eng.vocab.eos_ids:
                break
            out.append(tok)
            logits = t.step([tok], 1)
        return eng.tokenizer.decode(out).replace("\n", " ")[:100]

    for q in qs:
        turn = eng.docs.turn([{"role": "user", "content": q["question"]}])
        if turn.declined or not turn.blocks:
            print(f"{q['id']}: declined by the gate")
            continue
        ids = rows.ids(turn.blocks, turn.question)
        tail = ids[n0 + sum(len(rows.blocks[c]) for c in turn.blocks) :]
        print(f"{q['id']} {q['question']!r} expects {q['expect']}, passages {[c + 1 for c in turn.blocks]}")
        for how in ("prefilled", "turn", "alone", "alone+", "venue"):
            fresh()
            if how == "prefilled":
                prefill([x for c in turn.blocks for x in rows.blocks[c]])
            elif how == "alone+":
                kept, at = [], n0
                for c in turn.blocks:
                    t.rewind(n0)
                    prefill(rows.blocks[c], at)
                    kept.append(t.rows(n0, n0 + len(rows.blocks[c])))
                    at += len(rows.blocks[c])
                t.rewind(n0)
                for kv, pos in kept:
                    t.place(kv, pos)
            elif how == "turn":
                for c in turn.blocks:
                    prefill(rows.blocks[c], layout[c])
            else:
                for c in turn.blocks:
                    t.place(*(rows.rows[c] if how == "alone" else venue[c]))
            print(f"  {how:9s}  {answer(tail)!r}", flush=True)


if __name__ == "__main__":
    main()
