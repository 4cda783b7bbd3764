"""Token trees for tree verification: shape, flattening, ancestor mask, acceptance. Pure functions.

A round's candidates are several continuations of the context that share prefixes (the draft
model's chain with its runners-up at each depth, the n-gram drafter's alternative continuations).
Merged into a trie they form a tree whose root is ctx[-1], the newest token the target has not
seen yet. The tree is verified in ONE target pass as a flat sequence:

    tokens   [N]     node i's token; node 0 is the root (ctx[-1])
    parent   [N]     parent[0] = -1, parent[i] < i (a parent precedes its children: topological order)
    depth    [N]     depth[0] = 0; the node's rotary position is cache length + depth
    ancestors [N, N] bool, ancestors[i, j] = j is i or an ancestor of i (lower triangular)
    q        [N]     the draft distribution node i's token was SAMPLED from, or None (deterministic:
                     greedy drafts, runners-up, n-gram copies). Only a node's first child may carry q.

The target's logits row i (the prediction after node i's path) decides which child of i is
accepted; the accepted path (node indices, starting at 0) and the target's next token are the
round's result. Greedy acceptance follows the argmax, so the output is target-alone output.
Sampled acceptance is multi-candidate rejection sampling (SpecInfer/Sequoia): at a node with target
distribution p, the residual r starts at p and each child x (draft q, one-hot for deterministic
ones) in order is accepted with probability min(1, r(x)/q(x)); after a rejection
r <- normalize(max(r - q, 0)). If no child is accepted the next token is sampled from r. Each
stage keeps the target's distribution exactly: a rejected candidate's mass is removed from r before
the next candidate is tried, and a deterministic candidate chosen after the sampled one (e.g. the
draft's runner-up, picked knowing the sampled token) is exact because the stage is exact for any
fixed candidate, whatever it was conditioned on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .sampling import SamplingParams, greedy_tokens, probs, sample, without


@dataclass
class Tree:
    """A flattened token tree (shapes in the module docstring)."""

    tokens: list[int]
    parent: list[int]
    depth: list[int]
    q: list[np.ndarray | None] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # per node: "model" | "model-alt" | "ngram" | "root"

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not self.q:
            self.q = [None] * n
        if not self.source:
            self.source = ["root"] + ["?"] * (n - 1)
        if not (len(self.parent) == len(self.depth) == len(self.q) == len(self.source) == n) or n == 0:
            raise ValueError("a tree needs tokens, parent, depth, q and source of one length >= 1")
        if self.parent[0] != -1 or self.depth[0] != 0:
            raise ValueError("node 0 must be the root (parent -1, depth 0)")
        for i in range(1, n):
            p = self.parent[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i}: parent {p} must precede it")
            if self.depth[i] != self.depth[p] + 1:
                raise ValueError(f"node {i}: depth {self.depth[i]} is not its parent's + 1")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def children(self, i: int) -> list[int]:
        """Node i's children, in candidate order (the order acceptance tries them)."""
        return [j for j in range(i + 1, len(self.tokens)) if self.parent[j] == i]

    def width(self) -> int:
        """The most children any node has (1 for a chain)."""
        counts: dict[int, int] = {}
        for p in self.parent[1:]:
            counts[p] = counts.get(p, 0) + 1
        return max(counts.values(), default=0)

    def is_chain(self) -> bool:
        return self.width() <= 1

    def ancestors(self) -> np.ndarray:
        """bool [N, N]: ancestors[i, j] is True when j is i or one of i's ancestors."""
        n = len(self.tokens)
        anc = np.zeros((n, n), dtype=bool)
        for i in range(n):
            p = self.parent[i]
            if p >= 0:
                anc[i] = anc[p]
            anc[i, i] = True
        return anc

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[i] for i in path]

    def shape(self) -> str:
        """Nodes per depth below the root, e.g. "1-3-2" (for stats and bench)."""
        counts = [0] * (self.max_depth + 1)
        for d in self.depth:
            counts[d] += 1
        return "-".join(str(c) for c in counts[1:]) or "0"


def from_paths(root: int, paths: Sequence[tuple[Sequence[int], Sequence[np.ndarray] | None, str]],
               *, max_nodes: int | None = None) -> Tree:
    """Merges candidate continuations into a trie under `root`. paths: (tokens, q rows or None,
    source); only the FIRST path may carry q (sampled tokens, see the module docstring): a node
    created by it is its parent's first child. Later paths share existing nodes and add the rest.
    `max_nodes` (root included) drops whatever does not fit, in path order."""
    tokens, parent, depth, qs, srcs = [root], [-1], [0], [None], ["root"]
    kids: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for pi, (toks, q, src) in enumerate(paths):
        if q is not None and pi != 0:
            raise ValueError("only the first candidate path may carry sampled distributions")
        node = 0
        for d, t in enumerate(toks):
            key = (node, int(t))
            nxt = kids.get(key)
            if nxt is None:
                if max_nodes is not None and len(tokens) >= max_nodes:
                    break
                nxt = len(tokens)
                kids[key] = nxt
                tokens.append(int(t))
                parent.append(node)
                depth.append(depth[node] + 1)
                qs.append(None if q is None else q[d])
                srcs.append(src)
            node = nxt
    return Tree(tokens, parent, depth, qs, srcs)


def accept_greedy(rows: np.ndarray, tree: Tree, usable: int) -> tuple[list[int], int]:
    """Follows the target's argmax down the tree. rows: [N, V], row i the target's prediction after
    node i's path. Returns the accepted path (node indices from 0) and the target's next token."""
    best = greedy_tokens(rows, usable)
    kids = _child_map(tree)
    path = [0]
    while True:
        nxt = int(best[path[-1]])
        child = kids.get((path[-1], nxt))
        if child is None:
            return path, nxt
        path.append(child)


def accept_sampled(rows: np.ndarray, tree: Tree, params: SamplingParams, rng: np.random.Generator,
                   usable: int) -> tuple[list[int], int]:
    """Multi-candidate rejection sampling down the tree (module docstring). Same returns as
    accept_greedy; the tokens it yields are distributed exactly as the target's own samples."""
    path = [0]
    while True:
        node = path[-1]
        r = probs(rows[node], params, usable)
        accepted = None
        for c in tree.children(node):
            x = tree.tokens[c]
            if not 0 <= x < usable:
                continue  # never accepted, and its (zero) mass needs no removal
            q = tree.q[c]
            qx = 1.0 if q is None else float(q[x])
            if rng.random() * qx < r[x]:
                accepted = c
                break
            r = without(r, q, x)
            total = r.sum()
            if total <= 0.0:  # only when r == q up to rounding, where rejection cannot happen
                r = probs(rows[node], params, usable)
            else:
                r = r / total
        if accepted is None:
            return path, sample(r, rng)
        path.append(accepted)


def _child_map(tree: Tree) -> dict[tuple[int, int], int]:
    return {(p, tree.tokens[i]): i for i, p in enumerate(tree.parent) if p >= 0}
