"""`edgespec bench BUNDLE --questions Q.jsonl`: a venue's questions with the facts their answers must hold,
asked under several conditions and drafting modes in one process, scored by fact, not by speed alone.

A question file is JSON Lines (tests/data/venues/*/questions.jsonl):
    {"id": "m01", "question": "How much is an adult day ticket?", "kind": "lookup",
     "pages": ["tickets.html"], "expect": [["£12", "12.00", "12 pounds"]]}
`expect` is a list of facts, each a list of spellings one of which must appear in the answer (case and
spacing ignored); an empty `expect` means the pages do not answer it and the answer must decline. `pages`
names the pages that hold the answer (or, for one that must be declined, where a person would look).

Conditions (each question is asked under each, every drafting mode back to back, A B A B ...):
    plain     the question alone: what the model knows
    by-hand   the question after the right pages (`pages`, read from --venue), put in the prompt by hand
    docs      the question to an engine opened with --docs INDEX: retrieval picks the passages and may decline

Per condition and mode: answers holding all their facts (of the answerable), declines (of the unanswerable)
and wrong declines (of the answerable), retrieval recall (the expected pages among the sources), median
time to first token, decode tokens/s and its ratio to the target alone on the same questions, and tokens
accepted from the documents' drafting source.
"""
from __future__ import annotations

import json
import re
import statistics
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from ..errors import InvalidRequest

CONDITIONS = ("plain", "by-hand", "docs")
KINDS = ("lookup", "sum", "near-duplicate", "unanswerable")
# how a model or the kiosk says it does not know: a decline, for questions the pages do not answer
DECLINES = ("can't find", "cannot find", "could not find", "couldn't find", "not in the", "don't have", "do not have",
            "no information", "not mentioned", "not available", "won't guess", "unable to", "not provided",
            "does not say", "doesn't say", "do not say", "don't say", "not specified", "does not mention",
            "doesn't mention", "not stated", "i don't know", "i do not know", "not include", "no mention")
BY_HAND = ("Answer the visitor's question using only the pages below. If the pages do not answer it, say that you "
           "cannot find it in the pages.")


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    kind: str
    pages: tuple[str, ...]
    expect: tuple[tuple[str, ...], ...]

    @property
    def answerable(self) -> bool:
        return bool(self.expect)


def load_questions(path: str | Path) -> list[Question]:
    """Every problem is an InvalidRequest naming the file and line; nothing runs on a bad file."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"--questions {p}: cannot be read ({getattr(e, 'strerror', None) or e})",
                             param="questions") from None
    out: list[Question] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p.name} line {n}"
        try:
            d = json.loads(line)
        except ValueError as e:
            raise InvalidRequest(f"{where}: not JSON ({e})", param="questions") from None
        if not isinstance(d, dict):
            raise InvalidRequest(f"{where}: not a JSON object", param="questions")
        q = _question(d, where)
        if q.id in seen:
            raise InvalidRequest(f"{where}: id {q.id!r} appears twice", param="questions")
        seen.add(q.id)
        out.append(q)
    if not out:
        raise InvalidRequest(f"--questions {p}: no questions", param="questions")
    return out


def _question(d: dict, where: str) -> Question:
    for key in ("id", "question"):
        if not isinstance(d.get(key), str) or not d[key].strip():
            raise InvalidRequest(f"{where}: {key!r} must be a non-empty string", param="questions")
    kind = d.get("kind", "lookup")
    if kind not in KINDS:
        raise InvalidRequest(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}", param="questions")
    pages = d.get("pages", [])
    if not isinstance(pages, list) or not all(isinstance(x, str) and x for x in pages):
        raise InvalidRequest(f"{where}: 'pages' must be a list of file names", param="questions")
    expect = d.get("expect")
    if not isinstance(expect, list) or not all(
            isinstance(f, list) and f and all(isinstance(s, str) and s.strip() for s in f) for f in expect):
        raise InvalidRequest(f"{where}: 'expect' must be a list of facts, each a non-empty list of spellings "
                             "([] for a question to decline)", param="questions")
    if (kind == "unanswerable") != (not expect):
        raise InvalidRequest(f"{where}: an unanswerable question has expect [] and only it does", param="questions")
    return Question(d["id"], d["question"], kind, tuple(pages), tuple(tuple(f) for f in expect))


# --- scoring ----------------------------------------------------------------------------------------------
def _norm(text: str) -> str:
    text = text.lower().replace("\u2019", "'").replace("\u00a0", " ")
    return re.sub(r"\s+", " ", text)


def holds(answer: str, fact: tuple[str, ...]) -> bool:
    """One of the fact's spellings appears in the answer, case and spacing ignored; a number is not found
    inside a longer number ("12.00" is not in "112.00", "30" not in "130")."""
    a = _norm(answer)
    for s in fact:
        s = _norm(s).strip()
        for m in re.finditer(re.escape(s), a):
            before = a[m.start() - 1] if m.start() else " "
            after = a[m.end()] if m.end() < len(a) else " "
            if not (s[0].isdigit() and before.isdigit()) and not (s[-1].isdigit() and after.isdigit()):
                return True
    return False


def is_decline(answer: str) -> bool:
    a = _norm(answer)
    return any(p in a for p in DECLINES)


@dataclass
class Answer:
    """What a generation gave back: the text, its stats (engine/results.py GenerationStats), the sources'
    file names and whether retrieval declined (docs condition only; None elsewhere)."""

    text: str
    stats: Any
    sources: list[str] = field(default_factory=list)
    declined_by_retrieval: bool | None = None


class Asker(Protocol):
    """The seam the bench asks through (an engine, or a fake in tests)."""

    def ask(self, messages: list[dict], *, draft: str, docs: bool, max_new_tokens: int) -> Answer: ...


@dataclass
class Sample:
    question: str
    kind: str
    condition: str
    mode: str
    text: str
    facts: bool | None  # every fact held (None: an unanswerable question)
    declined: bool
    recall: float | None  # share of the expected pages among the sources (docs condition, answerable only)
    ttft_s: float
    decode_tps: float
    new_tokens: int
    decode_s: float
    docs_tokens: int  # proposals accepted from the documents' drafting source
    by_retrieval: bool = False


def prompt_for(q: Question, condition: str, venue: Path | None) -> list[dict]:
    if condition != "by-hand":
        return [{"role": "user", "content": q.question}]
    assert venue is not None
    parts = [BY_HAND, ""]
    for name in q.pages:
        parts += [f"--- {name} ---", (venue / name).read_text(encoding="utf-8").strip(), ""]
    parts.append(f"Question: {q.question}")
    return [{"role": "user", "content": "\n".join(parts)}]


def check_venue(questions: list[Question], venue: Path | None, conditions: list[str]) -> None:
    if "by-hand" not in conditions:
        return
    if venue is None or not venue.is_dir():
        raise InvalidRequest(f"--conditions by-hand needs --venue, the folder of the pages the questions name "
                             f"(got {venue})", param="venue")
    missing = sorted({p for q in questions for p in q.pages if not (venue / p).is_file()})
    if missing:
        raise InvalidRequest(f"--venue {venue}: the questions name pages it does not hold: {', '.join(missing)}",
                             param="venue")


def score(q: Question, condition: str, mode: str, a: Answer) -> Sample:
    st = a.stats
    declined = bool(a.declined_by_retrieval) or is_decline(a.text)
    facts = all(holds(a.text, f) for f in q.expect) if q.answerable else None
    recall = None
    if condition == "docs" and q.answerable and q.pages:
        got = {Path(s).name for s in a.sources}
        recall = sum(p in got for p in q.pages) / len(q.pages)
    n = int(getattr(st, "new_tokens", 0))
    ttft = float(getattr(st, "ttft_s", 0.0))
    by_retrieval = bool(a.declined_by_retrieval)
    decode_s = 0.0 if by_retrieval else max(0.0, float(getattr(st, "total_s", 0.0)) - ttft)
    return Sample(q.id, q.kind, condition, mode, a.text, facts, declined, recall, ttft,
                  float(getattr(st, "decode_tokens_per_second", 0.0)), n, decode_s,
                  int((getattr(st, "accepted_by_source", None) or {}).get("docs", 0)), by_retrieval)


def run_questions(asker: Asker, questions: list[Question], conditions: list[str], modes: list[str], *,
                  venue: Path | None = None, max_new_tokens: int = 64,
                  on_sample: Callable[[Sample, int, int], None] | None = None,
                  condition_modes: dict[str, list[str]] | None = None) -> list[Sample]:
    """Each question under each condition, the modes back to back (their order rotating by question).
    `condition_modes`: a condition's own modes (e.g. the target alone for plain), else `modes`."""
    out: list[Sample] = []
    per = {c: (condition_modes or {}).get(c) or modes for c in conditions}
    total = len(questions) * sum(len(m) for m in per.values())
    for i, q in enumerate(questions):
        for cond in conditions:
            messages = prompt_for(q, cond, venue)
            ms = per[cond]
            rot = i % len(ms)
            for mode in ms[rot:] + ms[:rot]:
                a = asker.ask(messages, draft="none" if mode == "target" else mode, docs=cond == "docs",
                              max_new_tokens=max_new_tokens)
                out.append(score(q, cond, mode, a))
                if on_sample:
                    on_sample(out[-1], len(out), total)
    return out


def parse_conditions(spec: str | None, modes: list[str], *, docs: bool) -> tuple[list[str], dict[str, list[str]]]:
    """'plain:target,by-hand:target,docs' -> conditions and each one's modes (after a colon, '+'-joined;
    none given: `modes`). Default: plain and by-hand, and docs when there is an index."""
    from ..drafters import modes as drafting

    parts = [c.strip() for c in spec.split(",") if c.strip()] if spec else ["plain", "by-hand"] + (["docs"] if docs else [])
    conds, own = [], {}
    for part in parts:
        name, _, ms = part.partition(":")
        if name not in CONDITIONS:
            raise InvalidRequest(f"--conditions: {name!r} is not one of {', '.join(CONDITIONS)}", param="conditions")
        conds.append(name)
        if ms:
            listed = [m.strip() for m in ms.split("+") if m.strip()]
            bad = [m for m in listed if m != "target" and m not in drafting.NAMES]
            if bad or not listed:
                raise InvalidRequest(f"--conditions {part}: unknown mode(s) {bad or ms!r}", param="conditions")
            own[name] = ["target"] + [m for m in dict.fromkeys(listed) if m != "target"]
    if "docs" in conds and not docs:
        raise InvalidRequest("--conditions docs needs --docs INDEX", param="docs")
    return conds, own


# --- the report ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    condition: str
    mode: str
    answered: int  # answerable questions
    facts_held: int
    unanswerable: int
    declined: int  # of the unanswerable
    wrong_declines: int  # answerable ones declined
    recall: float | None
    ttft_median_s: float
    tokens_per_s: float  # decode tokens / decode seconds over the answers the model wrote
    speedup: float | None  # against the target alone, same condition, same questions
    docs_tokens: int
    same_as_target: int | None  # answers equal to the target alone's (greedy: all should be)


def summarize(samples: list[Sample]) -> list[Row]:
    rows = []
    keys = list(dict.fromkeys((s.condition, s.mode) for s in samples))
    target = {(s.condition, s.question): s for s in samples if s.mode == "target"}
    for cond, mode in keys:
        ss = [s for s in samples if (s.condition, s.mode) == (cond, mode)]
        ans = [s for s in ss if s.facts is not None]
        una = [s for s in ss if s.facts is None]
        rec = [s.recall for s in ss if s.recall is not None]
        written = [s for s in ss if not s.by_retrieval and s.new_tokens > 1 and s.decode_s > 0]
        tps = sum(s.new_tokens - 1 for s in written) / sum(s.decode_s for s in written) if written else 0.0
        speedup = same = None
        if mode != "target":
            pairs = [(s, target[(cond, s.question)]) for s in written if (cond, s.question) in target]
            pairs = [(s, t) for s, t in pairs if not t.by_retrieval and t.new_tokens > 1 and t.decode_s > 0]
            if pairs:
                mine = sum(s.new_tokens - 1 for s, _ in pairs) / sum(s.decode_s for s, _ in pairs)
                theirs = sum(t.new_tokens - 1 for _, t in pairs) / sum(t.decode_s for _, t in pairs)
                speedup = mine / theirs if theirs else None
            same = sum(s.text == target[(cond, s.question)].text for s in ss if (cond, s.question) in target)
        rows.append(Row(cond, mode, len(ans), sum(bool(s.facts) for s in ans), len(una), sum(s.declined for s in una),
                        sum(s.declined for s in ans), statistics.mean(rec) if rec else None,
                        _median_wait(ss), tps, speedup,
                        sum(s.docs_tokens for s in ss), same))
    return rows


def _median_wait(ss: list[Sample]) -> float:
    """Median TTFT of the turns the model answered: a turn retrieval declines answers at once, and
    counting those would halve the median of a condition that declines a quarter of its questions."""
    answered = [s.ttft_s for s in ss if not s.by_retrieval]
    return statistics.median(answered) if answered else 0.0


def report_text(rows: list[Row], meta: dict) -> str:
    head = (f"{meta.get('questions', '?')}: {meta.get('n', '?')} questions, up to {meta.get('max_new_tokens')} tokens; "
            f"load {meta.get('load', '?')}")
    cols = ("condition", "mode", "facts held", "declined", "wrong decl.", "recall", "TTFT med", "tok/s", "x target",
            "docs tok", "same")
    lines = [head, "  ".join(f"{c:>11}" for c in cols)]
    for r in rows:
        cells = (r.condition, r.mode, f"{r.facts_held}/{r.answered} {_pct(r.facts_held, r.answered)}",
                 f"{r.declined}/{r.unanswerable}", str(r.wrong_declines),
                 "-" if r.recall is None else f"{r.recall:.0%}", f"{r.ttft_median_s:.2f} s", f"{r.tokens_per_s:.1f}",
                 "-" if r.speedup is None else f"{r.speedup:.2f}x", str(r.docs_tokens),
                 "-" if r.same_as_target is None else str(r.same_as_target))
        lines.append("  ".join(f"{c:>11}" for c in cells))
    lines.append("facts held: answers holding every expected fact, of the answerable questions; declined: of the "
                 "unanswerable; x target: decode tokens/s against the target alone on the same questions and condition")
    return "\n".join(lines)


def _pct(a: int, b: int) -> str:
    return f"({100 * a / b:.0f} %)" if b else ""


def report_json(rows: list[Row], samples: list[Sample], meta: dict) -> dict:
    return {"meta": meta, "rows": [asdict(r) for r in rows], "samples": [asdict(s) for s in samples]}


# --- the engine behind the seam -------------------------------------------------------------------------
class EngineAsker:
    """Asks an Engine (greedy). Each ask starts as a kiosk's next visitor does: the cache holds what this
    prompt shares with the previous question's under the same condition (the system prompt, the
    template's instructions: the engine reuses that prefix between requests), and nothing of this
    question (bench/run.py fresh_cache first: the drafters' learned tables are forgotten too, as in the
    prompt bench, and no mode gets a free prefill from the mode before). The first question of a
    condition prefills its whole prompt. The plain and by-hand conditions run with the engine's
    documents set aside for the call, so retrieval does not rewrite their prompt."""

    def __init__(self, engine):
        self.engine = engine
        kn = engine.docs
        if kn is not None and kn.in_cache:  # the venue's system turn, pinned as `serve` pins it
            from ..engine.pinned import pin_system_prompt
            from ..models.files import edgespec_home

            pin_system_prompt(engine, None, save_dir=edgespec_home() / "pinned")
        # docs or not -> the prompt ids of the question being asked, and of the one before it
        self._current: dict[bool, list[int]] = {}
        self._previous: dict[bool, list[int]] = {}

    def ask(self, messages: list[dict], *, draft: str, docs: bool, max_new_tokens: int) -> Answer:
        from ..core.proposal import common_prefix
        from .run import fresh_cache

        fresh_cache(self.engine)
        with self._documents(docs):
            ids = self._prompt_ids(messages, docs)
            if ids and ids != self._current.get(docs):  # a new question (every mode of it sees the same head)
                self._previous[docs], self._current[docs] = self._current.get(docs, []), ids
            if ids and self._previous.get(docs):
                self.engine.hold(ids[: common_prefix(self._previous[docs], ids)])
            r = self.engine.generate(messages=messages, draft=draft, max_new_tokens=max_new_tokens, temperature=0.0)
        d = getattr(r, "docs", None) or {}
        files = [s.get("file", "") for s in d.get("sources", [])]
        return Answer(r.text, r.stats, files, bool(d.get("declined")) if docs else None)

    def _prompt_ids(self, messages: list[dict], docs: bool) -> list[int]:
        """The tokens the target will prefill for these messages (with docs: the turn retrieval writes;
        [] for a turn retrieval declines, which runs no model)."""
        kn = self.engine.docs
        if docs and kn is not None:
            turn = kn.turn(messages)
            if turn.declined:
                return []
            messages = turn.messages
        return self.engine.encode(messages=messages)

    @contextmanager
    def _documents(self, on: bool) -> Iterator[None]:
        kept = self.engine.docs
        if on and kept is None:
            raise InvalidRequest("--conditions docs needs --docs INDEX (an engine with documents)", param="docs")
        if on:
            yield
            return
        self.engine.docs = None
        try:
            yield
        finally:
            self.engine.docs = kept


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"
