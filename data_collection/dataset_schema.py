"""The collected dataset's row schema: the one place its column names and types are written.

Each row is one root c of a trajectory: its identity (``key``, ``prompt_id``, ``source``, ``split``, the
sampling setting, ``position`` = ``context_length``, ``root_token``), the hidden states of the features
(`decoding.features.HIDDEN_COLUMNS`: ``h_p_prev``, ``h_q_prev``, ``h_q_root``, ``e_root``, float16), the probability scalars
(`decoding.features.PROBABILITY_SCALARS`), per method the labels Ê(c, a) over the action space and their
standard errors (`label_column`, `label_se_column`), and the collection's seconds per root
(`seconds_column`). `rows_table` writes `RootRows` (data_collection/root_collector.py) as one shard's table;
`data_collection.dataset.label_matrix` reads a method's labels back as ``[N, A]``.
"""

from __future__ import annotations

SECONDS_KINDS = ("draft", "target", "labels")


def label_column(method: str) -> str:
    """The column of ``method``'s labels Ê(c, a): one fixed-size list of A floats per root."""
    return f"E_{method}"


def label_se_column(method: str) -> str:
    """The column of the standard errors of ``method``'s labels (over the union trees)."""
    return f"E_se_{method}"


def is_label_column(name: str) -> bool:
    return name.startswith("E_") and not name.startswith("E_se_")


def seconds_column(kind: str) -> str:
    """Seconds per root spent on ``kind`` (one of `SECONDS_KINDS`)."""
    return f"seconds_{kind}"


def trajectory_key(t) -> str:
    """The ``key`` column: one trajectory (prompt, sampling setting, sample)."""
    return f"{t.prompt_id}|T={t.temperature}|top_p={t.top_p}|{t.sample}"


def rows_table(trajs, rows_list, methods, space_size: int):
    """One shard's pyarrow table from the collected `RootRows` of its trajectories (the columns above)."""
    import numpy as np
    import pyarrow as pa

    from decoding.features import HIDDEN_COLUMNS, PROBABILITY_SCALARS

    cols: dict[str, list] = {k: [] for k in ("key", "prompt_id", "source", "split", "temperature", "top_p",
                                             "sample", "position", "context_length", "root_token")}
    hidden = {k: [] for k in HIDDEN_COLUMNS}
    scalars: list[np.ndarray] = []
    labels = {m: [] for m in methods}
    se = {m: [] for m in methods}
    secs = {k: [] for k in SECONDS_KINDS}
    for t, rows in zip(trajs, rows_list, strict=True):
        for i, r in enumerate(rows.position):
            for k, v in (("key", trajectory_key(t)), ("prompt_id", t.prompt_id), ("source", t.source),
                         ("split", t.split), ("temperature", t.temperature), ("top_p", t.top_p),
                         ("sample", t.sample), ("position", r), ("context_length", r),
                         ("root_token", rows.root_token[i])):
                cols[k].append(v)
            for k in hidden:
                hidden[k].append(getattr(rows, k)[i])
            scalars.append(rows.probability_scalars[i])
            for m in methods:
                labels[m].append(rows.labels[m][i])
                se[m].append(rows.label_se[m][i])
            for k in secs:
                secs[k].append(rows.seconds[k][i])
    types = {"key": pa.string(), "prompt_id": pa.string(), "source": pa.string(), "split": pa.string(),
             "temperature": pa.float32(), "top_p": pa.float32(), "sample": pa.int32(), "position": pa.int32(),
             "context_length": pa.int32(), "root_token": pa.int32()}
    arrays = {k: pa.array(v, type=types[k]) for k, v in cols.items()}

    def fixed(vectors: list, dtype, width: int):
        flat = np.concatenate([np.asarray(v).reshape(-1) for v in vectors]) if vectors else np.zeros(0)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.astype(dtype.to_pandas_dtype())), width)

    for k, v in hidden.items():
        width = int(np.asarray(v[0]).shape[0]) if v else 1
        arrays[k] = fixed(v, pa.float16(), width)
    sc = np.stack(scalars) if scalars else np.zeros((0, len(PROBABILITY_SCALARS)))
    for j, name in enumerate(PROBABILITY_SCALARS):
        arrays[name] = pa.array(sc[:, j].astype(np.float32))
    for m in methods:
        arrays[label_column(m)] = fixed(labels[m], pa.float32(), space_size)
        arrays[label_se_column(m)] = fixed(se[m], pa.float32(), space_size)
    for k, v in secs.items():
        arrays[seconds_column(k)] = pa.array(v, type=pa.float32())
    return pa.table(arrays)
