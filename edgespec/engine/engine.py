"""Engine: a bundle opened for generation — text in, text out, as the target alone would write it.

    eng = Engine.open("bundles/qwen-coder")         # draft="auto" | "model" | "suffix" | "recycle" | "ngram" | "heads" | "none"
    r = eng.generate("def fib(n):", max_new_tokens=64)
    for delta in eng.stream(messages=[{"role": "user", "content": "hi"}], temperature=0.7, seed=1): ...

The engine owns the models, the drafters and the prefix cache, and lends them to the decode loop
(loop.py) one request at a time (a lock; the server queues in front of it). Requests are checked and
tokenized first (requests.py); the edge concerns are consulted once, when the engine is built
(build.py): a memory plan sizes the cache and decides whether the draft fits, a governor caps k or
drafting, or paces rounds, under a power or thermal limit.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Generator

from ..core.costmodel import CostModel
from ..core.runner import ModelRunner
from ..core.sampling import SamplingParams
from ..drafters import (AutoDrafter, Drafter, ModelDrafter, NgramDrafter, NoDrafter, RecycleDrafter, SuffixDrafter,
                        SuffixIndex)
from ..errors import DraftUnavailable, InvalidRequest, PromptTooLong
from ..limits import DEFAULT_K_CAP, PREFILL_CHUNK, SUFFIX_CAPACITY
from ..models.bundle import Bundle
from ..drafters.heads import NO_HEADS, from_record
from . import build, selfdraft
from .loop import Parts, PrefixCache, decode, pin_for_determinism
from .requests import (Encoder, Request, cancel_fn, check_draft_mode, check_k, check_max_new_tokens, check_stop,
                       check_tree_mode)
from .results import GenerationResult, Stream
from .tree_round import TreeVerifier

log = logging.getLogger("edgespec.engine")


class Engine:
    def __init__(self, bundle: Bundle, target: ModelRunner, draft: ModelRunner | None, tokenizer, *,
                 draft_mode: str = "auto", k: int | None = None, governor=None, memory_plan=None,
                 prefill_chunk: int = PREFILL_CHUNK, self_runner=None, tree: str = "auto",
                 suffix_capacity: int = SUFFIX_CAPACITY, deterministic: bool | None = None, heads: bool = False):
        self.bundle = bundle
        # deterministic mode lives in the target runner (core/runner.py); the engine pins requests
        # to what keeps it (loop.pin_for_determinism). None: whatever the runner was built with
        self.deterministic = bool(getattr(target, "deterministic", False)) if deterministic is None else deterministic
        self.target = target
        self.draft_runner = draft
        self.tokenizer = tokenizer
        self.max_len = target.max_len
        self.model_name = bundle.name
        self.draft_mode = draft_mode
        self.k = k
        self.governor = governor
        self.memory_plan = memory_plan
        self.prefill_chunk = prefill_chunk
        tf = bundle.manifest.tokenizer
        self.usable = min(tf.usable_vocab, target.vocab_size)
        self.eos_ids = frozenset(tf.eos_ids)
        self.costs = CostModel(target.times, draft.times if draft is not None else None)
        self.self_runner = self_runner  # the self-draft (engine/selfdraft.py), when loaded
        ngram = NgramDrafter(self.costs)
        model = (ModelDrafter(draft, self.usable, self.costs, vocab_map=_draft_vocab_map(bundle))
                 if draft is not None else None)
        own = None
        if self_runner is not None:
            from ..drafters.self import SelfDrafter

            own = SelfDrafter(self_runner, self.usable, CostModel(target.times, self_runner.times))
        # free drafters: the suffix index spans requests (bounded; reset_cache() clears it), the
        # recycle table learns from the target's verify rows
        self._suffix = SuffixDrafter(SuffixIndex(suffix_capacity), self.costs)
        recycle = RecycleDrafter(self.usable, self.costs)
        self._drafters: dict[str, Drafter] = {"none": NoDrafter(), "ngram": ngram, "suffix": self._suffix,
                                              "recycle": recycle}
        if model is not None:
            self._drafters["model"] = model
        if own is not None:
            self._drafters["self"] = own
        # draft heads (`export --heads`): a small graph over the target's hidden state (drafters/heads.py)
        heads_drafter = None
        if heads:
            rec = bundle.manifest.heads
            heads_drafter = from_record(rec, bundle.root, build.load_heads_session(bundle.root / rec["path"]),
                                        target, self.usable)
        if heads_drafter is not None:
            self._drafters["heads"] = heads_drafter
        self._drafters["auto"] = AutoDrafter(self.costs, [d for d in (self._suffix, recycle, model, own, heads_drafter)
                                                          if d is not None])
        check_tree_mode(tree)
        self.tree_mode = tree
        self._tree = TreeVerifier(self.costs, ngram, model)
        self._cache = PrefixCache()
        self.pinned = None  # a PinnedPrefix (pinned.py): written back before a request that starts with it
        self._lock = threading.Lock()
        cfg = bundle.tokenizer_config()
        self._encode = Encoder(tokenizer, tf,
                               bos_text=_token_text(cfg.get("bos_token")) or self._id_text(tf.bos_id),
                               eos_text=_token_text(cfg.get("eos_token")) or
                               self._id_text(tf.eos_ids[0] if tf.eos_ids else None))

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, bundle: str | os.PathLike | Bundle, *, draft: str = "auto", k: int | None = None,
             max_len: int | None = None, providers=None, draft_providers=None, threads: int | None = None,
             device=None, memory_budget=None, power_budget=None, max_temp=None, verify: bool = True,
             warmup: bool = True, tree: str = "auto", suffix_capacity: int = SUFFIX_CAPACITY,
             deterministic: bool = False) -> "Engine":
        """Verifies the bundle (sha256 unless verify=False), plans memory, loads the models.

        draft: the default drafting mode of requests ("auto" | "model" | "suffix" | "recycle" |
        "ngram" | "self" | "heads" | "none"). "heads" (and "auto") load the bundle's draft heads when it
        has them (`edgespec export --heads`). Without "auto" or "model" the draft model is not loaded at all
        (less memory, faster start). "self" loads the self-draft instead (the target with layers
        skipped, on shared weights: engine/selfdraft.py); only an engine opened with it serves
        draft="self" requests, and its `auto` has the self-draft as one more option.
        suffix_capacity: tokens the suffix index keeps across requests (4 bytes each; the oldest
        are evicted).
        warmup: time the step sizes adaptive drafting chooses between once at open (about 1 s on
        a 2-core CPU), so the first request neither pays one-off allocations nor guesses costs.
        device: None (no board defaults), "auto" (this board, detected) or a profile name: its
        provider orders, threads, default memory budget and max_len fill what is left unset
        (docs/edge.md, "What --device sets"); explicit options always win.
        tree: the default tree verification of requests ("auto" | "on" | "off", docs/runtime.md).
        deterministic: the same request gives the same tokens whatever the cache holds and whichever
        drafter runs (docs/runtime.md, "Deterministic mode"); chains only, sampled requests undrafted."""
        check_draft_mode(draft)
        check_k(k)
        check_tree_mode(tree)
        if deterministic and tree == "on":
            raise InvalidRequest("tree='on' is not possible in deterministic mode: use tree='auto' or 'off'",
                                 param="tree")
        # every edge option is checked before the bundle is read: a typo costs no model load
        edge = build.edge_options(device, providers, draft_providers, threads, memory_budget, power_budget, max_temp)
        providers, draft_providers, threads = edge["providers"], edge["draft_providers"], edge["threads"]
        b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, verify=verify)
        if draft == "model" and b.draft is None:
            raise DraftUnavailable(f"bundle {b.name} has no draft model: use draft='ngram' or 'auto'", param="draft")
        if draft == "heads" and b.manifest.heads is None:
            raise DraftUnavailable(NO_HEADS.format(name=b.name), param="draft")
        want_draft = draft in ("auto", "model") and b.draft is not None
        plan = build.memory_plan(b, max_len=max_len, want_draft=want_draft, profile=edge["profile"],
                                 budget=edge["memory_budget"], providers=providers)
        for note in plan.notes:  # what a budget changed matters; the rest is detail
            log.log(logging.INFO if plan.budget_bytes is not None else logging.DEBUG, "memory plan: %s", note)
        if draft == "model" and not plan.load_draft:
            raise DraftUnavailable("the memory budget leaves no room for the draft model: use draft='ngram' "
                                   "or 'auto', or raise the budget", param="draft")
        # both models on one shared thread pool: they take turns, and must not fight over cores
        target = self_runner = None
        if selfdraft.wanted(draft, plan.load_draft):
            pair = selfdraft.open_for_engine(b, plan.max_len, required=draft == "self", providers=providers,
                                             threads=threads, profile=edge["profile"], deterministic=deterministic)
            if pair is not None:
                target, self_runner = pair.target, pair.runner
        if target is None:
            target = build.load_runner(b.model_path("target"), b.target, plan.max_len, providers=providers,
                                       threads=threads, shared_threads=plan.load_draft, profile=edge["profile"],
                                       deterministic=deterministic)
        draft_runner = None
        if plan.load_draft:
            draft_runner = build.load_runner(b.model_path("draft"), b.draft, plan.max_len,
                                             providers=draft_providers if draft_providers is not None else providers,
                                             threads=threads, shared_threads=True, profile=edge["profile"])
        governor = build.governor(edge, spinning=build.sessions_spin(plan.load_draft))
        eng = cls(b, target, draft_runner, b.load_tokenizer(), draft_mode=draft, k=k, governor=governor,
                  memory_plan=plan, prefill_chunk=plan.prefill_chunk, self_runner=self_runner, tree=tree,
                  suffix_capacity=suffix_capacity, deterministic=deterministic,
                  heads=draft in ("auto", "heads") and b.manifest.heads is not None and target.has_hidden)
        if tree == "on":
            eng._check_tree_possible("on")
        if warmup and draft != "none":
            eng.warmup()
        return eng

    def close(self) -> None:
        with self._lock:
            if self.governor is not None:
                self.governor.close()
            self.target = None  # type: ignore[assignment]
            self.draft_runner = None
            self.self_runner = None
            self._drafters = {}

    @property
    def has_draft(self) -> bool:
        return self.draft_runner is not None

    def cached(self) -> list[int]:
        """The tokens whose K/V the target cache holds now (what the next request can reuse)."""
        with self._lock:
            n = self.target.length if self.target is not None else 0
            return list(self._cache.tokens[:n])

    # -- the public calls -------------------------------------------------------------------------
    def generate(self, prompt: str | None = None, *, messages=None, max_new_tokens: int = 256,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop=None, draft: str | None = None, k: int | None = None, cancel=None,
                 tree: str | None = None) -> GenerationResult:
        s = self.stream(prompt, messages=messages, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, top_k=top_k, seed=seed, stop=stop, draft=draft, k=k, cancel=cancel, tree=tree)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def stream(self, prompt: str | None = None, *, messages=None, max_new_tokens: int = 256,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
               stop=None, draft: str | None = None, k: int | None = None, cancel=None,
               tree: str | None = None) -> Stream:
        """Validates and tokenizes now (bad input raises here, before anything runs); generation
        runs as the stream is iterated. tree: "auto" | "on" | "off" (None: the engine's default),
        tree verification of the drafts (docs/runtime.md)."""
        req = self._request(prompt, messages, max_new_tokens, temperature, top_p, top_k, seed, stop, draft, k, cancel,
                            tree)
        return Stream(self._run(req), len(req.ids))

    def count_tokens(self, prompt: str | None = None, *, messages=None) -> int:
        return len(self._encode(prompt, messages))

    def encode(self, prompt: str | None = None, *, messages=None) -> list[int]:
        """The token ids a request with this prompt or these messages starts from."""
        return self._encode(prompt, messages)

    def warmup(self, k_max: int = 4) -> None:
        """Runs each step size up to k_max + 1 tokens twice (the first run of a shape pays one-off
        allocations, the second is what the cost model keeps), so the first request is not slowed
        by them and adaptive drafting starts from this device's real costs."""
        with self._lock:
            self._invalidate()
            for s in range(1, min(k_max + 1, self.max_len - 1) + 1):
                for _ in range(2):
                    self.target.rewind(0)
                    self.target.step([0] * s, s)  # as a verify: every row scored
            if self.draft_runner is not None:
                for s in (1, 2):
                    for _ in range(2):
                        self.draft_runner.rewind(0)
                        self.draft_runner.step([0] * s, 1)
            if "heads" in self._drafters:
                self._drafters["heads"].warmup()
            if self.self_runner is not None:  # its steps are 1 token (it never catches up)
                for _ in range(3):
                    self.self_runner.rewind(0)
                    self.self_runner.step([0], 1)
            self._invalidate()

    def reset_cache(self) -> None:
        """Forgets what the caches hold, so the next request prefills its whole prompt, and what the
        free drafters learned from earlier requests (the suffix index, the recycle table): benchmarks
        use this to time every mode from the same start. Waits for a running request."""
        with self._lock:
            self._invalidate()
            for d in self._drafters.values():
                d.forget()

    # -- requests ---------------------------------------------------------------------------------
    def _check_tree_possible(self, mode: str) -> None:
        """tree="on" on a graph that cannot run trees is refused with the fix; "auto" just chains."""
        if mode == "on" and not self.target.can_tree:
            why = ("its graphs follow contract v1 (format_version 1): re-export the bundle with this "
                   "edgespec (`edgespec export`) for tree verification"
                   if not self.target.supports_tree else "the target does not run on the CPU provider "
                   "(tree verification compacts the cache on the host)")
            if self.target.facts.graph_flavor() == "cuda":  # graph contract v3: no attention_bias on CUDA
                why = ("its cuda-flavored graph has no attention_bias input (onnxruntime's CUDA "
                       "GroupQueryAttention refuses one): trees run on the CPU provider with a cpu-flavored graph")
            raise InvalidRequest(f"tree='on' is not possible with bundle {self.bundle.name}: {why}; "
                                 "use tree='auto' or 'off'", param="tree")

    def _request(self, prompt, messages, max_new_tokens, temperature, top_p, top_k, seed, stop, draft, k,
                 cancel, tree=None) -> Request:
        check_max_new_tokens(max_new_tokens)
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        mode = self.draft_mode if draft is None else draft
        check_draft_mode(mode)
        if mode == "model" and "model" not in self._drafters:
            why = ("the bundle has no draft model" if self.bundle.draft is None else
                   "the draft model was not loaded (engine opened with draft="
                   f"{self.draft_mode!r}, or the memory plan left it out)")
            raise DraftUnavailable(f"draft='model' is not possible: {why}", param="draft")
        if mode == "heads" and "heads" not in self._drafters:
            why = (NO_HEADS.format(name=self.bundle.name) if self.bundle.manifest.heads is None else
                   f"draft='heads' is not possible: the heads were not loaded (engine opened with draft={self.draft_mode!r})")
            raise DraftUnavailable(why, param="draft")
        if mode == "self" and "self" not in self._drafters:
            raise DraftUnavailable("draft='self' is not possible: the self-draft was not loaded (open the engine "
                                   "with draft='self')", param="draft")
        check_k(k)
        tree = self.tree_mode if tree is None else tree
        check_tree_mode(tree)
        self._check_tree_possible(tree)
        stops = check_stop(stop)
        ids = self._encode(prompt, messages)
        if len(ids) >= self.max_len:
            raise PromptTooLong(len(ids), max_new_tokens, self.max_len)
        req = Request(ids, max_new_tokens, params, stops, mode, self.k if k is None else k, cancel_fn(cancel), tree)
        return pin_for_determinism(req) if self.deterministic else req

    def _drafter(self, mode: str, k: int | None) -> tuple[Drafter, int]:
        """The drafter and per-round proposal cap for a mode. k=None lets the drafter choose each
        round from measured costs (up to DEFAULT_K_CAP); a given k is used as is."""
        drafter = self._drafters[mode]
        if mode == "none":
            return drafter, 0
        drafter.set_adaptive(k is None)
        return drafter, DEFAULT_K_CAP if k is None else k

    def _invalidate(self) -> None:
        """Forget what the caches hold (after an error mid-step, or a warm-up)."""
        self._cache.clear()
        if self.target is not None:
            self.target.reset()
        for d in self._drafters.values():
            d.reset()

    # -- the loop ---------------------------------------------------------------------------------
    def _run(self, req: Request) -> Generator[str, None, GenerationResult]:
        with self._lock:
            if self.target is None:
                raise InvalidRequest("this engine is closed", param=None)
            drafter, k_cap = self._drafter(req.draft, req.k)
            if self.pinned is not None:
                self.pinned.restore(req.ids, self.target, self._cache)
            parts = Parts(self.target, self.tokenizer, self.eos_ids, self.usable, self.prefill_chunk,
                          free_drafter=self._suffix, governor=self.governor, tree=self._tree,
                          on_end=self._suffix.record)
            try:
                return (yield from decode(parts, req, drafter, k_cap, self._cache))
            except GeneratorExit:
                # the stream was closed between rounds (a client pressed Stop): every cache is
                # consistent there, so the next turn reuses what this one prefilled and generated
                raise
            except BaseException:
                self._invalidate()
                raise

    def _id_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.tokenizer.id_to_token(token_id) or ""


def _draft_vocab_map(bundle: Bundle):
    """The pruned draft's logits row -> token id map (`export --draft-vocab`), or None."""
    facts = bundle.manifest.models.get("draft")
    if facts is None or not facts.vocab_map:
        return None
    import numpy as np

    return np.load(bundle.root / facts.vocab_map, allow_pickle=False)


def _token_text(v) -> str:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""
