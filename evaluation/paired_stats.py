"""Confidence intervals for end-to-end decoding measurements, paired by prompt and seed (numpy / pandas).

Terms:
- a *run*: one policy decoding one prompt with one seed; it yields ``tokens`` (new tokens), ``seconds``
  (wall time, prefill included), ``decode_seconds`` (the steps after the prompt's prefill: what the offline path
  estimator models), ``emitted`` (tokens the steps produced) and ``steps`` (target passes).
- a *unit*: a (prompt, seed) pair; every policy decodes every unit, so two policies are compared on the
  same units (*paired*): per-prompt difficulty and most of the machine's drift cancel in their ratio.
- an aggregate *rate* over units: ``sum num / sum den`` (tokens/s = sum tokens / sum seconds; block
  efficiency = sum emitted / sum steps), the way a long decoding job experiences it.
- a *ratio* of two policies: rate of A / rate of B over the same units.

Intervals are percentile bootstraps that resample PROMPTS with replacement (a prompt's seeds move
together: they share its text, so they are not independent): `Bootstrap` says how (level, draws, seed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Bootstrap:
    """A percentile bootstrap: the interval's level ``ci``, ``n_boot`` resamples, drawn with ``seed``."""

    ci: float = 0.95
    n_boot: int = 2000
    seed: int = 0


def _group_weights(groups: np.ndarray, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(index [U] of each unit's group, weights [n_boot, G])``: how often each group is drawn per resample."""
    _, idx = np.unique(groups, return_inverse=True)
    g = int(idx.max()) + 1 if idx.size else 0
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, g, size=(n_boot, g)) if g else np.zeros((n_boot, 0), dtype=np.int64)
    weights = np.zeros((n_boot, g))
    np.add.at(weights, (np.repeat(np.arange(n_boot), g), draws.reshape(-1)), 1.0)
    return idx, weights


def _sums(values: np.ndarray, idx: np.ndarray, g: int) -> np.ndarray:
    return np.bincount(idx, weights=np.asarray(values, dtype=np.float64), minlength=g)


def _interval(point: float, boot: np.ndarray, ci: float) -> dict:
    boot = boot[np.isfinite(boot)]
    lo, hi = (np.quantile(boot, [(1 - ci) / 2, (1 + ci) / 2]) if boot.size else (np.nan, np.nan))
    return {"value": float(point), "low": float(lo), "high": float(hi)}


def rate_ci(num, den, groups, boot: Bootstrap = Bootstrap()) -> dict:
    """``sum num / sum den`` over units with a bootstrap interval over ``groups`` (``[U]`` each)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    idx, w = _group_weights(np.asarray(groups), boot.n_boot, boot.seed)
    g = w.shape[1]
    n, d = _sums(num, idx, g), _sums(den, idx, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        draws = (w @ n) / (w @ d)
    return _interval(num.sum() / den.sum(), draws, boot.ci)


def ratio_ci(a: tuple, b: tuple, groups, boot: Bootstrap = Bootstrap()) -> dict:
    """Paired ratio ``(sum num_a / sum den_a) / (sum num_b / sum den_b)`` of ``a = (num_a, den_a)`` and
    ``b = (num_b, den_b)``: the four arrays are aligned on the same units (``[U]``), resampled together by
    ``groups``."""
    arrays = [np.asarray(x, np.float64) for x in (*a, *b)]
    idx, w = _group_weights(np.asarray(groups), boot.n_boot, boot.seed)
    g = w.shape[1]
    na, da, nb, db = (w @ _sums(x, idx, g) for x in arrays)
    with np.errstate(invalid="ignore", divide="ignore"):
        draws = (na / da) / (nb / db)
    a, b = arrays[0].sum() / arrays[1].sum(), arrays[2].sum() / arrays[3].sum()
    return _interval(a / b, draws, boot.ci)


def paired(runs: pd.DataFrame, a: str, b: str, keys=("prompt_id", "seed")) -> pd.DataFrame:
    """Runs of policies ``a`` and ``b`` joined on their common units (columns suffixed ``_a`` / ``_b``)."""
    left = runs[runs["policy"] == a].set_index(list(keys))
    right = runs[runs["policy"] == b].set_index(list(keys))
    return left.join(right, how="inner", lsuffix="_a", rsuffix="_b").reset_index()


def policy_table(runs: pd.DataFrame, references: dict[str, str], boot: Bootstrap = Bootstrap()) -> dict[str, dict]:
    """Per policy: tokens/s (wall time, and ``decode_``: after the prefill) and block efficiency with intervals, and
    the paired ratio of each to each reference policy (``references``: label -> policy name; absent ones are skipped).

    ``runs``: one row per run with columns policy, prompt_id, seed, tokens, seconds, decode_seconds, emitted, steps."""
    out: dict[str, dict] = {}
    for policy, rows in runs.groupby("policy", sort=False):
        entry = {"units": int(len(rows)), "prompts": int(rows["prompt_id"].nunique()),
                 "tokens_per_second": rate_ci(rows["tokens"], rows["seconds"], rows["prompt_id"], boot),
                 "decode_tokens_per_second": rate_ci(rows["tokens"], rows["decode_seconds"], rows["prompt_id"], boot),
                 "block_efficiency": rate_ci(rows["emitted"], rows["steps"], rows["prompt_id"], boot)}
        for label, ref in references.items():
            if ref not in set(runs["policy"]):
                continue
            j = paired(runs, policy, ref)
            if not len(j):
                continue
            entry[f"tps_vs_{label}"] = ratio_ci((j["tokens_a"], j["seconds_a"]), (j["tokens_b"], j["seconds_b"]),
                                                j["prompt_id"], boot)
            entry[f"decode_tps_vs_{label}"] = ratio_ci((j["tokens_a"], j["decode_seconds_a"]),
                                                       (j["tokens_b"], j["decode_seconds_b"]), j["prompt_id"], boot)
            entry[f"block_efficiency_vs_{label}"] = ratio_ci((j["emitted_a"], j["steps_a"]),
                                                             (j["emitted_b"], j["steps_b"]), j["prompt_id"], boot)
        out[str(policy)] = entry
    return out


def gain_by(runs: pd.DataFrame, column: str, policies: list[str], reference: str,
            boot: Bootstrap = Bootstrap()) -> dict[str, dict[str, dict]]:
    """``{value of column: {policy: paired tokens/s ratio to reference (with interval)}}``, e.g. by temperature."""
    out: dict[str, dict[str, dict]] = {}
    for value, rows in runs.groupby(column, sort=True):
        for policy in policies:
            j = paired(rows, policy, reference)
            if len(j) and policy != reference:
                out.setdefault(str(value), {})[policy] = ratio_ci(
                    (j["tokens_a"], j["seconds_a"]), (j["tokens_b"], j["seconds_b"]), j["prompt_id"], boot)
    return out


RATIO_KEYS = {"ar": "autoregressive", "best_static": "best_static", "adaptive_chain": "adaptive_chain",
              "threshold_chain": "threshold_chain", "prompt_lookup": "prompt_lookup"}


def selector_ratios(table: dict, selector: str | None, lookup_then: str | None = None) -> dict:
    """Flat ``selector_vs_<peer>`` (+ ``_lo`` / ``_hi``) paired tokens/s ratios of the trained ``selector`` alone
    (None where a peer did not run), the same ``lookup_then_selector_vs_<peer>`` of prompt lookup's rule first and
    the selector elsewhere (``lookup_then``, when it ran), prompt lookup's own ``prompt_lookup_vs_ar``, and
    ``<key>_tps_vs_*`` of the selector and Traversal's best static."""
    out: dict = {}
    for prefix, name in (("selector", selector), ("lookup_then_selector", lookup_then)):
        if prefix == "lookup_then_selector" and name is None:
            continue
        entry = table.get(name, {}) if name else {}
        for key, ref in RATIO_KEYS.items():
            r = entry.get(f"tps_vs_{ref}")
            out[f"{prefix}_vs_{key}"] = r["value"] if r else None
            out[f"{prefix}_vs_{key}_lo"] = r["low"] if r else None
            out[f"{prefix}_vs_{key}_hi"] = r["high"] if r else None
    lookup = (table.get(RATIO_KEYS["prompt_lookup"]) or {}).get("tps_vs_autoregressive")
    if lookup:
        out.update({"prompt_lookup_vs_ar": lookup["value"], "prompt_lookup_vs_ar_lo": lookup["low"],
                    "prompt_lookup_vs_ar_hi": lookup["high"]})
    for key, name in (("selector", selector), ("static_traversal", "static:traversal")):
        if name in table:
            out[f"{key}_tps_vs_autoregressive"] = table[name]["tps_vs_autoregressive"]["value"]
            if "tps_vs_traversal_best_static" in table[name]:
                out[f"{key}_tps_vs_traversal_best_static"] = table[name]["tps_vs_traversal_best_static"]["value"]
    return out


def offline_vs_online(table: dict) -> dict[str, dict]:
    """Per policy of ``table`` with an offline estimate (``offline.vs_autoregressive``: path TPS on TEST labels,
    `decoding.throughput`): that estimate next to the online paired ratio to autoregressive of the decode after the
    prefill (``decode_tps_vs_autoregressive``: the labels and prices hold steps only; the prefill, the same for every
    policy, would pull a wall-time ratio towards 1) and its interval, and whether the interval holds it (``inside``).
    Policies without labels (adaptive and threshold chains, lookup) have no offline estimate and are left out."""
    out = {}
    for name, e in table.items():
        off = (e.get("offline") or {}).get("vs_autoregressive")
        on = e.get("decode_tps_vs_autoregressive") or {}
        if off is None or on.get("value") is None:
            continue
        lo, hi = on.get("low"), on.get("high")
        out[name] = {"offline": float(off), "online": on["value"], "low": lo, "high": hi,
                     "inside": bool(lo is not None and hi is not None and lo <= off <= hi)}
    return out
