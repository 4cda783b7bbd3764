"""The bundle's chat template, compiled and rendered as untrusted data: a sandbox with budgets.

A chat template is Jinja2 source from a file anyone could have edited. Jinja2's sandbox stops it from
reaching Python's internals, but not from looping for hours (`range(100000)` inside `range(100000)`)
or building a 100 MB string (`'x' * 100000000`), and such a string is built by one C call that
holds the GIL: while it runs, not even SIGTERM is handled. So every place a template can make work
is metered before the work is done:

- loops over `range`, calls (macros, methods, `caller`, `loop`), filters and the operators that can
  grow a value (`*`, `**`, `+`, `%`) each spend one operation of a budget that grows with the
  conversation (OPS_BASE + OPS_PER_MESSAGE per message);
- a string or list an operator, call or filter would produce is sized first where it can be
  (`'x' * n`, `s.center(n)`, `2 ** n`, format widths) and checked after otherwise; nothing over
  MAX_CHARS is built, and the rendered output stops at MAX_CHARS;
- a wall-clock deadline (SECONDS) backs all of this up, checked at each operation (and enforced by
  killing the render's process, below);
- a macro that calls itself without end is Python's RecursionError, caught here.

- a filter's, method's or operator's input or result spends operations by its size before (or, for
  results made by one C call, as soon as) it is made: one per item for the filters that work per item
  in Python (urlize, wordwrap, title, sort, map, ...), one per 64 or 256 characters for the others; so
  the budget bounds the work itself, not just the number of steps.

The render itself runs in a child process killed at the deadline (models/template_process.py): a
single long call cannot hold the caller past it. A bundle's template is compiled and probe-rendered
when the bundle is read (models/bundle.py), so a template that loops or balloons refuses the bundle in
under a second; the same budgets hold at request time (core/chat.py), where overrunning them is a 400.
"""
from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable

# largest string, list or rendered prompt a template may make (2 Mi characters: about 500 K tokens, past any
# edge device's cache, and twice the server's 1 MiB request body)
MAX_CHARS = 1 << 21
MAX_TEMPLATE_CHARS = 1 << 20  # a chat template's own source (real ones are under 40 KB)
MAX_INT_BITS = 1 << 16  # integers a template may compute (about 20,000 digits; templates count, not factor)
OPS_BASE = 100_000  # operations a render may spend, plus OPS_PER_MESSAGE for each message
OPS_PER_MESSAGE = 1_000
SECONDS = 2.0  # wall-clock backstop of one render (real templates render in milliseconds, on a Pi too)
# What a filter's input costs in operations, before it runs (measured on the dev CPU, 1 M characters):
# Python-level work per character or item (urlize 1.6 s, wordwrap 2.3 s, sort 4.5 s, map 3.3 s, title 0.34 s)
# spends one operation per item; C-speed work about 50 ns per character (striptags, escape, list, split)
# one per 64 characters; the rest (trim, upper, replace, tojson, about 1-25 ns) one per 256. So the whole
# budget is at most about half a second of filter work, however it is spent.
PER_ITEM_FILTERS = frozenset({"urlize", "wordwrap", "title", "pprint", "wordcount", "unique", "sort", "dictsort",
                              "map", "select", "reject", "selectattr", "rejectattr", "batch", "slice", "max", "min",
                              "groupby", "sum", "urlencode", "xmlattr", "items", "join", "list"})
MEDIUM_FILTERS = frozenset({"striptags", "escape", "forceescape", "e", "capitalize", "int", "float", "tojson",
                            "truncate", "center", "indent", "replace", "format"})
MEDIUM_CHARS_PER_OP = 64
METHOD_CHARS_PER_OP = 16  # a str method is C, but may make an item per character (split) that is sized after
FAST_CHARS_PER_OP = 256
_WIDTH = re.compile(r"\d{7,}")  # a format width or precision of a million or more
_NESTED_SPEC = re.compile(r"\{[^{}]*:[^{}]*\{")  # a replacement field inside a format spec


# the metering filters' names: not identifiers, so no template can call or shadow them
METER_ITER, METER_CONCAT = "edgespec-metered-iter", "edgespec-metered-concat"


class TemplateRefused(Exception):
    """The template went over a budget or cannot be compiled; the message is one line."""


class _Budget:
    def __init__(self, ops: int, seconds: float):
        self.ops = ops
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds

    def tick(self) -> None:
        self.ops -= 1
        if self.ops < 0:
            raise TemplateRefused("loops or calls exceed the render budget (a template that never ends?)")
        if self.ops & 255 == 0 and time.monotonic() > self.deadline:
            raise TemplateRefused(f"rendering took over {self.seconds:g} s")


_local = threading.local()  # the render in progress on this thread: hooks have no other way to it


def _budget() -> _Budget:
    b = getattr(_local, "budget", None)
    if b is None:  # a compiled template used outside render(): give it a budget of its own
        b = _local.budget = _Budget(OPS_BASE, SECONDS)
    b.tick()
    return b


def _spend(ops: int, what: str) -> None:
    """Work proportional to a value's size, paid before it is done (a filter over 2 M characters)."""
    b = _budget()
    b.ops -= ops
    if b.ops < 0:
        raise TemplateRefused(f"{what}: over the render budget of work (a very long value, or many of them)")


def _filter_cost(name: str, value: Any) -> int:
    """Operations a filter's input costs (the tables above): items for the per-item filters, characters
    and items all the way down (the value's weight) for the rest."""
    if name in PER_ITEM_FILTERS:
        if name == "pprint":
            return _weight(value)
        return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0
    per = MEDIUM_CHARS_PER_OP if name in MEDIUM_FILTERS else FAST_CHARS_PER_OP
    return _weight(value) // per


def _weight(x: Any, memo: dict | None = None) -> int:
    """Characters or items printing `x` could produce: a list counts its items' weights, each time
    it holds them (`[big] * 1000` weighs 1000 bigs, though it is only 1000 references), so that
    `str()`, `tojson` or output of a value can never be far over its weight. Stops counting past
    MAX_CHARS (the verdict is made), so it costs at most that many steps."""
    if isinstance(x, (str, bytes)):
        return len(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return x.bit_length() // 3 + 1
    if not isinstance(x, (list, tuple, dict)):
        return 1
    memo = {} if memo is None else memo
    known = memo.get(id(x))
    if known is not None:
        return known
    memo[id(x)] = 0  # a cycle counts once
    total = len(x)
    for item in (x.items() if isinstance(x, dict) else x):
        total += _weight(item, memo)
        if total > MAX_CHARS:
            break
    memo[id(x)] = total
    return total


def _check_size(n: int, what: str) -> None:
    if n > MAX_CHARS:
        raise TemplateRefused(f"{what} would make a value of {n:,} characters or items (limit {MAX_CHARS:,})")


def _check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateRefused(f"{what} would make an integer of {bits:,} bits (limit {MAX_INT_BITS:,})")


def _check_args(args: tuple, kwargs: dict, what: str) -> None:
    """Integer arguments are widths and counts (`center(n)`, `indent(n)`, `lipsum(n)`): capped;
    format strings may not carry a width of a million."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_CHARS:
            shown = f"{a:,}" if a.bit_length() <= 64 else f"of {a.bit_length():,} bits"
            raise TemplateRefused(f"{what}: argument {shown} is over the limit ({MAX_CHARS:,})")
        if isinstance(a, str) and "%" in a and _WIDTH.search(a):
            raise TemplateRefused(f"{what}: a format width of a million or more")
        if isinstance(a, (str, bytes)):  # `f(s ~ s)`: `~` is not metered, the call it feeds is
            _check_size(len(a), what)


def _check_result(x: Any, what: str) -> Any:
    _check_size(_weight(x), what)
    return x


def _listed(v: Any) -> Any:
    """An iterable a join or sum will consume, made a list so it can be sized first (it was going
    to be consumed whole anyway); strings and sized containers as they are."""
    return v if isinstance(v, (str, bytes, list, tuple, dict)) or not hasattr(v, "__iter__") else list(v)


def _grow(what: str, obj: Any, args: tuple) -> tuple:
    """Sizes a string method's result before it is built, for the methods that can multiply; returns
    the arguments to call it with (a generator joined is listed first, to be sized)."""
    if not isinstance(obj, str):
        return args
    if what == "replace" and len(args) >= 2 and isinstance(args[1], str):
        _check_size((obj.count(args[0]) if isinstance(args[0], str) and args[0] else len(obj) + 1) * len(args[1])
                    + len(obj), "str.replace")
    elif what == "join" and args:
        args = (_listed(args[0]), *args[1:])
        if isinstance(args[0], (list, tuple)):
            _check_size(len(obj) * len(args[0]) + _weight(args[0]), "str.join")
    elif what == "expandtabs":
        tab = args[0] if args and isinstance(args[0], int) else 8
        _check_size(obj.count("\t") * tab + len(obj), "str.expandtabs")
    elif what == "translate" and args and isinstance(args[0], dict):
        _check_size(len(obj) * max([_weight(v) for v in args[0].values()] or [0]), "str.translate")
    return args


def _check_format(fmt: str, args: tuple, kwargs: dict) -> None:
    """str.format: no width of a million in the format string, nor in an argument it substitutes
    into a format spec (`'{:>{}}'.format(1, '9' * 9)`); each field can print its largest argument."""
    if _WIDTH.search(fmt):
        raise TemplateRefused("str.format: a format width of a million or more")
    values = [*args, *kwargs.values(), *(v for a in args if isinstance(a, dict) for v in a.values())]
    if _NESTED_SPEC.search(fmt) and any(isinstance(v, str) and _WIDTH.search(v) for v in values):
        raise TemplateRefused("str.format: a format width of a million or more")
    _check_size(len(fmt) + fmt.count("{") * max([_weight(v) for v in values] or [0]), "str.format")


def _binop_size(op: str, left: Any, right: Any) -> None:
    """Sizes what an operator would build, before it builds it."""
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                _check_size(_weight(seq) * max(n, 0), "'*'")
        if isinstance(left, int) and isinstance(right, int):  # one multiply of huge ints holds the GIL
            _check_bits(left.bit_length() + right.bit_length(), "'*'")
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        _check_bits(right * abs(left).bit_length(), "'**'")
    elif op == "+" and isinstance(left, (str, bytes, list, tuple)):
        _check_size(_weight(left) + _weight(right), "'+'")
    elif op == "%" and isinstance(left, str):
        if _WIDTH.search(left):
            raise TemplateRefused("'%': a format width of a million or more")
        _check_args(right if isinstance(right, tuple) else (right,), {}, "'%'")
        _check_size(len(left) + left.count("%") * _weight(right), "'%'")


def _filter_size(name: str, args: tuple) -> tuple:
    """The filters that multiply, sized before they run (the rest are checked after)."""
    if name in ("join", "sum") and len(args) >= 2:  # (eval_ctx or environment, value, ...)
        args = (args[0], _listed(args[1]), *args[2:])
        sep = args[2] if name == "join" and len(args) > 2 and isinstance(args[2], str) else ""
        n = len(args[1]) if isinstance(args[1], (list, tuple, dict, str)) else 0
        _check_size(_weight(args[1]) + len(sep) * n, f"filter {name}")
    elif name == "indent" and args and isinstance(args[0], str):
        width = args[1] if len(args) > 1 else 4
        per = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _check_size(len(args[0]) + (args[0].count("\n") + 1) * per, "filter indent")
    elif name == "format" and args and isinstance(args[0], str):
        _binop_size("%", args[0], args[1:])
    return args


class _Range:
    """`range` for templates: Jinja2's sandboxed range (at most 100,000 items) whose iteration
    spends one operation per item; otherwise a range (len, indexing, truth, `in`, reversed)."""

    def __call__(self, *args: int) -> "_MeteredRange":
        from jinja2.sandbox import safe_range

        _check_args(args, {}, "range")
        return _MeteredRange(safe_range(*args))


class _MeteredRange:
    def __init__(self, r: range):
        self.r = r

    def __iter__(self):
        for i in self.r:
            _budget()
            yield i

    def __reversed__(self):
        return iter(_MeteredRange(self.r[::-1]))

    def __len__(self) -> int:
        return len(self.r)

    def __bool__(self) -> bool:
        return bool(self.r)

    def __contains__(self, x: Any) -> bool:
        return x in self.r

    def __getitem__(self, i: Any) -> Any:
        got = self.r[i]
        return _MeteredRange(got) if isinstance(got, range) else got

    def __repr__(self) -> str:
        return repr(self.r)


def _namespace_class():
    from jinja2.utils import Namespace

    class MeteredNamespace(Namespace):
        """`namespace()` whose attributes are sized when set (`ns.s = ns.s ~ ns.s` doubles)."""

        def __setitem__(self, name: str, value: Any) -> None:
            _budget()
            _check_result(value, f"namespace.{name}")  # `ns.s = ns.s ~ ns.s` doubles
            super().__setitem__(name, value)

    return MeteredNamespace


def _metered_filter(name: str, f: Callable) -> Callable:
    import functools

    from jinja2.utils import _PassArg

    passes = int(_PassArg.from_obj(f) is not None)  # a context, eval context or environment comes first

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        _budget()
        _check_args(args, kwargs, f"filter {name}")
        value = args[1 if passes else 0] if len(args) > passes else None  # ([context,] value, ...)
        _spend(_filter_cost(name, value), f"filter {name}")
        if name == "replace" and len(args) >= 4:  # (eval_ctx, s, old, new[, count])
            _grow("replace", str(args[1]), (str(args[2]), str(args[3])))
        args = _filter_size(name, args)
        return _check_result(f(*args, **kwargs), f"filter {name}")

    return run


def _metered_iter(value: Any) -> Any:
    """Every `{% for %}` iterates through this (make_environment's parse step wraps each loop's
    iterable): one operation per item, so a loop over a 2 M-character string with an empty body is
    stopped like a `range` loop."""
    for item in value:
        _budget()
        yield item


def _metered_concat(value: Any) -> Any:
    """`a ~ b` (made by Jinja in one C call; its operands are bounded): its result sized and paid for."""
    _check_result(value, "'~'")
    _spend(_weight(value) // FAST_CHARS_PER_OP, "'~'")
    return value


def _tojson(x, indent=None, ensure_ascii=False, sort_keys=False):
    if isinstance(indent, int) and not isinstance(indent, bool):
        indent = min(indent, 16)  # each nesting level of each line: a big indent multiplies the output
    elif indent is not None:
        indent = None
    return json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def make_environment(raise_exception: Callable[[str], Any]):
    """The sandbox: Jinja2's immutable sandbox, metered. `raise_exception` is the template's
    `raise_exception(msg)` (Hugging Face templates call it to refuse a conversation)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class _Meter(NodeTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = nodes.Filter(node.iter, METER_ITER, [], [], None, None, lineno=node.lineno)
            return node

        def visit_Concat(self, node):
            node = self.generic_visit(node)
            return nodes.Filter(node, METER_CONCAT, [], [], None, None, lineno=node.lineno)

    class MeteredEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def _parse(self, source, name, filename):
            """Each loop's iterable and each `~` run through a metering filter (added after parsing,
            so no template can name or avoid them)."""
            return _Meter().visit(super()._parse(source, name, filename))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
            _budget()
            _check_args(args, kwargs, "call")
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, (str, bytes, list, tuple, dict)):  # a method: work on its object, and
                _spend(_weight(owner) // METHOD_CHARS_PER_OP, "call")  # perhaps an item per character
            args = _grow(getattr(__obj, "__name__", ""), owner, args)
            out = _check_result(super().call(__context, __obj, *args, **kwargs), "call")
            if isinstance(out, (str, bytes, list, tuple)):  # a method's result (a split's million items)
                _spend(len(out) // MEDIUM_CHARS_PER_OP, "call")
            return out

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None

            def checked(*args: Any, **kwargs: Any) -> str:
                _check_format(value.__self__, args, kwargs)
                return _check_result(wrapped(*args, **kwargs), "str.format")

            return checked

        def call_binop(self, context, operator, left, right):
            _budget()
            _binop_size(operator, left, right)
            out = super().call_binop(context, operator, left, right)
            if isinstance(out, (str, bytes, list, tuple)):  # built by one C call: paid for by its size
                _spend(len(out) // FAST_CHARS_PER_OP, f"'{operator}'")
            return out

    env = MeteredEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    env.filters = {k: _metered_filter(k, f) for k, f in env.filters.items()}
    env.filters[METER_ITER] = _metered_iter
    env.filters[METER_CONCAT] = _metered_concat
    env.globals.pop("lipsum", None)  # lorem ipsum of n paragraphs: no chat template writes filler text
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["range"] = _Range()
    env.globals["namespace"] = _namespace_class()
    return env


@lru_cache(maxsize=8)
def compiled(template: str, raise_exception: Callable[[str], Any]):
    """The compiled template (cached: a bundle has one). Raises TemplateRefused, one line."""
    if not isinstance(template, str):
        raise TemplateRefused(f"is a {type(template).__name__}, not a string")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateRefused(f"is {len(template):,} characters (limit {MAX_TEMPLATE_CHARS:,})")
    try:
        return make_environment(raise_exception).from_string(template)
    except RecursionError:
        raise TemplateRefused("nested too deeply to compile") from None
    except MemoryError:
        raise TemplateRefused("ran out of memory compiling it") from None
    except Exception as e:  # TemplateSyntaxError, or Python's compiler refusing the generated code
        raise TemplateRefused(f"does not compile: {_one_line(e)}") from None


def render_budgeted(tmpl: Any, n_messages: int, **variables: Any) -> str:
    """Renders within the budgets. Raises TemplateRefused (a budget), RecursionError, or whatever
    the template itself raises (the caller decides what each is)."""
    return render_metered(tmpl, n_messages, **variables)[0]


def render_metered(tmpl: Any, n_messages: int, **variables: Any) -> tuple[str, int]:
    """render_budgeted's text and the operations it spent: what a template costs, counted the same
    way on every machine (models/template_process.py compares a long conversation with a short one)."""
    budget = _local.budget = _Budget(OPS_BASE + OPS_PER_MESSAGE * max(n_messages, 0), SECONDS)
    start = budget.ops
    try:
        out: list[str] = []
        total = 0
        for chunk in tmpl.generate(**variables):
            total += len(chunk)
            if total > MAX_CHARS:
                raise TemplateRefused(f"the rendered prompt is over {MAX_CHARS:,} characters")
            budget.tick()
            out.append(chunk)
        return "".join(out), start - budget.ops
    finally:
        _local.budget = None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__
