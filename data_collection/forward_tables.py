"""Measuring the latency profile of a target/draft pair on this machine (ALGORITHMS.md section 6).

The one step-timing implementation of the project: ``branchpoint profile`` builds the `LatencyModel`
tables (`profile_pair`) and ``branchpoint train-draft`` reports its draft/target step-time ratio
(`step_times`) with it. Every timed operation runs the engine's own code path, so the profile prices what
decoding really runs:

- *draft step* ``(c, rows)``: on a draft `KVState` holding ``c`` slots, one `tree_pass.forward_nodes` call
  with ``rows`` query rows at one position, each row seeing the context and itself (the mask drafting
  builds for a rollout level), then the sampling transform of its rows to numpy (as drafting does). A feature
  draft (`models.eagle_draft`, no cache) runs one ``step`` over ``rows`` nodes; its cost does not depend on the
  context or on the features' values, so the token embeddings stand in for them;
- *target pass* ``(c, tokens)``: on a target `KVState` holding ``c`` slots, one
  `tree_pass.target_tree_pass` over a tree of ``tokens`` nodes (root included), then the sampling
  transform of all its rows (as the decode loop does). The tree is a chain; its shape does not change
  the cost (dense attention with an additive mask);
- *deciding*: what a selector's step computes before its network runs, per feature set
  (`data_collection.step_prices.time_deciding`).

Each operation's cache is cropped back to ``c`` slots outside the timed region. Each timed call comes right after
one untimed call of the same cell (``Grid.prime``): the tables hold what an operation costs warm, every cell alike.
Unprimed, the first cell of each kind in a round was the only one that followed the other kind's calls and paid for
the switch alone: in stop 61's slow phase the 1-row draft cell read 8.0 ms against 3.1 for 2 rows and the 1-token
target pass 50 ms against 38 for 2 tokens, which put the tables' plain step at 1.3x a decoded one (``plain_scale``
0.76). What a switch costs in a decode is in the whole-step fit (`data_collection.step_prices`). Repeats are interleaved
(every grid cell, of every context, once per round) so that load from other processes hits all cells alike; the first
``warmup`` rounds are discarded and the table holds the mean of the rest (`decoding.pricing`: means are the one
statistic of step time). CUDA is synchronised
before and after each timed operation.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import torch

from decoding.actions import Action
from decoding.latency import LatencyModel
from decoding.sampling import Sampling
from decoding.tree import build_tree
from engine.cache import KVState
from engine.torch_sampling import to_numpy_rows, transform_logits
from engine.tree_pass import forward_nodes, prefill, target_tree_pass

DEFAULT_SAMPLING = Sampling()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def draft_step(kv: KVState, rows: int, tokens: Sequence[int], sampling: Sampling, vocab_size: int) -> np.ndarray:
    """One draft forward of ``rows`` query rows after the cached slots, as drafting runs it; ``[rows, V]``."""
    c = len(kv)
    allowed = np.zeros((rows, c + rows), dtype=bool)  # [rows, c + rows]
    allowed[:, :c] = True
    allowed[np.arange(rows), c + np.arange(rows)] = True
    logits, _ = forward_nodes(kv, list(tokens[:rows]), [c] * rows, allowed)
    return to_numpy_rows(transform_logits(logits, sampling, vocab_size))


def feature_draft_step(draft: torch.nn.Module, rows: int, tokens: Sequence[int], sampling: Sampling,
                       vocab_size: int) -> np.ndarray:
    """One step of a feature draft over ``rows`` nodes, as drafting runs it; ``[rows, V]``."""
    ids = torch.as_tensor(list(tokens[:rows]), dtype=torch.long, device=draft.device)
    logits, _ = draft.step(draft.get_input_embeddings()(ids), ids)
    return to_numpy_rows(transform_logits(logits, sampling, vocab_size))


def target_pass(kv: KVState, tokens: Sequence[int], sampling: Sampling, vocab_size: int) -> np.ndarray:
    """One target tree pass over ``len(tokens)`` nodes (root first), as the decode loop runs it; ``[n, V]``."""
    n = len(tokens)
    tree = build_tree(Action(1, n - 1, 0), np.asarray([-1, *tokens[1:]]), np.zeros((n, 1)))
    logits, _ = target_tree_pass(kv, int(tokens[0]), tree)
    return to_numpy_rows(transform_logits(logits, sampling, vocab_size))


@dataclass
class GridTimes:
    """Raw seconds of every timed operation (warm-up rounds dropped)."""

    draft: np.ndarray  # [C, R, repeats]
    target: np.ndarray  # [C, N, repeats]


@dataclass(frozen=True)
class TimedPair:
    """The models a profile times and the vocabulary their probability rows cover."""

    target: torch.nn.Module
    draft: torch.nn.Module
    vocab_size: int


@dataclass(frozen=True)
class Grid:
    """The cells a profile times: context lengths x draft query rows and x target tokens, ``repeats`` timed rounds
    after ``warmup`` untimed ones, the rows transformed with ``sampling``."""

    contexts: Sequence[int]
    draft_rows: Sequence[int]
    target_tokens: Sequence[int]
    repeats: int
    warmup: int = 2
    sampling: Sampling = DEFAULT_SAMPLING
    prime: bool = True  # one untimed call of each cell's own operation right before it is timed (module docstring)


def tile_ids(ids: Sequence[int], length: int) -> list[int]:
    """``ids`` repeated to exactly ``length`` tokens (a realistic context of any length)."""
    ids = [int(i) for i in ids] or [0]
    return (ids * (1 + length // len(ids)))[:length]


@torch.inference_mode()
def time_grid(pair: TimedPair, context_ids: Sequence[int], grid: Grid, progress: str | None = None) -> GridTimes:
    """Time the draft step and the target pass at every cell of ``grid`` (see the module docstring).

    ``context_ids``: token ids the contexts are cut from (tiled when shorter than the largest context)."""
    from tqdm.auto import tqdm

    target, draft, vocab_size = pair.target, pair.draft, pair.vocab_size
    contexts, draft_rows, target_tokens = grid.contexts, grid.draft_rows, grid.target_tokens
    repeats, warmup, sampling = grid.repeats, grid.warmup, grid.sampling

    if repeats < 1 or warmup < 0:
        raise ValueError(f"time_grid: repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if min(contexts) < 1:
        raise ValueError(f"time_grid: context lengths must be >= 1, got {list(contexts)}")
    ids = tile_ids(context_ids, max(contexts) + max(max(draft_rows), max(target_tokens)))
    feed = ids[-max(max(draft_rows), max(target_tokens)):]  # tokens fed by the timed operations
    device = next(target.parameters()).device
    draft_s = np.zeros((len(contexts), len(draft_rows), repeats))
    target_s = np.zeros((len(contexts), len(target_tokens), repeats))
    # one cache pair per context (forks of one prefill), so that every round visits every context: a slow phase of
    # a shared machine then lands on all cells alike (timing the contexts one after the other, a slow minute made
    # the 64-token cells read 35 ms and the 256-token ones 26 ms)
    features = bool(getattr(draft, "reads_target_hidden", False))  # a feature draft keeps no cache
    full_t, full_d = KVState(target), None if features else KVState(draft)
    for kv in (full_t, full_d):
        if kv is not None:
            prefill(kv, ids[:max(contexts)])
    caches = [(full_t.fork(c), None if features else full_d.fork(c)) for c in contexts]
    del full_t, full_d
    bar = tqdm(total=len(contexts) * (warmup + repeats) * (len(draft_rows) + len(target_tokens)), desc=progress,
               unit="pass", disable=progress is None, mininterval=1.0)
    try:
        for rnd in range(warmup + repeats):
            for ci, c in enumerate(contexts):
                kv_t, kv_d = caches[ci]
                for kind, counts, kv in (("draft", draft_rows, kv_d), ("target", target_tokens, kv_t)):
                    for j, n in enumerate(counts):
                        for _ in range(2 if grid.prime else 1):  # the last call is the timed one
                            _sync(device)
                            start = time.perf_counter()
                            if kind == "target":
                                target_pass(kv, feed[:n], sampling, vocab_size)
                            elif features:
                                feature_draft_step(draft, n, feed, sampling, vocab_size)
                            else:
                                draft_step(kv, n, feed, sampling, vocab_size)
                            _sync(device)
                            elapsed = time.perf_counter() - start
                            if kv is not None:
                                kv.crop(c)
                        if rnd >= warmup:
                            (draft_s if kind == "draft" else target_s)[ci, j, rnd - warmup] = elapsed
                        bar.update()
    finally:
        bar.close()
    return GridTimes(draft_s, target_s)


def machine_info(device: torch.device) -> dict:
    """Where the profile was measured: machine, CPU, threads, device and library versions."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for name in ("torch", "transformers", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "machine": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(), "versions": versions,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def profile_pair(pair: TimedPair, context_ids: Sequence[int], grid: Grid, progress: str | None = None,
                 meta: dict | None = None) -> LatencyModel:
    """Measure the forward tables and return the `LatencyModel` (means; ``meta`` is extended with the machine and the
    measurement settings); step ratios, deciding and verification are measured after it (`pipeline.profile`)."""
    start = time.perf_counter()
    info = machine_info(next(pair.target.parameters()).device)
    times = time_grid(pair, context_ids, grid, progress)
    settings = {"repeats": grid.repeats, "warmup": grid.warmup, "statistic": "mean",
                "sampling": {"temperature": grid.sampling.temperature, "top_p": grid.sampling.top_p},
                "vocab_size": int(pair.vocab_size)}
    meta = dict(meta or {})
    meta["settings"] = {**settings, **meta.get("settings", {})}
    meta["settings"]["seconds"] = round(time.perf_counter() - start, 1)
    return LatencyModel(np.asarray(grid.contexts), np.asarray(grid.draft_rows), np.mean(times.draft, axis=-1),
                        np.asarray(grid.target_tokens), np.mean(times.target, axis=-1), meta={**info, **meta})


def step_times(pair: TimedPair, context_ids: Sequence[int], reps: int = 30, warmup: int = 3) -> dict:
    """One decode step of each model (one token after a KV cache holding ``context_ids``), timed as the
    profile times it: means and minima in ms and the draft/target ratio of the means
    (``step_time_ratio``, a train_draft metric)."""
    grid = time_grid(pair, context_ids, Grid([len(context_ids)], [1], [1], reps, warmup))
    med = {"draft": float(np.mean(grid.draft)) * 1e3, "target": float(np.mean(grid.target)) * 1e3}
    low = {"draft": float(grid.draft.min()) * 1e3, "target": float(grid.target.min()) * 1e3}
    return {
        "target_step_ms": med["target"], "draft_step_ms": med["draft"],
        "target_step_ms_min": low["target"], "draft_step_ms_min": low["draft"],
        "step_time_ratio": med["draft"] / med["target"], "step_time_ratio_min": low["draft"] / low["target"],
        "context_tokens": len(context_ids), "reps": reps, "threads": torch.get_num_threads(),
    }

