"""The union tree: one drafted tree that contains a tree of every action of an ActionSpace
(ALGORITHMS.md section 4, "one tree pass can serve many actions").

Layout: a trunk of max L1 tokens (node j = trunk node at depth j, node 0 = root), then, from every
trunk node j with j in the space's L1 range, max K independent rollouts of max L2 tokens. The tree
of action (K, L1, L2) is the sub-tree: trunk nodes 0..L1, then the first K rollouts at trunk node
L1, each truncated at L2 tokens. Every node is a fresh draw from q given its parent, so each
sub-tree has exactly the law of ``sample_tree(action)`` (different actions share draws, which
correlates their labels but leaves each one unbiased). One target pass over the union tree gives
the p rows of all sub-trees.

Node order (topological): root, trunk 1..max L1, then for each branch depth j (ascending), each
rollout k, the rollout's nodes by depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .actions import Action, ActionSpace
from .tree import DistFn, DraftTree, children_lists, sample_layout


@dataclass
class UnionTree:
    """A union tree and the node indices of its parts."""

    space: ActionSpace
    tree: DraftTree  # action = space.max_action (the envelope; the shape itself is the union layout)
    rollouts: np.ndarray  # [len(space.L1), max K, max L2] node index of rollout k's node at depth j+1+d

    @property
    def max_l1(self) -> int:
        return self.space.L1[-1]

    def subtree_nodes(self, action: Action) -> np.ndarray:
        """Union node indices of ``action``'s tree, in the node order of ``sample_tree``."""
        row = self.space.L1.index(action.L1) if action.L1 in self.space.L1 else -1
        if row < 0 or action.K > self.rollouts.shape[1] or action.L2 > self.rollouts.shape[2]:
            raise ValueError(f"action {action} is not covered by the union tree of {self.space!r}")
        trunk = np.arange(action.L1 + 1, dtype=np.int64)
        if action.L2 == 0:
            return trunk
        return np.concatenate([trunk, self.rollouts[row, : action.K, : action.L2].reshape(-1)])

    def subtree(self, action: Action) -> DraftTree:
        """``action``'s tree as a standalone DraftTree (its p rows: ``p_rows[subtree_nodes(action)]``)."""
        nodes = self.subtree_nodes(action)
        position = {int(u): i for i, u in enumerate(nodes)}
        par = self.tree.parents[nodes]
        parents = np.array([-1] + [position[int(u)] for u in par[1:]], dtype=np.int64)
        return DraftTree(action, self.tree.tokens[nodes].copy(), parents, self.tree.depths[nodes].copy(),
                         children_lists(parents), self.tree.q_rows[nodes])


def union_layout(space: ActionSpace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(parents [n], depths [n], rollouts [len(L1), max K, max L2])`` of the union tree."""
    max_l1, kmax, l2max = space.L1[-1], space.K[-1], space.L2[-1]
    parents = [-1] + list(range(max_l1))
    depths = list(range(max_l1 + 1))
    rollouts = np.zeros((len(space.L1), kmax, l2max), dtype=np.int64)
    for row, j in enumerate(space.L1):
        for k in range(kmax):
            prev = j
            for d in range(l2max):
                parents.append(prev)
                depths.append(j + d + 1)
                prev = rollouts[row, k, d] = len(parents) - 1
    return np.asarray(parents, dtype=np.int64), np.asarray(depths, dtype=np.int64), rollouts


def union_from_tokens(space: ActionSpace, tokens: np.ndarray, q_rows: np.ndarray) -> UnionTree:
    """Wrap externally drafted union-tree tokens ``[n]`` (tokens[0] = -1) and q rows ``[n, V]``."""
    parents, depths, rollouts = union_layout(space)
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.shape != parents.shape:
        raise ValueError(f"union tree of {space!r} has {parents.shape[0]} nodes, got {tokens.shape[0]} tokens")
    tree = DraftTree(space.max_action, tokens, parents, depths, children_lists(parents), q_rows)
    return UnionTree(space, tree, rollouts)


def sample_union_tree(space: ActionSpace, draft: DistFn, rng: np.random.Generator) -> UnionTree:
    """Draft the union tree node by node from q (``draft`` called once per distinct prefix)."""
    parents, _, _ = union_layout(space)
    tokens, q_rows = sample_layout(parents, draft, rng)
    return union_from_tokens(space, tokens, q_rows)
