"""The collected roots as every offline estimate reads them: one table of labels, step prices and root columns.

An `OfflineTable` holds, for the N roots of a collected dataset (`data_collection.dataset`) and the action grid it
was collected on:

- ``labels[method]``: Ê ``[N, A]`` of each labelled verification method (ALGORITHMS.md section 4);
- ``seconds[method]``: T ``[N, A]``, what a step of each action costs at each root's context when ``method``
  verifies it and nothing is decided (`decoding.pricing.step_seconds`, no feature cost: a static policy);
- ``columns``: the roots' split, context length, sampling setting, prompt source and, when collected, the draft's
  distance to the target at the root (`ROOT_COLUMNS`).

The estimators over it are `decoding.throughput`'s (the decode path, docs/throughput.md); collect's summary and
evaluate's offline table read the same `OfflineTable`. The selector's training rows (features, standard errors)
are `selector.data`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from decoding import pricing
from decoding.actions import ActionSpace
from decoding.errors import UserInputError

from .dataset import load_collected, read_dataset_manifest
from .dataset_schema import label_column

ROOT_COLUMNS = ("split", "context_length", "temperature", "top_p", "source", "l1_p_q_prev")


@dataclass(frozen=True)
class OfflineTable:
    """Labels, step prices and root columns of N collected roots (module docstring)."""

    space: ActionSpace
    labels: dict[str, np.ndarray]
    seconds: dict[str, np.ndarray]
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["split"])

    def split_rows(self, split: str, all_when_missing: bool = True) -> np.ndarray:
        """``[N]`` bool: the roots of ``split``; every root when none is of it and ``all_when_missing``."""
        rows = self.columns["split"] == split
        return rows if rows.any() or not all_when_missing else np.ones(len(self), bool)

    def rows(self, mask: np.ndarray) -> OfflineTable:
        """The table of the roots where ``mask`` holds."""
        return replace(self, labels={m: e[mask] for m, e in self.labels.items()},
                       seconds={m: t[mask] for m, t in self.seconds.items()},
                       columns={c: v[mask] for c, v in self.columns.items()})


def load_offline_table(collect_out: str | Path, space: ActionSpace, latency, priced: Sequence[str] = (),
                       methods: Sequence[str] | None = None, columns: Sequence[str] = ()) -> OfflineTable:
    """The `OfflineTable` of the dataset at ``collect_out``, collected on ``space`` (a clear error otherwise): the
    labels of ``methods`` (None: every collected method), the step seconds of each of ``priced`` (the verification
    methods to price; none: `decoding.pricing.VERIFY_REFERENCE`), and ``columns`` besides `ROOT_COLUMNS`."""
    manifest = read_dataset_manifest(collect_out)
    actions = [str(a) for a in space]
    if manifest["actions"] != actions:
        raise UserInputError(f"{collect_out} was collected on another action grid ({len(manifest['actions'])} "
                             f"actions) than actions.* ({len(actions)}); re-collect or set actions.* to its grid "
                             f"{manifest.get('grid')}")
    collected = list(manifest["methods"])
    methods = collected if methods is None else list(methods)
    missing = [m for m in methods if m not in collected]
    if missing:
        raise UserInputError(f"{collect_out} has no labels for {missing} (collected: {collected}); add them to "
                             "collect.methods and re-collect")
    ds = load_collected(collect_out)
    wanted = tuple(dict.fromkeys((*ROOT_COLUMNS, *columns)))  # a root column asked for again is read once
    keep = [c for c in (*wanted, *(label_column(m) for m in methods)) if c in ds.column_names]
    data = ds.select_columns(keep).with_format("numpy")[:]
    columns = {c: np.asarray(data[c]) for c in wanted if c in data}
    labels = {m: np.asarray(data[label_column(m)], dtype=np.float64) for m in methods}
    ctx = columns["context_length"]
    seconds = {m: pricing.step_seconds(latency, ctx, space, [m]) for m in dict.fromkeys(priced)} if priced else \
        {pricing.VERIFY_REFERENCE: pricing.step_seconds(latency, ctx, space)}
    return OfflineTable(space, labels, seconds, columns)
