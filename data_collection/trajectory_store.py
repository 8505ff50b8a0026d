"""Trajectories: target-sampled continuations of every prompt, sampled once and stored as token ids.

Terms:
- *trajectory*: one prompt (chat-formatted, as token ids) and one continuation the target sampled after it
  at one sampling setting (temperature then top-p, `decoding.sampling`), with the prompt's id, source and
  split (`data_collection.prompts.SPLITS`). ``sample`` numbers the trajectories of one (prompt, setting).
- *setting*: a (temperature, top_p) pair of the sampling grid. ``draft`` prompts are sampled at T = 1,
  top-p 1 (what distillation needs); train/val/test prompts at grid settings.

Storage: a folder with ``trajectories.parquet`` (one row per trajectory; loadable with
``datasets.load_dataset("parquet", data_files=...)``) and ``manifest.json`` (the stage's config, the
target's spec, fingerprint and tokenizer, counts per split, the row count and the Parquet's sha256).
Both are written temp-then-rename, the Parquet first, so a reader never sees a manifest without its data.
`load_trajectories` checks the checksum and the schema and raises `TrajectoryError` (one clear line)
on a missing, corrupt or mismatching folder.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from data_collection.prompts import SPLITS
from decoding.errors import UserInputError
from decoding.files import sha256_file, write_json_atomic
from decoding.sampling import sampling_key

PARQUET_FILE = "trajectories.parquet"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
COLUMNS = ("prompt_id", "source", "split", "temperature", "top_p", "sample", "prompt_ids", "continuation_ids")
REBUILD = "rebuild it with `branchpoint trajectories` (or `dvc repro trajectories`)"


class TrajectoryError(UserInputError):
    """A trajectories folder that is missing, corrupt, or does not match what the caller needs."""


@dataclass(frozen=True)
class Trajectory:
    prompt_id: str
    source: str
    split: str  # one of data_collection.prompts.SPLITS
    temperature: float
    top_p: float
    sample: int
    prompt_ids: list[int]  # token ids of the chat-formatted prompt
    continuation_ids: list[int]  # target-sampled tokens (EOS included when it ended the sample)

    @property
    def setting(self) -> tuple[float, float]:
        return (self.temperature, self.top_p)


def save_trajectories(folder: str | Path, trajectories: Sequence[Trajectory], manifest: dict) -> Path:
    """Write ``trajectories`` and ``manifest`` (plus counts, row count and checksum) into ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = sorted({t.split for t in trajectories} - set(SPLITS))
    if bad:
        raise ValueError(f"unknown splits {bad}; splits are {SPLITS}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "prompt_id": pa.array([t.prompt_id for t in trajectories], pa.string()),
        "source": pa.array([t.source for t in trajectories], pa.string()),
        "split": pa.array([t.split for t in trajectories], pa.string()),
        "temperature": pa.array([t.temperature for t in trajectories], pa.float64()),
        "top_p": pa.array([t.top_p for t in trajectories], pa.float64()),
        "sample": pa.array([t.sample for t in trajectories], pa.int32()),
        "prompt_ids": pa.array([t.prompt_ids for t in trajectories], pa.list_(pa.int32())),
        "continuation_ids": pa.array([t.continuation_ids for t in trajectories], pa.list_(pa.int32())),
    })
    parquet = folder / PARQUET_FILE
    tmp = parquet.with_name(f".{PARQUET_FILE}.tmp{os.getpid()}")
    pq.write_table(table, tmp)
    digest = sha256_file(tmp)
    os.replace(tmp, parquet)
    full = {
        **manifest,
        "format_version": FORMAT_VERSION,
        "parquet": PARQUET_FILE,
        "rows": len(trajectories),
        "sha256": digest,
        "counts": summarize(trajectories),
    }
    write_json_atomic(folder / MANIFEST_FILE, full)
    return folder


def summarize(trajectories: Iterable[Trajectory]) -> dict:
    """Per split: trajectories, continuation tokens and trajectories per setting ("T=1.0,top_p=1.0")."""
    out: dict[str, dict] = {}
    for t in trajectories:
        entry = out.setdefault(t.split, {"trajectories": 0, "tokens": 0, "settings": Counter()})
        entry["trajectories"] += 1
        entry["tokens"] += len(t.continuation_ids)
        entry["settings"][sampling_key(t.temperature, t.top_p)] += 1
    return {s: {**v, "settings": dict(sorted(v["settings"].items()))} for s, v in sorted(out.items())}


def read_trajectory_manifest(path: str | Path) -> dict:
    """The manifest of the trajectories folder ``path`` (a clear error when missing or unreadable)."""
    folder = _folder(path)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise TrajectoryError(f"no trajectories at {folder}/ ({MANIFEST_FILE} missing); {REBUILD}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrajectoryError(f"{manifest_path} is not valid JSON ({e}); {REBUILD}") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        raise TrajectoryError(f"{manifest_path}: format {version!r} is not {FORMAT_VERSION}; {REBUILD}")
    return manifest


def load_trajectories(path: str | Path, splits: Iterable[str] | None = None) -> list[Trajectory]:
    """The trajectories stored in folder ``path`` (or its Parquet file), those of ``splits`` only when given.

    Raises `TrajectoryError` when the folder is missing, the checksum or row count disagrees with the
    manifest, or the Parquet lacks a column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = _folder(path)
    manifest = read_trajectory_manifest(folder)
    wanted = None if splits is None else set(splits)
    if wanted is not None and wanted - set(SPLITS):
        raise ValueError(f"unknown splits {sorted(wanted - set(SPLITS))}; splits are {SPLITS}")
    parquet = folder / manifest.get("parquet", PARQUET_FILE)
    if not parquet.is_file():
        raise TrajectoryError(f"{parquet} is missing (the manifest names it); {REBUILD}")
    if sha256_file(parquet) != manifest.get("sha256"):
        raise TrajectoryError(f"{parquet} does not match the sha256 in its manifest (corrupt or replaced); {REBUILD}")
    try:
        table = pq.read_table(parquet)
    except (pa.ArrowException, OSError) as e:
        raise TrajectoryError(f"{parquet} cannot be read as Parquet ({e}); {REBUILD}") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing or table.num_rows != manifest.get("rows"):
        what = f"columns {missing} missing" if missing else f"{table.num_rows} rows, manifest says {manifest.get('rows')}"
        raise TrajectoryError(f"{parquet}: {what}; {REBUILD}")
    cols = {c: table.column(c).to_pylist() for c in COLUMNS}
    out = []
    for i in range(table.num_rows):
        if wanted is None or cols["split"][i] in wanted:
            out.append(Trajectory(**{c: cols[c][i] for c in COLUMNS}))
    return out


def check_target(manifest: dict, fingerprint_difference: str | None, where: str) -> None:
    """Raise `TrajectoryError` when the trajectories were sampled from another target.

    ``fingerprint_difference``: `models.self_draft.fingerprint_difference(manifest["target_fingerprint"], target)`.
    """
    if fingerprint_difference is not None:
        raise TrajectoryError(
            f"{where}: the trajectories were sampled from another target ({fingerprint_difference}; "
            f"manifest target {manifest.get('target')!r}); {REBUILD}"
        )


def _folder(path: str | Path) -> Path:
    path = Path(path)
    return path.parent if path.suffix == ".parquet" or path.name == MANIFEST_FILE else path
