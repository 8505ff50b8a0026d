"""Draft trees of delayed tree expansion (ALGORITHMS.md sections 1-2).

A ``DraftTree`` is the data every verifier consumes. Node 0 is the *root* (token -1, the position
where the step starts); nodes are in topological order (parent < child). For an action
``(K, L1, L2)`` the node order is: root, trunk nodes 1..L1, then rollout 1 (depths L1+1..L1+L2),
rollout 2, ... . Trunk nodes have exactly ONE child (trunk multiplicity 1); the *branch node*
(depth L1) has K children, which may repeat a token (two rollouts that drew the same first token
stay two nodes, each with its own subtree).

``draft(prefix)`` / ``target(prefix)`` are callables returning ``q(.|root+prefix)`` /
``p(.|root+prefix)``, where ``prefix`` is the tuple of draft tokens from the root down to a node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .actions import Action
from .probability import categorical, check_distribution, check_rows

DistFn = Callable[[tuple[int, ...]], np.ndarray]  # prefix -> [V] distribution


@dataclass
class DraftTree:
    """A drafted tree (see module docstring for the node order)."""

    action: Action
    tokens: np.ndarray  # [n] int64; tokens[0] = -1 (root)
    parents: np.ndarray  # [n] int64; parents[0] = -1
    depths: np.ndarray  # [n] int64; root 0, branch node L1
    children: list[list[int]]  # child node indices of each node, in draw order
    q_rows: np.ndarray  # [n, V] q(.|root+path(node)) for nodes with children (leaf rows may be zero)

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return int(self.tokens.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.q_rows.shape[1])

    @property
    def branch_node(self) -> int:
        """Index of the branch node (the trunk node at depth L1; node order makes it node L1)."""
        return self.action.L1

    def path_tokens(self, i: int) -> tuple[int, ...]:
        """Draft tokens from the root (excluded) down to node ``i`` (included)."""
        out: list[int] = []
        while i > 0:
            out.append(int(self.tokens[i]))
            i = int(self.parents[i])
        return tuple(reversed(out))

    def child_tokens(self, i: int) -> list[int]:
        """Tokens of node ``i``'s children, in draw order (duplicates kept)."""
        return [int(self.tokens[c]) for c in self.children[i]]

    def validate(self) -> None:
        """Check structure and q rows; raise ValueError naming the first problem."""
        n = self.num_nodes
        for name in ("tokens", "parents", "depths"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.shape != (n,):
                raise ValueError(f"DraftTree.{name}: expected shape ({n},), got {getattr(arr, 'shape', None)}")
        if self.parents[0] != -1 or self.depths[0] != 0 or self.tokens[0] != -1:
            raise ValueError("DraftTree: node 0 must be the root (token -1, parent -1, depth 0)")
        if len(self.children) != n:
            raise ValueError(f"DraftTree.children: expected {n} lists, got {len(self.children)}")
        for i in range(1, n):
            par = int(self.parents[i])
            if not 0 <= par < i:
                raise ValueError(f"DraftTree: node {i} has parent {par}; nodes must be topological")
            if self.depths[i] != self.depths[par] + 1:
                raise ValueError(f"DraftTree: node {i} depth {self.depths[i]} != parent depth + 1")
            if i not in self.children[par]:
                raise ValueError(f"DraftTree: node {i} missing from children of its parent {par}")
        has_children = np.array([len(c) > 0 for c in self.children])
        check_rows(self.q_rows, "DraftTree.q_rows", n, required=has_children)
        for i in range(1, n):
            if self.q_rows[self.parents[i], self.tokens[i]] <= 0:
                raise ValueError(f"DraftTree: node {i} token {self.tokens[i]} has q = 0 under its parent; "
                                 "children must be drawn from q")


def tree_layout(action: Action) -> tuple[np.ndarray, np.ndarray]:
    """``(parents, depths)`` of the tree an action drafts, in the node order of this module."""
    parents = [-1] + list(range(action.L1))  # root, trunk
    depths = list(range(action.L1 + 1))
    for _ in range(action.K if action.L2 > 0 else 0):
        prev = action.L1
        for d in range(action.L2):
            parents.append(prev)
            depths.append(action.L1 + d + 1)
            prev = len(parents) - 1
    return np.asarray(parents, dtype=np.int64), np.asarray(depths, dtype=np.int64)


def children_lists(parents: np.ndarray) -> list[list[int]]:
    """Children of each node, in node (= draw) order."""
    children: list[list[int]] = [[] for _ in range(parents.shape[0])]
    for i in range(1, parents.shape[0]):
        children[int(parents[i])].append(i)
    return children


def build_tree(action: Action, tokens: np.ndarray, q_rows: np.ndarray) -> DraftTree:
    """Assemble the DraftTree of ``action`` from its node tokens (tokens[0] = -1) and q rows."""
    parents, depths = tree_layout(action)
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.shape != parents.shape:
        raise ValueError(f"build_tree: action {action} has {parents.shape[0]} nodes, got {tokens.shape[0]} tokens")
    return DraftTree(action, tokens, parents, depths, children_lists(parents), np.asarray(q_rows))


def sample_layout(parents: np.ndarray, draft: DistFn, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample every node of a tree layout from q, parents first: ``(tokens [n], q_rows [n, V])``.

    Node i (i >= 1) is drawn from q(.|root + path(parent)); children of one node are i.i.d. ``draft``
    is called once per distinct prefix. ``q_rows`` holds the rows of nodes with children and always
    the root's (also when the root is a leaf, so the tree knows its vocabulary size); leaves get zeros.
    """
    n = parents.shape[0]
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def q_of(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in cache:
            cache[prefix] = check_distribution(draft(prefix), f"draft({prefix})")
        return cache[prefix]

    paths: list[tuple[int, ...]] = [()]
    tokens = np.full(n, -1, dtype=np.int64)
    root_q = q_of(())
    for i in range(1, n):
        parent_path = paths[parents[i]]
        tokens[i] = categorical(q_of(parent_path), rng)
        paths.append(parent_path + (int(tokens[i]),))
    children = children_lists(parents)
    q_rows = np.zeros((n, root_q.shape[0]), dtype=np.float64)  # [n, V]
    for i in range(n):
        if children[i] or i == 0:
            row = q_of(paths[i])
            if row.shape != root_q.shape:
                raise ValueError(f"draft({paths[i]}): vocabulary {row.shape[0]} != {root_q.shape[0]} at the root")
            q_rows[i] = row
    return tokens, q_rows


def sample_tree(action: Action, draft: DistFn, rng: np.random.Generator) -> DraftTree:
    """Draft the tree of ``action``: trunk token by token, then K independent rollouts, all from q."""
    parents, depths = tree_layout(action)
    tokens, q_rows = sample_layout(parents, draft, rng)
    return DraftTree(action, tokens, parents, depths, children_lists(parents), q_rows)


def target_rows(tree: DraftTree, target: DistFn | np.ndarray) -> np.ndarray:
    """``[n, V]`` target rows p(.|root+path(node)) for every node (leaves too: bonus tokens).

    ``target`` is a callable ``prefix -> p`` or an already computed ``[n, V]`` array (validated)."""
    n, vocab = tree.num_nodes, tree.vocab_size
    if isinstance(target, np.ndarray):
        return check_rows(target, "p_rows", n, vocab)
    cache: dict[tuple[int, ...], np.ndarray] = {}
    rows = np.empty((n, vocab), dtype=np.float64)  # [n, V]
    for i in range(n):
        path = tree.path_tokens(i)
        if path not in cache:
            row = check_distribution(target(path), f"target({path})")
            if row.shape[0] != vocab:
                raise ValueError(f"target({path}): vocabulary {row.shape[0]} != draft vocabulary {vocab}")
            cache[path] = row
        rows[i] = cache[path]
    return rows


def proposal_tree(tokens, vocab_size: int) -> DraftTree:
    """The chain ``(1, len(tokens), 0)`` of tokens proposed without the draft (`decoding.policy.Choice.proposal`), with
    one-hot q rows (the leaf's row is zero): any chain verifier then accepts x_i with probability p_i(x_i)."""
    n = len(tokens)
    if n < 1:
        raise ValueError("proposal_tree needs at least one proposed token")
    q_rows = np.zeros((n + 1, vocab_size))
    for i, t in enumerate(tokens):
        if not 0 <= int(t) < vocab_size:
            raise ValueError(f"proposal_tree: token {t} is outside the vocabulary of {vocab_size}")
        q_rows[i, int(t)] = 1.0
    return build_tree(Action(1, n, 0), np.array([-1, *tokens], dtype=np.int64), q_rows)
