"""A pinned prefix: the tokens every conversation starts with (a kiosk's system prompt), prefilled
once before the server is ready and kept for every later conversation.

Why: the engine reuses the longest common prefix of a slot's cache and the request admitted to it
(batch.py), so visitors after the first already skip the system prompt's prefill; but the first
visitor after every start paid it all (44 s for a 900-token prompt on a loaded 2-core board), and a
request that shares nothing with it (another client, the server's warm-up) overwrites those rows.
Pinning keeps a copy of the prefix's K/V rows (`Slot.snapshot`: kv_bytes_per_token x its
length, ~25 MB for 900 tokens of the int4 1.5B target's fp32 cache) and writes it back
(`Slot.restore`, a memory copy) whenever a request starting with the prefix finds the cache
holding something else. Where the cache is not on the host (a GPU provider) there is no copy: the
prefix is prefilled at start and reused while requests share it, as before.

Saved (optional) next to the bundle's cache: `<dir>/<key>.npz`, key = sha256 of the bundle's
manifest digest, its chat template and the prompt, holding the rows, the prefix's token ids and a
sha256 of all of it. A restart loads it instead of prefilling; a file that is corrupt, stale (other
tokens, other cache shape or dtype) or unreadable is ignored with one log line and replaced.

    pin = pinned.pin_system_prompt(engine, text, save_dir=edgespec_home() / "pinned")
    engine.pinned = pin          # admission restores it before a request that starts with it

At every --parallel: pin_system_prompt reads and sets the engine's `pinned`, `venue_rows` and
`repins_on_reload`, checks rows against `engine.target` (slot 0: every slot's cache has the same
shape) and fills the cache through `engine.hold(tokens, rows)` and `engine.compute_venue_rows(rows)`.
The engine keeps one copy of the rows, fills every free slot from it and writes it back into a slot
a request overwrote when the next request admitted there starts with the prefix (batch.py).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.proposal import common_prefix
from ..errors import InvalidRequest
from ..docs import answer as _answer

log = logging.getLogger("edgespec.engine")


@dataclass
class PinnedPrefix:
    tokens: list[int]
    rows: list[np.ndarray] | None  # the target cache's rows for `tokens` (None: cache not on the host)
    source: str = "prefill"  # "prefill" | "file": how this start got them (logs and tests)
    text: str = ""  # the system prompt (the kiosk page sends it when its URL sets none)
    chat: bool = True  # the prefix is a chat's system turn (False: a bundle without a chat template)

    def request(self, user: str) -> dict:
        """generate() arguments for a visitor's turn `user`: a request that starts with the prefix,
        in the shape prefix_tokens rendered it (the server's warm-up is one)."""
        return visit(self.text, user, self.chat)

    def restore(self, ids: Sequence[int], target, cache, *, past: bool = True) -> bool:
        """Before a request: if it starts with the prefix (and goes on past it, unless not `past`) and
        the target cache lost it, writes the rows back so the request reuses them. True when it did."""
        n = len(self.tokens)
        if self.rows is None or len(ids) < n + past or list(ids[:n]) != self.tokens:
            return False
        if common_prefix(cache.tokens[: target.length], self.tokens) >= n:
            return False  # still there
        target.restore(self.rows)
        cache.tokens = list(self.tokens)
        return True


def visit(system: str, user: str, chat: bool = True) -> dict:
    """A request with this system prompt and user turn: a chat's messages, or (a bundle without a
    chat template) the prompt text followed by the turn, as a completion's prompt."""
    if chat:
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    return {"prompt": system + user}


def prefill_to(target, held: Sequence[int], tokens: Sequence[int], chunk: int) -> None:
    """Makes a cache (a core/slot.Slot: one slot of the target's runner) hold
    exactly `tokens`, given that it holds `held` now: kept as far as the two agree, the rest
    prefilled in chunks of `chunk` tokens."""
    reuse = min(common_prefix(list(held), list(tokens)), target.length)
    target.rewind(reuse)
    for i in range(reuse, len(tokens), chunk):
        target.step(tokens[i : i + chunk], 1)


def hold_slot(target, cache, tokens: Sequence[int], rows, pinned: PinnedPrefix | None, chunk: int):
    """Makes one cache slot (target: a core/slot.Slot; cache: its sequence.PrefixCache) hold exactly
    `tokens` and returns the snapshot of their rows (Slot.snapshot; None when the cache is not on
    the host): `rows` written back when given (ValueError, the slot untouched, when they do not fit
    it), else what the slot lacks of `tokens` prefilled in chunks of `chunk` (a prefix of the pinned
    one, `pinned`, is a memory copy away). The engine's hold, on each free slot."""
    if rows is not None:
        target.restore(rows)
    else:
        if pinned is not None:
            pinned.restore(tokens, target, cache, past=False)
        prefill_to(target, cache.tokens[: target.length], tokens, chunk)
        rows = target.snapshot(len(tokens))
    cache.tokens = list(tokens)
    return rows


def fits(engine, tokens: Sequence[int]) -> bool:
    """Whether a pinned prefix of these tokens leaves the cache room for a turn (else a log line)."""
    if len(tokens) < engine.max_len - 1:
        return True
    log.warning("pinned prefix: the system prompt's %d tokens do not fit the cache (%d): not pinned",
                len(tokens), engine.max_len)
    return False


def prefix_tokens(engine, system: str) -> tuple[list[int], bool]:
    """The tokens every conversation with this system prompt starts with, whatever follows: the
    common prefix of two renderings that differ only in the user's turn (template-agnostic), and
    whether they were a chat's (False: a bundle without a chat template)."""
    head, _, chat = turn_frame(engine, system)
    return head, chat


def turn_frame(engine, system: str) -> tuple[list[int], list[int], bool]:
    """(the tokens before a single user turn's content, those after it, whether it is a chat): the
    common prefix and suffix of two renderings that differ only in the user's turn."""
    chat = True
    try:
        a, b = engine.encode(**visit(system, "A")), engine.encode(**visit(system, "Z"))
    except InvalidRequest:
        chat = False
        a, b = engine.encode(**visit(system, "A", chat)), engine.encode(**visit(system, "Z", chat))
    n = common_prefix(a, b)
    m = common_prefix(a[n:][::-1], b[n:][::-1])
    return a[:n], a[len(a) - m :] if m else [], chat


def cache_key(engine, tokens: Sequence[int]) -> str:
    m = engine.bundle.manifest
    template = engine.bundle.tokenizer_config().get("chat_template") or ""
    h = hashlib.sha256()
    weights = m.digest or json.dumps(m.files, sort_keys=True)  # the files' sha256s when the digest is absent
    for part in (weights, json.dumps(template), json.dumps(list(map(int, tokens)))):
        h.update(str(part).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def _checksum(tokens: np.ndarray, rows: Sequence[np.ndarray]) -> str:
    h = hashlib.sha256(np.ascontiguousarray(tokens).tobytes())
    for r in rows:
        h.update(str((r.shape, r.dtype.str)).encode())
        h.update(np.ascontiguousarray(r).tobytes())
    return h.hexdigest()


def save(path: Path, tokens: Sequence[int], rows: Sequence[np.ndarray]) -> None:
    """Writes the rows atomically (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    toks = np.asarray(tokens, dtype=np.int64)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, tokens=toks, sha256=np.array(_checksum(toks, rows)), **{f"kv{i}": r for i, r in enumerate(rows)})
    os.replace(tmp, path)


def load(path: Path, tokens: Sequence[int]) -> list[np.ndarray]:
    """The saved rows for `tokens` (each [1, heads, len(tokens), dim]), checked against the checksum;
    Engine.hold checks them against the live cache's buffers. Raises ValueError saying what is wrong."""
    with np.load(path, allow_pickle=False) as z:
        toks = z["tokens"]
        want = str(z["sha256"])
        rows = [z[f"kv{i}"] for i in range(sum(1 for k in z.files if k.startswith("kv")))]
    if toks.tolist() != list(tokens):
        raise ValueError("it holds other tokens (stale)")
    if _checksum(toks, rows) != want:
        raise ValueError("checksum mismatch (corrupt)")
    if not rows or any(r.ndim != 4 or r.shape[2] != len(tokens) for r in rows):
        raise ValueError(f"its cache rows do not hold {len(tokens)} tokens (stale)")
    return rows


def pin_system_prompt(engine, system: str | None, *, save_dir: str | os.PathLike | None = None,
                      keep_same: bool = False) -> PinnedPrefix | None:
    """Prefills (or loads) the system prompt's prefix into the engine's target cache and pins it:
    sets `engine.pinned`, returns it. None (and a log line) when the prompt does not fit the cache.
    An engine whose documents put the whole venue in the cache (docs/answer.py) pins the system
    turn its requests get, the venue in it (`system` None: the default system prompt's), and pins
    it again after every reload of the documents (`keep_same`: a pin of the same tokens is kept as it is)."""
    kn = engine.docs
    venue = kn is not None and kn.venue is not None
    if kn is not None and not engine.repins_on_reload:
        engine.repins_on_reload = True
        kn.on_reload.append(lambda: pin_system_prompt(engine, engine.pinned.text if engine.pinned else system,
                                                      save_dir=save_dir, keep_same=True))
    rendered = kn.system(system) if venue else system
    layout = None  # the cached reading's passages (venue_rows.py)
    if kn is not None and kn.cached and engine.target.can_place:
        layout = _venue_rows(engine, kn, system or _answer.DEFAULT_SYSTEM)
        rendered = system or _answer.DEFAULT_SYSTEM
    if not rendered:
        engine.pinned = None
        return None
    tokens, chat = (layout.base, True) if layout is not None else prefix_tokens(engine, rendered)
    if not tokens:
        return None
    kept = getattr(engine, "pinned", None)
    held = getattr(engine, "venue_rows", None)
    same_rows = layout is None if held is None else layout is not None and held.all_tokens() == layout.all_tokens()
    if keep_same and kept is not None and kept.tokens == list(tokens) and kept.text == (system or "") and same_rows:
        if held is not None:
            held.index = layout.index  # the same passages, the reloaded index's objects
        return kept  # a reload that changed nothing a turn reads: nothing to do
    engine.venue_rows = None
    if not fits(engine, tokens):
        return None
    path = Path(save_dir) / f"{cache_key(engine, tokens)}.npz" if save_dir is not None else None
    pin = None
    if path is not None and path.exists():
        try:
            rows = load(path, tokens)
            pin = PinnedPrefix(list(tokens), engine.hold(tokens, rows), source="file")  # ValueError: not this cache's
        except (ValueError, OSError, KeyError, EOFError) as e:
            log.warning("pinned prefix: ignoring %s: %s", path, e)
        except Exception as e:  # noqa: BLE001 - a damaged zip raises many kinds; never fatal
            log.warning("pinned prefix: ignoring %s: unreadable (%s)", path, type(e).__name__)
    if pin is None:
        pin = PinnedPrefix(list(tokens), engine.hold(tokens))
        if path is not None and pin.rows is not None:
            try:
                save(path, tokens, pin.rows)
            except OSError as e:
                log.warning("pinned prefix: cannot save %s: %s", path, e)
    pin.text, pin.chat = system or "", chat
    engine.pinned = pin
    log.info("pinned prefix: %d tokens of system prompt%s (%s)", len(tokens),
             " and the venue's documents" if venue else "", pin.source)
    if layout is not None and pin.rows is not None:
        _fill_rows(engine, layout, save_dir)
    return pin


def _venue_rows(engine, kn, system: str):
    """The cached reading's layout for this system prompt (engine/venue_rows.py), or None (logged) when
    the venue's positions do not fit the model's context."""
    from . import venue_rows

    head, tail, chat = turn_frame(engine, system)
    if not chat:
        return None

    def encode(text: str) -> list[int] | None:
        try:
            return engine.encode(**visit(system, text))
        except InvalidRequest:
            return None

    rows = venue_rows.plan(system, kn.index, encode, head, tail)
    limit = engine.target.facts.max_context or engine.max_len
    if rows is not None and rows.end() + _answer.TURN_ROOM > limit:
        log.warning("venue rows: the venue's %d tokens do not fit the model's %d positions: passages are quoted",
                    rows.tokens, limit)
        return None
    return rows


def _fill_rows(engine, rows, save_dir) -> None:
    """The passages' rows from the saved file, or computed (and saved); then the engine uses them."""
    from . import venue_rows

    path = venue_rows.cache_file(save_dir, cache_key(engine, rows.all_tokens()))
    source = "computed"
    if path is not None and path.exists():
        try:
            rows.unstack(load(path, rows.all_tokens()[len(rows.base) :]))
            first = min(rows.rows)
            engine.target.check_rows(rows.rows[first][0], len(rows.blocks[first]))
            source = "file"
        except Exception as e:  # noqa: BLE001 - a damaged or stale file is recomputed, never fatal
            log.warning("venue rows: ignoring %s: %s", path, e)
            rows.rows.clear()
    if not rows.rows:
        engine.compute_venue_rows(rows)
        if path is not None:
            try:
                save(path, rows.all_tokens()[len(rows.base) :], rows.stacked())
            except OSError as e:
                log.warning("venue rows: cannot save %s: %s", path, e)
    engine.venue_rows = rows
    log.info("venue rows: %d passages, %d tokens in the cache's copy (%s)", len(rows.rows), rows.tokens, source)
