"""``branchpoint collect``: stage collect, features + measured block efficiency at every root.

Reads: the trajectories (``trajectories.out``; splits ``collect.splits``, never the draft's prompts), the
pair (``model.*``), the latency profile (``profile.out``, for the metrics only), params ``actions.*`` and
``collect.*``. Writes: ``collect.out`` (Parquet shards + manifests, `data_collection.dataset`) and
``collect.metrics`` (metrics/collect.json).

Scale-out: ``--shard i/N`` (or torchrun's RANK / WORLD_SIZE) takes the prompts whose stable hash falls in
part i and writes only its own shards and ``manifest-<i>of<N>.json``; ``--merge`` joins the parts into
``manifest.json`` and writes the metrics (done automatically when N = 1). An interrupted run resumes
where it stopped (a shard is the unit); a run with a different configuration refuses to append unless
``--restart`` is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

from data_collection.dataset_schema import trajectory_key  # noqa: F401  (the collect keys; tests import it here)
from decoding.errors import UserInputError
from decoding.files import sha256_file, stable_hash64

SECTIONS = ("model", "trajectories", "actions", "profile", "collect")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="collect only part I of N of the prompts (default: RANK/WORLD_SIZE under torchrun, "
                             "else 0/1)")
    parser.add_argument("--merge", action="store_true",
                        help="join the finished parts' manifests into manifest.json and write the metrics")
    parser.add_argument("--restart", action="store_true",
                        help="delete collect.out first (needed after a configuration change)")
    parser.add_argument("--restart-on-change", action="store_true",
                        help="delete collect.out only when it was collected with another configuration "
                             "(what `dvc repro` uses: changed params mean stale labels)")


def parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        return (int(rank), int(world)) if rank is not None and world is not None else (0, 1)
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserInputError(f"--shard {text!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise UserInputError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def prompt_part(prompt_id: str, count: int) -> int:
    """The part (of ``count``) a prompt belongs to: a stable hash, so every process agrees."""
    return stable_hash64(prompt_id) % count


def draft_digest(folder: str | Path) -> str:
    """The identity of a trained draft artifact (either kind) in a dataset's config hash: its weights and its config without
    ``extra`` (the training run's bookkeeping: seconds, record counts, MLflow run id), so a retrain to the same
    weights keeps the collected rows valid and other weights or another config do not."""
    from models.self_draft import CONFIG_FILE, WEIGHTS_FILE, read_raw_config

    folder = Path(folder)
    read_raw_config(folder)  # a clear error when the folder is not an artifact
    config = {k: v for k, v in json.loads((folder / CONFIG_FILE).read_text()).items() if k != "extra"}
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    h.update(bytes.fromhex(sha256_file(folder / WEIGHTS_FILE)))
    return h.hexdigest()[:16]


def trajectories_digest(folder: str | Path) -> str:
    """The identity of a trajectories folder in a dataset's config hash: the sha256 of its Parquet (the tokens
    collect reads), not the manifest's bookkeeping (sampling seconds, speed, batch size)."""
    from data_collection.trajectory_store import (
        PARQUET_FILE,
        REBUILD,
        TrajectoryError,
        read_trajectory_manifest,
    )

    folder = Path(folder)
    parquet = folder / read_trajectory_manifest(folder).get("parquet", PARQUET_FILE)
    if not parquet.is_file():
        raise TrajectoryError(f"{parquet} is missing (the manifest names it); {REBUILD}")
    return sha256_file(parquet)[:16]


def code_digest(root: Path | None = None) -> str:
    """sha256 (16 hex digits) of the source of every project module stage collect runs (`pipeline.stage_deps.code_deps`
    from its entry modules, under ``root``, default this checkout). Part of the configuration hash: rows computed by
    other code (an engine edit, a draft's inference path) are never appended to, and ``--restart-on-change`` starts
    over, as dvc reruns the stage."""
    from pipeline.stage_deps import ROOT, code_deps

    root = ROOT if root is None else Path(root)
    digest = hashlib.sha256()
    for rel in code_deps(["pipeline.cli", "pipeline.collect", "pipeline.sections"], root):
        path = root / rel
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file() and "__pycache__" not in f.parts:
                digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def _header(cfg, pair, space) -> dict:
    import numpy
    import torch
    import transformers

    from data_collection.dataset import FORMAT_VERSION, config_hash
    from decoding.features import FeatureSchema
    from models.loading import TRAINED_DRAFTS, parse_spec

    scheme, rest = parse_spec(cfg.model.draft)
    draft_id = draft_digest(rest) if scheme in TRAINED_DRAFTS else cfg.model.draft
    c = cfg.collect
    config = {
        "format_version": FORMAT_VERSION,  # the row schema: a dataset of another version is never appended to
        "model": {"target": cfg.model.target, "draft": cfg.model.draft, "draft_digest": draft_id,
                  "dtype": cfg.model.dtype, "backend": cfg.model.backend, "compile": cfg.model.compile},
        "trajectories": trajectories_digest(cfg.trajectories.out),
        "code": code_digest(),
        "actions": {"K": cfg.actions.K, "L1": cfg.actions.L1, "L2": cfg.actions.L2},
        "collect": {k: getattr(c, k) for k in ("splits", "methods", "num_trees", "root_stride",
                                                "max_roots_per_trajectory", "shard_size", "seed")},
    }
    hidden = {"target": int(pair.target.config.hidden_size), "draft": int(pair.draft.config.hidden_size)}
    return {
        "format_version": FORMAT_VERSION, "config_hash": config_hash(config), "config": config,
        "pair": {"target": cfg.model.target, "draft": cfg.model.draft, "draft_digest": draft_id,
                 "vocab_size": pair.vocab_size, "tokenizer": type(pair.tokenizer).__name__,
                 "tokenizer_size": len(pair.tokenizer), "hidden_sizes": hidden},
        "actions": [str(a) for a in space], "grid": config["actions"], "methods": list(c.methods),
        "num_trees": c.num_trees, "root_stride": c.root_stride,
        "schema": FeatureSchema.for_pair("paper", hidden["target"], hidden["draft"]).to_dict(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "numpy": numpy.__version__},
    }


def collect_part(cfg, pair, index: int, count: int, restart: bool, restart_on_change: bool) -> dict:
    """Collect this process's part; returns its manifest."""
    from tqdm.auto import tqdm

    from data_collection.dataset import DatasetError, ShardWriter
    from data_collection.dataset_schema import rows_table
    from data_collection.root_collector import RootCollector, UnionTrees, root_positions
    from data_collection.trajectory_store import load_trajectories
    from decoding.sampling import Sampling
    from models.loading import eos_ids

    c, space = cfg.collect, cfg.actions.space()
    trajs = load_trajectories(cfg.trajectories.out, splits=c.splits)
    if not trajs:
        raise UserInputError(f"no trajectories of splits {c.splits} in {cfg.trajectories.out}; check prompts.split "
                         "and rerun `branchpoint trajectories`")
    mine = sorted((t for t in trajs if prompt_part(t.prompt_id, count) == index), key=trajectory_key)
    eos = set(eos_ids(pair.tokenizer, pair.target))
    positions = []
    for t in mine:
        pos = root_positions(len(t.prompt_ids), list(t.prompt_ids) + list(t.continuation_ids), c.root_stride, eos)
        positions.append(pos[: c.max_roots_per_trajectory] if c.max_roots_per_trajectory else pos)
    header = {**_header(cfg, pair, space), "shard": {"index": index, "count": count}}
    try:
        writer = ShardWriter(c.out, index, count, header, restart=restart)
    except DatasetError:
        if not restart_on_change:
            raise
        print(f"collect: {c.out} was collected with another configuration; starting over (--restart-on-change)")
        writer = ShardWriter(c.out, index, count, header, restart=True)
    collector = RootCollector(pair.target, pair.draft, pair.vocab_size, space, c.methods, UnionTrees(c.num_trees, c.seed))
    chunks = [range(k, min(k + c.shard_size, len(mine))) for k in range(0, len(mine), c.shard_size)]
    total = sum(len(p) for p in positions)
    bar = tqdm(total=total, desc=f"collect {index}/{count}", unit="root", mininterval=2.0)
    for ci, chunk in enumerate(chunks):
        n_roots = sum(len(positions[j]) for j in chunk)
        if writer.done(ci):
            bar.update(n_roots)
            continue
        rows_list = []
        for j in chunk:
            t = mine[j]
            seq = list(t.prompt_ids) + list(t.continuation_ids)
            rows = collector.collect(seq, positions[j], Sampling(t.temperature, t.top_p), trajectory_key(t))
            rows_list.append(rows)
            bar.update(len(rows))
        writer.write(ci, rows_table([mine[j] for j in chunk], rows_list, c.methods, len(space)))
    bar.close()
    writer.manifest["complete"] = True
    from decoding.files import write_json_atomic

    write_json_atomic(writer.path, writer.manifest)
    return writer.manifest


def collect_metrics(cfg) -> dict:
    """metrics/collect.json from the merged dataset and the latency profile (see README / issue notes)."""
    import numpy as np

    from data_collection.dataset import read_dataset_manifest
    from data_collection.dataset_schema import SECONDS_KINDS, seconds_column
    from data_collection.offline_table import load_offline_table
    from decoding import pricing, throughput
    from decoding.actions import AR_ACTION
    from decoding.latency import LatencyModel
    from decoding.sampling import sampling_key

    c, space = cfg.collect, cfg.actions.space()
    manifest = read_dataset_manifest(c.out)
    seconds_columns = {k: seconds_column(k) for k in SECONDS_KINDS}
    table = load_offline_table(c.out, space, LatencyModel.load(cfg.profile.out), methods=c.methods,
                               columns=list(seconds_columns.values()))
    split, temps, tops = (table.columns[k] for k in ("split", "temperature", "top_p"))
    T = table.seconds[pricing.VERIFY_REFERENCE]  # [N, A] (a static policy, Traversal's verification)
    ar = space.index(AR_ACTION) if AR_ACTION in space else None
    secs = {k: float(np.mean(table.columns[col].astype(np.float64))) for k, col in seconds_columns.items()}
    out: dict = {
        "roots": len(table), "roots_per_split": {s: int((split == s).sum()) for s in ("train", "val", "test")},
        "seconds_per_root": {**secs, "total": sum(secs.values())},
        "actions": len(space), "num_trees": c.num_trees, "config_hash": manifest["config_hash"],
        "latency_profile": cfg.profile.out, "methods": {},
    }
    fit, ev = table.split_rows("train"), table.split_rows("test")
    labels = table.labels
    trav_static = None
    if "traversal" in labels:
        trav_static = throughput.best_static(labels["traversal"][fit], T[fit])
    for m, E in labels.items():
        entry: dict = {"mean_label_all_actions": float(np.nanmean(E)), "by_sampling": {}}
        if ar is not None:
            s = throughput.summary(E[fit], T[fit], E[ev], T[ev], ar)
            s["best_static"] = str(space[s.pop("best_static_index")])
            if trav_static is not None:
                trav = throughput.path_tps(labels["traversal"][ev], T[ev], np.full(ev.sum(), trav_static))
                s["oracle_vs_traversal_best_static"] = s["tps_oracle"] / trav
            entry.update(s)
        for temp, top in sorted(set(zip(temps.tolist(), tops.tolist(), strict=True))):
            sel = (temps == temp) & (tops == top)
            f, e = sel & fit, sel & ev
            if f.any() and e.any() and ar is not None:
                s = throughput.summary(E[f], T[f], E[e], T[e], ar)
                s["best_static"] = str(space[s.pop("best_static_index")])
                entry["by_sampling"][sampling_key(temp, top)] = {**s, "roots_fit": int(f.sum()),
                                                                    "roots_eval": int(e.sum())}
        out["methods"][m] = entry
    out["note"] = ("best static chosen on train roots, measured on test roots; oracle = per-root argmax E/T; "
                   "TPS from labels and the step prices (decoding/pricing.py, no feature cost)")
    return out


def run(cfg, args) -> int:
    import torch

    from data_collection.dataset import merge_manifests
    from decoding.files import write_json_atomic
    from models.loading import load_pair

    index, count = parse_shard(args.shard)
    if not args.merge:
        torch.set_num_threads(cfg.model.threads)
        start = time.perf_counter()
        pair = load_pair(cfg.model.target, cfg.model.draft, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                             cfg.model.placement())
        collect_part(cfg, pair, index, count, args.restart, args.restart_on_change)
        print(f"collect: part {index}/{count} done in {time.perf_counter() - start:.0f} s -> {cfg.collect.out}")
        if count > 1:
            print("collect: run `branchpoint collect --merge` once every part has finished")
            return 0
    merged = merge_manifests(cfg.collect.out)
    metrics = collect_metrics(cfg)
    write_json_atomic(cfg.collect.metrics, metrics)
    print(f"collect: {merged['rows']} roots in {len(merged['shards'])} shards; metrics -> {cfg.collect.metrics}")
    for m, e in metrics["methods"].items():
        if "oracle_vs_ar" in e:
            print(f"  {m:10s} best static {e['best_static']:>6s}: {e['best_static_vs_ar']:.3f}x AR; "
                  f"oracle {e['oracle_vs_ar']:.3f}x AR, {e['oracle_vs_best_static']:.3f}x best static")
    print(json.dumps(metrics["seconds_per_root"]))
    return 0
