"""Benchmark: which draft is worth choosing for -> benchmarks/results/drafts.json (issue #46, docs/draft.md).

One row per draft of the pipeline's target (as `load_pair` loads it: the quantized backend on CPU), each measured
the way stage train_draft measures its artifact (`pipeline.train_draft.measure_draft`, TEST trajectories):

- per-token acceptance ``sum_x min(p, q)`` at T = 1.0 and 0.6 along the target's own continuations;
- the draft's decode step over the target's (one token after a KV cache, interleaved, ``step_time_ratio``);
- the best *chain* (K = 1, L1 = 0, L2 = L) along the decode path, over autoregressive, from those two and the
  profile's step prices (`chain_speedup`).

Rows:
1. every trained draft given by ``--drafts`` (default: ``model.draft``, stage train_draft's artifact), named by its
   kind: ``self_draft`` (`models.self_draft`) and ``eagle`` (`models.eagle_draft`, a head on the target's last
   hidden state). The EAGLE head drafts its deeper tokens from its own predicted features, so its acceptance is
   measured per depth (`models.eagle_draft.EagleDraft.unrolled_logits`) and the chain model reads depth d's
   acceptance at a chain's d-th token;
2. ``layer_skip``: training-free layer skipping (Draft & Verify, SWIFT): the target's own layers with a searched set
   skipped (`layer_skip_draft`). The search is a one-shot importance order on VAL (acceptance with each single layer
   skipped; least harmful first), cut where the modelled chain speedup peaks; the best few cuts are measured on TEST.

The chain model. A chain rooted at position t accepts its first j drafted tokens with probability
``prod_{i<j} a_{i+1}[t+i]`` (``models.draft_data.chain_block_efficiency``; ``a_d`` the acceptance at depth d, the
same at every depth for a draft with its own cache), so its block efficiency there is
``E[t, L] = 1 + sum_{j=1..L} prod_{i<j} a_{i+1}[t+i]``. A chain step costs, over a plain step at context c
(`decoding.pricing`: the profile's fitted step line, with this draft's forwards in place of the profiled draft's),

    T(L) = tables * (t_p(c, 1 + L) / t_p(c, 1) + L * r) + step + forward * L + node * L      (r: step_time_ratio)

and the path estimator (`decoding.throughput.path_tps`) gives the chain's speedup over autoregressive,
``n / sum_t T(L) / E[t, L]``; the row reports the best L. For the self-draft the same number from the collect
stage's labels (trees included, `metrics/collect.json`) stands next to it.

Run: ``python -m benchmarks.bench_drafts`` after ``dvc repro train_draft profile`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from decoding import throughput

OUT = Path("benchmarks/results/drafts.json")
CHAIN_LENGTHS = range(1, 9)
def relabeled_layer(layer, index: int):
    """A shallow copy of a decoder ``layer`` (same weights) whose attention writes KV cache slot ``index``."""
    out = copy.copy(layer)
    out._modules = dict(layer._modules)
    attn = copy.copy(layer.self_attn)
    attn._modules = dict(layer.self_attn._modules)
    attn.layer_idx = index
    out._modules["self_attn"] = attn
    if hasattr(out, "layer_idx"):
        out.layer_idx = index
    return out


def layer_skip_draft(target, keep: list[int]):
    """The target with only the decoder layers ``keep`` (ascending indices), sharing every weight with it: an HF
    causal LM of ``len(keep)`` layers that decodes with its own KV cache like any HF draft. A target on the lean path
    (`models.lean_layers.use_lean_forward`, as `load_model` leaves it on CPU) gets a lean path over the kept layers:
    the copied stack's own forward would run all of the target's."""
    import torch

    from models.lean_layers import use_lean_forward

    keep = sorted(int(i) for i in keep)
    n = target.config.num_hidden_layers
    if not keep or keep[0] < 0 or keep[-1] >= n or len(set(keep)) != len(keep):
        raise ValueError(f"layer_skip_draft: keep must be distinct layer indices in [0, {n}), got {keep}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(keep)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in keep]
    draft = copy.copy(target)
    draft._modules = dict(target._modules)
    draft.config = config
    model = copy.copy(target.model)
    lean = model.__dict__.pop("_lean_installed", False)
    model.__dict__.pop("forward", None)  # the target's lean forward, bound to all of its layers
    model._modules = dict(target.model._modules)
    model.config = config
    model._modules["layers"] = torch.nn.ModuleList(relabeled_layer(target.model.layers[i], j)
                                                   for j, i in enumerate(keep))
    draft._modules["model"] = model
    if lean:
        use_lean_forward(draft)
    return draft


def chain_efficiency(acceptance: list, length: int, deeper: list = ()) -> np.ndarray:
    """``[n]`` E[t, L] of a chain of ``length`` rooted at every position with ``length`` positions ahead
    (`models.draft_data.chain_efficiencies` of per-position acceptance arrays; ``deeper``: per depth 2, 3, ...)."""
    import torch

    from models.draft_data import chain_efficiencies

    def tensors(rows):
        return [torch.as_tensor(np.asarray(a)) for a in rows]

    return np.asarray(chain_efficiencies(tensors(acceptance), length, [tensors(d) for d in deeper]))


def chain_step_ratio(latency, context: float, length: int, draft_ratio: float) -> float:
    """T(L) over a plain step (module docstring): the profile's fitted step line with this draft's forwards."""
    tables, step, forward, node = latency.step_ratios.tree_vector()
    passes = float(latency.t_p(context, 1 + length) / latency.t_p(context, 1))
    return float(tables * (passes + length * draft_ratio) + step + forward * length + node * length)


def chain_speedup(acceptance: list, latency, context: float, draft_ratio: float, deeper: list = ()) -> dict:
    """The best chain along the decode path over autoregressive: ``{"L", "speedup", "by_L"}``."""
    by_length = {}
    for length in CHAIN_LENGTHS:
        e = chain_efficiency(acceptance, length, deeper)
        if e.size:
            t = np.full((e.size, 1), chain_step_ratio(latency, context, length, draft_ratio))
            by_length[length] = throughput.path_tps(e[:, None], t, np.zeros(e.size, int))  # plain steps: AR is 1
    best = max(by_length, key=by_length.get)
    return {"L": best, "speedup": by_length[best], "by_L": by_length}


def _target_probs(target, data, temperature: float, vocab: int):
    """The target's sampling rows at every continuation position (computed once, reused for every skip variant)."""
    import torch

    from decoding.sampling import Sampling
    from engine.torch_sampling import transform_logits
    from models.draft_data import continuation_logits

    with torch.inference_mode():
        return [transform_logits(continuation_logits(target, prompt, cont, "cpu"), Sampling(temperature), vocab)
                for prompt, cont in zip(data.prompts, data.continuations, strict=True)]


def _acceptance(draft, data, target_probs, temperature: float, vocab: int) -> list:
    """Per continuation, ``sum_x min(p, q)`` at every position (`models.draft_data.position_stats` with the
    target's rows cached)."""
    import torch

    from decoding.sampling import Sampling
    from engine.torch_sampling import transform_logits
    from models.draft_data import continuation_logits

    with torch.inference_mode():
        return [torch.minimum(p, transform_logits(continuation_logits(draft, prompt, cont, "cpu"),
                                                  Sampling(temperature), vocab)).sum(-1).numpy()
                for prompt, cont, p in zip(data.prompts, data.continuations, target_probs, strict=True)]


def _step_ratio(target, draft, tokenizer, ids, context: int, reps: int) -> dict:
    """`data_collection.forward_tables.step_times` of the pair: one decode step each, interleaved."""
    from data_collection.forward_tables import TimedPair, step_times, tile_ids
    from models.loading import common_vocab_size

    return step_times(TimedPair(target, draft, common_vocab_size(target, draft, tokenizer)), tile_ids(ids, context),
                      reps=reps)


def search_layer_skip(target, tokenizer, val, latency, context: float, progress: bool = True) -> dict:
    """The one-shot importance search (module docstring) on VAL at T = 1: the order, and per number of skipped
    layers the VAL acceptance, the measured step ratio (10 interleaved steps) and the modelled chain speedup."""
    from tqdm import tqdm

    n = target.config.num_hidden_layers
    vocab = target.get_output_embeddings().weight.shape[0]
    probs = _target_probs(target, val, 1.0, vocab)
    single = {}
    for i in tqdm(range(n), desc="layer importance", disable=not progress):
        acc = _acceptance(layer_skip_draft(target, [j for j in range(n) if j != i]), val, probs, 1.0, vocab)
        single[i] = float(np.concatenate(acc).mean())
    order = sorted(range(n), key=lambda i: -single[i])  # least harmful to skip first
    curve = []
    for skip in tqdm(range(2, n - 1, 2), desc="skip curve", disable=not progress):
        keep = sorted(order[skip:])
        draft = layer_skip_draft(target, keep)
        acc = _acceptance(draft, val, probs, 1.0, vocab)
        ratio = _step_ratio(target, draft, tokenizer, val.prompts[0], int(context), reps=10)["step_time_ratio"]
        modelled = chain_speedup(acc, latency, context, ratio)
        curve.append({"skipped": skip, "keep": keep, "val_acceptance_T1.0": float(np.concatenate(acc).mean()),
                      "step_time_ratio": ratio, "modelled_chain_speedup": modelled["speedup"],
                      "modelled_L": modelled["L"]})
    return {"single_layer_skipped_val_acceptance": single, "order": order, "curve": curve}


def _row(cfg, target, tokenizer, draft, test, latency, context: float) -> dict:
    """What train_draft measures of ``draft`` (`pipeline.train_draft.measure_draft`: acceptance per TEST setting and
    depth, the step ratio; breakdowns left out) and, from the same per-position acceptance, the chain model."""
    from pipeline.train_draft import measure_draft, setting_stats

    stats = setting_stats(target, draft, test, depth=max(CHAIN_LENGTHS))
    row = {k: v for k, v in measure_draft(cfg, target, tokenizer, draft, test, stats).items()
           if not k.startswith("breakdown_")}
    for name, (_, s) in stats.items():
        row[f"best_chain_{name}"] = chain_speedup([a.numpy() for a in s.acceptance], latency, context,
                                                  row["step_time_ratio"], [[a.numpy() for a in d] for d in s.deeper])
    return row


def carried_rows(out: Path, names, measured: dict) -> dict:
    """The rows ``names`` of the previous result at ``out``, each marked ``carried_over`` with that run's profile and
    load; a clear error for a row it does not hold or one this run measured."""
    if not names:
        return {}
    old = json.loads(out.read_text()) if out.is_file() else {"rows": {}}
    missing = [n for n in names if n not in old["rows"]]
    again = [n for n in names if n in measured]
    if missing or again:
        raise SystemExit(f"bench_drafts --keep: {out} has no rows {missing}" if missing else
                         f"bench_drafts --keep: rows {again} were measured in this run")
    source = {"latency_profile": old.get("latency_profile"), "machine": old.get("machine")}
    return {n: {**old["rows"][n], "carried_over": old["rows"][n].get("carried_over", source)} for n in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--val-sequences", type=int, default=16, help="VAL trajectories the layer search reads")
    parser.add_argument("--measure", type=int, default=3, help="layer-skip cuts measured on TEST (best modelled)")
    parser.add_argument("--collect-metrics", default="metrics/collect.json",
                        help="the collect stage's metrics: the self-draft's best static from labels")
    parser.add_argument("--drafts", nargs="+", default=None,
                        help="trained draft specs to measure, e.g. eagle:artifacts/draft self_draft:/tmp/sd "
                             "(default: model.draft)")
    parser.add_argument("--keep", nargs="+", default=(), metavar="ROW",
                        help="rows of the existing --out file to carry over unmeasured (e.g. self_draft, when its "
                             "artifact is no longer built); each is marked with where it came from")
    parser.add_argument("--quick", action="store_true", help="4 VAL / 4 TEST trajectories, one cut: a smoke run")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from decoding.latency import LatencyModel
    from models.loading import load_draft, load_pair, parse_spec
    from pipeline.config import load_config
    from pipeline.train_draft import _continuations, load_split_trajectories

    cfg = load_config(args.params if Path(args.params).is_file() else None)
    torch.set_num_threads(cfg.model.threads)
    pair = load_pair(cfg.model.target, cfg.model.target, cfg.model.device, cfg.model.dtype,
                     cfg.model.cache_dir, cfg.model.placement())
    target, tokenizer = pair.target, pair.tokenizer
    latency = LatencyModel.load(cfg.profile.out)
    splits = load_split_trajectories(cfg, target)
    val = [t for t in splits["val"] if t.setting[0] == 1.0][: 4 if args.quick else args.val_sequences]
    test = splits["test"][:4] if args.quick else splits["test"]
    context = float(np.mean([len(t.prompt_ids) + len(t.continuation_ids) / 2 for t in test]))
    start = time.perf_counter()
    result: dict = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                    "threads": torch.get_num_threads(), "loadavg_start": os.getloadavg()},
        "target": cfg.model.target, "backend": cfg.model.backend, "latency_profile": cfg.profile.out,
        "mean_context": context, "test_trajectories": len(test), "quick": args.quick, "rows": {},
    }
    for spec in args.drafts or [cfg.model.draft]:
        kind = parse_spec(spec)[0]
        print(f"{kind}: measuring {spec}")
        draft = load_draft(spec, target, tokenizer, cfg.model.target, pair.dtype,
                           cfg.model.cache_dir)
        row = {"draft": spec, **_row(cfg, target, tokenizer, draft, test, latency, context)}
        collect = Path(args.collect_metrics)
        if spec == cfg.model.draft and collect.is_file():  # the collect stage labelled this draft's trees
            row["best_static_from_labels"] = {
                m: {k: v[k] for k in ("best_static", "best_static_vs_ar", "oracle_vs_ar")}
                for m, v in json.loads(collect.read_text())["methods"].items()}
        result["rows"][kind] = row
    search = search_layer_skip(target, tokenizer, _continuations(val), latency, context)
    result["layer_skip_search"] = search
    best = sorted(search["curve"], key=lambda c: -c["modelled_chain_speedup"])[: 1 if args.quick else args.measure]
    for cut in best:
        name = f"layer_skip_{cut['skipped']}"
        print(f"{name}: measuring on TEST (keeps {len(cut['keep'])} of {target.config.num_hidden_layers} layers)")
        row = _row(cfg, target, tokenizer, layer_skip_draft(target, cut["keep"]), test, latency, context)
        result["rows"][name] = {"keep": cut["keep"], **row}
    result["seconds"] = time.perf_counter() - start
    result["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    result["rows"].update(carried_rows(out, args.keep, result["rows"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    tmp.replace(out)
    for name, row in result["rows"].items():
        if "step_time_ratio" in row:
            print(f"{name:>16}: acceptance T1.0 {row.get('acceptance_test_T1.0', float('nan')):.3f}  "
                  f"T0.6 {row.get('acceptance_test_T0.6', float('nan')):.3f}  step ratio {row['step_time_ratio']:.3f}  "
                  f"best chain T1.0 {row['best_chain_T1.0']['speedup']:.3f}x (L={row['best_chain_T1.0']['L']})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
