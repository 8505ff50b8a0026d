"""Statistical losslessness harness: many independent first steps of speculative decoding, cheaply.

Decoding N independent samples of the first few tokens after a fixed prompt with the real models would
cost N times the drafting and tree passes. But the models are deterministic functions of the prefix,
and the samples share the prompt, so the harness computes each distinct prefix's rows ONCE:

- `PrefixOracle` keeps the prompt's KV cache (computed once) in both models; each batch of new
  prefixes, with their ancestors, is one tree (a trie) fed through the engine's tree pass
  (`forward_nodes`: ancestor-only masks, position = depth) on top of that cache, which is then
  cropped back to the prompt. Rows are transformed with the engine's sampling transform
  and stored sparse (support only).
- `simulate` runs N samples level-synchronously: each step drafts the action's tree (trunk, then K
  i.i.d. rollouts, each token drawn from q of its parent), verifies it with the registry method on
  the oracle rows, and continues from the emitted token until ``n_tokens`` tokens are out.
  Verification sees the tree's rows restricted to the union of their supports (exact: every other
  token has probability 0 in every row involved).
- `expected_law` gives the exact target law of the first ``n_tokens`` tokens on the top-B sequences.

Power (`chi_square_power`): for a goodness-of-fit chi-square over k bins, the noncentrality of a shift
from law P0 to P1 is ``lambda = N * sum (P1 - P0)^2 / P0 >= N * (sum |P1 - P0|)^2 = 4 N TV^2`` (Cauchy-
Schwarz), so ANY shift of total variation TV between the binned laws is detected with probability at
least ``P(ncx2(k - 1, 4 N TV^2) > chi2.ppf(1 - alpha, k - 1))``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from decoding.actions import Action
from decoding.sampling import Sampling
from decoding.tree import DraftTree, children_lists, tree_layout
from engine.cache import KVState
from engine.torch_sampling import to_numpy_rows, transform_logits
from engine.tree_pass import forward_nodes, prefill
from verifiers import get_method

Prefix = tuple[int, ...]


class PrefixOracle:
    """Transformed target/draft rows (sparse) for prefixes below the prompt's last token (the root)."""

    def __init__(self, target, draft, prompt: list[int], sampling: Sampling, vocab_size: int,
                 chunk: int = 512) -> None:
        self.sampling, self.vocab_size, self.chunk = sampling, vocab_size, chunk
        self.kv = [KVState(target), KVState(draft)]
        self.ctx = len(prompt) - 1
        self.node: dict[Prefix, int] = {}
        self.rows: list[list[tuple[np.ndarray, np.ndarray]]] = [[], []]  # [model][node] -> (idx, vals)
        with torch.inference_mode():
            for m, kv in enumerate(self.kv):
                if self.ctx:
                    prefill(kv, prompt[:-1])
                logits, _ = forward_nodes(kv, [prompt[-1]], [self.ctx], np.ones((1, len(kv) + 1), bool))
                row = to_numpy_rows(transform_logits(logits[0], self.sampling, vocab_size))
                idx = np.flatnonzero(row > 0)
                self.rows[m].append((idx, row[idx]))
        self.node[()] = 0

    def ensure(self, prefixes) -> None:
        """Compute rows for every prefix not seen yet: batches of new prefixes plus their ancestors go
        through one tree pass on top of the prompt's cache, which is cropped back afterwards."""
        new = sorted({pre for pre in prefixes if pre not in self.node}, key=len)
        with torch.inference_mode():
            for start in range(0, len(new), self.chunk):
                self._add(new[start:start + self.chunk])

    def _add(self, batch: list[Prefix]) -> None:
        nodes: dict[Prefix, int] = {(): 0}  # the mini-trie of the batch: root (cached) + closure
        for pre in batch:
            for cut in range(1, len(pre) + 1):
                nodes.setdefault(pre[:cut], len(nodes))
        order = list(nodes)[1:]  # parents before children (insertion order)
        base = len(self.kv[0])  # slots: prompt[:-1], root, then the mini-trie
        allowed = np.zeros((len(order), base + len(order)), dtype=bool)
        allowed[:, :base] = True  # context and root
        for r, pre in enumerate(order):
            for cut in range(1, len(pre) + 1):
                allowed[r, base + nodes[pre[:cut]] - 1] = True
        tokens = [pre[-1] for pre in order]
        positions = [self.ctx + len(pre) for pre in order]
        for m, kv in enumerate(self.kv):
            logits, _ = forward_nodes(kv, tokens, positions, allowed)
            kv.crop(base)
            rows = to_numpy_rows(transform_logits(logits, self.sampling, self.vocab_size))
            for pre, row in zip(order, rows, strict=True):
                if m == 0 and pre not in self.node:
                    self.node[pre] = len(self.rows[0])
                    self.rows[0].append(None)
                    self.rows[1].append(None)
                idx = np.flatnonzero(row > 0)
                self.rows[m][self.node[pre]] = (idx, row[idx])

    def p(self, pre: Prefix) -> tuple[np.ndarray, np.ndarray]:
        return self.rows[0][self.node[pre]]

    def q(self, pre: Prefix) -> tuple[np.ndarray, np.ndarray]:
        return self.rows[1][self.node[pre]]


def _draw(row: tuple[np.ndarray, np.ndarray], rng: np.random.Generator) -> int:
    idx, vals = row
    cdf = np.cumsum(vals)
    i = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), idx.shape[0] - 1)
    return int(idx[i])


def simulate(oracle: PrefixOracle, method: str, action: Action, n_samples: int, n_tokens: int,
             rng: np.random.Generator) -> list[Prefix]:
    """The first ``n_tokens`` tokens of ``n_samples`` independent speculative decodes."""
    verifier = get_method(method)
    parents, depths = tree_layout(action)
    children = children_lists(parents)
    n = parents.shape[0]
    levels = [np.flatnonzero(depths == d).tolist() for d in range(1, int(depths.max()) + 1)]
    inner = [i for i in range(n) if children[i]]
    out: list[Prefix] = [()] * n_samples
    active = list(range(n_samples))
    while active:
        # pres[a][i]: prefix (below the prompt root) of node i of sample a's tree
        pres = [[out[s]] + [()] * (n - 1) for s in active]
        for nodes in levels:
            oracle.ensure(pres[a][parents[i]] for a in range(len(active)) for i in nodes)
            for a in range(len(active)):
                pa = pres[a]
                for i in nodes:
                    par = pa[parents[i]]
                    pa[i] = par + (_draw(oracle.q(par), rng),)
        oracle.ensure(pre for pa in pres for pre in pa)
        still = []
        for a, s in enumerate(active):
            pa = pres[a]
            p_sp = [oracle.p(pre) for pre in pa]
            q_sp = {i: oracle.q(pa[i]) for i in inner}
            local = np.unique(np.concatenate([r[0] for r in p_sp] + [r[0] for r in q_sp.values()]))
            p_rows = np.zeros((n, local.shape[0]))
            q_rows = np.zeros((n, local.shape[0]))
            for i in range(n):
                p_rows[i, np.searchsorted(local, p_sp[i][0])] = p_sp[i][1]
            for i, (idx, vals) in q_sp.items():
                q_rows[i, np.searchsorted(local, idx)] = vals
            tokens = np.searchsorted(local, [pre[-1] if i else 0 for i, pre in enumerate(pa)])
            tokens[0] = -1
            tree = DraftTree(action, tokens, parents, depths, children, q_rows)
            accepted, emitted = verifier.verify(tree, p_rows, rng)
            new = (pa[accepted[-1]][len(out[s]):] if accepted else ()) + (int(local[emitted]),)
            out[s] = (out[s] + new)[:n_tokens]
            if len(out[s]) < n_tokens:
                still.append(s)
        active = still
    return out


def expected_law(oracle: PrefixOracle, n_tokens: int, top: int) -> dict[Prefix, float]:
    """Exact target probabilities of the ``top`` most likely ``n_tokens``-token sequences (beam over the
    oracle rows; exact because a sequence's probability is at most its prefix's)."""
    beam: dict[Prefix, float] = {(): 1.0}
    for _ in range(n_tokens):
        oracle.ensure(beam)
        cand: dict[Prefix, float] = {}
        for pre, pr in beam.items():
            idx, vals = oracle.p(pre)
            for t, v in zip(idx.tolist(), vals.tolist(), strict=True):
                cand[pre + (t,)] = pr * v
        beam = dict(sorted(cand.items(), key=lambda kv: -kv[1])[:top])
    return beam


def chi_square_test(samples: list[Prefix], law: dict[Prefix, float], min_expected: float = 5.0):
    """Goodness of fit of ``samples`` to ``law`` on its cells with expected count >= min_expected plus one
    rest cell. Returns (p-value, number of bins)."""
    n = len(samples)
    cells = [c for c, pr in law.items() if pr * n >= min_expected]
    probs = np.array([law[c] for c in cells] + [1.0 - sum(law[c] for c in cells)])
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for s in samples:
        counts[index.get(s, len(cells))] += 1
    if probs[-1] * n < min_expected:  # rest cell too small: fold it into the last listed cell
        probs[-2] += probs[-1]
        counts[-2] += counts[-1]
        probs, counts = probs[:-1], counts[:-1]
    stat = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    return float(stats.chi2.sf(stat, len(probs) - 1)), len(probs)


def chi_square_power(n: int, bins: int, tv: float = 0.02, alpha: float = 1e-3) -> float:
    """Lower bound on the probability of detecting any TV shift ``tv`` between the binned laws."""
    df = bins - 1
    return float(stats.ncx2.sf(stats.chi2.ppf(1 - alpha, df), df, 4 * n * tv * tv))


def samples_for_power(bins: int, power: float = 0.9, tv: float = 0.02, alpha: float = 1e-3) -> int:
    """Smallest N (to 500) whose `chi_square_power` reaches ``power``."""
    n = 500
    while chi_square_power(n, bins, tv, alpha) < power:
        n += 500
    return n
