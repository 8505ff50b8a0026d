"""Label noise vs union trees per root: ``python -m pipeline.label_noise --help`` (a study, not a dvc stage).

The label of an action is ``Ê(c, a)``, the mean over ``s`` sampled union trees of the exact expected block
efficiency of each tree (ALGORITHMS.md section 4): verification randomness is removed, drafting randomness
is not. This study measures how much drafting noise is left for s = 2 / 4 / 8 / 16 on a subset of roots.

At each of ``--roots`` roots of ``--split`` trajectories (a seeded choice of trajectories, roots every
``collect.root_stride`` tokens as the collect stage places them), ``--trees`` independent union trees are
drafted and labelled with the collection's own code (`data_collection.root_collector.RootCollector` with one tree
per collector, each with its own seed). For every s it reports, per method:

- ``se``: the standard error of Ê over the speculating actions, mean over roots (``std(ddof=1) / sqrt(s)``),
  and the same relative to Ê (``rel_se``);
- ``oracle_in_sample``: per-root oracle (argmax Ê/T) chosen AND scored on the same s trees, / autoregressive
  (what a noisy label makes the oracle look like);
- ``oracle_held_out``: the same choice scored on the other trees (s <= trees / 2): what that choice is worth;
- ``best_static``: the best static action chosen on the s trees, and its held-out TPS / autoregressive.

The gap between in-sample and held-out oracle is the optimism that label noise adds to the oracle of
metrics/collect.json. Writes ``--out`` (JSON) and a plot next to it (.png).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from decoding.files import write_json_atomic

TREE_COUNTS = (2, 4, 8, 16)


def pick_roots(trajs, stride: int, eos: set[int], count: int, seed: int) -> list[tuple]:
    """``[(trajectory, positions)]`` holding ``count`` roots in all: trajectories in a seeded order, each with
    its roots every ``stride`` tokens (as the collect stage places them), the last one cut to fit."""
    from data_collection.root_collector import root_positions

    order = np.random.default_rng(seed).permutation(len(trajs))
    out, left = [], count
    for i in order:
        t = trajs[int(i)]
        pos = root_positions(len(t.prompt_ids), list(t.prompt_ids) + list(t.continuation_ids), stride, eos)
        if pos and left > 0:
            out.append((t, pos[:left]))
            left -= len(pos[:left])
    return out


def tree_labels(pair, space, methods: list[str], picked: list[tuple], trees: int, seed: int) -> tuple[dict, np.ndarray]:
    """``({method: [trees, roots, A]}, context lengths [roots])``: one union tree per collector seed."""
    from tqdm.auto import tqdm

    from data_collection.dataset_schema import trajectory_key
    from data_collection.root_collector import RootCollector, UnionTrees
    from decoding.sampling import Sampling

    values: dict[str, list] = {m: [] for m in methods}
    bar = tqdm(total=trees * sum(len(p) for _, p in picked), desc="label noise", unit="root")
    for j in range(trees):
        collector = RootCollector(pair.target, pair.draft, pair.vocab_size, space, methods, UnionTrees(1, seed + 1 + j))
        per_root: dict[str, list] = {m: [] for m in methods}
        for t, pos in picked:
            rows = collector.collect(list(t.prompt_ids) + list(t.continuation_ids), pos,
                                     Sampling(t.temperature, t.top_p), trajectory_key(t))
            for m in methods:
                per_root[m].extend(rows.labels[m])
            bar.update(len(pos))
        for m in methods:
            values[m].append(np.stack(per_root[m]))
    bar.close()
    ctx = np.asarray([p for _, pos in picked for p in pos], dtype=np.float64)
    return {m: np.stack(v) for m, v in values.items()}, ctx


def noise_table(values: np.ndarray, T: np.ndarray, speculating: np.ndarray, ar: int, counts) -> list[dict]:
    """Per tree count s: standard error of Ê and the oracle / best static in sample and held out.
    ``values`` ``[trees, roots, A]``, ``T`` ``[roots, A]`` seconds, ``speculating`` ``[A]`` bool."""
    from decoding import throughput

    trees = values.shape[0]
    ar_tps = throughput.path_tps(values.mean(axis=0), T, np.full(T.shape[0], ar))  # Ê(AR) = 1 exactly
    out = []
    for s in counts:
        if s > trees:
            continue
        fit = values[:s]
        mean = fit.mean(axis=0)  # [roots, A]
        se = fit[:, :, speculating].std(axis=0, ddof=1) / np.sqrt(s)
        row = {"trees": s, "se": float(se.mean()), "rel_se": float((se / mean[:, speculating]).mean()),
               "oracle_in_sample": throughput.path_tps(mean, T, throughput.oracle_choice(mean, T)) / ar_tps}
        b = throughput.best_static(mean, T)
        row["best_static"] = int(b)
        if 2 * s <= trees:
            held = values[s:].mean(axis=0)
            row["oracle_held_out"] = throughput.path_tps(held, T, throughput.oracle_choice(mean, T)) / ar_tps
            row["best_static_held_out"] = throughput.path_tps(held, T, np.full(T.shape[0], b)) / ar_tps
        out.append(row)
    return out


def study(cfg, roots: int, trees: int, split: str, methods: list[str], seed: int) -> dict:
    import torch

    from data_collection.trajectory_store import load_trajectories
    from decoding import pricing
    from decoding.actions import AR_ACTION
    from decoding.errors import UserInputError
    from decoding.latency import LatencyModel
    from models.loading import eos_ids, load_pair

    torch.set_num_threads(cfg.model.threads)
    space = cfg.actions.space()
    if AR_ACTION not in space:
        raise UserInputError(f"the action space has no autoregressive action {AR_ACTION}: nothing to compare with")
    trajs = load_trajectories(cfg.trajectories.out, splits=[split])
    if not trajs:
        raise UserInputError(f"no {split} trajectories in {cfg.trajectories.out}: run `branchpoint trajectories`")
    pair = load_pair(cfg.model.target, cfg.model.draft, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                     cfg.model.placement())
    picked = pick_roots(trajs, cfg.collect.root_stride, set(eos_ids(pair.tokenizer, pair.target)), roots, seed)
    start = time.perf_counter()
    values, ctx = tree_labels(pair, space, methods, picked, trees, cfg.collect.seed)
    T = pricing.step_seconds(LatencyModel.load(cfg.profile.out), ctx, space)
    speculating = np.asarray([a.tree_size > 0 for a in space])
    return {"roots": int(len(ctx)), "trajectories": len(picked), "split": split, "trees": trees,
            "seconds": time.perf_counter() - start, "latency_profile": cfg.profile.out, "actions": len(space),
            "methods": {m: noise_table(v, T, speculating, space.index(AR_ACTION), TREE_COUNTS)
                        for m, v in values.items()},
            "note": "se = standard error of Ê over speculating actions (mean over roots); oracle / best static "
                    "TPS are ratios to autoregressive; held_out = chosen on the first s trees, scored on the rest"}


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.study import save_figure

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for m, rows in result["methods"].items():
        s = [r["trees"] for r in rows]
        a.plot(s, [r["se"] for r in rows], marker="o", label=m)
        b.plot(s, [r["oracle_in_sample"] for r in rows], marker="o", label=f"{m} in sample")
        held = [(r["trees"], r["oracle_held_out"]) for r in rows if "oracle_held_out" in r]
        if held:
            b.plot(*zip(*held, strict=True), marker="s", linestyle="--", label=f"{m} held out")
    a.set(xscale="log", yscale="log", xlabel="union trees per root (s)", ylabel="standard error of Ê",
          title="label noise")
    b.axhline(1.0, color="grey", linewidth=0.8)
    b.set(xscale="log", xlabel="union trees per root (s)", ylabel="per-root oracle / autoregressive",
          title="oracle: in sample vs held out")
    for ax in (a, b):
        ax.set_xticks(TREE_COUNTS, [str(s) for s in TREE_COUNTS])
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    from pipeline.study import add_config_arguments, study_config

    parser = argparse.ArgumentParser(prog="python -m pipeline.label_noise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roots", type=int, default=24, help="roots in the subset (default 24)")
    parser.add_argument("--trees", type=int, default=16, help="union trees drafted per root (default 16)")
    parser.add_argument("--split", default="train", choices=["train", "val", "test"])
    parser.add_argument("--methods", nargs="+", default=["traversal", "specinfer"])
    parser.add_argument("--seed", type=int, default=0, help="choice of the trajectories")
    parser.add_argument("--out", default="metrics/study_label_noise.json")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    if args.roots < 1 or args.trees < 2:
        parser.error(f"need --roots >= 1 and --trees >= 2, got {args.roots} and {args.trees}")
    cfg = study_config(args)
    unknown = sorted(set(args.methods) - set(cfg.collect.methods))
    if unknown:
        parser.error(f"--methods {unknown} are not collected methods {cfg.collect.methods}")
    result = study(cfg, args.roots, args.trees, args.split, args.methods, args.seed)
    out = Path(args.out)
    result["plot"] = str(plot(result, out.with_suffix(".png")))
    write_json_atomic(out, result)
    print(json.dumps({"out": str(out), "plot": result["plot"], "roots": result["roots"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
