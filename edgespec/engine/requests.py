"""A request checked and tokenized before anything runs: bad input raises InvalidRequest naming the
parameter, and nothing has been touched yet. The engine parses requests with a `RequestParser` (it
tells it which modes it can run), and reads the bundle's text side (tokenizer, chat template, EOS
ids) through a `Vocabulary`."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..core.constraint import Constraint, Grammars
from ..core.sampling import SamplingParams
from ..drafters import modes
from ..drafters.heads import NO_HEADS
from ..errors import DraftUnavailable, InvalidRequest, PromptTooLong
from ..limits import STOP_LIMIT
from .settings import Settings, check_k, check_tree
from .structured import Structured, check_structured, plain_tool_turns, tools_prompt


@dataclass(frozen=True, kw_only=True, eq=False)
class Options:
    """A request's options as a caller gives them, by keyword: Engine.generate/stream/submit
    pass theirs on as one of these, and the server maps a request body onto them.

    prompt or messages: the text (a completion) or chat turns (the bundle's chat template);
    max_new_tokens; sampling: temperature (0: greedy), top_p, top_k, seed; stop: a string or a
    list; draft: a mode of drafters/modes.py (None: the engine's default); k: proposals per round
    (None: sized from measured costs); cancel: a threading.Event or a callable returning bool;
    tree: "auto" | "on" | "off" (None: the engine's default); structured output
    (docs/structured-output.md): json_schema (a dict or JSON text), grammar (llguidance's Lark
    form), or tools (OpenAI's function list) with tool_choice; strict=False ignores JSON-schema
    keywords the grammar library does not implement instead of refusing them.

    Every value that does not depend on the engine (limits.py's bounds among them) is checked here,
    once, as the options are made: a bad one raises InvalidRequest naming its option before documents
    are read or anything is tokenized. What depends on the engine (a mode it did not load, a schema,
    the prompt's tokens) is RequestParser's."""

    prompt: str | None = None
    messages: list | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: Any = None
    draft: str | None = None
    k: int | None = None
    cancel: Any = None
    tree: str | None = None
    json_schema: Any = None
    grammar: str | None = None
    tools: Any = None
    tool_choice: Any = None
    strict: bool = True
    params: SamplingParams = field(init=False, repr=False)  # temperature, top_p, top_k and seed, checked

    def __post_init__(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
        object.__setattr__(self, "params", SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                                          top_k=self.top_k, seed=self.seed))
        object.__setattr__(self, "stop", tuple(check_stop(self.stop)))
        if self.draft is not None:
            modes.get(self.draft)
        check_k(self.k)
        if self.tree is not None:
            check_tree(self.tree)


@dataclass
class Request:
    ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop: list[str]
    draft: str
    k: int | None
    cancel: Callable[[], bool]
    tree: str = "off"  # "auto" | "on" | "off": tree verification (engine/tree_round.py)
    constraint: Constraint | None = None  # the grammar the answer follows (core/constraint.py), this request's own
    structured: Structured | None = None  # what was asked (the tool calls are read back from the answer with it)


@dataclass(frozen=True, eq=False)
class Prepared:
    """A request made ready to run by an engine's `prepare()`, on the caller's thread: the options it
    runs with (the documents' passages in its last turn, where the engine reads documents), its
    Request (parsed, checked and tokenized: None when the documents declined the turn, which is
    answered without the model) and that turn (docs.answer.Turn; None without documents).
    Engine.stream and submit run it as given: nothing is parsed or tokenized again."""

    options: Options
    request: Request | None
    turn: Any = None
    read: int | None = None  # the documents' reload count (Docs.generation) when the turn was read

    @property
    def prompt_tokens(self) -> int:
        """The tokens the model reads before answering (0 for a declined turn)."""
        return len(self.request.ids) if self.request is not None else 0


def as_prepared(prompt, options: dict, prepare: Callable[..., Prepared]) -> Prepared:
    """What Engine.stream and submit run: a Prepared as given, else prepare(prompt, **options)."""
    if isinstance(prompt, Prepared):
        if options:
            raise TypeError(f"a Prepared request runs as prepared: pass {', '.join(sorted(options))} to prepare()")
        return prompt
    return prepare(prompt, **options)


class Encoder:
    """Text or chat messages -> the token ids a request starts from (the bundle's chat template,
    its BOS rule)."""

    def __init__(self, tokenizer, tokenizer_facts, *, bos_text: str, eos_text: str):
        self.tokenizer = tokenizer
        self.facts = tokenizer_facts
        self.bos_text = bos_text
        self.eos_text = eos_text

    def __call__(self, prompt, messages, tools=()) -> list[int]:
        if prompt is not None and messages is not None:
            raise InvalidRequest("pass either a prompt or messages, not both", param="prompt")
        from ..core.chat import check_text, encode_chat

        if messages is not None:  # message text never becomes control tokens (core.chat.encode_chat)
            template = self.facts.chat_template
            extra = {}
            if tools and template and "tools" in template:  # the template shows them (Qwen2.5, Hermes)
                extra["tools"] = list(tools)
            elif tools:
                messages = [{"role": "system", "content": tools_prompt(tools)}, *messages]
            if not (template and "tool_calls" in template):  # earlier calls and results as plain turns
                messages = plain_tool_turns(messages)
            ids = encode_chat(self.tokenizer, template, messages,
                              bos_token=self.bos_text, eos_token=self.eos_text, **extra)
        elif prompt is None:
            raise InvalidRequest("a prompt or messages are required", param="prompt")
        elif not isinstance(prompt, str):
            raise InvalidRequest(f"prompt must be a string, got {type(prompt).__name__}", param="prompt")
        elif not prompt:
            raise InvalidRequest("prompt is empty", param="prompt")
        else:
            check_text(prompt, "prompt")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        tf = self.facts
        if tf.add_bos and tf.bos_id is not None and (not ids or ids[0] != tf.bos_id):
            ids = [tf.bos_id, *ids]
        if not ids:
            raise InvalidRequest("prompt is empty after tokenization", param="prompt")
        return ids


def not_loaded(mode: str, bundle, opened_with: str) -> str:
    """Why `mode` cannot run on an engine that did not load its runner (either engine's answer to
    RequestParser's `unavailable`); opened_with: the engine's default mode."""
    runner = modes.get(mode).runner
    if runner == "draft":
        return ("the bundle has no draft model" if bundle.draft is None else
                f"the draft model was not loaded (engine opened with draft={opened_with!r}, or the "
                "memory plan left it out)")
    if runner == "docs":
        return "the engine has no documents (open it with docs=INDEX, `--docs INDEX`)"
    if runner == "heads" and bundle.manifest.heads is None:
        return NO_HEADS.format(name=bundle.name)
    return f"the {mode} drafter was not loaded (open the engine with draft={mode!r})"


def check_max_new_tokens(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise InvalidRequest(f"max_new_tokens must be an integer >= 1, got {n!r}", param="max_new_tokens")
    return n


def check_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    if len(stop) > STOP_LIMIT:
        raise InvalidRequest(f"at most {STOP_LIMIT} stop strings, got {len(stop)}", param="stop")
    if any(s == "" for s in stop):
        raise InvalidRequest("stop strings must not be empty", param="stop")
    return list(stop)


def cancel_fn(cancel) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return lambda: bool(cancel())
    raise InvalidRequest("cancel must be a threading.Event or a callable returning bool", param="cancel")


@dataclass(frozen=True)
class Vocabulary:
    """The bundle's text side, as the engine uses it: the tokenizer, prompt/messages -> ids, the
    ids a model may choose (`usable`: logits rows past it are padding) and the end-of-text ids."""

    tokenizer: object
    encode: Encoder
    usable: int
    eos_ids: frozenset[int]
    grammars: Grammars  # structured output: requests' grammars compiled against this vocabulary

    @classmethod
    def of(cls, bundle, tokenizer, vocab_size: int) -> "Vocabulary":
        tf = bundle.manifest.tokenizer
        cfg = bundle.tokenizer_config()

        def id_text(token_id):
            return (tokenizer.id_to_token(token_id) or "") if token_id is not None else ""

        enc = Encoder(tokenizer, tf, bos_text=_token_text(cfg.get("bos_token")) or id_text(tf.bos_id),
                      eos_text=_token_text(cfg.get("eos_token")) or id_text(tf.eos_ids[0] if tf.eos_ids else None))
        return cls(tokenizer, enc, min(tf.usable_vocab, vocab_size), frozenset(tf.eos_ids),
                   Grammars(tokenizer, vocab_size, tf.eos_ids))


def _token_text(v) -> str:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


class RequestParser:
    """One request's parameters -> a Request, for an engine opened with `settings` (its defaults for
    draft, k and tree). The engine says what it cannot run: `unavailable(mode)` returns why a mode is
    not possible here (None: it is), `tree_check(mode)` raises for a tree mode it cannot run."""

    def __init__(self, vocab: Vocabulary, max_len: int, settings: Settings, *,
                 unavailable: Callable[[str], str | None], tree_check: Callable[[str], None] | None = None):
        self.vocab = vocab
        self.max_len = max_len
        self.settings = settings
        self.unavailable = unavailable
        self.tree_check = tree_check

    def __call__(self, o: Options) -> Request:
        """`o`'s own values were checked when it was made (Options); here, what this engine can run."""
        s = self.settings
        mode = s.draft if o.draft is None else o.draft
        tree = s.tree if o.tree is None else o.tree
        why = self.unavailable(mode)
        if why:
            raise DraftUnavailable(f"draft={mode!r} is not possible: {why}", param="draft")
        if self.tree_check is not None:
            self.tree_check(tree)
        st = check_structured(o.json_schema, o.grammar, o.tools, o.tool_choice, grammars=self.vocab.grammars,
                              lenient=not o.strict)
        if st is not None and st.tools and o.messages is None:
            raise InvalidRequest("tools need messages (a chat request), not a prompt", param="tools")
        ids = self.vocab.encode(o.prompt, o.messages, st.tools if st is not None else ())
        if len(ids) >= self.max_len:
            raise PromptTooLong(len(ids), o.max_new_tokens, self.max_len)
        constraint = None
        if st is not None and st.grammar is not None:
            constraint = self.vocab.grammars.compile(st.grammar)
            tree = "off"  # a constrained round is a chain: its rows are masked one grammar state after another
        req = Request(ids, o.max_new_tokens, o.params, list(o.stop), mode, s.k if o.k is None else o.k, cancel_fn(o.cancel),
                      tree, constraint, st)
        return pin_for_determinism(req) if s.deterministic else req


def pin_for_determinism(req: Request) -> Request:
    """What deterministic mode (the runners' `deterministic=True`, docs/runtime.md) changes in a
    request. Chains only: a tree's rows sit at other cache rows than the chain's and round
    differently. A sampled request runs without drafts: which tokens were proposed decides how its
    random draws are spent, and proposals depend on what earlier requests left (the suffix index)
    and on measured step times (adaptive k); without drafts a seed spends one draw per token and
    replays. Greedy requests keep their drafter: every token is the target's argmax whatever was
    proposed. Raises InvalidRequest for tree="on"."""
    if req.tree == "on":
        raise InvalidRequest("tree='on' is not possible in deterministic mode (tree rows round unlike chain "
                             "rows): use tree='auto' or 'off'", param="tree")
    return replace(req, tree="off", draft=req.draft if req.params.greedy else "none")
