"""Target and draft must give every token the same id, or a draft's proposal means a different token to
the target and "lossless" is lost (silently: the target just rejects more).

The check compares the real tokens (vocabulary and added tokens, with their special flag) id by id.
Logits rows are not tokens: Qwen2.5-7B scores 152064 rows and the 0.5B 151936 for the same 151665
tokens; rows past the tokenizer are padding, so only the usable range (ids below the smallest
tokenizer, and below every model's rows) is recorded for the runtime to sample from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgespec.errors import TokenizerMismatch


@dataclass
class TokenizerCheck:
    usable_vocab: int  # ids below this are the same token in every model and scored by every model
    tokenizer_sizes: dict[str, int]
    model_rows: dict[str, int]
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "usable_vocab": self.usable_vocab,
            "tokenizer_sizes": self.tokenizer_sizes,
            "model_rows": self.model_rows,
            "warnings": self.warnings,
        }


def id_table(tokenizer_json: Path) -> tuple[dict[int, str], set[int]]:
    """id -> token string (vocabulary and added tokens), and the ids of special tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    table = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return table, special


def check_tokenizers(tokenizers: dict[str, Path], model_rows: dict[str, int]) -> TokenizerCheck:
    """`tokenizers`: role -> tokenizer.json written for that model; `model_rows`: role -> logits rows.
    Raises TokenizerMismatch naming the first differing ids; returns the usable range otherwise."""
    tables = {role: id_table(p) for role, p in tokenizers.items()}
    sizes = {role: (max(t) + 1 if t else 0) for role, (t, _) in tables.items()}
    warnings: list[str] = []
    for role, (table, _) in tables.items():
        holes = sizes[role] - len(table)
        if holes:
            raise TokenizerMismatch(f"{role} tokenizer has {holes} unused ids below {sizes[role]}: ids must be contiguous")
    roles = list(tables)
    if len(roles) > 1:
        base = roles[0]
        for other in roles[1:]:
            _compare(base, tables[base], other, tables[other])
            if sizes[base] != sizes[other]:
                warnings.append(
                    f"{base} tokenizer has {sizes[base]} tokens, {other} {sizes[other]}: "
                    f"ids from {min(sizes[base], sizes[other])} on are not used"
                )
    usable = min(sizes.values())
    for role, rows in model_rows.items():
        if rows < sizes.get(role, usable):
            raise TokenizerMismatch(
                f"{role} model scores {rows} tokens but its tokenizer has {sizes[role]}: "
                "the model and the tokenizer do not belong together"
            )
        usable = min(usable, rows)
    return TokenizerCheck(usable_vocab=usable, tokenizer_sizes=sizes, model_rows=dict(model_rows), warnings=warnings)


def _compare(a: str, ta: tuple[dict[int, str], set[int]], b: str, tb: tuple[dict[int, str], set[int]]) -> None:
    table_a, special_a = ta
    table_b, special_b = tb
    common = min(len(table_a), len(table_b))
    diffs = [i for i in range(common) if table_a[i] != table_b[i]]
    if diffs:
        shown = ", ".join(f"id {i}: {table_a[i]!r} vs {table_b[i]!r}" for i in diffs[:3])
        raise TokenizerMismatch(
            f"{a} and {b} tokenizers differ at {len(diffs)} of the first {common} ids ({shown}"
            f"{', ...' if len(diffs) > 3 else ''}): the draft must share the target's tokenizer"
        )
    flag_diffs = sorted(i for i in (special_a ^ special_b) if i < common)
    if flag_diffs:
        i = flag_diffs[0]
        raise TokenizerMismatch(
            f"{a} and {b} tokenizers disagree on which tokens are special (first: id {i} {table_a[i]!r} is "
            f"{'special' if i in special_a else 'not special'} for {a})"
        )
