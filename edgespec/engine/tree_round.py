"""A round of tree verification: chain proposal -> widened into a tree -> one target pass -> accept
the longest path -> compact the caches. One sequence on its own cache slot (engine/round.py runs the
round and asks `propose` for the tree, `verify` for its pass): the engine keeps a verifier per slot.
With one slot every request gets it (tree="auto" trees where the cost model says it pays); with
several, a request that asked for tree="on" does, its tree verified alone on its slot while the
other requests' chains go in the round's one batched pass.

The round starts like a chain round (the drafter proposes, with its own adaptive length) and then
widens the chain with candidates that cost no extra draft step, offered through the drafter
interface (drafters/base.py):
- the draft's runners-up at each depth it drafted (its logits rows are already computed), recorded
  in Proposal.alts when the round asks (`set_tree_width`);
- free lookups' other continuations (`alternatives`): prompt lookup's other earlier matches of the
  context's suffix, the suffix index's other continuations of its longest earlier match (each first
  token that followed it, then its most frequent path: `SuffixIndex.alternatives`, O(match length)).
Merged into a trie (core/tree.py) they are verified in one target step: node i at cache row L+i and
rotary position L+depth(i), seeing only its ancestors (graph contract v2). The accepted path's rows
are then copied to rows L+1.. (`Slot.compact`), so afterwards the target cache holds exactly
ctx[:-1] again: the invariant of core/speculative.py. The draft model only ever ran the chain, so its
cache holds ctx + chain tokens; its feedback keeps the part of the chain the accepted path kept (the
accepted path's draft rows are already contiguous: the draft never computed a side branch).

Whether a round widens, and how much, is the cost model's call (`--tree auto`): each extra node has
an estimated probability of being accepted (reaching it times the learned chance that a runner-up
or an alternative copy is the target's token when the first candidate is not), and the tree is
grown node by node, most likely first, only while expected tokens per second of verify (measured
step costs by size, core/costmodel.py) go up; a tree must beat the plain chain by TREE_MIN_GAIN. On this
2-core CPU a verify of 5 tokens costs ~1.8x a 1-token step, so trees stay small here; where verify
is nearly flat (a GPU) the same rule grows them. A tree without a branch is verified as the drafter's
chain. Before widening, a bound on every node's reach (`_no_tree_can_pay`) tells the rounds where no
branching tree could be kept, whatever the alternatives: those skip the widening, and decide exactly as
if they had widened and pruned.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core import tree as treelib
from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from ..core.slot import Slot
from ..core.sampling import SamplingParams
from ..core.speculative import Round, usable_draft
from ..drafters.base import Beta, Session
from ..errors import InvalidRequest

DEFAULT_TREE_WIDTH = 4  # most children per node (the chain's token + runners-up / alternatives)
MAX_TREE_NODES = 32  # root included: a verify of more rows than this never paid in any measurement
TREE_MIN_GAIN = 0.05  # a tree must promise this much more than the chain it widens
# an alternative copy's tokens past its first, given the first was the target's: a copy that starts
# right usually goes on (the n-gram drafter's prior for a continuing span, drafters/ngram.py)
ALT_CONTINUE = 0.75


@dataclass
class TreeStats:
    """What tree verification did in a request (GenerationStats reads these)."""

    rounds: int = 0  # rounds verified as a tree
    nodes: int = 0  # tree nodes verified (roots included)
    shapes: dict[str, int] = field(default_factory=dict)  # "1-2-1" -> rounds
    accepted_depth: dict[int, int] = field(default_factory=dict)  # accepted path depth -> tree rounds
    off_chain: int = 0  # tree rounds whose accepted path left the drafter's chain (what the tree bought)


class TreeVerifier:
    """Widens a batch-of-one round into a tree and verifies it (see the module docstring); keeps the
    learned acceptance of runners-up and alternative copies, which the auto decision needs. It meets
    the drafter through drafters.base.Session only: `set_tree_width` (runners-up recorded in
    Proposal.alts), `alternatives` (free lookups' other continuations), the proposal's own
    per-token estimates (Proposal.accept) and draft cost (Proposal.draft_s)."""

    def __init__(self, costs: CostModel, target: Slot, width: int = DEFAULT_TREE_WIDTH):
        if not 1 <= width <= 8:
            raise ValueError(f"tree width must be 1..8, got {width}")
        self.costs = costs
        self.target = target
        self.width = width
        # P(a non-first child is the target's token | its parent was reached and the first child was
        # not): priors low (a runner-up is right far less often than the draft's first choice)
        self.alt = {"model-alt": Beta(0.15, weight=6.0), "ngram": Beta(0.15, weight=6.0),
                    "suffix-alt": Beta(0.15, weight=6.0)}
        self.cont = ALT_CONTINUE  # P(an alternative copy's next token is right | the ones before were)
        self.stats = TreeStats()

    def begin(self) -> None:
        self.stats = TreeStats()

    # -- the round ----------------------------------------------------------------------------------
    def propose(self, drafter: Session, ctx: list[int], k: int, params: SamplingParams, rng: np.random.Generator,
                usable: int, mode: str) -> tuple[Proposal, list[int], treelib.Tree | None]:
        """The round's proposal, its usable chain, and the tree it widens into (None: verify the
        chain, engine/round.py)."""
        target = self.target
        if mode == "off" or k <= 0 or not target.can_tree or self.width < 2:
            prop = drafter.propose(ctx, k, params, rng) if k > 0 else EMPTY
            return prop, usable_draft(prop, k, usable), None
        drafter.set_tree_width(self.width)  # the draft records its runners-up (Proposal.alts)
        try:
            prop = drafter.propose(ctx, k, params, rng)
        finally:
            drafter.set_tree_width(0)
        draft = usable_draft(prop, k, usable)
        free = target.max_len - target.length  # rows the tree may use, root included
        max_nodes = min(free, MAX_TREE_NODES)
        if mode == "auto" and self._no_tree_can_pay(prop, draft, max_nodes):
            return prop, draft, None
        tree = self._widen(ctx, prop, draft, k, drafter, usable, max_nodes)
        if mode == "auto":
            tree = self._prune(tree, prop, draft)
        return prop, draft, None if tree.is_chain() else tree

    def _widen(self, ctx, prop: Proposal, draft: list[int], k: int, drafter: Session, usable: int,
               max_nodes: int) -> treelib.Tree:
        paths: list[tuple[list[int], list | None, str]] = []
        q = None if prop.q is None else list(prop.q[: len(draft)])
        paths.append((draft, q, prop.source))
        for j, ups in enumerate(prop.alts[: len(draft)]):
            for t, _p in ups[: self.width - 1]:
                if 0 <= t < usable:
                    paths.append((draft[:j] + [t], None, "model-alt"))
        for cont, src in drafter.alternatives(ctx, k, self.width):
            cut = list(cont)
            for i, t in enumerate(cut):
                if not 0 <= t < usable:
                    cut = cut[:i]
                    break
            if cut:
                paths.append((cut, None, src))
        tree = treelib.from_paths(ctx[-1], paths, max_nodes=max_nodes)
        return _cap_width(tree, self.width)

    # -- cost model ---------------------------------------------------------------------------------
    def reach(self, tree: treelib.Tree, prop: Proposal, draft: list[int]) -> list[float]:
        """Estimated probability that each node is accepted (1 for the root)."""
        chain_p = self._chain_acceptance(prop, len(draft))
        p = [1.0] * len(tree)
        first_of: dict[int, int] = {}
        for i in range(1, len(tree)):
            par = tree.parent[i]
            if par not in first_of:  # the first child: the drafter's own candidate
                first_of[par] = i
                d = tree.depth[i]
                if tree.source[i] == prop.source and d - 1 < len(chain_p):
                    a = chain_p[d - 1]
                else:  # an alternative copy continuing past its own first token
                    a = self.cont
                p[i] = p[par] * a
            else:
                f = first_of[par]
                miss = max(0.0, 1.0 - p[f] / p[par]) if p[par] > 0 else 0.0
                src = tree.source[i] if tree.source[i] in self.alt else "ngram"
                p[i] = p[par] * miss * self.alt[src].mean
        return p

    @staticmethod
    def _chain_acceptance(prop: Proposal, n: int) -> list[float]:
        """Per-depth acceptance of the drafter's chain, given the depth before was accepted: the
        drafter's own per-token estimates (Proposal.accept; none: 0)."""
        return [float(a) for a in prop.accept[:n]] + [0.0] * max(0, n - len(prop.accept))

    def _no_tree_can_pay(self, prop: Proposal, draft: list[int], max_nodes: int) -> bool:
        """Whether `_prune` would keep no branching tree for any widening of this chain, whatever
        alternatives the widening found: then the round skips building them (`round` verifies the
        drafter's chain for every tree without a branch, so it decides exactly as if it had widened).

        Sound, not a guess. Off the chain, a widening holds a *spine* (the first child of the chain's
        last node, its first child, ...: each reach() times ngram.next = q) and nodes that have a
        non-first child (a runner-up or alternative) among themselves or their ancestors: each of
        those reaches at most w = the largest alternative mean times the most reach a parent can lose
        past its first child (p[parent] - p[first child], on the chain or the spine). `_prune` adds
        nodes most likely first, so spine nodes likelier than w come before any other, and a kept
        set branches only if it holds a non-spine node. So if, for every spine length and every size,
        chain + spine + w per other node stays under the best rate the spine's own prefixes reached
        (or under the chain's times 1 + TREE_MIN_GAIN), no branching subtree can be `_prune`'s pick.

        Why: on the 2-core dev CPU a verify of 2 rows costs 1.17x one of 1, so trees almost never
        pay there (no `auto` round of 3,217 in one measured run was verified as a tree), yet building
        and pruning the alternatives every round cost time; most rounds that still widened were plain
        ones, where a path under the root prices as paying (q = 0.75) and is dropped unverified."""
        c = min(len(draft), max_nodes - 1) + 1  # chain nodes the tree would hold, root included
        if c >= max_nodes:
            return True
        q = self.cont
        chain_p = self._chain_acceptance(prop, len(draft))
        reach, e, lost = 1.0, 1.0, 0.0
        for i in range(c - 1):  # the same products, in the same order, as reach() and _prune
            a = chain_p[i] if i < len(chain_p) else q
            lost = max(lost, reach * max(0.0, 1.0 - a))
            reach *= a
            e += reach
        slack = 1.0 + 1e-9  # the bound's sums against _prune's running sums, which may differ in the last bit
        w = max(b.mean for b in self.alt.values()) * max(lost, reach * max(0.0, 1.0 - q)) * slack
        rows = max_nodes - c  # nodes a widening may add
        cost = self._draft_seconds(prop) + self._row_costs()[c : max_nodes + 1]  # [m]: chain + m rows
        spine = [0.0]  # spine[j]: the reach of the spine's first j nodes, while each is likelier than w
        t = reach
        while len(spine) <= rows:
            t *= q
            if not t > w:
                break
            spine.append(spine[-1] + t)
        s_sum = np.array(spine)
        # the best rate `_prune` has seen once the spine's first j nodes are in (rounded down)
        seen = np.maximum(e / cost[0] * (1.0 + TREE_MIN_GAIN),
                          np.maximum.accumulate((e + s_sum) / cost[: len(spine)] / slack))
        m = np.arange(1, rows + 1)[None, :]  # nodes added, at least one off the spine
        s = np.minimum(m - 1, np.arange(len(spine))[:, None])  # spine nodes among them, per spine length
        bound = (e + s_sum[s] + (m - s) * w) / cost[None, 1:] * slack
        return bool((bound.max(axis=1) < seen).all())

    def _row_costs(self) -> np.ndarray:
        """verify_cost(n) for n = 0..MAX_TREE_NODES (index 0 unused), kept until a median moves;
        read-only, since every round shares it (the bound and `_prune` price from it)."""
        def rows(n_max: int) -> np.ndarray:
            pts = self.costs.measured()
            out = np.array([np.nan] + [self.verify_cost(n, pts) for n in range(1, n_max + 1)])
            out.setflags(write=False)
            return out
        return self.costs.cached(("tree-rows", MAX_TREE_NODES), rows)

    def _prune(self, tree: treelib.Tree, prop: Proposal, draft: list[int]) -> treelib.Tree:
        """The subtree (chain kept) with the best expected tokens per second, if it beats the chain
        by TREE_MIN_GAIN; else the chain."""
        p = self.reach(tree, prop, draft)
        chain = {0}
        node = 0
        for t in draft:
            nxt = next((c for c in tree.children(node) if tree.tokens[c] == t and tree.source[c] == prop.source), None)
            if nxt is None:
                break
            chain.add(nxt)
            node = nxt
        d = self._draft_seconds(prop)
        rows = self._row_costs()  # the bound's prices: both decide from the same numbers
        e = sum(p[i] for i in chain)
        chain_rate = e / (d + rows[len(chain)])
        keep = set(chain)
        best, best_keep = chain_rate, set(chain)
        extra = sorted((i for i in range(len(tree)) if i not in chain), key=lambda i: -p[i])
        added = True
        while added:  # add the most likely node whose parent is in; keep the best size seen
            added = False
            for i in extra:
                if i not in keep and tree.parent[i] in keep:
                    keep.add(i)
                    e += p[i]
                    added = True
                    rate = e / (d + rows[len(keep)])
                    if rate > best:
                        best, best_keep = rate, set(keep)
                    break
        if best < chain_rate * (1.0 + TREE_MIN_GAIN):
            best_keep = chain
        return subtree(tree, best_keep)

    def verify_cost(self, n: int, pts: dict[int, float] | None = None) -> float:
        """Seconds of a target step of n tokens: the cost model's estimate, but past the largest size
        measured never less than that size's cost per token times n. A tree is wider than any chain
        the warm-up timed, and extrapolating a noisy slope from a few small sizes made 15-node trees
        look as cheap as 9-token verifies (measured: 3x dearer); per-token-linear is what a
        compute-bound CPU does, and a device where wide steps are cheap shows it once they are timed."""
        t = self.costs.verify(n)
        pts = self.costs.measured() if pts is None else pts
        if pts:
            m = max(pts)
            if n > m:
                t = max(t, pts[m] * n / m)
        return t

    @staticmethod
    def _draft_seconds(prop: Proposal) -> float:
        return prop.draft_s

    # -- verify -------------------------------------------------------------------------------------
    def verify(self, drafter: Session, ctx: list[int], prop: Proposal, draft: list[int], tree: treelib.Tree,
               params: SamplingParams, rng: np.random.Generator, usable: int) -> Round:
        """One target pass over the flattened tree, the accepted path compacted to the cache rows
        after ctx[:-1] (the round's invariant, core/speculative.py)."""
        target = self.target
        base = len(ctx) - 1  # == target.length; the root is ctx[-1], written at row base
        rows = target.step_tree(tree.tokens, tree.depth, tree.ancestors())  # [N, V]
        if params.greedy:
            path, nxt = treelib.accept_greedy(rows, tree, usable)
        else:
            path, nxt = treelib.accept_sampled(rows, tree, params, rng, usable)
        n = len(path) - 1
        target.compact([base + i for i in path[1:]], base + 1)  # accepted rows -> contiguous
        target.rewind(base + 1 + n)
        accepted = tree.path_tokens(path[1:])
        # the drafter's own chain: how much of it the accepted path kept (its learning signal)
        on_chain = 0
        while on_chain < min(n, len(draft)) and accepted[on_chain] == draft[on_chain] \
                and tree.source[path[on_chain + 1]] == prop.source:
            on_chain += 1
        # the draft's cache holds ctx + its chain: past the part the accepted path kept, its rows may
        # be stale, so that is the length it may keep (a draft never computed a side branch)
        drafter.feedback(prop, on_chain, base + 1 + on_chain)
        self._learn(tree, path)
        s = self.stats
        shape = tree.shape()
        s.rounds += 1
        s.nodes += len(tree)
        s.shapes[shape] = s.shapes.get(shape, 0) + 1
        s.accepted_depth[n] = s.accepted_depth.get(n, 0) + 1
        if n > on_chain:
            s.off_chain += 1
        # `drafted` of a tree round is its depth: the most tokens it could have accepted, so the
        # acceptance rate keeps its chain meaning (accepted / acceptable); tree_nodes counts them all
        return Round(accepted + [nxt], tree.max_depth, n, prop.source if prop.tokens else "ngram",
                     tree_shape=shape, tree_nodes=len(tree))

    def _learn(self, tree: treelib.Tree, path: list[int]) -> None:
        """Scores the non-first children of every node the accepted path reached whose first child
        was not accepted: hit for the accepted one, miss for the others."""
        for j, node in enumerate(path):
            kids = tree.children(node)
            if len(kids) < 2:
                continue
            taken = path[j + 1] if j + 1 < len(path) else None
            if taken == kids[0]:
                continue
            for c in kids[1:]:
                src = tree.source[c] if tree.source[c] in self.alt else "ngram"
                self.alt[src].add(c == taken, c != taken)


def check_tree_possible(mode: str, target: Slot, bundle_name: str) -> None:
    """tree="on" on a graph that cannot run trees is refused with the fix, by name, before a request
    runs (every slot runs the same graph); "auto" and "off" just chain."""
    if mode != "on" or target.can_tree:
        return
    why = ("its graphs follow contract v1 (format_version 1): re-export the bundle with this "
           "edgespec (`edgespec export`) for tree verification"
           if not target.supports_tree else "the target does not run on the CPU provider "
           "(tree verification compacts the cache on the host)")
    if target.facts.graph_flavor() == "cuda":  # graph contract v3: no attention_bias on CUDA
        why = ("its cuda-flavored graph has no attention_bias input (onnxruntime's CUDA "
               "GroupQueryAttention refuses one): trees run on the CPU provider with a cpu-flavored graph")
    raise InvalidRequest(f"tree='on' is not possible with bundle {bundle_name}: {why}; use tree='auto' or 'off'",
                         param="tree")


def subtree(tree: treelib.Tree, keep: set[int]) -> treelib.Tree:
    """The nodes in `keep` (closed under parent, root included), in their original order."""
    order = [i for i in range(len(tree)) if i in keep]
    index = {old: new for new, old in enumerate(order)}
    return treelib.Tree([tree.tokens[i] for i in order],
                        [index[tree.parent[i]] if tree.parent[i] >= 0 else -1 for i in order],
                        [tree.depth[i] for i in order], [tree.q[i] for i in order],
                        [tree.source[i] for i in order])


def _cap_width(tree: treelib.Tree, width: int) -> treelib.Tree:
    """Drops every child past the first `width` of its parent (and their subtrees)."""
    keep: set[int] = set()
    count: dict[int, int] = {}
    for i in range(len(tree)):
        par = tree.parent[i]
        if par < 0:
            keep.add(i)
            continue
        if par not in keep:
            continue
        count[par] = count.get(par, 0) + 1
        if count[par] <= width:
            keep.add(i)
    return subtree(tree, keep) if len(keep) < len(tree) else tree
