"""Verification cost per method and tree shape: the seconds of one `VerificationMethod.verify` call.

The step ratios (`data_collection.step_prices`) decode with Traversal only, so without this the latency
model priced a tree the same under every method. It is not the same: on the 2-core CPU, with SmolLM2's 49,152-
token rows, GBV verified a 2,0,1 tree in 5.2 ms and a 2,1,2 tree in 11.9 ms, Khisti a 3,0,1 tree in 10.6 ms,
Traversal each in 0.3-0.4 ms; online, GBV's 2,0,1 steps took 4.4 ms longer than SpecInfer's at the same block
efficiency, and the latency model still ranked GBV's 2,0,1 the best static.

How: for each shape of the action grid and each method that supports it, ``repeats`` timed calls (after one
untimed call) on trees drawn from real rows: ``q_pool`` / ``p_pool`` are draft / target probability rows of the
pair at real positions (`pipeline.profile` takes them from one forward of each model over the profile's
context); each tree node gets a random position, its q and p rows are that position's (so they agree as often
as the pair does) and its children are drawn from its q row, as in decoding. The mean of the calls is kept (`decoding.latency.LatencyModel.verify_seconds`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from decoding.actions import Action
from decoding.tree import build_tree, sample_layout, tree_layout
from verifiers import METHODS, get_method


def measure_verify_seconds(actions: Sequence[Action], q_pool: np.ndarray, p_pool: np.ndarray,
                           methods: Sequence[str] = tuple(METHODS), repeats: int = 5,
                           progress: str | None = None) -> dict[str, dict[str, float]]:
    """``{method: {"K,L1,L2": mean seconds}}`` over the trees of ``actions`` (empty trees skipped) that each
    method supports (module docstring). ``q_pool``, ``p_pool``: ``[P, V]`` probability rows at the same P
    positions; the trees' tokens and rows are drawn from them with a fixed seed. ``progress``: the label of a
    progress bar (None: no bar)."""
    from tqdm.auto import tqdm

    q_pool, p_pool = np.asarray(q_pool, dtype=np.float64), np.asarray(p_pool, dtype=np.float64)
    if q_pool.ndim != 2 or q_pool.shape != p_pool.shape or not len(q_pool):
        raise ValueError(f"measure_verify_seconds: q_pool and p_pool must be [P, V] of one shape with P >= 1, got "
                         f"{q_pool.shape} and {p_pool.shape}")
    if repeats < 1:
        raise ValueError(f"measure_verify_seconds: repeats must be >= 1, got {repeats}")
    rng = np.random.default_rng(0)
    shapes = [a for a in actions if a.tree_size]
    out: dict[str, dict[str, float]] = {m: {} for m in methods}
    bar = tqdm(total=len(shapes) * len(methods), desc=progress, unit="tree", disable=progress is None, mininterval=1.0)
    for action in shapes:
        parents, _ = tree_layout(action)
        for name in methods:
            method = get_method(name)
            times = []
            for r in range(repeats + 1):  # the first call is untimed (imports, numba dispatch, caches)
                position: dict[tuple[int, ...], int] = {}

                def q_of(prefix: tuple[int, ...], position=position) -> np.ndarray:
                    return q_pool[position.setdefault(prefix, int(rng.integers(len(q_pool))))]

                tokens, q_rows = sample_layout(parents, q_of, rng)
                tree = build_tree(action, tokens, q_rows)
                if not method.supports(tree):
                    break
                paths: list[tuple[int, ...]] = [()]
                for i in range(1, len(tokens)):
                    paths.append(paths[parents[i]] + (int(tokens[i]),))
                # a node's target row at the position of its own draft row (a leaf: a fresh position)
                p_rows = p_pool[[position.setdefault(path, int(rng.integers(len(p_pool)))) for path in paths]]
                start = time.perf_counter()
                method.verify(tree, p_rows, rng)
                if r:
                    times.append(time.perf_counter() - start)
            if times:
                out[name][str(action)] = float(np.mean(times))
            bar.update()
    bar.close()
    return {m: by for m, by in out.items() if by}
