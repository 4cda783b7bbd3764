"""Prompt sets for `edgespec bench`: the shipped sets (prompts/*.jsonl) and the user's own files, each
line checked, every problem reported with its line number before anything runs."""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from ..errors import InvalidRequest

PROMPT_SETS = ("code", "chat", "multiturn", "heldout", "unseen", "structured")
PROMPT_KEYS = {"id", "category", "prompt", "messages", "max_new_tokens", "raw", "conversation", "json_schema"}
PROMPT_ORDERS = ("file", "reverse", "interleave")  # `bench --order`: see order_prompts


@dataclass
class Prompt:
    id: str
    category: str
    prompt: str | None = None
    messages: list[dict] | None = None
    max_new_tokens: int | None = None
    raw: bool = False
    set: str = ""  # which set or file it came from
    conversation: str | None = None  # turns of one conversation share this (run in file order)
    json_schema: dict | None = None  # the answer follows this schema (structured output)

    def turn(self) -> list[dict]:
        """This prompt as chat messages."""
        return list(self.messages) if self.messages is not None else [{"role": "user", "content": self.prompt}]

    def request(self, history: Sequence[dict] = ()) -> dict[str, Any]:
        """Keyword arguments for Engine.generate: the chat template unless the prompt is raw;
        `history`: the earlier turns of its conversation (messages, answers included)."""
        if self.raw and not history:
            return {"prompt": self.prompt}
        return {"messages": [*history, *self.turn()]}

    def generation(self, history: Sequence[dict] = ()) -> dict[str, Any]:
        """request() and the structured output the answer is held to (Engine.generate's keywords)."""
        return {**self.request(history), **({} if self.json_schema is None else {"json_schema": self.json_schema})}


def prompt_units(prompts: Sequence[Prompt]) -> list[list[Prompt]]:
    """What runs without a reset in between: each prompt alone, or a conversation's turns in file
    order (the unit sits where its first turn is)."""
    units: list[list[Prompt]] = []
    convs: dict[str, list[Prompt]] = {}
    for p in prompts:
        if p.conversation is None:
            units.append([p])
        elif p.conversation in convs:
            convs[p.conversation].append(p)
        else:
            convs[p.conversation] = [p]
            units.append(convs[p.conversation])
    return units


def order_prompts(prompts: Sequence[Prompt], order: str) -> list[Prompt]:
    """The prompts in the order a run sends them: "file" as given, "reverse" last first, "interleave"
    one of each category in turn (round robin, categories in order of first appearance), the traffic of
    a service whose apps ask different things. A conversation moves as one unit, its turns in file order.

    Why: `auto` carries what it learned from one request into the next (the draft's rate, the share of a
    reply its rounds write, reply lengths), so with the shipped sets in file order a category's requests
    follow each other and inherit the state of their own kind: a category's figure is partly the order's,
    so a comparison is judged over more than one order."""
    if order not in PROMPT_ORDERS:
        raise InvalidRequest(f"--order {order!r}: must be one of {', '.join(PROMPT_ORDERS)}", param="order")
    units = prompt_units(prompts)
    if order == "reverse":
        units.reverse()
    elif order == "interleave":
        queues: dict[str, list[list[Prompt]]] = {}
        for u in units:
            queues.setdefault(u[0].category, []).append(u)
        units = []
        while any(queues.values()):
            units += [q.pop(0) for q in queues.values() if q]
    return [p for u in units for p in u]


def load_prompts(spec: str) -> list[Prompt]:
    """`spec`: "code", "chat", "multiturn", "heldout", "unseen", "structured" (each prompt with the JSON schema
    its answer follows), a path to a .jsonl file, or several of these
    joined by commas.
    Every problem in a file is reported with its line number; nothing runs on a bad file."""
    out: list[Prompt] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part in PROMPT_SETS:
            text = resources.files("edgespec.bench").joinpath("prompts", f"{part}.jsonl").read_text(encoding="utf-8")
            out += parse_prompts(text, part)
        else:
            path = Path(part).expanduser()
            if not path.is_file():
                raise InvalidRequest(
                    f"--prompts {part!r}: not a built-in set ({', '.join(PROMPT_SETS)}) and no such file", param="prompts")
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise InvalidRequest(f"{path}: cannot read: {e}", param="prompts") from None
            out += parse_prompts(text, str(path))
    if not out:
        raise InvalidRequest(f"--prompts {spec!r}: no prompts", param="prompts")
    seen: dict[str, str] = {}
    for p in out:
        if p.id in seen:
            raise InvalidRequest(f"prompt id {p.id!r} appears twice ({seen[p.id]} and {p.set})", param="prompts")
        seen[p.id] = p.set
    return out


def parse_prompts(text: str, source: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}:{n}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(d, dict):
            problems.append(f"{where}: each line must be a JSON object")
            continue
        unknown = sorted(set(d) - PROMPT_KEYS)
        if unknown:
            problems.append(f"{where}: unknown key(s) {unknown}; allowed: {sorted(PROMPT_KEYS)}")
        has_p, has_m = "prompt" in d, "messages" in d
        if has_p == has_m:
            problems.append(f"{where}: needs exactly one of 'prompt' (a string) or 'messages' (a list)")
            continue
        if has_p and (not isinstance(d["prompt"], str) or not d["prompt"].strip()):
            problems.append(f"{where}: 'prompt' must be a non-empty string")
        if has_m:
            m = d["messages"]
            ok = isinstance(m, list) and m and all(
                isinstance(x, dict) and isinstance(x.get("role"), str) and isinstance(x.get("content"), str) for x in m)
            if not ok:
                problems.append(f"{where}: 'messages' must be a non-empty list of {{\"role\": str, \"content\": str}}")
        cat = d.get("category", "default")
        if not isinstance(cat, str) or not cat.strip():
            problems.append(f"{where}: 'category' must be a non-empty string")
        mnt = d.get("max_new_tokens")
        if mnt is not None and (isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1):
            problems.append(f"{where}: 'max_new_tokens' must be a positive integer, got {mnt!r}")
        if "raw" in d and not isinstance(d["raw"], bool):
            problems.append(f"{where}: 'raw' must be true or false")
        if "raw" in d and has_m:
            problems.append(f"{where}: 'raw' applies to 'prompt' only")
        conv = d.get("conversation")
        if conv is not None and (not isinstance(conv, str) or not conv.strip()):
            problems.append(f"{where}: 'conversation' must be a non-empty string")
        elif conv is not None and d.get("raw"):
            problems.append(f"{where}: a conversation's turns are chat messages: 'raw' cannot be used")
        if "json_schema" in d and not isinstance(d["json_schema"], dict):
            problems.append(f"{where}: 'json_schema' must be a JSON schema object")
        pid = d.get("id", f"{Path(source).stem}-{n}")
        if not isinstance(pid, str) or not pid:
            problems.append(f"{where}: 'id' must be a non-empty string")
        if problems and problems[-1].startswith(where):
            continue
        prompts.append(Prompt(id=pid, category=cat, prompt=d.get("prompt"), messages=d.get("messages"),
                              max_new_tokens=mnt, raw=bool(d.get("raw", False)), set=source,
                              conversation=d.get("conversation"), json_schema=d.get("json_schema")))
    if problems:
        raise InvalidRequest(f"{len(problems)} problem(s) in the prompts:\n  " + "\n  ".join(problems), param="prompts")
    if not prompts:
        raise InvalidRequest(f"{source}: no prompts in the file", param="prompts")
    return prompts
