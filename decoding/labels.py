"""Labels: expected block efficiency per action (ALGORITHMS.md section 4).

- ``expected_block_efficiency(tree, target, method)``: exact E[accepted + 1] over verification
  randomness on one fixed tree (the DP of section 4 for OT-based methods; Traversal's fixed test
  sequence for ``traversal``/``bv``).
- ``estimate_block_efficiency``: mean and standard error over repeated verification of one tree.
- ``union_labels``: block efficiency of EVERY action of an ActionSpace from one union tree
  (union_tree.py). OT-based methods use the fast batched path below; ``reference_union_labels``
  computes the same numbers action by action with the reference DP (tests compare them).
- ``action_labels``: Ê(c, a) = mean over s sampled union trees (paper: s = 4).

Fast path (OT methods). In a delayed tree only the branch node has more than one child. Every
one-child node accepts its child x with the solver's chain acceptance (``min(1, p(x)/q(x))``; ``p(x)``
for nss), so with T[j] = P(reach trunk node j) and S[k, L2] = 1 + sum_{d=2..L2} P(reach depth d of
rollout k | its first node accepted), the DP collapses to
    E(K, L1, L2) = sum_{j=1..L1} T[j] + T[L1] * sum_{i<K} w_{L1,K,i} S[i, L2],
where w_{L1,K,i} is the branching probability of rollout i's first token at branch node L1 with K
children (0 for a repeated token: the walk takes the first copy). Only the branch rows need O(V) work.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from .actions import ActionSpace
from .probability import check_rows
from .tree import DistFn, DraftTree, target_rows
from .union_tree import UnionTree, sample_union_tree
from .verifiers import get_method
from .verifiers.base import VerificationMethod
from .verifiers.ot import OTMethod, _f64, first_occurrence
from .verifiers.ratios import RatioTable


def expected_block_efficiency(tree: DraftTree, target: DistFn | np.ndarray,
                              method: str | VerificationMethod) -> float:
    """Exact E[accepted draft tokens + 1] over the verification randomness on this fixed tree."""
    return get_method(method).expected_block_efficiency(tree, target_rows(tree, target))


def estimate_block_efficiency(tree: DraftTree, target: DistFn | np.ndarray, method: str | VerificationMethod,
                              rng: np.random.Generator, repeats: int = 64) -> tuple[float, float]:
    """(mean, standard error) of accepted + 1 over ``repeats`` verifications of the same tree."""
    if repeats < 2:
        raise ValueError(f"repeats must be >= 2 to report a standard error, got {repeats}")
    m = get_method(method)
    p_rows = target_rows(tree, target)
    eff = np.array([len(m.verify(tree, p_rows, rng)[0]) + 1.0 for _ in range(repeats)])
    return float(eff.mean()), float(eff.std(ddof=1) / np.sqrt(repeats))


def _chain_acceptance(method: OTMethod, p_x: np.ndarray, q_x: np.ndarray, p_rows, q_rows, parents, tokens):
    fn = method.chain_acceptance or getattr(method.solver, "chain_acceptance", None)
    if fn is not None:
        return np.asarray(fn(p_x, q_x), dtype=np.float64)
    out = np.empty(p_x.shape)  # generic (slow) fallback: the solver's law with one child
    for idx in np.ndindex(p_x.shape):
        par, tok = int(parents[idx]), int(tokens[idx])
        out[idx] = method.solver.output_distribution(p_rows[par], q_rows[par], [tok])[tok]
    return out


def _branch_weights(method: OTMethod, rows: UnionRows, first: np.ndarray) -> np.ndarray:
    """w [J, Kmax(K), Kmax(i)] (see module docstring) at the branch rows."""
    p_b, q_b = rows.p_b, rows.q_b
    fn = getattr(method.solver, "branch_weights", None)
    if fn is not None:
        if "tables" in inspect.signature(fn).parameters:
            return fn(p_b, q_b, first, tables=rows.tables)
        return fn(p_b, q_b, first)
    n_rows, kmax = first.shape
    w = np.zeros((n_rows, kmax, kmax))
    is_first = first_occurrence(first)
    p64, q64 = p_b.astype(np.float64), q_b.astype(np.float64)
    for j in range(n_rows):
        for k in range(1, kmax + 1):
            out = method.solver.output_distribution(p64[j], q64[j], [int(t) for t in first[j, :k]])
            w[j, k - 1, :k] = np.where(is_first[j, :k], out[first[j, :k]], 0.0)
    return w


@dataclass
class UnionRows:
    """What the fast label path reads from the p/q rows of a union tree, gathered once and shared
    by all OT methods. J = len(space.L1) branch rows; shapes in comments."""

    p_rows: np.ndarray  # [n, V] (kept for the generic fallbacks)
    trunk_p: np.ndarray  # [max L1] p(trunk token j | trunk node j-1), j = 1..max L1
    trunk_q: np.ndarray  # [max L1]
    roll_p: np.ndarray  # [J, Kmax, L2max-1] p of rollout nodes at depth offset d >= 1 given their parent
    roll_q: np.ndarray  # [J, Kmax, L2max-1]
    first: np.ndarray  # [J, Kmax] first token of each rollout
    p_b: np.ndarray  # [J, V] branch rows of p (a view when L1 is a contiguous range)
    q_b: np.ndarray  # [J, V]
    _tables: list[RatioTable] | None = None

    @property
    def tables(self) -> list[RatioTable]:
        """Likelihood-ratio tables of the branch rows (built once, shared by methods)."""
        if self._tables is None:
            self._tables = [RatioTable.build(self.p_b[j], self.q_b[j]) for j in range(self.p_b.shape[0])]
        return self._tables


def gather_union_rows(union: UnionTree, p_rows: np.ndarray) -> UnionRows:
    """Gather the scalars and branch rows the fast label path needs (see UnionRows)."""
    tree = union.tree
    if p_rows.shape != tree.q_rows.shape:
        raise ValueError(f"p_rows: expected shape {tree.q_rows.shape} (one row per union-tree node), got {p_rows.shape}")
    q_rows, tokens, parents = tree.q_rows, tree.tokens, tree.parents
    tj = np.arange(1, union.max_l1 + 1)
    ro = union.rollouts  # [J, Kmax, L2max]
    par, tok = parents[ro[..., 1:]], tokens[ro[..., 1:]]
    l1 = union.space.L1
    branch = slice(l1[0], l1[-1] + 1) if l1 == tuple(range(l1[0], l1[-1] + 1)) else np.asarray(l1)
    return UnionRows(
        p_rows=p_rows,
        trunk_p=_f64(p_rows[tj - 1, tokens[tj]]), trunk_q=_f64(q_rows[tj - 1, tokens[tj]]),
        roll_p=_f64(p_rows[par, tok]), roll_q=_f64(q_rows[par, tok]),
        first=tokens[ro[..., 0]] if ro.shape[2] else np.zeros(ro.shape[:2], dtype=np.int64),
        p_b=p_rows[branch], q_b=q_rows[branch])


def fast_ot_labels(union: UnionTree, rows: UnionRows, method: OTMethod) -> np.ndarray:
    """``[len(space)]`` exact block efficiency of every action's sub-tree for an OT-based method.

    Only the branch rows get O(V) work; everything else is gathered scalars (``rows``)."""
    tree = union.tree
    ks, l1s, l2s, l1_pos = union.space.arrays()
    # trunk: reach[j] = P(reach trunk node j), e_trunk[L1] = sum_{j=1..L1} reach[j]
    tj = np.arange(1, union.max_l1 + 1)
    tau = _chain_acceptance(method, rows.trunk_p, rows.trunk_q, rows.p_rows, tree.q_rows, tj - 1, tree.tokens[tj])
    reach = np.concatenate([[1.0], np.cumprod(tau)])  # [max L1 + 1]
    e_trunk = np.concatenate([[0.0], np.cumsum(reach[1:])])
    ro = union.rollouts  # [J, Kmax, L2max]
    if ro.shape[2] == 0:
        return e_trunk[l1s] + 1.0
    # rollouts: s[j, k, L2] = expected accepted rollout tokens given its first node accepted
    alpha = _chain_acceptance(method, rows.roll_p, rows.roll_q, rows.p_rows, tree.q_rows,
                              tree.parents[ro[..., 1:]], tree.tokens[ro[..., 1:]])  # [J, Kmax, L2max-1]
    pi = np.cumprod(np.concatenate([np.ones(ro.shape[:2] + (1,)), alpha], axis=-1), axis=-1)
    s = np.concatenate([np.zeros(ro.shape[:2] + (1,)), np.cumsum(pi, axis=-1)], axis=-1)  # [J, Kmax, L2max+1]
    w = _branch_weights(method, rows, rows.first)  # [J, K, i]
    big_w = np.einsum("jki,jil->jkl", w, s)  # [J, Kmax, L2max+1]
    labels = e_trunk[l1s] + reach[l1s] * big_w[l1_pos, ks - 1, l2s] + 1.0
    if not np.all(np.isfinite(labels)):
        raise ValueError(f"{method.name}: non-finite labels; check p_rows / q_rows for NaN")
    return labels


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
    canon = union.space.canonical_array()
    values: dict[str, np.ndarray] = {}
    stderr: dict[str, np.ndarray] = {}
    rows = None
    for name in methods:
        m = get_method(name)
        se = np.zeros(len(union.space))
        if isinstance(m, OTMethod):
            rows = rows or gather_union_rows(union, p_rows)
            vals = fast_ot_labels(union, rows, m)
            if m.chains_only:
                vals[[not a.is_chain for a in union.space.actions]] = np.nan
        else:
            vals = np.full(len(union.space), np.nan)
            exact = repeats is None and getattr(m, "block_efficiency_fn", None) is not None
            cache: dict = {}
            for i in np.unique(canon):
                a = union.space.actions[i]
                if a.K > 1 and a.L2 > 0 and getattr(m, "chains_only", False):
                    continue
                nodes = union.subtree_nodes(a)
                if exact:
                    vals[i] = m.block_efficiency_fn(tree, p_rows, nodes=nodes, mass_cache=cache)
                elif getattr(m, "block_efficiency_mc_fn", None) is not None:
                    if rng is None:
                        raise ValueError(f"{name}: estimating labels by repeated verification needs an rng")
                    vals[i], se[i] = m.block_efficiency_mc_fn(tree, p_rows, repeats or 64, rng, nodes=nodes,
                                                              mass_cache=cache)
                else:
                    sub = union.subtree(a)
                    if rng is None:
                        raise ValueError(f"{name}: estimating labels by repeated verification needs an rng")
                    vals[i], se[i] = estimate_block_efficiency(sub, p_rows[nodes], m, rng, repeats or 64)
            vals, se = vals[canon], se[canon]
        values[name], stderr[name] = vals, se
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
