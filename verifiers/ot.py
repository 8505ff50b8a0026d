"""OT-based (top-down) verifiers: per-node solvers and the generic tree walk (ALGORITHMS.md 3.1, 4).

Solvers: ``nss`` (emit y ~ p), ``naive_tree`` (speculative sampling on the first child),
``specinfer`` (multi-round sampling, q fixed), ``spectr`` (k-SEQ). Each implements the ``OTSolver``
protocol (base.py), including the two batched helpers of the label path (union_context.py):
- ``chain_acceptance(p_x, q_x)``: branching probability of the only child x of a one-child node
  (``min(1, p/q)`` from base.StandardChainSolver for all but nss, whose is ``p(x)``);
- ``branch_weights(p, q, first_tokens, tables=None)``: for rows j, K = 1..Kmax and child positions
  i < K, the branching probability of child i's token at a node whose children are
  ``first_tokens[j, :K]``, or 0 when an earlier child has the same token (the walk moves to the
  FIRST copy, by position). ``tables``: precomputed ratios.RatioTable per row, shared by methods.
The reference ``output_distribution`` and the batched helpers use the same formulas (ratios.py),
so they agree to rounding, and the one-child cases of naive_tree, specinfer and spectr coincide.

``OTMethod`` turns a solver into a tree verifier: walk from the root; at a node call the solver on
its children; if the emitted token equals a child's token move to the first child with it, else
stop and emit it; at a leaf emit a bonus token ~ p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from decoding.probability import acceptance, as_float64, categorical
from decoding.tree import DraftTree

from .base import ChainRestricted, OTSolver, StandardChainSolver
from .ratios import RatioTable
from .union_context import UnionContext, branching_union_labels


def first_occurrence(tokens: np.ndarray) -> np.ndarray:
    """``[..., k]`` bool: position i holds the first copy of its token among positions 0..i."""
    eq = tokens[..., :, None] == tokens[..., None, :]  # [..., k, k]
    earlier = np.tril(np.ones(eq.shape[-2:], dtype=bool), k=-1)
    return ~np.any(eq & earlier, axis=-1)


def _positions_below_k(kmax: int) -> np.ndarray:
    """``[Kmax, Kmax]`` bool: entry (K-1, i) is True when i < K."""
    return np.tril(np.ones((kmax, kmax), dtype=bool))


def _gather(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """rows [J, ..., V], tokens [J, k] -> [J, ..., k] values rows[j, ..., tokens[j, i]]."""
    idx = tokens.reshape(tokens.shape[0], *([1] * (rows.ndim - 2)), tokens.shape[1])
    return np.take_along_axis(rows, np.broadcast_to(idx, (*rows.shape[:-1], tokens.shape[1])), axis=-1)


def _sequential_weights(accept: np.ndarray, rest: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Branching weights of a sequential accept/reject solver.

    accept [J, Kmax(K), Kmax(i)]: acceptance prob of child i when the node has K children;
    rest [J, Kmax(K), Kmax(i)]: law of the final draw (after all K rejections) at child i's token.
    Returns w [J, Kmax, Kmax] (see module docstring)."""
    kmax = tokens.shape[1]
    below = _positions_below_k(kmax)  # [K, i]
    a = np.where(below, accept, 0.0)
    survive = np.cumprod(1.0 - a, axis=-1)  # [J, K, i]: all of 0..i rejected
    before = np.concatenate([np.ones_like(survive[..., :1]), survive[..., :-1]], axis=-1)
    hit = a * before  # [J, K, i] P(child i is the accepted one)
    eq = tokens[:, :, None] == tokens[:, None, :]  # [J, i, i']
    same_token = np.einsum("jkm,jim->jki", hit, eq.astype(np.float64))
    none = survive[..., -1:]  # [J, K, 1] every child rejected
    w = same_token + none * rest
    return np.where(below & first_occurrence(tokens)[:, None, :], w, 0.0)


class NSSSolver:
    """SpecInfer paper's naive sampling: emit y ~ p; a child with token y is accepted."""

    name = "nss"

    def sample(self, p, q, children, rng):
        return categorical(p, rng)

    def output_distribution(self, p, q, children):
        return np.asarray(p, dtype=np.float64).copy()

    def chain_acceptance(self, p_x, q_x):
        return as_float64(p_x)

    def branch_weights(self, p, q, tokens, tables=None):
        kmax = tokens.shape[1]
        p_y = as_float64(_gather(p, tokens))  # [J, k]
        mask = _positions_below_k(kmax)[None] & first_occurrence(tokens)[:, None, :]
        return np.where(mask, p_y[:, None, :], 0.0)


def _tables(p: np.ndarray, q: np.ndarray, tables: list[RatioTable] | None) -> list[RatioTable]:
    """One RatioTable per row of p, q ``[J, V]`` (reused when given)."""
    return tables if tables is not None else [RatioTable.build(p[j], q[j]) for j in range(p.shape[0])]


class NaiveTreeSolver(StandardChainSolver):
    """Standard speculative sampling on the first child X1; the residual draw
    ``norm((p - q)+)`` may land on another child. With one child this is ``naive``."""

    name = "naive_tree"

    @staticmethod
    def residual_row(p64: np.ndarray, q64: np.ndarray, table: RatioTable) -> np.ndarray:
        mass = table.mass(1.0)
        return np.maximum(p64 - q64, 0.0) / mass if mass > 0 else p64.copy()

    def sample(self, p, q, children, rng):
        p64, q64 = as_float64(p), as_float64(q)
        x1 = int(children[0])
        if rng.random() < acceptance(p64[x1], q64[x1]):
            return x1
        return categorical(np.maximum(p64 - q64, 0.0), rng)

    def output_distribution(self, p, q, children):
        p64, q64 = as_float64(p), as_float64(q)
        x1 = int(children[0])
        a = float(acceptance(p64[x1], q64[x1]))
        out = (1.0 - a) * self.residual_row(p64, q64, RatioTable.build(p64, q64))
        out[x1] += a
        return out

    def branch_weights(self, p, q, tokens, tables=None):
        kmax = tokens.shape[1]
        p64, q64 = as_float64(p), as_float64(q)
        mass = np.array([t.mass(1.0) for t in _tables(p64, q64, tables)])[:, None]  # [J, 1]
        p_y, q_y = _gather(p64, tokens), _gather(q64, tokens)  # [J, k]
        res_y = np.where(mass > 0, np.maximum(p_y - q_y, 0.0) / np.where(mass > 0, mass, 1.0), p_y)
        a = acceptance(p_y[:, :1], q_y[:, :1])  # [J, 1]
        w = a * (tokens == tokens[:, :1]) + (1.0 - a) * res_y
        mask = _positions_below_k(kmax)[None] & first_occurrence(tokens)[:, None, :]
        return np.where(mask, w[:, None, :], 0.0)


class SpecInferSolver(StandardChainSolver):
    """Multi-round speculative sampling (SpecInfer): r = p; for each child Xi accept it w.p.
    ``min(1, r(Xi)/q(Xi))``, else ``r = norm((r - q)+)``; q never changes; finally emit y ~ r.

    The residual after i rejections is ``r_i = (p - c_i q)+ / n_i`` with c_0 = 0, n_0 = 1,
    ``c_i = c_{i-1} + n_{i-1}``, ``n_i = sum (p - c_i q)+``: norm((norm((p - c q)+) - q)+) =
    norm((p - (c + n) q)+). It depends only on i, not on the draws. If n_i = 0 (then r_{i-1} = q
    and every child is accepted surely) r_i = r_{i-1}."""

    name = "specinfer"

    @staticmethod
    def shifts(table: RatioTable, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(c, n)``, each ``[k+1]``: r_i = (p - c_i q)+ / n_i for i = 0..k."""
        c, n = [0.0], [1.0]
        for _ in range(k):
            c_new = c[-1] + n[-1]
            n_new = table.mass(c_new)
            c.append(c_new if n_new > 0 else c[-1])
            n.append(n_new if n_new > 0 else n[-1])
        return np.array(c), np.array(n)

    def sample(self, p, q, children, rng):
        p64, q64 = as_float64(p), as_float64(q)
        c, n, table = 0.0, 1.0, None
        for x in children:
            if rng.random() < acceptance(max(p64[x] - c * q64[x], 0.0) / n, q64[x]):
                return int(x)
            table = table or RatioTable.build(p64, q64)
            n_new = table.mass(c + n)
            if n_new > 0:
                c, n = c + n, n_new
        return categorical(np.maximum(p64 - c * q64, 0.0), rng)

    def output_distribution(self, p, q, children):
        p64, q64 = as_float64(p), as_float64(q)
        c, n = self.shifts(RatioTable.build(p64, q64), len(children))  # [k+1]
        out = np.zeros(p64.shape[0])
        alive = 1.0
        for i, x in enumerate(children):
            a = float(acceptance(max(p64[x] - c[i] * q64[x], 0.0) / n[i], q64[x]))
            out[x] += alive * a
            alive *= 1.0 - a
        return out + alive * (np.maximum(p64 - c[-1] * q64, 0.0) / n[-1])

    def branch_weights(self, p, q, tokens, tables=None):
        kmax = tokens.shape[1]
        p64, q64 = as_float64(p), as_float64(q)
        cn = [self.shifts(t, kmax) for t in _tables(p64, q64, tables)]
        c, n = np.stack([x[0] for x in cn]), np.stack([x[1] for x in cn])  # [J, Kmax+1]
        p_y, q_y = _gather(p64, tokens), _gather(q64, tokens)  # [J, i]
        r_y = np.maximum(p_y[:, None, :] - c[:, :, None] * q_y[:, None, :], 0.0) / n[:, :, None]  # [J, m, i]
        a = acceptance(np.diagonal(r_y[:, :kmax, :], axis1=1, axis2=2), q_y)  # [J, i]: r_i(y_i) vs q(y_i)
        accept = np.broadcast_to(a[:, None, :], (a.shape[0], kmax, kmax))
        return _sequential_weights(accept, r_y[:, 1:, :], tokens)


def spectr_params(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, float, float]:
    """(rho*, c, mass) of k-SEQ for one node with k children (see RatioTable.spectr)."""
    rho, c, mass = RatioTable.build(p, q).spectr(k)
    return float(rho[k - 1]), float(c[k - 1]), float(mass[k - 1])


class SpecTrSolver(StandardChainSolver):
    """SpecTr k-SEQ: accept child Xi w.p. ``min(1, p(Xi) / (rho* q(Xi)))`` in order; if none is
    accepted emit y ~ ``norm((p - min(q, p/rho*) * c)+)`` with ``c = (1 - (1-beta)^k) / beta``
    (computed as sum_{i<k} (1-beta)^i, stable at beta = 0). rho*, c and the residual mass come from
    RatioTable.spectr (the same numbers on the reference and the label path)."""

    name = "spectr"

    @staticmethod
    def _residual(p, q, rho, c, mass) -> np.ndarray:
        """Residual values ``(p - c min(q, p/rho))+ / mass`` (p where mass = 0); broadcasts, so p, q
        may be a row or gathered tokens and rho, c, mass scalars or arrays."""
        ok = mass > 0
        return np.where(ok, np.maximum(p - c * np.minimum(q, p / rho), 0.0) / np.where(ok, mass, 1.0), p)

    def _setup(self, p, q, children):
        """(p, q as float64, (rho*, c, mass) or None for one child, acceptance of each child)."""
        p64, q64 = as_float64(p), as_float64(q)
        k = len(children)
        params = spectr_params(p64, q64, k) if k > 1 else None  # k = 1: rho* = 1, no O(V) work yet
        rho = params[0] if params is not None else 1.0
        kids = np.asarray(children, dtype=np.int64)
        return p64, q64, params, acceptance(p64[kids] / rho, q64[kids])

    def _residual_row(self, p64, q64, params, k: int) -> np.ndarray:
        return self._residual(p64, q64, *(params or spectr_params(p64, q64, k)))

    def sample(self, p, q, children, rng):
        p64, q64, params, acc = self._setup(p, q, children)
        for x, a in zip(children, acc, strict=True):
            if rng.random() < a:
                return int(x)
        return categorical(self._residual_row(p64, q64, params, len(children)), rng)

    def output_distribution(self, p, q, children):
        p64, q64, params, acc = self._setup(p, q, children)
        out = np.zeros(p64.shape[0])
        alive = 1.0
        for x, a in zip(children, acc, strict=True):
            out[x] += alive * a
            alive *= 1.0 - a
        return out + alive * self._residual_row(p64, q64, params, len(children))

    def branch_weights(self, p, q, tokens, tables=None):
        kmax = tokens.shape[1]
        p64, q64 = as_float64(p), as_float64(q)
        params = np.stack([np.stack(t.spectr(kmax)) for t in _tables(p64, q64, tables)])  # [J, 3, K]
        rho, c, mass = params[:, 0, :, None], params[:, 1, :, None], params[:, 2, :, None]  # [J, K, 1]
        p_y, q_y = _gather(p64, tokens)[:, None, :], _gather(q64, tokens)[:, None, :]  # [J, 1, i]
        accept = acceptance(p_y / rho, q_y)  # [J, K, i]
        return _sequential_weights(accept, self._residual(p_y, q_y, rho, c, mass), tokens)


@dataclass
class OTMethod(ChainRestricted):
    """A top-down tree verifier built from a per-node solver.

    ``chains_only`` marks methods defined on chains (every node has <= 1 child), e.g. ``naive``.
    Labels: the exact DP of ALGORITHMS.md section 4 (``expected_block_efficiency``); on a union tree
    its factorized form from the solver's ``chain_acceptance`` and ``branch_weights``
    (union_context.branching_union_labels)."""

    name: str
    solver: OTSolver
    chains_only: bool = False
    description: str = ""
    exact_block_efficiency: ClassVar[bool] = True
    tree_alternative: ClassVar[str] = "'naive_tree' or another tree method"

    def branching(self, tree: DraftTree, p_rows: np.ndarray, node: int) -> tuple[list[int], np.ndarray]:
        """Branching probabilities at ``node``: (first child node of each distinct child token, B)."""
        kids = tree.children[node]
        toks = [int(tree.tokens[c]) for c in kids]
        out = self.solver.output_distribution(p_rows[node], tree.q_rows[node], toks)
        first: dict[int, int] = {}
        for c, t in zip(kids, toks, strict=True):
            first.setdefault(t, c)
        return list(first.values()), np.array([out[t] for t in first])

    def verify(self, tree: DraftTree, p_rows: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
        self._check(tree)
        accepted: list[int] = []
        node = 0
        while tree.children[node]:
            kids = tree.children[node]
            toks = [int(tree.tokens[c]) for c in kids]
            t = int(self.solver.sample(p_rows[node], tree.q_rows[node], toks, rng))
            if t not in toks:
                return accepted, t
            node = kids[toks.index(t)]  # first copy by position
            accepted.append(node)
        return accepted, categorical(p_rows[node], rng)  # bonus token at a leaf

    def outcome_distribution(self, tree: DraftTree, p_rows: np.ndarray) -> dict[tuple[int, ...], float]:
        self._check(tree)
        law: dict[tuple[int, ...], float] = {}

        def add(key: tuple[int, ...], mass: float) -> None:
            law[key] = law.get(key, 0.0) + mass

        def walk(node: int, prefix: tuple[int, ...], mass: float) -> None:
            kids = tree.children[node]
            if not kids:
                for t in np.flatnonzero(p_rows[node] > 0):
                    add(prefix + (int(t),), mass * float(p_rows[node, t]))
                return
            toks = [int(tree.tokens[c]) for c in kids]
            out = self.solver.output_distribution(p_rows[node], tree.q_rows[node], toks)
            for t in np.flatnonzero(out > 0):
                t = int(t)
                if t in toks:
                    walk(kids[toks.index(t)], prefix + (t,), mass * float(out[t]))
                else:
                    add(prefix + (t,), mass * float(out[t]))

        walk(0, (), 1.0)
        return law

    def expected_block_efficiency(self, tree: DraftTree, p_rows: np.ndarray) -> float:
        """DP of ALGORITHMS.md section 4: E(leaf) = depth; E(n) = (1 - sum B) depth + sum B E(child)."""
        self._check(tree)
        values = tree.depths.astype(np.float64)  # E(n), filled bottom-up (children have larger index)
        for node in range(tree.num_nodes - 1, -1, -1):
            if tree.children[node]:
                firsts, b = self.branching(tree, p_rows, node)
                values[node] = (1.0 - b.sum()) * tree.depths[node] + float(b @ values[firsts])
        return float(values[0]) + 1.0

    def union_block_efficiency(self, ctx: UnionContext) -> np.ndarray:
        vals = branching_union_labels(ctx, self.solver, self.name)
        if self.chains_only:
            vals[[not a.is_chain for a in ctx.union.space.actions]] = np.nan
        return vals

    def estimate_union_block_efficiency(self, ctx, repeats, rng):
        """The exact DP (cheaper than one verification): standard error 0."""
        vals = self.union_block_efficiency(ctx)
        return vals, np.zeros_like(vals)


def make_ot_methods() -> list[OTMethod]:
    """The OT-based entries of the registry defined in this module."""
    naive_tree = NaiveTreeSolver()
    return [
        OTMethod("naive", naive_tree, chains_only=True,
                 description="standard speculative sampling (chains only; on trees use naive_tree)"),
        OTMethod("nss", NSSSolver(), description="naive sampling: emit y ~ p, accept a matching child"),
        OTMethod("naive_tree", naive_tree, description="speculative sampling on the first child"),
        OTMethod("specinfer", SpecInferSolver(), description="SpecInfer multi-round sampling"),
        OTMethod("spectr", SpecTrSolver(), description="SpecTr k-SEQ"),
    ]
