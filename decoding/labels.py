"""Labels: expected block efficiency per action (ALGORITHMS.md section 4).

- ``expected_block_efficiency(tree, target, method)``: exact E[accepted + 1] over verification
  randomness on one fixed tree (the DP of section 4 for OT-based methods; Traversal's fixed test
  sequence for ``traversal``/``bv``).
- ``estimate_block_efficiency``: mean and standard error over repeated verification of one tree.
- ``union_labels``: block efficiency of EVERY action of an ActionSpace from one union tree
  (union_tree.py), through each method's declared label hooks (``union_block_efficiency``, exact, or
  ``estimate_union_block_efficiency``, repeated verification; verifiers/base.py). OT methods use the
  factorized DP of section 4 (verifiers/union_context.py), Traversal its fixed test sequence per
  sub-tree, GBV its greedy-path schedule (verifiers/gbv.py). ``reference_union_labels`` computes the
  same numbers action by action on extracted sub-trees (tests compare them).
- ``action_labels``: Ê(c, a) = mean over s sampled union trees (paper: s = 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifiers import get_method
from verifiers.base import VerificationMethod
from verifiers.union_context import UnionContext, repeated_verification

from .actions import ActionSpace
from .probability import check_rows
from .tree import DistFn, DraftTree, target_rows
from .union_tree import UnionTree, sample_union_tree


def expected_block_efficiency(tree: DraftTree, target: DistFn | np.ndarray,
                              method: str | VerificationMethod) -> float:
    """Exact E[accepted draft tokens + 1] over the verification randomness on this fixed tree."""
    return get_method(method).expected_block_efficiency(tree, target_rows(tree, target))


def estimate_block_efficiency(tree: DraftTree, target: DistFn | np.ndarray, method: str | VerificationMethod,
                              rng: np.random.Generator, repeats: int = 64) -> tuple[float, float]:
    """(mean, standard error) of accepted + 1 over ``repeats`` verifications of the same tree."""
    return repeated_verification(get_method(method), tree, target_rows(tree, target), repeats, rng)


def reference_union_labels(union: UnionTree, p_rows: np.ndarray, method: str | VerificationMethod) -> np.ndarray:
    """Same as ``union_labels`` for one method, action by action on extracted sub-trees (slow)."""
    m = get_method(method)
    out = np.full(len(union.space), np.nan)
    for i, a in enumerate(union.space.actions):
        sub = union.subtree(a)
        if m.supports(sub):
            out[i] = m.expected_block_efficiency(sub, p_rows[union.subtree_nodes(a)])
    return out


def union_labels(union: UnionTree, p_rows: np.ndarray, methods: list[str] | tuple[str, ...],
                 repeats: int | None = None, rng: np.random.Generator | None = None, validate: bool = True
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Block efficiency of every action for each method, from one union tree and its p rows.

    Returns ``(values, stderr)``: ``values[name]`` is ``[len(space)]`` (NaN where the method does not
    apply, e.g. ``bv`` on K > 1 trees); ``stderr[name]`` is 0 for exact labels. Exact everywhere,
    except methods without exact block efficiency, or all non-OT methods when ``repeats`` is given:
    those are estimated by ``repeats`` verifications per action (needs ``rng``). ``validate=False``
    skips the O(n V) check of ``p_rows`` (shape is always checked)."""
    tree = union.tree
    if validate:
        check_rows(p_rows, "p_rows", tree.num_nodes, tree.vocab_size)
    elif p_rows.shape != tree.q_rows.shape:
        raise ValueError(f"p_rows: expected shape {tree.q_rows.shape}, got {p_rows.shape}")
    ctx = UnionContext(union, p_rows)
    values: dict[str, np.ndarray] = {}
    stderr: dict[str, np.ndarray] = {}
    for name in methods:
        m = get_method(name)
        if repeats is None and m.exact_block_efficiency:
            values[name] = m.union_block_efficiency(ctx)
            stderr[name] = np.zeros(len(union.space))
        else:
            values[name], stderr[name] = m.estimate_union_block_efficiency(ctx, repeats or 64, rng)
    return values, stderr


@dataclass
class ActionLabels:
    """Ê(c, a) for one root: ``mean[name]`` ``[A]``, ``per_tree[name]`` ``[s, A]`` (one row per union tree)."""

    space: ActionSpace
    mean: dict[str, np.ndarray]
    per_tree: dict[str, np.ndarray]


def action_labels(space: ActionSpace, draft: DistFn, target: DistFn, methods: list[str] | tuple[str, ...],
                  rng: np.random.Generator, num_trees: int = 4) -> ActionLabels:
    """Ê(c, a) for every action and method: mean over ``num_trees`` sampled union trees (exact over
    verification randomness, so only drafting variance remains)."""
    if num_trees < 1:
        raise ValueError(f"num_trees must be >= 1, got {num_trees}")
    per_tree: dict[str, list[np.ndarray]] = {name: [] for name in methods}
    for _ in range(num_trees):
        union = sample_union_tree(space, draft, rng)
        values, _ = union_labels(union, target_rows(union.tree, target), methods)
        for name in methods:
            per_tree[name].append(values[name])
    stacked = {name: np.stack(v) for name, v in per_tree.items()}
    return ActionLabels(space, {name: v.mean(axis=0) for name, v in stacked.items()}, stacked)
