"""Findings from the collected labels: the paper's three claims on our pair, and GBV vs Traversal (numpy).

Input: labels ``E[method]`` ``[N, A]`` (Ê(c, a) of every root and action of an `ActionSpace`, NaN where a
method does not apply) and each root's temperature ``[N]``. Action families (tree size > 0 only):
- *root branching*: ``L1 = 0, K >= 2, L2 >= 1`` (K rollouts from the root);
- *delayed*: ``L1 >= 1, K >= 2, L2 >= 1`` (a trunk, then K rollouts);
- *chains*: ``K = 1`` or ``L2 = 0`` (canonical actions only: ``L2 = 0`` labels do not depend on K).
OT methods are the top-down verifiers of ALGORITHMS.md 3.1 that were collected (nss, naive_tree,
specinfer, spectr, khisti, naive); Traversal and GBV are not OT-based.

Claims (from "Dynamic Delayed Tree Expansion", arXiv 2602.16994), each tested on mean Ê over roots:
1. at root branching Traversal beats every OT method: for no OT method and root-branching action is mean
   Ê(traversal) < mean Ê(method) (ties, |gain| <= 1e-9, are counted apart), and against each it wins on some action; the gain is
   ``traversal / method - 1``;
2. delaying the branch point raises OT methods' block efficiency: at every tree size ``L1 + K * L2``
   that both families reach, the best delayed action's mean Ê > the best root-branching action's;
3. OT acceptance is high near the root and falls with depth while draft/target divergence grows: the
   per-depth acceptance ``a_d = S_d / S_(d-1)``, ``S_d = mean Ê(K, 0, d) - mean Ê(K, 0, d - 1)`` (for OT
   methods ``S_d`` is exactly P(at least d draft tokens accepted): the walk down to depth d - 1 is the
   same on both nested trees), decreases from depth 1 to the deepest depth, for K = 1 (the chain, where
   ``1 - a_d`` is the expected total-variation distance between p and q at the depth-d node the walk
   reached: the divergence) and for the largest K.
GBV (issue #15): mean Ê of GBV, Traversal and SpecInfer per family and temperature, and GBV with K
rollouts vs Block Verification (= Traversal on the K = 1 chain of the same depths), the comparison of
the GBV paper (+30% reported on OPT pairs).
"""

from __future__ import annotations

import warnings

import numpy as np

from decoding.actions import Action, ActionSpace
from decoding.method_names import CHAIN_EQUIVALENT

OT_METHODS = ("nss", "naive_tree", "specinfer", "spectr", "khisti", "naive")
TIE = 1e-9  # relative difference of mean labels counted as a tie (equal methods, e.g. on depth-1 trees)


def families(space: ActionSpace) -> dict[str, list[int]]:
    """Action indices of each family (see module docstring)."""
    canon = space.canonical_array()
    fam: dict[str, list[int]] = {"root_branching": [], "delayed": [], "chains": []}
    for i, a in enumerate(space):
        if a.tree_size == 0:
            continue
        if a.is_chain:
            if canon[i] == i:
                fam["chains"].append(i)
        elif a.L1 == 0:
            fam["root_branching"].append(i)
        else:
            fam["delayed"].append(i)
    return fam


def chain_source(methods) -> str | None:
    """The collected method whose K = 1 labels are standard speculative sampling's (chain decoding): the first of
    `decoding.method_names.CHAIN_EQUIVALENT` (the registry's `chain_equivalent_methods()`) collected."""
    return next((m for m in CHAIN_EQUIVALENT if m in methods), None)


def _nanmean(x: np.ndarray, axis: int | None = None):
    """``np.nanmean`` that gives NaN for an all-NaN slice (labels of a method that cannot verify those actions)
    without its "Mean of empty slice" warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def _mean(E: np.ndarray) -> np.ndarray:
    return _nanmean(E, axis=0) if E.shape[0] else np.full(E.shape[1], np.nan)


def claim_root_branching(labels: dict[str, np.ndarray], space: ActionSpace) -> dict:
    """Claim 1: Traversal vs every OT method on every root-branching action."""
    idx = families(space)["root_branching"]
    ots = [m for m in OT_METHODS if m in labels]
    if "traversal" not in labels or not ots or not idx:
        return {"testable": False, "why": "needs traversal, an OT method and root-branching actions (K >= 2)"}
    trav = _mean(labels["traversal"])[idx]
    per = {}
    for m in ots:
        gain = trav / _mean(labels[m])[idx] - 1
        per[m] = {"wins": int((gain > TIE).sum()), "ties": int((np.abs(gain) <= TIE).sum()),
                  "losses": int((gain < -TIE).sum()), "of": len(idx), "mean_gain": float(np.mean(gain)),
                  "min_gain": float(np.min(gain)), "worst_action": str(space[idx[int(np.argmin(gain))]])}
    best_ot = np.max(np.stack([_mean(labels[m])[idx] for m in ots]), axis=0)
    gain_best = trav / best_ot - 1
    holds = all(p["losses"] == 0 and p["wins"] > 0 for p in per.values())
    return {"testable": True, "holds": holds, "actions": len(idx),
            "per_method": per, "mean_gain_over_best_ot": float(np.mean(gain_best)),
            "min_gain_over_best_ot": float(np.min(gain_best))}


def _best_at_size(mean: np.ndarray, space: ActionSpace, idx: list[int]) -> dict[int, tuple[float, str]]:
    out: dict[int, tuple[float, str]] = {}
    for i in idx:
        n = space[i].tree_size
        if np.isfinite(mean[i]) and (n not in out or mean[i] > out[n][0]):
            out[n] = (float(mean[i]), str(space[i]))
    return out


def claim_delay(labels: dict[str, np.ndarray], space: ActionSpace) -> dict:
    """Claim 2: best delayed vs best root-branching action at each matched tree size, per OT method."""
    fam = families(space)
    ots = [m for m in OT_METHODS if m in labels]
    per = {}
    for m in [*ots, *(x for x in ("traversal", "gbv") if x in labels)]:
        mean = _mean(labels[m])
        root, delayed = _best_at_size(mean, space, fam["root_branching"]), _best_at_size(mean, space, fam["delayed"])
        sizes = sorted(set(root) & set(delayed))
        if not sizes:
            continue
        gains = np.array([delayed[n][0] / root[n][0] - 1 for n in sizes])
        per[m] = {"sizes": sizes, "wins": int((gains > 0).sum()), "of": len(sizes), "mean_gain": float(gains.mean()),
                  "by_size": {str(n): {"root": root[n][1], "root_E": root[n][0], "delayed": delayed[n][1],
                                       "delayed_E": delayed[n][0]} for n in sizes}}
    tested = [m for m in ots if m in per]
    if not tested:
        return {"testable": False, "why": "needs an OT method and tree sizes reached by both L1 = 0 and L1 > 0"}
    return {"testable": True, "holds": all(per[m]["wins"] == per[m]["of"] for m in tested), "per_method": per,
            "ot_methods": tested}


def depth_profile(E: np.ndarray, space: ActionSpace, K: int) -> np.ndarray:
    """``[D]`` per-depth acceptance ``a_d`` of the root-branching actions (K, 0, d), d = 1..D (K = 1: the chain
    (1, d, 0) then (1, L1max, j), the trunk and its first rollout: nested sub-chains of one union tree)."""
    mean = _mean(E)
    chain: list[Action] = []
    if K == 1:
        chain = [Action(1, d, 0) for d in space.L1 if d >= 1]
        last = max(space.L1)
        chain += [Action(1, last, j) for j in space.L2 if j >= 1]
    else:
        chain = [Action(K, 0, d) for d in space.L2 if d >= 1]
    values = [1.0]  # Ê of the empty tree
    for a in chain:
        if a not in space:
            break
        values.append(float(mean[space.index(space.canonical(a))]))
    s = np.diff(np.array(values))  # S_d = P(at least d accepted)
    prev = np.concatenate([[1.0], s[:-1]])
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / prev


def _falls(acc: np.ndarray) -> bool:
    acc = acc[np.isfinite(acc)]
    return bool(acc.size >= 2 and acc[0] > acc[-1])


def claim_depth(labels: dict[str, np.ndarray], space: ActionSpace, tv_prev: np.ndarray | None = None) -> dict:
    """Claim 3: per-depth acceptance of the chain and of root branching with the largest K, per OT method."""
    src = chain_source(labels)
    ots = [m for m in OT_METHODS if m in labels]
    if src is None or not ots:
        return {"testable": False, "why": "needs an OT method's labels"}
    chain = depth_profile(labels[src], space, 1)
    kmax = max(space.K)
    per = {m: depth_profile(labels[m], space, kmax).tolist() for m in [*ots, *(x for x in ("traversal",) if x in labels)]}
    out = {"testable": True, "chain_method": src, "chain_acceptance": chain.tolist(),
           "chain_divergence_tv": (1 - chain).tolist(), "K": kmax, "root_branching_acceptance": per,
           "falls_chain": _falls(chain), "falls_root_branching": {m: _falls(np.array(per[m])) for m in ots}}
    if tv_prev is not None and np.size(tv_prev):
        out["tv_prev_mean"] = float(np.nanmean(tv_prev))  # TV(p, q) at the token before the root (depth 0)
    out["holds"] = bool(out["falls_chain"] and all(out["falls_root_branching"].values()))
    return out


def gbv_comparison(labels: dict[str, np.ndarray], space: ActionSpace, temperature: np.ndarray) -> dict:
    """Mean Ê of GBV vs Traversal vs SpecInfer per family and temperature; GBV vs BV at equal depths."""
    methods = [m for m in ("gbv", "traversal", "specinfer") if m in labels]
    if "gbv" not in labels:
        return {"testable": False, "why": "gbv labels were not collected (add gbv to collect.methods)"}
    fam = families(space)
    temps = np.asarray(temperature, dtype=np.float64)
    groups = {"all": np.ones(len(temps), bool), **{f"T={t:g}": temps == t for t in np.unique(temps)}}
    table: dict[str, dict] = {}
    for name, idx in fam.items():
        if not idx:
            continue
        for g, rows in groups.items():
            entry = {m: float(_nanmean(labels[m][rows][:, idx])) for m in methods}
            for m in methods[1:]:
                entry[f"gbv_vs_{m}"] = entry["gbv"] / entry[m] - 1
            entry["roots"] = int(rows.sum())
            table.setdefault(name, {})[g] = entry
    out = {"testable": True, "methods": methods, "families": table, "actions": {k: len(v) for k, v in fam.items()}}
    if "traversal" in labels:  # GBV with K rollouts vs BV (traversal on the K = 1 chain, same depths)
        gm, tm = _mean(labels["gbv"]), _mean(labels["traversal"])
        ratios = [gm[i] / tm[space.index(Action(1, space[i].L1, space[i].L2))] - 1
                  for i in fam["root_branching"] + fam["delayed"] if Action(1, space[i].L1, space[i].L2) in space]
        out["gbv_vs_bv_same_depth"] = float(np.mean(ratios)) if ratios else float("nan")
        ch = fam["chains"]
        out["chain_max_abs_diff_gbv_traversal"] = float(np.nanmax(np.abs(gm[ch] - tm[ch]))) if ch else float("nan")
    return out


def findings(labels: dict[str, np.ndarray], space: ActionSpace, temperature: np.ndarray,
             tv_prev: np.ndarray | None = None) -> dict:
    """All of the above on one set of roots."""
    return {"roots": int(len(temperature)),
            "claim1_traversal_beats_ot_at_root_branching": claim_root_branching(labels, space),
            "claim2_delay_raises_ot_block_efficiency": claim_delay(labels, space),
            "claim3_ot_acceptance_falls_with_depth": claim_depth(labels, space, tv_prev),
            "gbv": gbv_comparison(labels, space, temperature)}


def findings_summary(f: dict) -> dict[str, float]:
    """A few flat numbers of the findings (for `dvc metrics diff`): verdicts as 0/1 and the main gains."""
    out: dict[str, float] = {}
    c1, c2, c3, g = (f[k] for k in ("claim1_traversal_beats_ot_at_root_branching",
                                    "claim2_delay_raises_ot_block_efficiency",
                                    "claim3_ot_acceptance_falls_with_depth", "gbv"))
    for name, c in (("claim1", c1), ("claim2", c2), ("claim3", c3)):
        if c.get("testable"):
            out[f"{name}_holds"] = float(c["holds"])
    if c1.get("testable"):
        out["claim1_traversal_vs_best_ot"] = c1["mean_gain_over_best_ot"]
    if c2.get("testable"):
        out["claim2_delay_gain_mean_over_ot"] = float(np.mean([c2["per_method"][m]["mean_gain"]
                                                               for m in c2["ot_methods"]]))
    if g.get("testable"):
        for fam, groups in g["families"].items():
            for m in g["methods"][1:]:
                out[f"gbv_vs_{m}_{fam}"] = groups["all"][f"gbv_vs_{m}"]
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def markdown(f: dict) -> str:
    """The findings as a short markdown section (verdicts first, then the numbers)."""
    lines = [f"Labels of {f['roots']} collected roots (mean Ê over roots)."]
    c1 = f["claim1_traversal_beats_ot_at_root_branching"]
    if c1["testable"]:
        worst = min(c1["per_method"].items(), key=lambda kv: kv[1]["min_gain"])
        lines.append(f"1. **Traversal beats every OT method at root branching: {'holds' if c1['holds'] else 'does not hold'}.** "
                     f"Over {c1['actions']} root-branching actions Traversal's mean Ê is {_pct(c1['mean_gain_over_best_ot'])} "
                     f"above the best OT method on average (least: {_pct(c1['min_gain_over_best_ot'])}); closest method "
                     f"{worst[0]} (of {worst[1]['of']} actions: {worst[1]['wins']} won, {worst[1]['ties']} tied, "
                     f"{worst[1]['losses']} lost; worst {_pct(worst[1]['min_gain'])} at "
                     f"{worst[1]['worst_action']}).")
    c2 = f["claim2_delay_raises_ot_block_efficiency"]
    if c2["testable"]:
        parts = ", ".join(f"{m} {c2['per_method'][m]['wins']}/{c2['per_method'][m]['of']} sizes "
                          f"({_pct(c2['per_method'][m]['mean_gain'])})" for m in c2["ot_methods"])
        extra = "".join(f"; {m} (not OT) {_pct(c2['per_method'][m]['mean_gain'])}" for m in ("traversal", "gbv")
                        if m in c2["per_method"])
        lines.append(f"2. **Delaying the branch point raises OT block efficiency at matched tree sizes: "
                     f"{'holds' if c2['holds'] else 'does not hold'}.** Best L1 > 0 vs best L1 = 0 action of the same "
                     f"size: {parts}{extra}.")
    c3 = f["claim3_ot_acceptance_falls_with_depth"]
    if c3["testable"]:
        ch = " ".join(f"{a:.2f}" for a in c3["chain_acceptance"])
        rb = "; ".join(f"{m} " + " ".join(f"{a:.2f}" for a in v) for m, v in c3["root_branching_acceptance"].items())
        tv = f" (TV at the token before the root: {c3['tv_prev_mean']:.2f})" if "tv_prev_mean" in c3 else ""
        lines.append(f"3. **OT acceptance falls with depth while divergence grows: {'holds' if c3['holds'] else 'does not hold'}.** "
                     f"Chain ({c3['chain_method']}) acceptance by depth: {ch}; divergence 1 - a_d = "
                     f"{' '.join(f'{d:.2f}' for d in c3['chain_divergence_tv'])}{tv}. Root branching with K = {c3['K']}: {rb}.")
    g = f["gbv"]
    if g["testable"]:
        lines.append("")
        lines.append("GBV vs Traversal vs SpecInfer (mean Ê; issue #15):")
        lines.append("")
        head = ["family", "sampling", "roots", *g["methods"], *[f"GBV vs {m}" for m in g["methods"][1:]]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for fam, groups in g["families"].items():
            for grp, e in groups.items():
                lines.append("| " + " | ".join([fam, grp, str(e["roots"]), *[f"{e[m]:.3f}" for m in g["methods"]],
                                                  *[_pct(e[f"gbv_vs_{m}"]) for m in g["methods"][1:]]]) + " |")
        if "gbv_vs_bv_same_depth" in g:
            lines.append("")
            lines.append(f"GBV with K >= 2 rollouts vs BV on the K = 1 chain of the same depths: "
                         f"{_pct(g['gbv_vs_bv_same_depth'])} (the GBV paper reports +30% on OPT pairs); on chains GBV "
                         f"and Traversal agree to {g['chain_max_abs_diff_gbv_traversal']:.1e} (K = 1 GBV is BV).")
    return "\n".join(lines)
