"""Features and labels at the roots of one trajectory (ALGORITHMS.md sections 4-5).

A *trajectory* is a prompt plus a target-sampled continuation (`data_collection.trajectory_store`). Its
*roots* are every ``root_stride``-th continuation position r (the root token is ``seq[r]``, the context
``seq[:r]``; a root that is an EOS token is skipped, decoding would have stopped there). For each root:

- features (`decoding.features`): the target and draft hidden states and probability rows come from ONE
  prefill of the trajectory per model (not from token-by-token decoding; both give the same numbers
  up to float rounding, tests/test_collect.py checks it against the decoder);
- labels: ``num_trees`` union trees of the action space (`decoding.union_tree`) are drafted below the
  root as one *forest* (all copies share the root, so one batched draft forward per depth drafts them
  all, on the same KV-cached path as the decoder's drafting: `engine.drafting.draft_layout`),
  then ONE target tree pass over the forest gives every p row. Each union tree gives the exact block
  efficiency of every action for every method (`decoding.labels.union_labels`); Ê(c, a) is their mean.

The forest's copies are independent draws (disjoint subtrees under a shared root), so the s union trees
are i.i.d. samples exactly as s separate draftings would be. All randomness of a root comes from a
generator seeded by (seed, trajectory key, root position), so a root's row does not depend on which
other roots were collected before it: an interrupted run resumes with identical rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from decoding.actions import ActionSpace
from decoding.features import HIDDEN_COLUMNS, probability_scalars
from decoding.files import stable_hash64
from decoding.labels import union_labels
from decoding.sampling import Sampling
from decoding.tree import DraftTree, children_lists
from decoding.union_tree import union_from_tokens, union_layout
from engine.cache import KVState
from engine.drafting import DraftRoot, DraftRule, draft_layout
from engine.torch_sampling import prob_rows
from engine.tree_pass import (
    causal_allowed,
    forward_nodes,
    hidden_numpy,
    input_embeddings,
    target_tree_pass,
)


@dataclass
class RootRows:
    """Columns of the roots of one trajectory (R roots; A actions; H_p / H_q hidden sizes)."""

    position: list[int] = field(default_factory=list)  # root position r in the trajectory (= context length)
    root_token: list[int] = field(default_factory=list)
    h_p_prev: list[np.ndarray] = field(default_factory=list)  # [H_p] float16
    h_q_prev: list[np.ndarray] = field(default_factory=list)  # [H_q] float16
    h_q_root: list[np.ndarray] = field(default_factory=list)  # [H_q] float16
    e_root: list[np.ndarray] = field(default_factory=list)  # [H_p] float16, the target's embedding of the root token
    probability_scalars: list[np.ndarray] = field(default_factory=list)  # [6] float64, decoding.features order
    labels: dict[str, list[np.ndarray]] = field(default_factory=dict)  # method -> R x [A] mean over trees
    label_se: dict[str, list[np.ndarray]] = field(default_factory=dict)  # method -> R x [A] std error over trees
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"draft": [], "target": [], "labels": []})

    def __len__(self) -> int:
        return len(self.position)


def root_positions(prompt_len: int, seq: list[int], stride: int, eos: set[int]) -> list[int]:
    """Positions r = prompt_len, prompt_len + stride, ... < len(seq) whose token is not an EOS."""
    if stride < 1:
        raise ValueError(f"root_stride must be >= 1, got {stride}")
    return [r for r in range(max(prompt_len, 1), len(seq), stride) if seq[r] not in eos]


def root_seed(seed: int, key: str, position: int) -> np.random.Generator:
    """The generator of one root: a function of (seed, trajectory key, position) only."""
    return np.random.default_rng(stable_hash64(f"{seed}|{key}|{position}"))


def forest_layout(space: ActionSpace, copies: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(parents, depths, m)``: ``copies`` union trees of ``space`` under one shared root; copy i holds
    nodes ``1 + i*(m-1) .. (i+1)*(m-1)`` where m is the union tree's node count (root included)."""
    parents, depths, _ = union_layout(space)
    m = parents.shape[0]
    f_par, f_dep = [np.array([-1])], [np.array([0])]
    for i in range(copies):
        off = 1 + i * (m - 1)
        par = parents[1:].copy()
        f_par.append(np.where(par == 0, 0, par - 1 + off))
        f_dep.append(depths[1:])
    return np.concatenate(f_par).astype(np.int64), np.concatenate(f_dep).astype(np.int64), m


@dataclass(frozen=True)
class UnionTrees:
    """How many union trees a root's labels average (the standard error falls as 1/sqrt) and the seed of their
    draws."""

    num_trees: int = 4
    seed: int = 0


class RootCollector:
    """Collects features and labels along trajectories for one draft/target pair (see module docstring)."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, vocab_size: int, space: ActionSpace,
                 methods: list[str], trees: UnionTrees = UnionTrees()) -> None:
        if trees.num_trees < 1:
            raise ValueError(f"num_trees must be >= 1, got {trees.num_trees}")
        self.target, self.draft = target, draft
        self.vocab_size = int(vocab_size)
        self.space, self.methods = space, list(methods)
        self.num_trees, self.seed = int(trees.num_trees), int(trees.seed)
        self.parents, self.depths, self.union_nodes = forest_layout(space, self.num_trees)
        self.children = children_lists(self.parents)

    @torch.inference_mode()
    def prefill(self, model: torch.nn.Module, seq: list[int], keep: int | list[int] = 0
                ) -> tuple[KVState, torch.Tensor, torch.Tensor]:
        """One causal pass over ``seq``: its cache, logits ``[n, V']`` and last-layer hidden states ``[n, H]``;
        ``keep`` as `forward_nodes` takes it (a list of positions: both only there, the head skipping the rest: a
        prefill of a few hundred tokens needs the rows of its few roots)."""
        kv = KVState(model)
        logits, hidden = forward_nodes(kv, seq, list(range(len(seq))), causal_allowed(0, len(seq)), True, keep=keep)
        return kv, logits, hidden

    @torch.inference_mode()
    def _prefill(self, seq: list[int], positions: list[int], sampling: Sampling) -> dict:
        """Both prefills and the raw features of every root (float32 hidden states, float64 rows)."""
        if min(positions) < 1 or max(positions) >= len(seq):
            raise ValueError(f"root positions must lie in [1, {len(seq) - 1}], got {positions}")
        last, n = max(positions), len(positions)
        prev = [r - 1 for r in positions]
        feature_draft = getattr(self.draft, "reads_target_hidden", False)
        t0 = time.perf_counter()
        if feature_draft:  # also the features two back (a zero feature before the first token): the draft's input
            kv_t, p_logits, h_all = self.prefill(self.target, seq[:last], [max(r - 2, 0) for r in positions] + prev)
            p_logits, h_p, h_pp = p_logits[n:], h_all[n:], h_all[:n].clone()
            h_pp[torch.tensor([r < 2 for r in positions])] = 0.0
        else:
            kv_t, p_logits, h_p = self.prefill(self.target, seq[:last], prev)  # context of the last root; [R, .]
        t1 = time.perf_counter()
        if feature_draft:  # its step on the target's features: before the root's predecessor, then before the root
            ids = torch.tensor([seq[r] for r in prev + positions], dtype=torch.long)
            kv_d, (q_logits, h_q) = None, self.draft.step(torch.cat([h_pp, h_p]), ids)
        else:
            kv_d, q_logits, h_q = self.prefill(self.draft, seq[: last + 1], prev + positions)  # ... plus its root
        t2 = time.perf_counter()
        return {
            "kv_t": kv_t, "kv_d": kv_d, "seconds": {"target": t1 - t0, "draft": t2 - t1},
            "f_root": h_q[n:] if feature_draft else None,  # [R, H] the roots' draft features
            "p_prev": prob_rows(p_logits, sampling, self.vocab_size),  # [R, V]
            "q_prev": prob_rows(q_logits[:n], sampling, self.vocab_size),  # [R, V]
            "q_root": prob_rows(q_logits[n:], sampling, self.vocab_size),  # [R, V]
            "h_p_prev": hidden_numpy(h_p),  # [R, H_p]
            "h_q_prev": hidden_numpy(h_q[:n]),  # [R, H_q]
            "h_q_root": hidden_numpy(h_q[n:]),  # [R, H_q]
            "e_root": input_embeddings(self.target, [seq[r] for r in positions]),  # [R, H_p]
        }

    @torch.inference_mode()
    def features(self, seq: list[int], positions: list[int], sampling: Sampling) -> dict[str, np.ndarray]:
        """The raw features of the roots at ``positions`` (what `decoding.policy.RootFeatures` holds):
        ``p_prev``, ``q_prev``, ``q_root`` ``[R, V]`` and ``h_p_prev``, ``h_q_prev``, ``h_q_root``, ``e_root`` ``[R, H]``."""
        pre = self._prefill(seq, positions, sampling)
        return {k: v for k, v in pre.items() if k not in ("kv_t", "kv_d", "seconds", "f_root")}

    @torch.inference_mode()
    def collect(self, seq: list[int], positions: list[int], sampling: Sampling, key: str) -> RootRows:
        """Rows of the roots at ``positions`` of the token sequence ``seq`` (prompt + continuation)."""
        out = RootRows(labels={m: [] for m in self.methods}, label_se={m: [] for m in self.methods})
        if not positions:
            return out
        pre = self._prefill(seq, positions, sampling)
        scalars = probability_scalars(pre["p_prev"], pre["q_prev"], pre["q_root"])  # [R, 6]
        share = {k: v / len(positions) for k, v in pre["seconds"].items()}
        for i, r in enumerate(positions):
            draft_root = (DraftRoot(None, pre["q_root"][i], draft=self.draft, feature=pre["f_root"][i])
                          if pre["kv_d"] is None else DraftRoot(pre["kv_d"].fork(r + 1), pre["q_root"][i]))
            rows = self._labels(pre["kv_t"], draft_root, seq, r, sampling, root_seed(self.seed, key, r))
            out.position.append(r)
            out.root_token.append(int(seq[r]))
            for name in HIDDEN_COLUMNS:
                getattr(out, name).append(pre[name][i].astype(np.float16))
            out.probability_scalars.append(scalars[i])
            for m in self.methods:
                out.labels[m].append(rows["mean"][m])
                out.label_se[m].append(rows["se"][m])
            for part in ("draft", "target"):
                out.seconds[part].append(rows["seconds"][part] + share[part])
            out.seconds["labels"].append(rows["seconds"]["labels"])
        return out

    def _labels(self, kv_t: KVState, draft_root: DraftRoot, seq: list[int], r: int, sampling: Sampling,
                rng: np.random.Generator) -> dict:
        """Ê(c, a) at root r: mean over the forest's union trees, per method (and its standard error).
        ``draft_root``: the draft at the root (its cache forked to context + root, or a feature draft's feature)."""
        t0 = time.perf_counter()
        drafted = draft_layout(draft_root, self.parents, self.depths, DraftRule(sampling, self.vocab_size), rng)
        t1 = time.perf_counter()
        forest = DraftTree(self.space.max_action, drafted.tokens, self.parents, self.depths, self.children,
                           drafted.q_rows)
        logits, _ = target_tree_pass(kv_t.fork(r), int(seq[r]), forest)
        p_rows = prob_rows(logits, sampling, self.vocab_size)  # [n, V]
        t2 = time.perf_counter()
        m = self.union_nodes
        per_tree: dict[str, list[np.ndarray]] = {name: [] for name in self.methods}
        for i in range(self.num_trees):
            idx = np.concatenate([[0], np.arange(1 + i * (m - 1), 1 + (i + 1) * (m - 1))])
            union = union_from_tokens(self.space, drafted.tokens[idx], drafted.q_rows[idx])
            values, _ = union_labels(union, p_rows[idx], self.methods, validate=False)
            for name in self.methods:
                per_tree[name].append(values[name])
        t3 = time.perf_counter()
        stacked = {k: np.stack(v) for k, v in per_tree.items()}  # [s, A]
        se = {k: (v.std(axis=0, ddof=1) / np.sqrt(v.shape[0]) if v.shape[0] > 1 else np.zeros(v.shape[1]))
              for k, v in stacked.items()}
        return {"mean": {k: v.mean(axis=0) for k, v in stacked.items()}, "se": se,
                "seconds": {"draft": t1 - t0, "target": t2 - t1, "labels": t3 - t2}}
