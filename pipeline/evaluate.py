"""``branchpoint evaluate``: stage evaluate, end-to-end decoding speed of every policy, the report and the findings.

Reads: the TEST trajectories (``trajectories.out``: prompts and their sampling settings), the collected labels
(``collect.out``: TRAIN roots choose each best static action, TEST roots give the offline TPS, all roots the
findings), the latency profile (``profile.out``), the exported selector (``export.out``), the pair
(``model.*``), ``evaluate.train_metrics`` when present. Writes: ``evaluate.metrics`` (metrics/evaluate.json),
plot data under ``evaluate.plots`` (`dvc plots show`), ``evaluate.report`` (reports/report.md + figures/), one
MLflow run tagged ``stage=evaluate``. Steps:

1. best static actions on TRAIN labels (`evaluation.online.best_statics`, every labelled method) and their offline
   TPS on TEST;
2. policies: autoregressive, chain, the adaptive chain, the threshold chain (N and threshold tuned on
   ``evaluate.tune_prompts`` TRAIN prompts, `tuned_threshold_chain`), the best static of each of ``evaluate.methods``
   and the one of the highest TRAIN TPS over every labelled method (``best_static``, the hardware-aware best static
   tree), prompt lookup (tuned on TRAIN prompts), the selector (``auto`` and restricted to each of
   ``evaluate.selector_methods``, priced with ``profile.out``) and the selector behind prompt lookup (the headline);
   every policy built by the registry (`policies.registry`);
3. ``evaluate.prompts`` TEST prompts x ``evaluate.seeds`` decoded by every policy (`decode_units`), every step priced
   by `decoding.pricing` next to its measured seconds: the pricing audit (`evaluation.audit`);
4. tokens/s and block efficiency with paired bootstrap intervals, ratios to autoregressive, Traversal's
   best static, the best static and the adaptive chain (flat ``selector_vs_*`` keys with ``_lo`` / ``_hi``) (`evaluation.paired_stats`), gains by temperature and prompt source, per-depth acceptance;
5. findings from the labels (`evaluation.claims`); the report (`evaluation.report`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from decoding.errors import UserInputError
from decoding.files import write_json_atomic

SECTIONS = ("model", "tracking", "trajectories", "actions", "profile", "collect", "export", "evaluate")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging")
    parser.add_argument("--no-selector", action="store_true", help="evaluate without the exported selector")


def pick_units(cfg, split: str = "test", n: int | None = None):
    """The ``split`` trajectories to decode, one per prompt: ``n`` of them (default ``evaluate.prompts``; 0 = all),
    in a seeded order; returns ``(units, available prompts)``. A prompt sampled at several settings
    (``trajectories.all_settings``) is decoded at one of them, picked by the same seeded hash, so every setting
    is represented."""
    import hashlib

    from data_collection.trajectory_store import load_trajectories

    trajs = load_trajectories(cfg.trajectories.out, splits=[split])
    if not trajs:
        raise UserInputError(f"no {split.upper()} trajectories in {cfg.trajectories.out}; check prompts.split")
    seen, units = set(), []
    def order(t) -> str:
        return hashlib.sha256(f"{cfg.evaluate.seed}|{t.prompt_id}|{t.temperature}|{t.top_p}|{t.sample}".encode()).hexdigest()

    for t in sorted(trajs, key=order):
        if t.prompt_id not in seen:  # one trajectory (setting) per prompt
            seen.add(t.prompt_id)
            units.append(t)
    n = (cfg.evaluate.prompts if n is None else n) or len(units)
    return units[:n], len(units)


def tuned_threshold_chain(cfg, decoder):
    """``(policy, tuning)``: the threshold chain with N and the threshold tuned on ``evaluate.tune_prompts`` TRAIN
    prompts (`evaluation.online.tune_threshold_chain`), or ``(None, None)`` when ``evaluate.threshold_chain`` is off."""
    from evaluation import online as oe

    ec = cfg.evaluate
    if not ec.threshold_chain:
        return None, None
    units, _ = pick_units(cfg, "train", ec.tune_prompts)
    tuning = oe.tune_threshold_chain(decoder, units, ec.tune_lengths, ec.tune_thresholds, ec.tune_max_new_tokens,
                                     ec.warmup)
    print(f"evaluate: threshold chain tuned on {len(units)} TRAIN prompts in {tuning['seconds']:.0f} s: "
          f"N = {tuning['max_length']}, threshold = {tuning['threshold']}", flush=True)
    return oe.threshold_chain_policy(tuning["max_length"], tuning["threshold"]), tuning


def tuned_prompt_lookup(cfg, decoder):
    """``(length, min_ngram, tuning)`` of prompt lookup decoding tuned on ``evaluate.tune_prompts`` TRAIN prompts
    (`evaluation.online.tune_prompt_lookup`), or None when ``evaluate.lookup`` is off."""
    from evaluation import online as oe

    ec = cfg.evaluate
    if not ec.lookup:
        return None
    units, _ = pick_units(cfg, "train", ec.tune_prompts)
    tuning = oe.tune_prompt_lookup(decoder, units, ec.lookup_lengths, ec.lookup_min_ngrams,
                                   ec.lookup_tune_max_new_tokens, ec.warmup)
    print(f"evaluate: prompt lookup tuned on {len(units)} TRAIN prompts in {tuning['seconds']:.0f} s: "
          f"N = {tuning['length']}, shortest suffix = {tuning['min_ngram']}", flush=True)
    return tuning


def _selector_spec(cfg, methods=None) -> dict:
    latency = cfg.profile.out if Path(cfg.profile.out).is_file() else None
    return {"folder": cfg.export.out, "latency": latency, "methods": methods}


def with_lookup(cfg, policies: list, tuning: dict | None) -> list:
    """``policies`` with prompt lookup (before the selectors) and the first selector decoded with the same lookup
    first (``<selector>:lookup``, on its own runtime)."""
    from evaluation import online as oe

    if tuning is None:
        return policies
    lookup = {"length": tuning["length"], "min_ngram": tuning["min_ngram"]}
    at = next((i for i, p in enumerate(policies) if p.kind == "selector"), len(policies))
    out = [*policies[:at], oe.prompt_lookup_policy(lookup["length"], lookup["min_ngram"]), *policies[at:]]
    selector = next((p for p in policies if p.kind == "selector"), None)
    if selector is not None:
        out.append(oe.selector_policy(f"{selector.name}:{oe.LOOKUP_FIRST}", _selector_spec(cfg), lookup))
    return out


def evaluated_policies(cfg, statics, space, with_selector: bool):
    from evaluation.online import adaptive_chain_policy, selector_policy, static_policy
    from policies.registry import build_policy

    policies = [build_policy("autoregressive")]
    for name, (method, a) in statics.items():
        policies.append(static_policy(name, method, space[a]))
    if cfg.evaluate.adaptive_chain:
        policies.append(adaptive_chain_policy(space, statics))
    runtime = None
    if with_selector:
        sel = selector_policy("selector", _selector_spec(cfg))
        runtime = sel.policy
        policies.append(sel.named("selector:auto" if runtime.auto else f"selector:{runtime.methods[0]}"))
        check_selector_methods(cfg.evaluate.selector_methods, runtime, cfg.export.out)
        if runtime.auto:
            for m in cfg.evaluate.selector_methods or runtime.methods:
                policies.append(selector_policy(f"selector:{m}", _selector_spec(cfg, [m])))
    return policies, runtime


def check_selector_methods(methods: list[str], runtime, folder: str) -> None:
    """``evaluate.selector_methods`` must have an effect: a `UserInputError` when the exported selector decides one
    method (not auto), or when it names a method the selector does not predict."""
    if methods and not runtime.auto:
        raise UserInputError(f"evaluate.selector_methods {methods} has no effect: the selector in {folder} predicts one "
                             f"method ({runtime.methods[0]}); set evaluate.selector_methods to [] or train it with "
                             "train.method: auto")
    missing = [m for m in methods if m not in runtime.methods]
    if missing:
        raise UserInputError(f"evaluate.selector_methods names {missing}, which the selector in {folder} does not "
                             f"predict (it has {runtime.methods})")


def offline_part(cfg):
    """Labels, best statics (TRAIN), their offline TPS (TEST and TRAIN), the best static of all, the findings."""

    from data_collection.dataset import read_dataset_manifest
    from data_collection.offline_table import load_offline_table
    from decoding.latency import LatencyModel
    from evaluation import online as oe
    from evaluation.claims import findings

    space, collected = cfg.actions.space(), read_dataset_manifest(cfg.collect.out)["methods"]
    decoded = list(dict.fromkeys(["traversal", *(cfg.evaluate.methods or cfg.collect.methods)]))
    missing = [m for m in decoded if m not in collected]
    if missing:
        raise UserInputError(f"evaluate.methods names {missing}, but {cfg.collect.out} has labels only for "
                             f"{sorted(collected)}; add them to collect.methods and re-collect, or drop them")
    # the best static is chosen among every labelled method; only it, the chain and evaluate.methods are decoded
    methods = list(dict.fromkeys([*decoded, *(m for m in cfg.collect.methods if m in collected)]))
    table = load_offline_table(cfg.collect.out, space, LatencyModel.load(cfg.profile.out),
                               priced=[*methods, oe.CHAIN_METHOD])  # each method's steps priced as its own
    fit, test = table.split_rows("train"), table.split_rows("test", all_when_missing=False)
    on_fit = table.rows(fit)
    statics = oe.best_statics(on_fit, methods, cfg.evaluate.chain)
    offline = oe.offline_tps(table.rows(test), statics)
    best = oe.best_static_name(oe.offline_tps(on_fit, statics))
    cols, labels = table.columns, table.labels
    tv = cols["l1_p_q_prev"] / 2 if "l1_p_q_prev" in cols else None
    found = findings(labels, space, cols["temperature"], tv)
    statics_decoded = {n: (m, a) for n, (m, a) in statics.items() if n in (oe.CHAIN_STATIC, best) or m in decoded}
    return {"space": space, "statics": statics_decoded, "offline": offline, "best_static": best, "findings": found,
            "test_roots": int(test.sum()), "fit_roots": int(fit.sum())}


@dataclass
class Decoded:
    """Every (unit, policy) decode of the evaluation (`decode_all`)."""

    units: list  # the TEST trajectories decoded, one per prompt
    available: int  # TEST prompts there were to pick from
    policies: list  # the `policies.registry.BuiltPolicy` decoded
    runtime: object | None  # the exported selector's runtime, when a selector policy was decoded
    runs: list[dict]  # one row per decode (`evaluation.online.decode_units`)
    seconds: float  # decoding time (tuning excluded)


def decode_all(cfg, args, off) -> Decoded:
    """The pair, the policies and every (unit, policy) decode."""
    import torch

    from decoding.latency import LatencyModel
    from engine.decoder import SpeculativeDecoder
    from evaluation import online as oe
    from models.loading import eos_ids, load_pair

    ec = cfg.evaluate
    units, available = pick_units(cfg)
    torch.set_num_threads(cfg.model.threads)
    pair = load_pair(cfg.model.target, cfg.model.draft, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                     cfg.model.placement())
    decoder = SpeculativeDecoder(pair.target, pair.draft, pair.vocab_size, eos_ids(pair.tokenizer, pair.target))
    policies, runtime = evaluated_policies(cfg, off["statics"], off["space"], ec.selector and not args.no_selector)
    threshold_chain, off["threshold_chain_tuning"] = tuned_threshold_chain(cfg, decoder)
    if threshold_chain is not None:
        policies.insert(next((i for i, p in enumerate(policies) if p.kind == "selector"), len(policies)),
                        threshold_chain)
    off["prompt_lookup_tuning"] = tuned_prompt_lookup(cfg, decoder)
    policies = with_lookup(cfg, policies, off["prompt_lookup_tuning"])
    print(f"evaluate: {len(units)} of {available} TEST prompts x {len(ec.seeds)} seeds x {len(policies)} policies "
          f"({', '.join(p.name + (f' {p.action}' if p.action else '') for p in policies)}), "
          f"{ec.max_new_tokens} new tokens each", flush=True)
    start = time.perf_counter()  # tuning above is not decode time: it is in the tuning's own seconds
    runs = oe.decode_units(decoder, units, policies, oe.DecodePlan(ec.max_new_tokens, tuple(ec.seeds), ec.warmup),
                           oe.Progress("evaluate"), LatencyModel.load(cfg.profile.out))
    return Decoded(units, available, policies, runtime, runs, time.perf_counter() - start)


def selector_policies(policies) -> dict[str, str | None]:
    """Names of the selector's policies: ``selector`` (the trained selector alone: the headline) and
    ``lookup_then_selector`` (prompt lookup's rule first, the selector elsewhere; None when it did not run)."""
    from evaluation.online import LOOKUP_FIRST

    alone = next((p.name for p in policies if p.kind == "selector" and not p.name.endswith(f":{LOOKUP_FIRST}")), None)
    lookup = next((p.name for p in policies if p.kind == "selector" and p.name.endswith(f":{LOOKUP_FIRST}")), None)
    return {"selector": alone, "lookup_then_selector": lookup}


def references(off) -> dict[str, str]:
    """Label -> policy name of every paired-ratio reference (absent policies are skipped by the table)."""
    from evaluation import online as oe

    refs = {"autoregressive": oe.AUTOREGRESSIVE, "traversal_best_static": "static:traversal",
            "adaptive_chain": oe.ADAPTIVE_CHAIN, "threshold_chain": oe.THRESHOLD_CHAIN,
            "prompt_lookup": oe.PROMPT_LOOKUP}
    if off["best_static"]:
        refs["best_static"] = off["best_static"]
    return refs


def tables(cfg, off, policies, runs):
    """``(policy table with paired ratios, gains by temperature / source)``."""
    import pandas as pd

    from evaluation.paired_stats import Bootstrap, gain_by, policy_table

    ec = cfg.evaluate
    df = pd.DataFrame(runs)
    refs = references(off)
    boot = Bootstrap(ec.ci, ec.bootstrap, ec.seed)
    table = policy_table(df, refs, boot)
    table = {p.name: table[p.name] for p in policies}  # in the order of the policies
    names = [p.name for p in policies]
    main_refs = {k: refs[k] for k in ("autoregressive", "traversal_best_static")}
    gains = {col: {ref: gain_by(df, col, names, refv, boot) for ref, refv in main_refs.items()}
             for col in ("temperature", "source")}
    for p in policies:
        table[p.name].update({"kind": p.kind, "method": p.method, "action": p.action,
                              "best_static": p.name == off["best_static"]})
        if p.name in off["offline"]:
            table[p.name]["offline"] = off["offline"][p.name]
    return table, gains


NOTE = ("tokens/s = sum new tokens / sum wall seconds (prefill included) over prompts x seeds; intervals: {ci:.0%} "
        "percentile bootstrap over prompts ({bootstrap} resamples), paired by prompt and seed for ratios; offline = "
        "path TPS from TEST labels and the step prices (decoding/pricing.py); best statics chosen on TRAIN labels; "
        "best_static = the hardware-aware best static tree; pricing_audit: measured vs modelled step seconds per "
        "policy (evaluation/audit.py)")


def run(cfg, args) -> int:
    from evaluation import online as oe
    from evaluation.audit import pricing_audit
    from evaluation.claims import findings_summary
    from evaluation.paired_stats import offline_vs_online, selector_ratios
    from evaluation.report import clean, write_outputs

    ec = cfg.evaluate
    start = time.perf_counter()
    off = offline_part(cfg)
    decoded = decode_all(cfg, args, off)
    units, policies, runtime, runs, decode_seconds = (decoded.units, decoded.policies, decoded.runtime, decoded.runs,
                                                      decoded.seconds)
    load_seconds = time.perf_counter() - start - decode_seconds  # labels, the pair, the policies, tuning
    table, gains = tables(cfg, off, policies, runs)
    train_metrics = json.loads(Path(ec.train_metrics).read_text()) if Path(ec.train_metrics).is_file() else None
    names = selector_policies(policies)
    alone, then = names["selector"], names["lookup_then_selector"]
    metrics = {
        "pair": {"target": cfg.model.target, "draft": cfg.model.draft, "threads": cfg.model.threads},
        "units": {"prompts": len(units), "available_test_prompts": decoded.available, "seeds": list(ec.seeds),
                  "max_new_tokens": ec.max_new_tokens, "runs": len(runs)},
        "seconds": {"load": load_seconds, "decode": decode_seconds, "total": time.perf_counter() - start,
                    "tune_threshold_chain": (off["threshold_chain_tuning"] or {}).get("seconds"),
                    "tune_prompt_lookup": (off.get("prompt_lookup_tuning") or {}).get("seconds")},
        "policies": table, "gain_by_temperature": gains["temperature"], "gain_by_source": gains["source"],
        "acceptance_by_depth": oe.depth_acceptance(runs), "best_static": off["best_static"],
        "chosen": {p.name: oe.chosen(runs, p.name) for p in policies
                   if p.kind in ("selector", oe.ADAPTIVE_CHAIN, oe.THRESHOLD_CHAIN, oe.PROMPT_LOOKUP)},
        "pricing_audit": pricing_audit(runs),
        "threshold_chain_tuning": off["threshold_chain_tuning"],
        "prompt_lookup_tuning": off.get("prompt_lookup_tuning"),
        "offline": {"test_roots": off["test_roots"], "fit_roots": off["fit_roots"], "statics": off["offline"],
                    "selector": _train_summary(train_metrics)},
        "findings": off["findings"], "findings_summary": findings_summary(off["findings"]),
        "note": NOTE.format(ci=ec.ci, bootstrap=ec.bootstrap),
    }
    if runtime is not None:
        metrics["selector"] = {"folder": cfg.export.out, "methods": runtime.methods, "auto": runtime.auto,
                               "feature_set": runtime.feature_set, "policy": alone, "policy_lookup_then": then}
    sel_offline = (metrics["offline"]["selector"] or {}).get("selector_vs_autoregressive")
    if alone in table and sel_offline is not None:  # its offline ratio (TEST roots, stage train)
        table[alone]["offline"] = {"vs_autoregressive": sel_offline}
    if alone:  # where the selector speculates or declines, what it chooses: per sampling setting / source
        metrics["selector_by"] = {col: oe.choices_by(runs, alone, col) for col in ("temperature", "source")}
    metrics["offline_vs_online"] = offline_vs_online(table)
    metrics.update(selector_ratios(table, alone, then))  # flat, for `dvc metrics diff` and the headline file
    paths = write_outputs(cfg, metrics, runs)
    write_json_atomic(Path(ec.metrics), clean(metrics), sort_keys=False)
    print(paths["summary"])
    print(f"evaluate: {len(runs)} runs in {decode_seconds:.0f} s (total {metrics['seconds']['total']:.0f} s) -> "
          f"{ec.metrics}, {ec.report}, {ec.plots}/")
    if not args.no_mlflow:
        _log_mlflow(cfg, metrics, paths)
    return 0


def _train_summary(train_metrics: dict | None) -> dict | None:
    """The offline TEST table of the trained selector (metrics/train.json of stage train), when present."""
    if not train_metrics:
        return None
    test = train_metrics.get("test") or train_metrics.get("val") or {}
    keep = ("roots", "tps", "selector_vs_best_static", "selector_vs_oracle", "selector_vs_autoregressive",
            "selector_vs_traversal_best_static", "best_static", "by_method", "chosen")
    out = {k: test[k] for k in keep if k in test}
    out.update({k: train_metrics.get(k) for k in ("method", "feature_set", "objective")})
    return out


def mlflow_name(policy: str) -> str:
    """A policy's MLflow metric prefix: ``selector_auto``; the selector behind prompt lookup's rule
    (``selector:auto:lookup``) is ``lookup_then_selector_auto``, named for what decodes first."""
    from evaluation.online import LOOKUP_FIRST

    base = policy.removesuffix(f":{LOOKUP_FIRST}")
    return ("lookup_then_" if base != policy else "") + base.replace(":", "_")


def _log_mlflow(cfg, metrics: dict, paths: dict) -> None:
    import mlflow

    from evaluation.report import clean
    from pipeline.tracking import start_run

    flat = {k: v for k, v in metrics.items() if k.startswith(("selector_vs_", "lookup_then_selector_vs_",
                                                               "prompt_lookup_vs_")) and isinstance(v, float)}
    for name, e in metrics["policies"].items():
        k = mlflow_name(name)
        flat[f"{k}/tokens_per_second"] = e["tokens_per_second"]["value"]
        flat[f"{k}/block_efficiency"] = e["block_efficiency"]["value"]
        for ref in ("autoregressive", "traversal_best_static"):
            if f"tps_vs_{ref}" in e:
                flat[f"{k}/tps_vs_{ref}"] = e[f"tps_vs_{ref}"]["value"]
    with start_run(cfg, "evaluate"):
        ec = cfg.evaluate
        mlflow.log_params({"prompts": ec.prompts, "seeds": ",".join(map(str, ec.seeds)),
                           "max_new_tokens": ec.max_new_tokens, "methods": ",".join(ec.methods),
                           "selector": cfg.export.out if "selector" in metrics else "-",
                           "target": cfg.model.target, "draft": cfg.model.draft})
        mlflow.log_metrics({k: float(v) for k, v in flat.items() if v == v})
        mlflow.log_artifact(cfg.evaluate.report, "report")
        for p in paths["figures"]:
            mlflow.log_artifact(str(p), "report/figures")
        mlflow.log_dict(clean(metrics), "evaluate.json")
