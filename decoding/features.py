"""The feature schema of the selector (ALGORITHMS.md section 5): names, order, shapes, how each is computed.

Numpy only (no torch): the collection stage, selector training, the ONNX export's sidecar and the
torch-free runtime (`export/runtime.py`) all import this one module, so the features a decoder hands a
selector are built exactly as the training rows were.

Inputs of a selector (in this order):
- hidden-state features, each a float vector (stored float16, fed float32):
  ``h_p_prev`` ``[H_p]`` target last-layer hidden state at the token before the root;
  ``h_q_prev`` ``[H_q]`` draft hidden state at the token before the root;
  ``h_q_root`` ``[H_q]`` draft hidden state at the root (the draft's root step computes it anyway);
  ``e_root`` ``[H_p]`` the target's input embedding of the root token (beyond the paper: a table lookup, no
  forward; ``h_p_prev`` describes the context *before* the root and cannot know which token was sampled);
- ``scalars`` ``[S]``: the scalar features of the feature set, in `SCALARS` order.

Scalars. *Stored* scalars are computed when the root is seen (collection or decoding) from the
transformed probability rows (`decoding.sampling`): p_prev = p(.|context), q_prev = q(.|context),
q_root = q(.|context + root). *Derived* scalars come from the machine's latency profile
(`decoding.latency.LatencyModel`) at the root's context length, so a selector moved to another machine
takes that machine's profile without re-collecting. Entropies and KL divergences are in nats; a KL
term where the second distribution is 0 uses ``max(q, EPS)`` (top-p and vocabulary subsets produce
such zeros), so every feature is finite.

Feature sets (`FEATURE_SETS`): ``paper`` (all of section 5) and ``target_only`` (the target-side
features, the root token's embedding, context, sampling and latencies: computable without the draft's root
step, so declining to speculate costs exactly one plain target step). Adding ``e_root`` to ``target_only``
raised its offline TEST throughput from 1.04x to 1.08x autoregressive and its Spearman from 0.21 to 0.36
(3 seeds, docs/selector.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .errors import UserInputError
from .sampling import Sampling

if TYPE_CHECKING:  # pragma: no cover
    from .latency import LatencyModel

EPS = 1e-10  # floor of the second argument of a KL divergence


@dataclass
class RootFeatures:
    """What a selector may look at when choosing the action of a step (numpy arrays only)."""

    context_length: int  # tokens before the root (prompt + emitted so far, root excluded)
    sampling: Sampling
    p_prev: np.ndarray | None  # [V] p(.|context): target row from the last target pass (None before any)
    q_prev: np.ndarray | None = None  # [V] q(.|context): draft row at the token before the root
    q_root: np.ndarray | None = None  # [V] q(.|context + root) (None when the draft has not run)
    h_p_prev: np.ndarray | None = None  # [H_p] target last-layer hidden state at the token before the root
    h_q_prev: np.ndarray | None = None  # [H_q] draft last-layer hidden state at the token before the root
    h_q_root: np.ndarray | None = None  # [H_q] ... at the root
    e_root: np.ndarray | None = None  # [H_p] target input embedding of the root token
    # values computed from these fields, shared by every selector asked at this root (`vectorize` computes the
    # entropy of p_prev once); hand it on with the same rows only
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    # token ids up to and including the root (the decoder fills it; `policies.lookup` reads it)
    context: Sequence[int] | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Feature:
    name: str
    side: str  # "target" (needs only the target's last pass), "draft" (needs the draft's root step), "context"
    source: str  # "stored" (computed at the root) or "derived" (from the latency profile)
    doc: str


HIDDEN: tuple[Feature, ...] = (
    Feature("h_p_prev", "target", "stored", "target last-layer hidden state at the token before the root [H_p]"),
    Feature("h_q_prev", "draft", "stored", "draft last-layer hidden state at the token before the root [H_q]"),
    Feature("h_q_root", "draft", "stored", "draft last-layer hidden state at the root [H_q]"),
    Feature("e_root", "target", "stored", "target input embedding of the root token [H_p] (no forward needed)"),
)

HIDDEN_COLUMNS: tuple[str, ...] = tuple(f.name for f in HIDDEN)  # every collected row stores all of them

SCALARS: tuple[Feature, ...] = (
    Feature("entropy_p_prev", "target", "stored", "H(p_prev) = -sum p log p, nats"),
    Feature("entropy_q_prev", "draft", "stored", "H(q_prev), nats"),
    Feature("entropy_q_root", "draft", "stored", "H(q_root), nats"),
    Feature("kl_p_q_prev", "draft", "stored", "KL(p_prev || q_prev) = sum p log(p / max(q, EPS)), nats"),
    Feature("kl_q_p_prev", "draft", "stored", "KL(q_prev || p_prev) = sum q log(q / max(p, EPS)), nats"),
    Feature("l1_p_q_prev", "draft", "stored", "||p_prev - q_prev||_1 (= 2 x total variation)"),
    Feature("context_length", "context", "stored", "tokens before the root"),
    Feature("temperature", "context", "stored", "sampling temperature (0 = greedy)"),
    Feature("top_p", "context", "stored", "nucleus mass kept"),
    Feature("draft_step_ms", "context", "derived", "profiled draft step, 1 row, at this context length (ms)"),
    Feature("target_step_ms", "context", "derived", "profiled target pass over 1 token at this context length (ms)"),
)

STORED_SCALARS: tuple[str, ...] = tuple(f.name for f in SCALARS if f.source == "stored")
PROBABILITY_SCALARS: tuple[str, ...] = STORED_SCALARS[:6]  # the ones computed from p/q rows

FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "paper": tuple(f.name for f in HIDDEN + SCALARS if f.name != "e_root"),  # ALGORITHMS.md section 5, as written
    "target_only": ("h_p_prev", "e_root", "entropy_p_prev", "context_length", "temperature", "top_p", "draft_step_ms",
                    "target_step_ms"),
}


class FeatureError(UserInputError):
    """Features handed to a selector do not match its schema (names, shapes, NaN)."""


def entropy(rows: np.ndarray) -> np.ndarray:
    """``[...]`` entropy in nats of probability rows ``[..., V]``.

    Zero entries take log 1 (their term is exactly 0), so no -inf or NaN is ever formed: the same sum as
    ``-sum(p log p over p > 0)``, bit for bit, 5x faster on a 49k row than masking NaN terms afterwards."""
    r = np.asarray(rows, dtype=np.float64)
    return -(r * np.log(np.where(r > 0, r, 1.0))).sum(axis=-1)


def kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``[...]`` KL(p || q) in nats, with ``q`` floored at `EPS` where p > 0 (computed as `entropy` is: zero
    terms exactly 0, in place, no -inf or NaN formed)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    pos = p > 0
    d = np.log(np.where(pos, p, 1.0))
    d -= np.log(np.where(pos, np.maximum(q, EPS), 1.0))
    d *= p
    return d.sum(axis=-1)


def probability_scalars(p_prev: np.ndarray, q_prev: np.ndarray | None = None,
                        q_root: np.ndarray | None = None, entropy_p: np.ndarray | float | None = None) -> np.ndarray:
    """``[..., 6]`` the `PROBABILITY_SCALARS` from rows ``[..., V]`` (NaN for draft terms when q is None).

    Vectorized: the collection stage passes all roots of a trajectory at once. ``entropy_p``: H(p_prev) when
    the caller has it already (`FeatureSchema.vectorize` keeps it in `RootFeatures.memo`)."""
    h_p = entropy(p_prev) if entropy_p is None else np.asarray(entropy_p, dtype=np.float64)
    p_prev = np.asarray(p_prev, dtype=np.float64)
    nan = np.full(p_prev.shape[:-1], np.nan)
    if q_prev is None:
        h_q = kl_pq = kl_qp = l1 = nan
    else:
        q_prev = np.asarray(q_prev, dtype=np.float64)
        h_q, kl_pq, kl_qp, l1 = entropy(q_prev), kl(p_prev, q_prev), kl(q_prev, p_prev), np.abs(p_prev - q_prev).sum(-1)
    h_qr = nan if q_root is None else entropy(q_root)
    return np.stack([h_p, h_q, h_qr, kl_pq, kl_qp, l1], axis=-1)


def derived_scalars(context_length: np.ndarray | int, latency: LatencyModel) -> dict[str, np.ndarray]:
    """The latency features at these context lengths (ms): one root's from the model's memo
    (`LatencyModel.root_step_seconds`), an array's interpolated at once."""
    if np.ndim(context_length) == 0 and float(context_length) == int(context_length):
        t_q, t_p = latency.root_step_seconds(int(context_length))
        return {"draft_step_ms": 1e3 * np.float64(t_q), "target_step_ms": 1e3 * np.float64(t_p)}
    ctx = np.asarray(context_length, dtype=np.float64)
    return {"draft_step_ms": 1e3 * np.asarray(latency.t_q(ctx, 1), dtype=np.float64),
            "target_step_ms": 1e3 * np.asarray(latency.t_p(ctx, 1), dtype=np.float64)}


@dataclass(frozen=True)
class FeatureSchema:
    """The inputs of one selector: a feature set and the hidden sizes of the pair."""

    feature_set: str
    hidden_sizes: Mapping[str, int]  # {"h_p_prev": H_p, "h_q_prev": H_q, "h_q_root": H_q} (those in the set)

    def __post_init__(self) -> None:
        if self.feature_set not in FEATURE_SETS:
            raise ValueError(f"unknown feature set {self.feature_set!r}; known: {', '.join(FEATURE_SETS)}")
        missing = [h for h in self.hidden if h not in self.hidden_sizes]
        if missing:
            raise ValueError(f"feature set {self.feature_set!r} needs the sizes of {missing}")

    @classmethod
    def for_pair(cls, feature_set: str, target_hidden: int, draft_hidden: int) -> FeatureSchema:
        sizes = {"h_p_prev": target_hidden, "h_q_prev": draft_hidden, "h_q_root": draft_hidden, "e_root": target_hidden}
        names = FEATURE_SETS.get(feature_set, ())
        return cls(feature_set, {k: int(v) for k, v in sizes.items() if k in names})

    @property
    def hidden(self) -> tuple[str, ...]:
        return tuple(f.name for f in HIDDEN if f.name in FEATURE_SETS[self.feature_set])

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(f.name for f in SCALARS if f.name in FEATURE_SETS[self.feature_set])

    @property
    def needs_draft(self) -> bool:
        """Whether the features need the draft's root step (q rows or draft hidden states)."""
        by_name = {f.name: f for f in HIDDEN + SCALARS}
        return any(by_name[n].side == "draft" for n in FEATURE_SETS[self.feature_set])

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """ONNX / runtime inputs (batch axis excluded), in input order."""
        return {**{h: (int(self.hidden_sizes[h]),) for h in self.hidden}, "scalars": (len(self.scalars),)}

    def to_dict(self) -> dict:
        """The schema as the ONNX sidecar writes it (names, order, dtypes, shapes, how each is computed)."""
        docs = {f.name: f for f in HIDDEN + SCALARS}
        return {
            "feature_set": self.feature_set,
            "inputs": [{"name": name, "dtype": "float32", "shape": ["batch", *shape]}
                       for name, shape in self.input_shapes().items()],
            "scalars": [{"name": n, "side": docs[n].side, "source": docs[n].source, "doc": docs[n].doc}
                        for n in self.scalars],
            "hidden": [{"name": n, "size": int(self.hidden_sizes[n]), "doc": docs[n].doc} for n in self.hidden],
            "kl_eps": EPS,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> FeatureSchema:
        try:
            return cls(d["feature_set"], {h["name"]: int(h["size"]) for h in d["hidden"]})
        except (KeyError, TypeError) as e:
            raise FeatureError(f"malformed feature schema: missing {e}") from None

    def vectorize(self, root: RootFeatures, latency: LatencyModel) -> dict[str, np.ndarray]:
        """The selector's inputs (float32, no batch axis) for one root, checked by `validate`."""
        values = {
            "context_length": float(root.context_length),
            "temperature": float(root.sampling.temperature),
            "top_p": float(root.sampling.top_p),
            **{k: float(v) for k, v in derived_scalars(root.context_length, latency).items()},
        }
        if any(n in PROBABILITY_SCALARS for n in self.scalars):
            if root.p_prev is None:
                raise FeatureError("features need p_prev (the target row before the root); none was given")
            draft = self.needs_draft
            if "entropy_p_prev" not in root.memo:
                root.memo["entropy_p_prev"] = entropy(root.p_prev)
            probs = probability_scalars(root.p_prev, root.q_prev if draft else None, root.q_root if draft else None,
                                        root.memo["entropy_p_prev"])
            values.update(zip(PROBABILITY_SCALARS, (float(x) for x in probs), strict=True))
        out = {}
        for h in self.hidden:
            v = getattr(root, h)
            if v is None:
                raise FeatureError(f"features need {h}; the decoder gave none (does the selector set "
                                   "needs_hidden_states = True?)")
            out[h] = np.asarray(v, dtype=np.float32).reshape(-1)
        out["scalars"] = np.array([values[n] for n in self.scalars], dtype=np.float32)
        self.validate(out)
        return out

    def validate(self, inputs: Mapping[str, np.ndarray], batched: bool = False) -> None:
        """Raise `FeatureError` naming the problem: a missing or extra input, a wrong shape, NaN or inf."""
        expected = self.input_shapes()
        missing = [k for k in expected if k not in inputs]
        extra = [k for k in inputs if k not in expected]
        if missing or extra:
            raise FeatureError(f"selector inputs do not match the schema ({self.feature_set}): "
                               f"missing {missing}, unexpected {extra}; expected {list(expected)}")
        for name, shape in expected.items():
            arr = np.asarray(inputs[name])
            got = arr.shape[1:] if batched else arr.shape
            if tuple(got) != shape:
                raise FeatureError(f"selector input {name!r}: expected shape {('batch', *shape) if batched else shape}, "
                                   f"got {arr.shape}")
            if not np.all(np.isfinite(arr)):
                bad = np.flatnonzero(~np.isfinite(arr.reshape(arr.shape[0], -1) if batched else arr.reshape(-1)))
                where = self.scalars[int(bad[0]) % len(self.scalars)] if name == "scalars" and not batched else name
                raise FeatureError(f"selector input {name!r} has NaN or inf values (first at {where!r})")


def scalar_matrix(columns: Mapping[str, Sequence[float] | np.ndarray], names: Sequence[str]) -> np.ndarray:
    """``[N, len(names)]`` float32 from per-scalar columns (e.g. a collected dataset's columns)."""
    return np.stack([np.asarray(columns[n], dtype=np.float32) for n in names], axis=-1)


def batch_inputs(schema: FeatureSchema, columns: Mapping[str, Sequence | np.ndarray], latency: LatencyModel
                 ) -> dict[str, np.ndarray]:
    """Batched selector inputs (float32, batch first) from a collected dataset's columns: hidden-state
    columns as they are, stored scalars from their columns, derived scalars from ``latency`` at each row's
    ``context_length``. The training data, the export's parity check and the offline evaluation all build
    their inputs here."""
    stored = [n for n in schema.scalars if n in STORED_SCALARS]  # the derived ones come from ``latency``
    missing = [n for n in (*schema.hidden, *stored, "context_length") if n not in columns]
    if missing:
        raise FeatureError(f"the collected dataset has no column {missing} that feature set {schema.feature_set!r} "
                           "needs: it was collected by an older branchpoint; re-collect it (branchpoint collect "
                           "--restart)")
    out = {h: np.asarray(columns[h], dtype=np.float32) for h in schema.hidden}
    derived = derived_scalars(np.asarray(columns["context_length"]), latency)
    cols = {n: (derived[n] if n in derived else np.asarray(columns[n])) for n in schema.scalars}
    out["scalars"] = scalar_matrix(cols, schema.scalars)
    return out
