"""data_collection/dataset_schema.py: RootRows -> shard table -> label matrix, one naming of the columns."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from data_collection.dataset import DatasetError, label_matrix
from data_collection.dataset_schema import (
    SECONDS_KINDS,
    is_label_column,
    label_column,
    label_se_column,
    rows_table,
    seconds_column,
    trajectory_key,
)
from data_collection.root_collector import RootRows
from decoding.features import PROBABILITY_SCALARS

A = 3


def _rows(n: int, rng) -> RootRows:
    rows = RootRows()
    for i in range(n):
        rows.position.append(10 + i)
        rows.root_token.append(i)
        rows.h_p_prev.append(rng.standard_normal(4).astype(np.float16))
        rows.h_q_prev.append(rng.standard_normal(2).astype(np.float16))
        rows.h_q_root.append(rng.standard_normal(2).astype(np.float16))
        rows.e_root.append(rng.standard_normal(4).astype(np.float16))
        rows.probability_scalars.append(rng.random(len(PROBABILITY_SCALARS)))
        for m in ("traversal", "specinfer"):
            rows.labels.setdefault(m, []).append(1 + rng.random(A))
            rows.label_se.setdefault(m, []).append(rng.random(A) / 10)
        for k in SECONDS_KINDS:
            rows.seconds[k].append(0.01 * (i + 1))
    return rows


def test_rows_table_round_trips_through_label_matrix():
    import datasets

    rng = np.random.default_rng(0)
    traj = SimpleNamespace(prompt_id="p1", source="math", split="train", temperature=0.6, top_p=1.0, sample=0)
    rows = _rows(2, rng)
    table = rows_table([traj], [rows], ["traversal", "specinfer"], A)
    ds = datasets.Dataset(table)
    for m in ("traversal", "specinfer"):
        np.testing.assert_allclose(label_matrix(ds, m), np.stack(rows.labels[m]).astype(np.float32))
        assert label_se_column(m) in table.column_names
    assert table.column("key").to_pylist() == [trajectory_key(traj)] * 2 == ["p1|T=0.6|top_p=1.0|0"] * 2
    assert {seconds_column(k) for k in SECONDS_KINDS} <= set(table.column_names)
    assert sorted(c for c in table.column_names if is_label_column(c)) == ["E_specinfer", "E_traversal"]
    np.testing.assert_array_equal(np.asarray(ds.with_format("numpy")["e_root"]), np.stack(rows.e_root))
    with pytest.raises(DatasetError, match="no labels for method 'gbv'.*E_specinfer"):
        label_matrix(ds, "gbv")


def test_label_and_error_columns_differ():
    assert label_column("bv") != label_se_column("bv") and not is_label_column(label_se_column("bv"))


def test_stable_hash64_pins_the_seeded_hashes():
    """Root seeds and the prompt split depend on these exact numbers (labels must stay bit-identical)."""
    from data_collection.prompts import unit_hash
    from data_collection.root_collector import root_seed
    from decoding.files import stable_hash64

    assert stable_hash64("0|p1|T=1.0|top_p=1.0|0|17") == 1673228781000335547
    assert stable_hash64("0\x00p1", "big") == 4759552186125548297
    assert unit_hash(0, "p1") == 4759552186125548297 / 2**64
    a = root_seed(0, "p1|T=1.0|top_p=1.0|0", 17).random(3)
    np.testing.assert_array_equal(a, np.random.default_rng(1673228781000335547).random(3))
