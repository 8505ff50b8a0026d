"""The collected dataset on disk: Parquet shards plus a manifest, resumable and mergeable.

Layout of the output folder (``collect.out``)::

    shards/part-<i>of<N>-<chunk>.parquet   one chunk of trajectories of process i of N
    manifest-<i>of<N>.json                 what process i has written (config hash, shards with sha256)
    manifest.json                          the merged manifest of all processes (what readers use)

Every file is written to a temporary name and renamed, so a killed process leaves only complete
files. A shard counts as done only when the process manifest lists it with a matching sha256; on
restart a missing, truncated or corrupt shard is collected again. A manifest whose config hash differs
from the current run is refused with one line naming the differing keys (or wiped with ``restart``).

Columns (one row per root): metadata (``key``, ``prompt_id``, ``source``, ``split``, ``temperature``,
``top_p``, ``sample``, ``position``, ``context_length``, ``root_token``), features (``h_p_prev``,
``h_q_prev``, ``h_q_root``, ``e_root`` as float16 vectors and the stored scalars of `decoding.features`), labels
(``E_<method>``: Ê(c, a) for every action of the grid, float32 [A]; ``E_se_<method>``: its standard
error over the union trees) and timings (``seconds_draft``, ``seconds_target``, ``seconds_labels``).
Load with `load_collected` (a ``datasets.Dataset``) or ``datasets.load_dataset("parquet", ...)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from decoding.errors import UserInputError
from decoding.files import read_json, sha256_file, write_json_atomic

from .dataset_schema import is_label_column, label_column

FORMAT_VERSION = 2  # 2: the e_root column (decoding.features.HIDDEN_COLUMNS)
MANIFEST = "manifest.json"
SHARD_DIR = "shards"


class DatasetError(UserInputError):
    """A collected dataset that is missing, corrupt or made with another configuration."""


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def diff_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts, as ``key: old -> new``."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def process_manifest_path(out: Path, index: int, count: int) -> Path:
    return out / f"manifest-{index}of{count}.json"


def shard_name(index: int, count: int, chunk: int) -> str:
    return f"{SHARD_DIR}/part-{index}of{count}-{chunk:05d}.parquet"


class ShardWriter:
    """Process i of N: which chunks are done, and atomic shard writes that update its manifest."""

    def __init__(self, out: str | Path, index: int, count: int, header: dict, restart: bool = False) -> None:
        self.out, self.index, self.count = Path(out), index, count
        self.path = process_manifest_path(self.out, index, count)
        self.header = header
        if restart and self.out.exists():
            shutil.rmtree(self.out)
        self.manifest = self._open()

    def _open(self) -> dict:
        existing = [p for p in self.out.glob("manifest-*of*.json")] if self.out.exists() else []
        for p in existing:
            try:
                old = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # unreadable: this process rewrites its own; others are checked at merge
            if old.get("config_hash") != self.header["config_hash"]:
                diff = diff_keys(old.get("config", {}), self.header["config"])
                raise DatasetError(
                    f"{self.out} holds roots collected with another configuration (config hash "
                    f"{old.get('config_hash')} vs {self.header['config_hash']}; differs: "
                    f"{'; '.join(diff[:6]) or 'unknown keys'}). Refusing to append: choose another collect.out "
                    "or rerun with --restart to delete it.")
        if self.path.exists():
            try:
                m = json.loads(self.path.read_text())
                m.update({k: v for k, v in self.header.items() if k != "shards"})
                return m
            except json.JSONDecodeError:
                pass
        return {**self.header, "shards": {}}

    def done(self, chunk: int) -> bool:
        """Whether ``chunk``'s shard is listed and its file matches the recorded sha256."""
        entry = self.manifest["shards"].get(str(chunk))
        if entry is None:
            return False
        path = self.out / entry["file"]
        if path.is_file() and sha256_file(path) == entry["sha256"]:
            return True
        print(f"collect: shard {entry['file']} is missing or corrupt (checksum mismatch); collecting it again")
        return False

    def write(self, chunk: int, table) -> dict:
        """Write one chunk's table (pyarrow) as a shard, then record it in the process manifest."""
        import pyarrow.parquet as pq

        name = shard_name(self.index, self.count, chunk)
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        entry = {"file": name, "rows": int(table.num_rows), "sha256": sha256_file(path)}
        self.manifest["shards"][str(chunk)] = entry
        write_json_atomic(self.path, self.manifest)
        return entry


def merge_manifests(out: str | Path, expected_count: int | None = None) -> dict:
    """Join the process manifests of ``out`` into ``manifest.json`` (checks hashes, shards and sha256)."""
    out = Path(out)
    parts = sorted(out.glob("manifest-*of*.json"))
    if not parts:
        raise DatasetError(f"{out}: no process manifests (manifest-<i>of<N>.json) to merge; run collect first")
    manifests = [json.loads(p.read_text()) for p in parts]
    hashes = {m["config_hash"] for m in manifests}
    if len(hashes) != 1:
        raise DatasetError(f"{out}: process manifests disagree on the config hash ({sorted(hashes)}); "
                           "they were collected with different configurations")
    counts = {m["shard"]["count"] for m in manifests}
    count = counts.pop() if len(counts) == 1 else None
    indices = sorted(m["shard"]["index"] for m in manifests)
    if count is None or indices != list(range(count)) or (expected_count and count != expected_count):
        raise DatasetError(f"{out}: expected process manifests 0..N-1 of one N, found {[p.name for p in parts]}")
    incomplete = [m["shard"]["index"] for m in manifests if not m.get("complete")]
    if incomplete:
        raise DatasetError(f"{out}: processes {incomplete} have not finished; rerun them (they resume) before merging")
    shards = []
    for m in manifests:
        for chunk in sorted(m["shards"], key=int):
            entry = m["shards"][chunk]
            if sha256_file(out / entry["file"]) != entry["sha256"]:
                raise DatasetError(f"{out / entry['file']}: checksum mismatch; rerun collect to re-collect it")
            shards.append(entry)
    merged = {k: v for k, v in manifests[0].items() if k not in ("shards", "shard", "complete")}
    merged.update({"shards": shards, "processes": count, "rows": sum(s["rows"] for s in shards)})
    write_json_atomic(out / MANIFEST, merged)
    return merged


def read_dataset_manifest(out: str | Path) -> dict:
    return read_json(Path(out) / MANIFEST, DatasetError, "run `branchpoint collect` (or `dvc repro collect`) first")


def load_collected(out: str | Path, splits: Iterable[str] | None = None, verify: bool = True):
    """The merged dataset as a ``datasets.Dataset`` (optionally only some splits), checksums verified."""
    import datasets

    out = Path(out)
    manifest = read_dataset_manifest(out)
    files = []
    for s in manifest["shards"]:
        path = out / s["file"]
        if verify and (not path.is_file() or sha256_file(path) != s["sha256"]):
            raise DatasetError(f"{path}: missing or checksum mismatch; rerun collect to re-collect it")
        files.append(str(path))
    if not files:
        raise DatasetError(f"{out}: the manifest lists no shards (no roots were collected)")
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    if splits is not None:
        keep = set(splits)
        ds = ds.filter(lambda s: s in keep, input_columns="split")
    return ds


def label_matrix(ds, method: str) -> np.ndarray:
    """``[N, A]`` float64 Ê of ``method`` from a loaded dataset."""
    col = label_column(method)
    if col not in ds.column_names:
        raise DatasetError(f"the dataset has no labels for method {method!r} (columns: "
                           f"{[c for c in ds.column_names if is_label_column(c)]})")
    return np.asarray(ds.with_format("numpy")[col], dtype=np.float64)
