"""Flags shared by commands of both halves (the runtime's CLI and `edgespec export`): here, beside the
runtime's other shared pieces, because the export half imports the runtime but never its CLI."""
from __future__ import annotations

import sys


def draft_model(new: str | None, old: str | None, command: str) -> str | None:
    """`--draft-model SRC`, or its old spelling `--draft SRC` with a warning: `--draft` names a drafting
    mode in generate, chat, serve and bench, so the model's path got a flag that says what it is."""
    from .errors import InvalidRequest

    if old is None:
        return new
    if new is not None and new != old:
        raise InvalidRequest(f"two draft models given (--draft-model {new} and --draft {old}): pass --draft-model "
                             "only", param="draft_model")
    print(f"edgespec {command}: warning: --draft SRC is now --draft-model SRC (--draft names a drafting mode in "
          "generate, serve and bench); the old spelling will go", file=sys.stderr)
    return old
