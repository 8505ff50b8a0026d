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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..actions import Action
from ..sampling import Sampling, draw
from ..tree import DraftTree, build_tree, tree_layout
from .cache import KVState
from .torch_sampling import prob_rows
from .tree_pass import forward_nodes, hidden_numpy


@dataclass
class DraftRoot:
    """Where drafting starts: the draft cache, which ends at the root (its last slot); ``q_root`` ``[V]``, q(.|root)
    after the sampling transform; ``h_root``, the root's hidden state (kept as ``hidden[0]`` when asked for)."""

    kv: KVState
    q_root: np.ndarray
    h_root: np.ndarray | None = None


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
    kv, sampling, vocab_size, hidden = root.kv, rule.sampling, rule.vocab_size, rule.hidden
    root_slot = len(kv) - 1
    n = parents.shape[0]
    has_child = np.zeros(n, dtype=bool)
    has_child[parents[1:]] = True
    tokens = np.full(n, -1, dtype=np.int64)
    q_rows = np.zeros((n, vocab_size), dtype=np.float64)  # [n, V]
    q_rows[0] = root.q_root
    node_slots = {0: root_slot}
    hid: dict[int, np.ndarray] | None = {0: root.h_root} if hidden else None
    root_pos = kv.positions[root_slot]
    forwards = 0
    for d in range(1, int(depths.max(initial=0)) + 1):
        nodes = np.flatnonzero(depths == d)  # [m] nodes at depth d, in node order
        tokens[nodes] = draw_children(q_rows, parents[nodes], rng)
        fed = nodes[has_child[nodes]]  # [f] nodes whose children are drawn next
        if fed.shape[0] == 0:
            continue
        num_cached, f = len(kv), fed.shape[0]
        allowed = np.zeros((f, num_cached + f), dtype=bool)
        allowed[:, :root_slot] = True  # the accepted context
        for r, node in enumerate(fed):
            a = int(parents[node])
            while a >= 0:  # ancestors (root included) are already in the cache
                allowed[r, node_slots[a]] = True
                a = int(parents[a])
            allowed[r, num_cached + r] = True
            node_slots[int(node)] = num_cached + r
        logits, h = forward_nodes(kv, tokens[fed], [root_pos + d] * f, allowed, output_hidden_states=hidden)
        forwards += 1
        q_rows[fed] = prob_rows(logits, sampling, vocab_size)
        if hidden:
            h_np = hidden_numpy(h)  # [f, H]
            hid.update({int(node): h_np[r] for r, node in enumerate(fed)})
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


def draft_stop_chain(root: DraftRoot, max_length: int, stop_below: float, rule: DraftRule,
                     rng: np.random.Generator) -> DraftedTree:
    """Draft a chain below the root token by token: draw x_i from q_{i-1} and stop after it when ``max q_{i-1} <
    stop_below`` or ``i = max_length`` (`decoding.threshold_chain`'s rule); a token is fed to the draft only when the
    chain continues. The tree's action is the realized chain ``(1, n, 0)``."""
    kv, sampling, vocab_size, hidden = root.kv, rule.sampling, rule.vocab_size, rule.hidden
    root_slot = len(kv) - 1
    tokens, rows = [-1], [np.asarray(root.q_root, dtype=np.float64)]
    node_slots = {0: root_slot}
    hid = {0: root.h_root} if hidden else None
    root_pos = kv.positions[root_slot]
    while True:
        i = len(tokens)  # the node drawn now, from rows[i - 1]
        tokens.append(int(draw(rows[i - 1][None], rng, 1)[0, 0]))
        if i >= max_length or float(np.max(rows[i - 1])) < stop_below:
            break
        node_slots[i] = len(kv)
        logits, h = forward_nodes(kv, [tokens[i]], [root_pos + i], np.ones((1, len(kv) + 1), dtype=bool),
                                  output_hidden_states=hidden)
        rows.append(prob_rows(logits, sampling, vocab_size)[0])
        if hidden:
            hid[i] = hidden_numpy(h)[0]
    n = len(tokens) - 1
    q_rows = np.zeros((n + 1, vocab_size))
    q_rows[: len(rows)] = np.stack(rows)
    return DraftedTree(build_tree(Action(1, n, 0), np.array(tokens), q_rows), node_slots, hid, len(rows) - 1)
