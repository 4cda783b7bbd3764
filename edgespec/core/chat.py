"""Chat messages -> prompt text, with the bundle's own chat template (Jinja2, as in Hugging Face).

The template comes from the bundle (exported from the model's tokenizer_config), so a conversation
is formatted exactly as the model was trained to see it. Rendering runs in Jinja2's sandbox: a
template is data from a file, not code we trust.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Sequence

from ..errors import InvalidRequest

ROLES = ("system", "user", "assistant", "tool")


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Checks the OpenAI-style message list and returns it as plain dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {'role', 'content'} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] is a {type(m).__name__}, expected an object", param="messages")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role is {role!r}, expected one of {', '.join(ROLES)}", param="messages")
        if isinstance(content, list):  # OpenAI content parts: only text parts can be used here
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise InvalidRequest(f"messages[{i}].content: only text parts are supported", param="messages")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string", param="messages")
        out.append({**m, "role": role, "content": content})
    if not any(m["content"].strip() for m in out):
        raise InvalidRequest("messages are all empty", param="messages")
    return out


def _raise(message: str):
    raise InvalidRequest(f"chat template: {message}", param="messages")


def _tojson(x, indent=None, ensure_ascii=False, sort_keys=False):
    return json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render(template: str | None, messages: Sequence[dict], *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """The prompt text for `messages`, ending with the assistant's turn opener when
    `add_generation_prompt` (the model then writes the assistant's reply)."""
    if not template:
        raise InvalidRequest("this bundle has no chat template: pass a plain prompt instead of messages", param="messages")
    from jinja2 import TemplateError

    msgs = validate_messages(messages)
    try:
        return _compile(template).render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token, **extra)
    except InvalidRequest:
        raise
    except TemplateError as e:
        raise InvalidRequest(f"the bundle's chat template failed on these messages: {e}", param="messages") from e
