"""Chat messages -> prompt text, with the bundle's own chat template (Jinja2, as in Hugging Face).

The template comes from the bundle (exported from the model's tokenizer_config), so a conversation
is formatted exactly as the model was trained to see it. Rendering runs in Jinja2's sandbox: a
template is data from a file, not code we trust.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

from ..errors import InvalidRequest
from ..models.template import TemplateRefused
from ..models.template_process import TemplateFailed, TemplateRaised, render as render_isolated

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
        check_text(content, f"messages[{i}].content")
        out.append({**m, "role": role, "content": content})
    # empty contents ("" or []) are accepted, as OpenAI does: the template's own markers still make a
    # non-empty prompt, and the model answers an empty turn like any other
    return out


def check_text(text: str, param: str) -> None:
    """Text the tokenizer can take: valid Unicode (a lone surrogate, which JSON can carry as an
    escape, makes the tokenizer raise a TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequest(f"{param} is not valid Unicode text (a lone surrogate at character {e.start})",
                             param=param) from None


def render(template: str | None, messages: Sequence[dict], *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """The prompt text for `messages`, ending with the assistant's turn opener when
    `add_generation_prompt` (the model then writes the assistant's reply). The template runs in
    models/template.py's metered sandbox: one that loops, balloons or recurses is a 400 here (and
    was refused when the bundle was read, if the probe conversation already showed it)."""
    if not template:
        raise InvalidRequest("this bundle has no chat template: pass a plain prompt instead of messages", param="messages")
    msgs = validate_messages(messages)
    try:  # in a child process killed at the deadline (models/template_process.py)
        return render_isolated(template, len(msgs), messages=msgs, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except TemplateRaised as e:  # the template's own raise_exception
        raise InvalidRequest(f"chat template: {e}", param="messages") from None
    except TemplateRefused as e:
        raise InvalidRequest(f"the bundle's chat template was stopped: {e}", param="messages") from None
    except RecursionError:
        raise InvalidRequest("the bundle's chat template recursed too deeply (a macro that calls itself "
                             "without end?)", param="messages") from None
    except MemoryError:
        raise InvalidRequest("the bundle's chat template ran out of memory on these messages", param="messages") from None
    except (TemplateFailed, Exception) as e:  # noqa: BLE001 - TemplateError, TypeError, ... in the template
        raise InvalidRequest(f"the bundle's chat template failed on these messages: {e}", param="messages") from None


# --- chat -> token ids, with message text kept apart from control tokens ----------------------------
# A message's content is the user's text: a "<|im_end|>" typed into it must be the characters, not the
# control token, or a kiosk visitor could close their turn and write the assistant's or the system's
# (a forged turn). The template's own markers stay control tokens.
_SENTINEL = "\ue000edgespec-content-{}\ue001"  # private-use characters: no template or user writes these
_text_only: dict[int, tuple[Any, Any]] = {}
_text_only_lock = threading.Lock()


_specials_of: dict[int, tuple[Any, list[str]]] = {}


def _specials(tokenizer: Any) -> list[str]:
    """The special tokens' strings (looked up once per tokenizer: Llama 3 has 256 of them)."""
    hit = _specials_of.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        found = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special and t.content]
        hit = _specials_of[id(tokenizer)] = (tokenizer, found)
    return hit[1]


def _as_text_tokenizer(tokenizer: Any) -> Any:
    """A copy of `tokenizer` that encodes special-token strings as plain text (encode_special_tokens).
    A copy, because the flag is per tokenizer and the original is shared by threads."""
    with _text_only_lock:
        hit = _text_only.get(id(tokenizer))
        if hit is None or hit[0] is not tokenizer:
            from tokenizers import Tokenizer

            clone = Tokenizer.from_str(tokenizer.to_str())
            clone.encode_special_tokens = True
            hit = _text_only[id(tokenizer)] = (tokenizer, clone)
        return hit[1]


def encode_chat(tokenizer: Any, template: str | None, messages: Sequence[dict], **render_kw: Any) -> list[int]:
    """Token ids of the chat prompt, in which no message content can produce a special token.

    Content without any special-token string (nearly every request) is rendered and encoded in one
    piece, exactly as before. Content holding one is placed by rendering the template with a sentinel
    in place of each content: the pieces between sentinels are the template's (encoded with specials),
    the contents are encoded as text. A template that changes the content it inserts (so the pieces
    cannot be matched) gets a 400 for such content instead of a forged turn."""
    text = render(template, messages, **render_kw)
    msgs = validate_messages(messages)
    specials = _specials(tokenizer)
    risky = [i for i, m in enumerate(msgs) if any(s in m["content"] for s in specials)]
    if not risky:
        return tokenizer.encode(text, add_special_tokens=False).ids
    marked = [{**m, "content": _SENTINEL.format(i)} if i in risky else m for i, m in enumerate(msgs)]
    frame = render(template, marked, **render_kw)
    pieces: list[tuple[str, bool]] = []  # (text, is_content)
    rest = frame
    for i in risky:
        head, sep, rest = rest.partition(_SENTINEL.format(i))
        if not sep or _SENTINEL.format(i) in rest:
            break  # the template dropped or repeated the content
        pieces += [(head, False), (msgs[i]["content"], True)]
    else:
        pieces.append((rest, False))
        if "".join(p for p, _ in pieces) == text:
            plain = _as_text_tokenizer(tokenizer)
            ids: list[int] = []
            for piece, is_content in pieces:
                if piece:
                    ids += (plain if is_content else tokenizer).encode(piece, add_special_tokens=False).ids
            return ids
    i = risky[0]
    token = next(s for s in specials if s in msgs[i]["content"])
    raise InvalidRequest(f"messages[{i}].content holds the control token {token!r}, which this bundle's chat "
                         "template cannot keep apart from its own markers; remove it", param=f"messages[{i}].content")
