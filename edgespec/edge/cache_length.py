"""The cache length: what a caller may ask for, and the one default when none is asked for.

Used by the memory plan (edge/memory.py), which then shrinks it to fit a budget, and by the engine's
Settings (engine/settings.py), which check a given one where it enters.
"""
from __future__ import annotations

from ..errors import InvalidRequest
from ..limits import DEFAULT_MAX_LEN


def check_max_len(max_len) -> None:
    """A cache length someone asked for: an integer of at least 2 (the prompt's last token and one more)."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise InvalidRequest(f"max_len must be an integer >= 2, got {max_len!r}", param="max_len")


def default_max_len(bundle, profile=None) -> int:
    """The cache length when none is asked for (the one place this default is decided): the bundle's
    own, written by export (`--max-context`, manifest.defaults["max_len"]), else DEFAULT_MAX_LEN;
    capped by the board's profile (`default_max_len`: what its memory and speed make sensible)."""
    defaults = getattr(getattr(bundle, "manifest", None), "defaults", None) or {}
    want = defaults.get("max_len")
    want = int(want) if isinstance(want, int) and not isinstance(want, bool) and want >= 2 else DEFAULT_MAX_LEN
    board = getattr(profile, "default_max_len", None)
    return min(want, int(board)) if board else want
