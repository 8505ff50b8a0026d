"""Drafting a tree layout with the draft model's KV cache (ALGORITHMS.md sections 2 and 4).

The draft cache holds the accepted sequence up to (and including) the root. A *layout* is a parents
array in topological order (`decoding.tree.tree_layout` for one action, `decoding.union_tree.union_layout`
for the union tree of a whole action space); drafting is level by level:
- every node at depth d is drawn from its parent's transformed q row (`decoding.sampling.draw`, one
  draw per node in node order, so children of one parent are i.i.d.);
- the nodes of depth d that have children are then fed to the draft as ONE batched forward, each query
  row attending to the context, its own ancestors and itself only (tree mask on the cache), so
  different branches never see each other. For one action this is the trunk token by token, then the
  K rollouts as one batch per depth. Leaves are never fed (their q rows are never needed).
The q rows of all fed nodes are kept for verification; with ``hidden=True`` also their last-layer
hidden states (the selector's ``h_q_prev`` when such a node ends the accepted path). The cache slot of
each fed node is recorded so the cache can be pruned to the accepted path afterwards.

A draft that reads the target's features instead of keeping a cache (`models.eagle_draft`, ``DraftRoot.kv`` None)
is fed the same nodes, each with its parent's feature (the root's from the draft's root step): no mask, no slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from decoding.actions import Action
from decoding.sampling import Sampling, draw
from decoding.tree import DraftTree, build_tree, tree_layout

from .cache import KVState
from .torch_sampling import prob_rows
from .tree_pass import forward_nodes, hidden_numpy


@dataclass
class DraftRoot:
    """Where drafting starts: the draft cache, which ends at the root (its last slot); ``q_root`` ``[V]``, q(.|root)
    after the sampling transform; ``h_root``, the root's hidden state (kept as ``hidden[0]`` when asked for).
    A feature draft has no cache (``kv`` None): ``draft`` is the module and ``feature`` the root's ``[H]``."""

    kv: KVState | None
    q_root: np.ndarray
    h_root: np.ndarray | None = None
    draft: torch.nn.Module | None = None
    feature: torch.Tensor | None = None


class _CacheFeed:
    """Feeds drafted nodes to a cached draft: one forward per call on the draft's KV cache, each node attending to the
    context, its ancestors and itself (tree mask); records every fed node's cache slot."""

    def __init__(self, root: DraftRoot) -> None:
        self.kv = root.kv
        self.root_slot = len(self.kv) - 1
        self.root_pos = self.kv.positions[self.root_slot]
        self.slots = {0: self.root_slot}

    def __call__(self, fed: np.ndarray, parents: np.ndarray, tokens: np.ndarray, depth: int, hidden: bool):
        kv, f = self.kv, fed.shape[0]
        num_cached = len(kv)
        allowed = np.zeros((f, num_cached + f), dtype=bool)
        allowed[:, :self.root_slot] = True  # the accepted context
        for r, node in enumerate(fed):
            a = int(parents[node])
            while a >= 0:  # ancestors (root included) are already in the cache
                allowed[r, self.slots[a]] = True
                a = int(parents[a])
            allowed[r, num_cached + r] = True
            self.slots[int(node)] = num_cached + r
        return forward_nodes(kv, tokens[fed], [self.root_pos + depth] * f, allowed, output_hidden_states=hidden)


class _FeatureFeed:
    """Feeds drafted nodes to a feature draft (`models.eagle_draft.EagleDraft.step`): each node with its parent's
    feature; ``slots`` numbers the fed nodes (there is no cache to prune)."""

    def __init__(self, root: DraftRoot) -> None:
        self.draft = root.draft
        self.features = {0: root.feature}
        self.slots = {0: 0}

    def __call__(self, fed: np.ndarray, parents: np.ndarray, tokens: np.ndarray, depth: int, hidden: bool):
        h_prev = torch.stack([self.features[int(parents[node])] for node in fed])  # [f, H]
        ids = torch.as_tensor(tokens[fed], dtype=torch.long)
        logits, feats = self.draft.step(h_prev, ids)
        for r, node in enumerate(fed):
            self.features[int(node)] = feats[r]
            self.slots[int(node)] = len(self.slots)
        return logits, (feats if hidden else None)


def _feed(root: DraftRoot):
    return _CacheFeed(root) if root.kv is not None else _FeatureFeed(root)


@dataclass(frozen=True)
class DraftRule:
    """How nodes are drafted: rows transformed by ``sampling`` over the first ``vocab_size`` tokens; with
    ``hidden``, the fed nodes' last-layer hidden states are kept."""

    sampling: Sampling
    vocab_size: int
    hidden: bool = False


@dataclass
class DraftedLayout:
    """Drafted tokens of a layout and where its fed nodes live in the draft cache."""

    tokens: np.ndarray  # [n] int64, tokens[0] = -1 (root)
    q_rows: np.ndarray  # [n, V] q(.|root + path(node)) for fed nodes (root included); zero rows for leaves
    node_slots: dict[int, int]  # node index -> draft cache slot, for nodes fed to the draft (root included)
    hidden: dict[int, np.ndarray] | None  # node -> [H_q] float32 last-layer hidden state (fed nodes), if asked
    forwards: int  # draft forward passes spent (root excluded)


@dataclass
class DraftedTree:
    """A drafted action tree and where its nodes live in the draft cache."""

    tree: DraftTree
    node_slots: dict[int, int]
    hidden: dict[int, np.ndarray] | None
    forwards: int


def draft_layout(root: DraftRoot, parents: np.ndarray, depths: np.ndarray, rule: DraftRule,
                 rng: np.random.Generator) -> DraftedLayout:
    """Draft the layout ``parents`` / ``depths`` ``[n]`` below ``root`` (the cache's slots before the root are the
    context)."""
    sampling, vocab_size, hidden = rule.sampling, rule.vocab_size, rule.hidden
    feed = _feed(root)
    n = parents.shape[0]
    has_child = np.zeros(n, dtype=bool)
    has_child[parents[1:]] = True
    tokens = np.full(n, -1, dtype=np.int64)
    q_rows = np.zeros((n, vocab_size), dtype=np.float64)  # [n, V]
    q_rows[0] = root.q_root
    hid: dict[int, np.ndarray] | None = {0: root.h_root} if hidden else None
    forwards = 0
    for d in range(1, int(depths.max(initial=0)) + 1):
        nodes = np.flatnonzero(depths == d)  # [m] nodes at depth d, in node order
        tokens[nodes] = draw_children(q_rows, parents[nodes], rng)
        fed = nodes[has_child[nodes]]  # [f] nodes whose children are drawn next
        if fed.shape[0] == 0:
            continue
        logits, h = feed(fed, parents, tokens, d, hidden)
        forwards += 1
        q_rows[fed] = prob_rows(logits, sampling, vocab_size)
        if hidden:
            h_np = hidden_numpy(h)  # [f, H]
            hid.update({int(node): h_np[r] for r, node in enumerate(fed)})
    node_slots = feed.slots
    return DraftedLayout(tokens, q_rows, node_slots, hid, forwards)


def draw_children(q_rows: np.ndarray, parents: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per node from its parent's row, ``parents`` ``[m]`` in node order: the same draws as
    ``draw(q_rows[parents], rng, 1)[:, 0]`` (one uniform per node, in node order), but siblings next to each other
    share their parent's row and its cumulative sum (K rollouts cost one pass over the row, not K)."""
    bounds = np.flatnonzero(np.diff(parents)) + 1  # where a run of siblings ends
    if bounds.shape[0] + 1 == parents.shape[0]:  # no two siblings: one draw over all rows
        return draw(q_rows[parents], rng, 1)[:, 0]
    runs = np.split(np.arange(parents.shape[0]), bounds)
    return np.concatenate([draw(q_rows[parents[run[0]]][None], rng, run.shape[0])[0] for run in runs])


def draft_tree(root: DraftRoot, action: Action, rule: DraftRule, rng: np.random.Generator) -> DraftedTree:
    """Draft ``action``'s tree (node order of `decoding.tree.tree_layout`) below the root."""
    parents, depths = tree_layout(action)
    d = draft_layout(root, parents, depths, rule, rng)
    return DraftedTree(build_tree(action, d.tokens, d.q_rows), d.node_slots, d.hidden, d.forwards)


def draft_stop_chain(root: DraftRoot, max_length: int, stop_after, rule: DraftRule,
                     rng: np.random.Generator) -> DraftedTree:
    """Draft a chain below the root token by token: draw x_i from q_{i-1} and stop after it when
    ``stop_after(q_{i-1})`` is true or ``i = max_length`` (`decoding.policy.Choice.stop_after`); a token is fed to the
    draft only when the chain continues. The tree's action is the realized chain ``(1, n, 0)``."""
    sampling, vocab_size, hidden = rule.sampling, rule.vocab_size, rule.hidden
    feed = _feed(root)
    tokens, rows = [-1], [np.asarray(root.q_root, dtype=np.float64)]
    hid = {0: root.h_root} if hidden else None
    parents = np.arange(-1, max_length)  # a chain: node i's parent is i - 1
    while True:
        i = len(tokens)  # the node drawn now, from rows[i - 1]
        tokens.append(int(draw(rows[i - 1][None], rng, 1)[0, 0]))
        if i >= max_length or stop_after(rows[i - 1]):
            break
        logits, h = feed(np.array([i]), parents, np.asarray(tokens), i, hidden)
        rows.append(prob_rows(logits, sampling, vocab_size)[0])
        if hidden:
            hid[i] = hidden_numpy(h)[0]
    node_slots = feed.slots
    n = len(tokens) - 1
    q_rows = np.zeros((n + 1, vocab_size))
    q_rows[: len(rows)] = np.stack(rows)
    return DraftedTree(build_tree(Action(1, n, 0), np.array(tokens), q_rows), node_slots, hid, len(rows) - 1)
