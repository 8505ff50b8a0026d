"""The selector's training data: collected roots as arrays, and the Lightning data module over them.

A row is one *root* of the collected dataset (`data_collection.dataset`; the caller loads it, this layer
only reads columns by name). `SelectorData` holds, for N roots and O outputs of an `OutputLayout`:

- ``inputs``: the selector's inputs in `FeatureSchema.input_shapes` order (hidden states ``[N, H]``
  float32, ``scalars`` ``[N, S]``), built by `decoding.features.batch_inputs` exactly as the export's
  parity check builds them (latency scalars from the latency model at each root's context length);
- ``labels`` ``[N, O]``: Ê(c, output) (NaN where the output's method does not apply), ``label_se``;
- step times (seconds, `decoding.pricing.step_seconds`): ``cost`` ``[N, O]`` what one step costs when the
  selector chooses (its feature set's feature cost plus ``inference_seconds``), ``cost_static``
  ``[N, O]`` what it costs a static policy (no features), ``cost_ar`` ``[N]`` one autoregressive step;
- metadata: ``split`` (train / val / test, by prompt as collected: a prompt's roots are never in two
  splits), ``prompt_id``, ``source``, ``temperature``, ``top_p``, ``context_length``.

Standardization statistics are fitted on the train rows only (`SelectorDataModule.standardization`) and
stored in the network's buffers by the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from decoding import pricing, throughput
from decoding.actions import AR_ACTION
from decoding.errors import UserInputError
from decoding.features import FeatureSchema, batch_inputs
from decoding.sampling import sampling_key

from .network import OutputLayout

AR = AR_ACTION  # autoregressive: no tree, one target step


class SelectorDataError(UserInputError):
    """The collected dataset cannot train this selector (missing labels, splits or a grid mismatch)."""


@dataclass
class SelectorData:
    """Arrays of N roots for one feature schema and output layout (see module docstring)."""

    schema: FeatureSchema
    layout: OutputLayout
    inputs: dict[str, np.ndarray]  # name -> [N, H] / scalars [N, S], float32, schema order
    labels: np.ndarray  # [N, O] float32 Ê per output (NaN = method does not apply)
    label_se: np.ndarray  # [N, O] float32 standard error of the label over the union trees
    cost: np.ndarray  # [N, O] seconds of one step when the selector picks the output (features + inference)
    cost_static: np.ndarray  # [N, O] seconds of one step of the output's action as a static policy
    cost_ar: np.ndarray  # [N] seconds of one autoregressive step
    split: np.ndarray  # [N] str
    prompt_id: np.ndarray  # [N] str
    source: np.ndarray  # [N] str
    temperature: np.ndarray  # [N] float
    top_p: np.ndarray  # [N] float
    context_length: np.ndarray  # [N] int
    traversal: np.ndarray | None = None  # [N, A] Traversal's labels (the reference method), when collected
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def rows(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.split == split)

    def subset(self, idx: np.ndarray) -> SelectorData:
        per_row = ("labels", "label_se", "cost", "cost_static", "cost_ar", "split", "prompt_id", "source",
                   "temperature", "top_p", "context_length")
        return replace(self, inputs={k: v[idx] for k, v in self.inputs.items()},
                       traversal=None if self.traversal is None else self.traversal[idx],
                       **{k: getattr(self, k)[idx] for k in per_row})

    def sampling(self) -> np.ndarray:
        """``[N]`` the sampling setting of each root as a string key."""
        return np.array([sampling_key(t, p) for t, p in zip(self.temperature.tolist(), self.top_p.tolist(), strict=True)])

    def valid_outputs(self, idx: np.ndarray | None = None) -> np.ndarray:
        """``[O]`` the outputs a decision may pick: distinct steps (`OutputLayout.distinct`) with a finite label
        at every root (of ``idx``)."""
        labels = self.labels if idx is None else self.labels[idx]
        return np.all(np.isfinite(labels), axis=0) & np.asarray(self.layout.distinct(), dtype=bool)

    def static_base_rate(self, fit: np.ndarray) -> np.ndarray:
        """``[N]`` Ê / T of the best static output of each root's sampling setting, chosen on ``fit`` rows
        (the whole fit set's best static for a setting the fit rows lack): the paper's TPS_base."""
        keys = self.sampling()
        E = np.where(self.valid_outputs(fit), self.labels, np.nan)
        best_all = throughput.best_static(E[fit], self.cost_static[fit])
        f = np.unique(fit)  # sorted, as the per-key rows were summed before
        a_by_key = throughput.best_static_by_group(E[f], self.cost_static[f], keys[f], keys, best_all)
        a = np.array([a_by_key[k] for k in keys], dtype=np.int64)
        rows = np.arange(len(self))
        return (self.labels[rows, a] / self.cost_static[rows, a]).astype(np.float64)


def chain_labels(labels: np.ndarray, label_se: np.ndarray, actions) -> tuple[tuple, np.ndarray, np.ndarray]:
    """A chain selector's outputs and labels from the grid's: ``(chains, Ê [N, C], se [N, C])``.

    The chains are ``(1, n, 0)`` for every draft length n that a chain of the grid drafts (``K = 1``, or ``L2 = 0``
    at the smallest K), n = 0 (a plain step) included. Chains of equal length are the same draft in distribution
    (`decoding.actions`), so a length's label is the mean of its chains' labels (each an unbiased estimate from
    its own draws) and its standard error ``sqrt(sum se^2) / count``. Under any OT verifier a chain is verified by
    standard speculative sampling (ALGORITHMS.md section 3.1, k = 1): these are the labels of ``naive``."""
    from decoding.actions import Action

    k_min = min(a.K for a in actions)
    by_length: dict[int, list[int]] = {}
    for i, a in enumerate(actions):
        if a.K == 1 or (a.L2 == 0 and a.K == k_min):
            by_length.setdefault(a.tree_size, []).append(i)
    if not by_length:
        raise SelectorDataError("the action grid holds no chain (K = 1, or L2 = 0): no chain selector to train")
    lengths = sorted(by_length)
    E = np.stack([labels[:, by_length[n]].mean(axis=1) for n in lengths], axis=1).astype(np.float32)  # [N, C]
    se = np.stack([np.sqrt((label_se[:, by_length[n]].astype(np.float64) ** 2).sum(axis=1)) / len(by_length[n])
                   for n in lengths], axis=1).astype(np.float32)
    return tuple(Action(1, n, 0) for n in lengths), E, se


def _column(columns, name: str, dtype) -> np.ndarray:
    arr = columns[name]
    if isinstance(arr, np.ndarray) and arr.dtype != object:
        return arr.astype(dtype, copy=False)
    return np.stack([np.asarray(v, dtype=dtype) for v in arr]) if len(arr) else np.zeros((0,), dtype)


@dataclass(frozen=True)
class Labels:
    """The collected labels per method: Ê ``[N, A]`` and its standard errors (None: unknown, taken as 0)."""

    estimate: Mapping[str, np.ndarray]
    se: Mapping[str, np.ndarray] | None = None


def build_selector_data(columns, labels: Labels, schema: FeatureSchema, layout: OutputLayout, latency,
                        inference_seconds: float = 0.0) -> SelectorData:
    """`SelectorData` from a collected dataset's columns (``columns[name]`` -> array, e.g.
    ``datasets.Dataset.with_format("numpy")``) and its `Labels`."""
    labels, label_se = labels.estimate, labels.se
    missing = [m for m in layout.methods if m not in labels]
    if missing:
        raise SelectorDataError(f"no labels for methods {missing}; the dataset has {sorted(labels)}")
    ctx = _column(columns, "context_length", np.int64)
    inputs = batch_inputs(schema, columns, latency)  # the one place that builds inputs from dataset columns
    E = np.concatenate([np.asarray(labels[m], dtype=np.float32) for m in layout.methods], axis=1)  # [N, O]
    se = (np.concatenate([np.asarray(label_se[m], dtype=np.float32) for m in layout.methods], axis=1)
          if label_se is not None else np.zeros_like(E))
    if E.shape[1] != layout.size:
        raise SelectorDataError(f"labels have {E.shape[1]} columns, the layout {layout.size} outputs "
                         "(was the dataset collected on another action grid?)")
    features = schema.feature_set
    actions, methods = list(layout.actions), layout.methods
    return SelectorData(
        schema=schema, layout=layout, inputs=inputs, labels=E, label_se=se,
        cost=pricing.step_seconds(latency, ctx, actions, methods, features, inference_seconds),
        cost_static=pricing.step_seconds(latency, ctx, actions, methods),
        cost_ar=pricing.step_seconds(latency, ctx, [AR])[:, 0],
        split=np.asarray(columns["split"]).astype(str), prompt_id=np.asarray(columns["prompt_id"]).astype(str),
        source=np.asarray(columns["source"]).astype(str),
        temperature=_column(columns, "temperature", np.float64).round(6),
        top_p=_column(columns, "top_p", np.float64).round(6), context_length=ctx,
        traversal=np.asarray(labels["traversal"], dtype=np.float32) if "traversal" in labels else None,
        meta={"inference_seconds": float(inference_seconds)})


class _Rows(Dataset):
    """Rows of `SelectorData` as tensors: (inputs..., labels, label_se, cost, base_rate)."""

    def __init__(self, data: SelectorData, idx: np.ndarray, base_rate: np.ndarray) -> None:
        self.tensors = [torch.from_numpy(np.ascontiguousarray(data.inputs[k][idx], dtype=np.float32))
                        for k in data.schema.input_shapes()]
        self.tensors += [torch.from_numpy(np.ascontiguousarray(a[idx], dtype=np.float32))
                         for a in (data.labels, data.label_se, data.cost, base_rate)]

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


class SelectorDataModule(pl.LightningDataModule):
    """Train / val loaders over `SelectorData` (splits as collected, by prompt)."""

    def __init__(self, data: SelectorData, batch_size: int = 256, seed: int = 0) -> None:
        super().__init__()
        self.data, self.batch_size, self.seed = data, int(batch_size), int(seed)
        self.train_idx, self.val_idx = data.rows("train"), data.rows("val")
        if self.train_idx.size == 0:
            raise SelectorDataError("the collected dataset has no train roots; collect with collect.splits including train")
        if self.val_idx.size == 0:
            raise SelectorDataError("the collected dataset has no val roots (needed for validation and checkpointing); "
                             "collect with collect.splits including val")
        self.base_rate = data.static_base_rate(self.train_idx)  # [N]

    def standardization(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(mean, std) per input over the TRAIN rows only."""
        out = {}
        for name, x in self.data.inputs.items():
            xt = x[self.train_idx].astype(np.float64)
            out[name] = (xt.mean(axis=0), xt.std(axis=0))
        return out

    def full_batch(self, split: str = "train") -> tuple[torch.Tensor, ...]:
        """Every row of ``split`` as one batch (inputs..., labels, label_se, cost, base_rate)."""
        idx = {"train": self.train_idx, "val": self.val_idx}.get(split, self.data.rows(split))
        return tuple(_Rows(self.data, idx, self.base_rate).tensors)

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(_Rows(self.data, self.train_idx, self.base_rate), batch_size=self.batch_size,
                          shuffle=True, generator=gen, drop_last=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_Rows(self.data, self.val_idx, self.base_rate), batch_size=4096, shuffle=False)
