"""``branchpoint lookup``: exact labels of context lookup chains and the learned lookup gate (an opt-in stage, not in
dvc.yaml: it cost a first `dvc repro` ~5 minutes and the learned lookup tied prompt lookup's rule; run it, then
``evaluate --set evaluate.learned_lookup=true``).

Reads: the trajectories (``trajectories.out``; splits ``lookup.splits``), the target (``model.*``; no draft: a lookup
chain is verified without one), the latency profile (``profile.out``, pricing the offline comparison) and params
``lookup.*``. Writes: ``lookup.out``/labels.parquet (one row per root: identity, run, proposed tokens, H(p_prev) and
the N acceptances p_i(x_i); `data_collection.lookup_labels`), ``lookup.gate`` (`decoding.lookup_gate.LookupGate`
fitted on the TRAIN roots) and ``lookup.metrics``: the gate's error on VAL / TEST roots next to a run-blind table,
and offline tokens/s on TEST roots of prompt lookup's rule (every repeat, N tokens), the gate and the per-root
oracle, each over a plain step everywhere (`offline_comparison`), priced by the profile's plain step times the lookup
steps' measured ratios (`data_collection.lookup_labels.lookup_step_ratios`, also kept in the gate).

Every output is written to a temp file and renamed; the labels take a few minutes (one prefill per trajectory, one
pass of at most N + 1 tokens per root), so the stage is rerun whole rather than resumed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from decoding.errors import UserInputError

SECTIONS = ("model", "trajectories", "profile", "lookup")  # the params sections it loads
LABELS_FILE = "labels.parquet"
RULE_LENGTHS = (2, 3, 4, 6, 8)  # prompt lookup's chain lengths compared offline (capped at lookup.max_length)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def label_trajectories(cfg, target, vocab: int, eos: set[int], progress: bool = True) -> dict[str, np.ndarray]:
    """Columns of every root of the ``lookup.splits`` trajectories (`data_collection.lookup_labels`)."""
    from tqdm.auto import tqdm

    from data_collection.collect import root_positions
    from data_collection.dataset_schema import trajectory_key
    from data_collection.lookup_labels import lookup_labels
    from data_collection.trajectories import load_trajectories
    from decoding.sampling import Sampling

    lc = cfg.lookup
    trajs = sorted(load_trajectories(cfg.trajectories.out, splits=lc.splits), key=trajectory_key)
    if not trajs:
        raise UserInputError(f"no trajectories of splits {lc.splits} in {cfg.trajectories.out}; rerun "
                             "`branchpoint trajectories`")
    plans = []
    for t in trajs:
        seq = list(t.prompt_ids) + list(t.continuation_ids)
        plans.append((t, seq, root_positions(len(t.prompt_ids), seq, lc.root_stride, eos)))
    cols: dict[str, list] = {k: [] for k in ("key", "split", "source", "temperature", "top_p", "position", "run",
                                             "proposed", "entropy_p_prev", "accept")}
    bar = tqdm(total=sum(len(p) for _, _, p in plans), desc="lookup labels", unit="root", mininterval=2.0,
               disable=not progress)
    for t, seq, positions in plans:
        rows = lookup_labels(target, seq, positions, Sampling(t.temperature, t.top_p), vocab, lc.max_length)
        for i in range(len(rows)):
            for k, v in (("key", trajectory_key(t)), ("split", t.split), ("source", t.source),
                         ("temperature", t.temperature), ("top_p", t.top_p)):
                cols[k].append(v)
            for k in ("position", "run", "proposed", "entropy_p_prev", "accept"):
                cols[k].append(getattr(rows, k)[i])
        bar.update(len(rows))
    bar.close()
    out = {k: np.asarray(v) for k, v in cols.items() if k != "accept"}
    out["accept"] = np.stack(cols["accept"]) if cols["accept"] else np.zeros((0, lc.max_length))
    return out


TIMING_CONTEXT = 256  # context tokens at which the lookup steps are timed (`lookup_step_ratios`)


def timing_context(cfg) -> list[int]:
    """The first `TIMING_CONTEXT` tokens of the longest TRAIN trajectory: the context the lookup steps are timed at."""
    from data_collection.trajectories import load_trajectories

    seqs = [list(t.prompt_ids) + list(t.continuation_ids)
            for t in load_trajectories(cfg.trajectories.out, splits=["train"])]
    return max(seqs, key=len)[:TIMING_CONTEXT]


def save_labels(folder: str | Path, labels: dict[str, np.ndarray]) -> Path:
    """``folder/labels.parquet`` via a temp file and a rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(folder) / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: pa.array(v) for k, v in labels.items() if k != "accept"}
    width = labels["accept"].shape[1]
    arrays["accept"] = pa.FixedSizeListArray.from_arrays(pa.array(labels["accept"].reshape(-1)), width)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.table(arrays), tmp)
    tmp.replace(path)
    return path


def load_labels(folder: str | Path) -> dict[str, np.ndarray]:
    """The columns `save_labels` wrote (``accept`` as ``[R, N]``)."""
    import pyarrow.parquet as pq

    path = Path(folder) / LABELS_FILE
    if not path.is_file():
        raise UserInputError(f"{path} not found: run `branchpoint lookup`")
    table = pq.read_table(path)
    out = {k: table.column(k).to_numpy() for k in table.column_names if k != "accept"}
    accept = table.column("accept").combine_chunks()
    out["accept"] = accept.flatten().to_numpy(zero_copy_only=False).reshape(len(table), accept.type.list_size)
    return out


def gate_errors(gate, labels: dict[str, np.ndarray], blind) -> dict:
    """Mean absolute error of the predicted Ê(n) on roots with a repeat, over the lengths each root proposed, for
    ``gate`` and for the run-blind table ``blind`` (one cell: the mean per n)."""
    from decoding.lookup_gate import chain_block_efficiency

    has = ~np.isnan(labels["accept"])
    truth = chain_block_efficiency(labels["accept"])
    out = {}
    for name, g in (("gate", gate), ("run_blind", blind)):
        pred = g.predict(labels["run"], labels["entropy_p_prev"])
        out[f"mae_{name}"] = float(np.abs(pred - truth)[has].mean()) if has.any() else None
    return out


def offline_comparison(gate, labels: dict[str, np.ndarray], latency) -> dict:
    """Offline tokens/s (sum Ê / sum T over every root of ``labels``; a plain step: Ê 1) of a plain step everywhere,
    prompt lookup's rule (a chain of N tokens at every root with a repeat, each N of `RULE_LENGTHS`), the gate
    (the chain of the best predicted Ê / T where that beats a plain step) and the per-root oracle (the best of the
    plain step and every chain length, with the measured Ê); each also as a ratio to the plain step."""
    from decoding.actions import AR_ACTION
    from decoding.lookup_gate import chain_block_efficiency, lookup_step_seconds

    n_max = labels["accept"].shape[1]
    ctx = labels["position"].astype(np.float64)
    look_t = lookup_step_seconds(latency, ctx, n_max, None, gate.step_ratio)  # [R, N]
    plain_t = latency.step_seconds_at(ctx, [AR_ACTION])[:, 0]  # [R]
    truth = chain_block_efficiency(labels["accept"])  # [R, N]
    proposed = labels["proposed"].astype(np.int64)
    avail = np.arange(1, n_max + 1)[None, :] <= proposed[:, None]  # [R, N]

    def tps(e: np.ndarray, t: np.ndarray) -> float:
        return float(e.sum() / t.sum())

    ar = tps(np.ones_like(plain_t), plain_t)
    out = {"roots": int(ctx.size), "roots_with_repeat": int((proposed > 0).sum()), "autoregressive_tps": ar}
    rows = np.arange(ctx.size)
    for n in sorted({min(n, n_max) for n in RULE_LENGTHS}):
        m = np.minimum(proposed, n)  # the chain actually proposed (shorter where the context ends)
        e = np.where(m > 0, truth[rows, np.maximum(m, 1) - 1], 1.0)
        t = np.where(m > 0, look_t[rows, np.maximum(m, 1) - 1], plain_t)
        out[f"rule_N{n}_vs_ar"] = tps(e, t) / ar
    pred = gate.predict(labels["run"], labels["entropy_p_prev"])
    rate = np.where(avail, pred / look_t, -np.inf)
    pick = np.argmax(rate, axis=1)
    use = rate[rows, pick] > 1.0 / plain_t
    out["gate_vs_ar"] = tps(np.where(use, truth[rows, pick], 1.0), np.where(use, look_t[rows, pick], plain_t)) / ar
    out["gate_lookup_share"] = float(use.mean())
    true_rate = np.where(avail, truth / look_t, -np.inf)
    best = np.argmax(true_rate, axis=1)
    o_use = true_rate[rows, best] > 1.0 / plain_t
    out["oracle_vs_ar"] = tps(np.where(o_use, truth[rows, best], 1.0), np.where(o_use, look_t[rows, best], plain_t)) / ar
    out["oracle_lookup_share"] = float(o_use.mean())
    return out


def run(cfg, args) -> int:
    import torch

    from data_collection.lookup_labels import lookup_step_ratios
    from decoding.files import write_json_atomic
    from decoding.latency import LatencyModel
    from decoding.lookup_gate import LookupGate
    from decoding.sampling import Sampling
    from models.loading import eos_ids, load_model, load_tokenizer, resolve_device, resolve_dtype

    lc, m = cfg.lookup, cfg.model
    torch.set_num_threads(m.threads)
    start = time.perf_counter()
    tokenizer = load_tokenizer(m.target, m.cache_dir)
    target = load_model(m.target, resolve_device(m.device), resolve_dtype(m.dtype), m.cache_dir, m.device_map)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    labels = label_trajectories(cfg, target, vocab, set(eos_ids(tokenizer, target)), not args.no_progress)
    label_s = time.perf_counter() - start
    save_labels(lc.out, labels)

    def part(split: str, repeat_only: bool = False) -> dict[str, np.ndarray]:
        keep = labels["split"] == split
        if repeat_only:
            keep &= labels["run"] > 0
        return {k: v[keep] for k, v in labels.items()}

    train = part("train", repeat_only=True)
    if not train["run"].size:
        raise UserInputError(f"no TRAIN root of {cfg.trajectories.out} has a repeat in its context: nothing to fit "
                             "the lookup gate on")
    samplings = sorted({(float(t), float(p)) for t, p in zip(labels["temperature"], labels["top_p"], strict=True)})
    ratio, measured = lookup_step_ratios(target, vocab, timing_context(cfg), lc.max_length,
                                         [Sampling(t, p) for t, p in samplings])
    gate = LookupGate.fit(train["run"], train["entropy_p_prev"], train["accept"], prior=lc.prior, step_ratio=ratio)
    blind = LookupGate.fit(np.ones_like(train["run"]), np.zeros(train["run"].shape), train["accept"], prior=0.0)
    write_json_atomic(lc.gate, {**gate.to_dict(), "fitted_on": {"split": "train", "roots": int(train["run"].size)}})
    latency = LatencyModel.load(cfg.profile.out)
    parts = {s: part(s) for s in lc.splits}  # every root of each split
    metrics: dict = {"step_ratio": [round(float(r), 3) for r in ratio],
                     "step_ratio_measured": [round(float(r), 3) for r in measured], "label_seconds": round(label_s, 1),
                     "roots": {s: int(p["run"].size) for s, p in parts.items()},
                     "repeat_share": {s: float((p["run"] > 0).mean()) for s, p in parts.items() if p["run"].size}}
    for split, rows in parts.items():
        if split == "train" or not rows["run"].size:
            continue
        metrics[split] = {**gate_errors(gate, part(split, True), blind), **offline_comparison(gate, rows, latency)}
    write_json_atomic(lc.metrics, metrics)
    print(f"lookup: {labels['run'].size} roots labelled in {label_s:.0f} s -> {lc.out}/{LABELS_FILE}; gate fitted on "
          f"{train['run'].size} TRAIN roots with a repeat -> {lc.gate}")
    print("  a lookup step of n = 1.. tokens over a plain step: measured " + ", ".join(f"{r:.2f}" for r in measured)
          + "; the line through them " + ", ".join(f"{r:.2f}" for r in ratio))
    for split in ("val", "test"):
        if split in metrics:
            r = metrics[split]
            rules = ", ".join(f"N={k[6:-6]} {v:.3f}" for k, v in r.items() if k.startswith("rule_N"))
            print(f"  {split}: MAE gate {r['mae_gate']:.3f} vs run-blind {r['mae_run_blind']:.3f}; offline vs AR: "
                  f"rule {rules}; gate {r['gate_vs_ar']:.3f} (lookup at {r['gate_lookup_share']:.0%}); oracle "
                  f"{r['oracle_vs_ar']:.3f}")
    return 0
