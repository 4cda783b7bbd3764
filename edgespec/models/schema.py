"""Checking parsed JSON against a dataclass: the field's type from its annotation, its range from a
rule in a table, one readable line per problem.

The manifest's dataclasses (models/manifest.py) are the schema: a field added there is type-checked
here with no other change, and a range is one line in that module's rule tables. Nothing here knows
about bundles, so the table stays next to the fields it describes.

A rule is `rule(value, obj, root) -> str | None`: the value (already of the annotated type), the
object it sits in and the whole document (for ranges that depend on another field, e.g. token ids
below `usable_vocab`); it returns what is wrong, worded to follow the field's name, or None.
"""
from __future__ import annotations

import types
import typing
from functools import lru_cache
from typing import Any, Callable

Rule = Callable[[Any, dict, dict], "str | None"]


def show(v: Any, limit: int = 60) -> str:
    """A value for a one-line message: repr, cut short (a manifest may hold a megabyte string)."""
    try:
        text = repr(v)
    except ValueError:  # an int too long to print
        text = f"<{type(v).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_of(obj: Any, key: str) -> int | None:
    """obj[key] when it is a proper integer, else None (a rule that depends on another field skips
    when that field is itself wrong: it is reported once, under its own name)."""
    v = obj.get(key) if isinstance(obj, dict) else None
    return v if is_int(v) else None


def describe(hint: Any) -> str:
    """'an integer', 'a list of integers or null', ... for a message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if hint is type(None):
        return "null"
    if origin is list:
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict or hint is dict:
        return "an object"
    return {int: "an integer", str: "a string", bool: "true or false", float: "a number"}.get(hint, "a value")


def _plural(hint: Any) -> str:
    return {int: "integers", str: "strings", bool: "booleans", float: "numbers"}.get(hint, "values")


def fits(v: Any, hint: Any) -> bool:
    """Does the JSON value `v` have the annotated type `hint`? (bool is not an int; an int is a float.)"""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(v, a) for a in args)
    if hint is type(None):
        return v is None
    if origin is list:
        return isinstance(v, list) and (not args or all(fits(x, args[0]) for x in v))
    if origin is dict:
        return isinstance(v, dict) and (not args or all(fits(k, args[0]) and fits(x, args[1]) for k, x in v.items()))
    if hint is int:
        return is_int(v)
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if isinstance(hint, type):
        return isinstance(v, hint)
    return True


def check_object(obj: dict, cls: type, where: str, rules: dict[str, Rule], root: dict) -> list[str]:
    """Every present field of `obj` against `cls`'s annotation, then its rule. Missing and unknown
    fields are the caller's business (it words them)."""
    hints = _hints(cls)
    out = []
    for name, hint in hints.items():
        if name not in obj:
            continue
        v = obj[name]
        field = f"{where} {name}" if where.endswith(":") else f"{where}.{name}"
        if not fits(v, hint):
            out.append(f"{field} must be {describe(hint)}, got {show(v)}")
            continue
        rule = rules.get(name)
        said = rule(v, obj, root) if rule is not None and v is not None else None
        if said:
            out.append(f"{field}{said}" if said.startswith(".") else f"{field} {said}")
    return out


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# --- rules ------------------------------------------------------------------------------------------
def between(lo: int, hi: int) -> Rule:
    return lambda v, obj, root: None if lo <= v <= hi else f"must be from {lo:,} to {hi:,}, got {show(v)}"


def one_of(choices: tuple) -> Rule:
    return lambda v, obj, root: None if v in choices else f"{show(v)} is not one of {', '.join(map(str, choices))}"


def text(max_len: int = 256) -> Rule:
    """A non-empty string without control characters (a name printed in logs and headers)."""
    def rule(v, obj, root):
        if not v or len(v) > max_len or any(ord(c) < 32 for c in v):
            return f"must be a non-empty line of at most {max_len} characters, got {show(v)}"
        return None
    return rule


def all_of(*rules: Rule) -> Rule:
    def rule(v, obj, root):
        return next((said for r in rules if (said := r(v, obj, root))), None)
    return rule


def listed_in(key: str) -> Rule:
    """A path the document lists under `key` (the manifest's 'files')."""
    return lambda v, obj, root: None if v in root[key] else f"{show(v)} is not listed in {key!r}"


_name = text(200)


def io_name(v, obj, root):
    """A graph input or output name: a plain line, no '%' (it is not a pattern)."""
    return _name(v, obj, root) or (None if "%" not in v else f"{show(v)} is a graph input or output name and "
                                   "may not hold '%'")


def layer_pattern(v, obj, root):
    """A per-layer name: `pattern % i` must work, so one '%d' and no other '%'."""
    said = _name(v, obj, root)
    if said is None and (v.count("%") != 1 or "%d" not in v):
        said = f"{show(v)} must hold one '%d' (the layer number) and no other '%'"
    return said


def ids_below(bound: Callable[[dict, dict], "int | None"]) -> Rule:
    """Token ids (one, a list, or an object's values) inside [0, bound(obj, root)): an id past the
    vocabulary is never produced (an eos that never stops generation) or indexes past the embedding
    (a bos that gives all-zero logits)."""
    def rule(v, obj, root):
        ids = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [v]
        n = bound(obj, root)
        bad = next((i for i in ids if i < 0 or (n is not None and i >= n)), None)
        return None if bad is None else f"holds token id {show(bad)}, outside the vocabulary [0, {n})"
    return rule


def not_empty(why: str) -> Rule:
    return lambda v, obj, root: None if v else f"is empty: {why}"
