"""Drafting the tree of an action with the draft model's KV cache (ALGORITHMS.md section 2).

The draft cache holds the accepted sequence up to (and including) the root. Drafting is level by level:
- the *trunk* token by token: one draft forward per trunk node, each with one query row;
- then the K *rollouts* as one batch: one draft forward per rollout depth with K query rows, each
  row attending to the context, the trunk and its own rollout only (tree mask on the cache), so the
  rollouts are i.i.d. draws from q(.|branch node) and independent of each other.
Leaves are sampled but not fed (their q rows are never needed). Every sampled token is drawn from the
transformed draft row (`decoding.sampling`), and the rows of all nodes with children are kept in the
`DraftTree` for verification. Node order is `decoding.tree.tree_layout`'s (root, trunk, rollout 1,
rollout 2, ...); the cache slot of each fed node is recorded so the cache can be pruned afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..actions import Action
from ..sampling import Sampling, draw, to_numpy_rows, transform_logits
from ..tree import DraftTree, build_tree, tree_layout
from .cache import KVState
from .tree_pass import forward_nodes


@dataclass
class DraftedTree:
    """A drafted tree and where its nodes live in the draft cache."""

    tree: DraftTree
    node_slots: dict[int, int]  # node index -> draft cache slot, for nodes fed to the draft (root included)
    forwards: int  # draft forward passes spent on this tree (root excluded)


def draft_tree(kv: KVState, root_slot: int, q_root: np.ndarray, action: Action, sampling: Sampling,
               vocab_size: int, rng: np.random.Generator) -> DraftedTree:
    """Draft ``action``'s tree below the root, which is already processed at ``root_slot`` (the last slot).

    ``q_root`` ``[V]`` is q(.|root) after the sampling transform. Slots before ``root_slot`` are the context.
    """
    if root_slot != len(kv) - 1:
        raise RuntimeError(f"draft cache must end at the root (root slot {root_slot}, {len(kv)} slots)")
    parents, depths = tree_layout(action)
    n = parents.shape[0]
    max_depth = int(depths.max())
    tokens = np.full(n, -1, dtype=np.int64)
    q_rows = np.zeros((n, vocab_size), dtype=np.float64)  # [n, V]
    q_rows[0] = q_root
    node_slots = {0: root_slot}
    root_pos = kv.positions[root_slot]
    levels = [np.flatnonzero(depths == d) for d in range(max_depth + 1)]
    forwards = 0
    for d in range(1, max_depth + 1):
        nodes = levels[d]  # [m] nodes at depth d, in node order
        par = parents[nodes]
        # one draw per node from its parent's row; children of the same parent are i.i.d.
        tokens[nodes] = draw(q_rows[par], rng, 1)[:, 0]
        if d == max_depth:
            break  # leaves: no q rows needed
        m = nodes.shape[0]
        num_cached = len(kv)
        allowed = np.zeros((m, num_cached + m), dtype=bool)
        allowed[:, :root_slot] = True  # the accepted context
        for r, node in enumerate(nodes):
            a = int(parents[node])
            while a >= 0:  # ancestors (root included) are already in the cache
                allowed[r, node_slots[a]] = True
                a = int(parents[a])
            allowed[r, num_cached + r] = True
            node_slots[int(node)] = num_cached + r
        logits, _ = forward_nodes(kv, tokens[nodes], [root_pos + d] * m, allowed)
        forwards += 1
        q_rows[nodes] = to_numpy_rows(transform_logits(logits, sampling, vocab_size))
    return DraftedTree(build_tree(action, tokens, q_rows), node_slots, forwards)
