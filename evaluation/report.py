"""The evaluate stage's outputs besides its metrics: plot data for `dvc plots show`, PNG figures and the report.

Plot data (``evaluate.plots``; the plot definitions are the top-level ``plots:`` of dvc.yaml):
- ``tps_by_policy.csv``: policy, tokens/s with its interval, block efficiency, ratio to autoregressive online
  and offline;
- ``gain_by_temperature.csv`` / ``gain_by_source.csv``: ``group`` ("<value> | <policy>") and the paired tokens/s
  ratio to autoregressive with its interval;
- ``acceptance_by_depth.csv``: depth and the per-depth acceptance of the chain, Traversal's best static and the
  selector (its ``auto`` policy, or its one method) online, and of the chain from the labels (fixed column
  names; empty where a policy is absent);
- ``chosen_actions.csv``: that selector policy's share of steps per step class (`decoding.pricing.step_class`).
The report (``evaluate.report``) shows the same data as PNGs in ``figures/`` next to it, the evaluation table,
the online-vs-offline comparison, the pricing audit (`evaluation.audit`) and the findings.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from .audit import TOLERANCE as AUDIT_TOLERANCE
from .audit import audit_table

DEPTH_COLUMNS = {"chain": "chain", "static_traversal": "static:traversal", "selector": "selector"}  # column -> policy


def clean(obj):
    """JSON-safe: non-finite floats become None (dvc and browsers reject NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return clean(obj.item())
    return obj


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else
                        (f"{v:.6g}" if isinstance(v, float) else v) for v in r])
    os.replace(tmp, path)
    return path


def _ci(e: dict | None, fmt: str = "{:.2f}") -> str:
    if not e or e.get("value") is None:
        return "-"
    lo, hi = e.get("low"), e.get("high")
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return fmt.format(e["value"]) + (f" [{fmt.format(lo)}, {fmt.format(hi)}]" if ok else "")


def _selector_policy(metrics: dict) -> str:
    """The selector's main policy: ``selector:auto``, or ``selector:<method>`` for a one-method selector."""
    return (metrics.get("selector") or {}).get("policy") or "selector:auto"


def plot_data(metrics: dict, folder: Path) -> list[Path]:
    pol = metrics["policies"]
    rows = [[name, e["tokens_per_second"]["value"], e["tokens_per_second"]["low"], e["tokens_per_second"]["high"],
             e["block_efficiency"]["value"], e.get("tps_vs_autoregressive", {}).get("value", float("nan")),
             (e.get("offline") or {}).get("vs_autoregressive", float("nan"))] for name, e in pol.items()]
    out = [_write_csv(folder / "tps_by_policy.csv", ["policy", "tokens_per_second", "low", "high", "block_efficiency",
                                                      "tps_vs_autoregressive", "offline_tps_vs_autoregressive"], rows)]
    for by in ("temperature", "source"):
        g = metrics[f"gain_by_{by}"].get("autoregressive", {})
        rows = [[f"{'T=' if by == 'temperature' else ''}{value} | {p}", r["value"], r["low"], r["high"]]
                for value, per in g.items() for p, r in per.items()]
        out.append(_write_csv(folder / f"gain_by_{by}.csv", ["group", "tps_vs_autoregressive", "low", "high"], rows))
    acc = dict(metrics["acceptance_by_depth"])
    acc["selector"] = acc.get(_selector_policy(metrics)) or []
    labels = (metrics["findings"]["claim3_ot_acceptance_falls_with_depth"] or {}).get("chain_acceptance", [])
    depth = max([len(acc.get(p, [])) for p in DEPTH_COLUMNS.values()] + [len(labels), 1])
    rows = [[d + 1, *[(acc.get(p) or [])[d] if d < len(acc.get(p) or []) else float("nan")
                      for p in DEPTH_COLUMNS.values()],
             labels[d] if d < len(labels) else float("nan")] for d in range(depth)]
    out.append(_write_csv(folder / "acceptance_by_depth.csv", ["depth", *DEPTH_COLUMNS, "chain_from_labels"],
                          [[(float("nan") if v is None else v) for v in r] for r in rows]))
    chosen = metrics["chosen"].get(_selector_policy(metrics)) or {}
    out.append(_write_csv(folder / "chosen_actions.csv", ["choice", "fraction"], [[k, v] for k, v in chosen.items()]))
    return out


def figures(metrics: dict, folder: Path) -> list[Path]:
    """The report's PNG figures in ``folder``: tokens/s by policy, gains by temperature and prompt source,
    acceptance by depth, the selector's chosen actions."""
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for draw in (_tps_figure, _gain_figures, _acceptance_figure, _chosen_figure):
        out.extend(draw(metrics, folder))
    return out


def _save(fig, path: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _ci_err(es: list[dict]) -> list[list[float]]:
    """matplotlib's ``xerr`` of intervals ``{"value", "low", "high"}`` (a missing bound draws no bar)."""
    return [[e["value"] - (e["low"] if e["low"] is not None else e["value"]) for e in es],
            [(e["high"] if e["high"] is not None else e["value"]) - e["value"] for e in es]]


def _tps_figure(metrics: dict, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    pol = metrics["policies"]
    names = list(pol)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 1.6), sharey=True)
    tps = [pol[n]["tokens_per_second"] for n in names]
    a1.barh(names, [e["value"] for e in tps], xerr=_ci_err(tps), color="#4c78a8", capsize=3)
    a1.set_xlabel("tokens/s (online, 95% CI)")
    a1.invert_yaxis()
    ratio = [pol[n].get("tps_vs_autoregressive") or {"value": math.nan, "low": None, "high": None} for n in names]
    a2.barh(names, [e["value"] for e in ratio], xerr=_ci_err(ratio), color="#72b7b2", capsize=3, label="online")
    off = [(pol[n].get("offline") or {}).get("vs_autoregressive", math.nan) for n in names]
    a2.scatter(off, names, color="#e45756", zorder=3, label="offline (TEST labels)")
    a2.axvline(1.0, color="gray", ls="--", lw=1)
    a2.set_xlabel("tokens/s ratio to autoregressive")
    a2.legend(loc="lower right", fontsize=8)
    return _save(fig, folder / "tps_by_policy.png")


def _gain_figures(metrics: dict, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    out: list[Path] = []
    for by in ("temperature", "source"):
        g = metrics[f"gain_by_{by}"].get("autoregressive", {})
        groups = [(v, p, r) for v, per in g.items() for p, r in per.items()]
        if not groups:
            continue
        fig, ax = plt.subplots(figsize=(8, 0.3 * len(groups) + 1.4))
        labels = [f"{'T=' if by == 'temperature' else ''}{v} | {p}" for v, p, _ in groups]
        ax.barh(labels, [r["value"] for *_, r in groups], xerr=_ci_err([r for *_, r in groups]), color="#54a24b",
                capsize=2)
        ax.axvline(1.0, color="gray", ls="--", lw=1)
        ax.invert_yaxis()
        ax.set_xlabel(f"tokens/s ratio to autoregressive, by {by} (paired, 95% CI)")
        out += _save(fig, folder / f"gain_by_{by}.png")
    return out


def _acceptance_figure(metrics: dict, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, acc in metrics["acceptance_by_depth"].items():
        if acc and any(a is not None and a == a for a in acc):
            ax.plot(range(1, len(acc) + 1), [math.nan if a is None else a for a in acc], marker="o", label=name)
    c3 = metrics["findings"]["claim3_ot_acceptance_falls_with_depth"]
    if c3.get("chain_acceptance"):
        acc = c3["chain_acceptance"]
        ax.plot(range(1, len(acc) + 1), acc, "k--", marker="x", label=f"chain from labels ({c3['chain_method']})")
    ax.set_xlabel("depth")
    ax.set_ylabel("acceptance at depth")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return _save(fig, folder / "acceptance_by_depth.png")


def _chosen_figure(metrics: dict, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    chosen = metrics["chosen"].get(_selector_policy(metrics)) or {}
    if not chosen:
        return []
    top = list(chosen.items())[:15]
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(top) + 1.3))
    ax.barh([k for k, _ in top], [v for _, v in top], color="#f58518")
    ax.invert_yaxis()
    ax.set_xlabel("share of the selector's steps (online)")
    return _save(fig, folder / "chosen_actions.png")


def evaluation_table(metrics: dict) -> str:
    rows = ["| policy | action | block efficiency | tokens/s | vs autoregressive | vs Traversal best static | "
            "decode after the prefill, vs autoregressive | offline vs AR |", "|---|---|---|---|---|---|---|---|"]
    for name, e in metrics["policies"].items():
        off = (e.get("offline") or {}).get("vs_autoregressive")
        rows.append(f"| {name} | {e.get('action') or '-'} | {_ci(e['block_efficiency'])} | "
                    f"{_ci(e['tokens_per_second'], '{:.1f}')} | {_ci(e.get('tps_vs_autoregressive'))} | "
                    f"{_ci(e.get('tps_vs_traversal_best_static'))} | {_ci(e.get('decode_tps_vs_autoregressive'))} | "
                    f"{'-' if off is None else f'{off:.2f}'} |")
    return "\n".join(rows)


def selector_by_group(metrics: dict) -> str:
    """Per sampling setting and prompt source: the selector's speculation rate, top choices and its gain."""
    by = metrics.get("selector_by") or {}
    policy = _selector_policy(metrics)
    if not by or not policy:
        return "No selector was evaluated."
    gains = {"temperature": metrics.get("gain_by_temperature") or {}, "source": metrics.get("gain_by_source") or {}}
    rows = [f"Policy `{policy}` (the trained selector). Declines: share of its steps without a draft tree (a plain "
            "step); gains: paired tokens/s ratios.", "",
            "| group | steps | declines | top choices | vs autoregressive | vs Traversal best static |",
            "|---|---|---|---|---|---|"]
    for col, label in (("temperature", "T"), ("source", "source")):
        for value, e in (by.get(col) or {}).items():
            top = ", ".join(f"{k} {v:.0%}" for k, v in e["top"].items())
            ar = (gains[col].get("autoregressive") or {}).get(value, {}).get(policy)
            trav = (gains[col].get("traversal_best_static") or {}).get(value, {}).get(policy)
            rows.append(f"| {label} = {value} | {e['steps']} | {1 - e['speculate_fraction']:.0%} | {top} | {_ci(ar)} | "
                        f"{_ci(trav)} |")
    return "\n".join(rows)


def _selector_offline(sel: dict | None) -> str:
    if not sel or "tps" not in sel:
        return "No `metrics/train.json` (stage train) was found: the trained selector's offline table is absent."
    t = sel["tps"]
    lines = [f"Trained selector ({sel.get('method')}, {sel.get('feature_set')}, {sel.get('objective')}) on "
             f"{sel.get('roots')} TEST roots, offline (labels + latency profile): "
             f"{t.get('selector', math.nan):.1f} tokens/s = {sel.get('selector_vs_autoregressive', math.nan):.2f}x "
             f"autoregressive, {sel.get('selector_vs_traversal_best_static', math.nan):.2f}x Traversal's best static, "
             f"{sel.get('selector_vs_best_static', math.nan):.2f}x its best static ({sel.get('best_static')}), "
             f"{sel.get('selector_vs_oracle', math.nan):.2f}x the oracle."]
    for m, e in (sel.get("by_method") or {}).items():
        lines.append(f"- restricted to {m}: {e['tps_selector_this_method']:.1f} tokens/s offline vs its best static "
                     f"{e['best_static']} {e['tps_best_static']:.1f}")
    return "\n".join(lines)


def headline_paragraph(metrics: dict) -> str:
    pol = metrics["policies"]
    sel = pol.get(_selector_policy(metrics))
    trav = pol.get("static:traversal")
    parts = []
    if sel:
        parts.append(f"The trained selector alone decodes at {_ci(sel['tokens_per_second'], '{:.1f}')} tokens/s: "
                     f"{_ci(sel.get('tps_vs_autoregressive'))}x autoregressive, "
                     f"{_ci(sel.get('tps_vs_best_static'))}x the best static ({metrics.get('best_static')}) and "
                     f"{_ci(sel.get('tps_vs_traversal_best_static'))}x Traversal's best static action "
                     "(the paper reports 1.05x over Traversal on its GPU pairs).")
    then = pol.get((metrics.get("selector") or {}).get("policy_lookup_then") or "")
    lookup = pol.get("prompt_lookup")
    if lookup:
        parts.append(f"Prompt lookup decoding alone (no draft model) runs at {_ci(lookup.get('tps_vs_autoregressive'))}x "
                     "autoregressive.")
    if then:
        parts.append("Lookup then selector (a context lookup chain where the text repeats itself, the selector "
                     f"elsewhere) runs at {_ci(then.get('tps_vs_autoregressive'))}x autoregressive and "
                     f"{_ci(then.get('tps_vs_prompt_lookup'))}x prompt lookup alone.")
    if trav:
        parts.append(f"Traversal's best static ({trav.get('action')}) runs at {_ci(trav.get('tps_vs_autoregressive'))}x "
                     f"autoregressive with block efficiency {_ci(trav['block_efficiency'])}.")
    return " ".join(parts)


def report_markdown(metrics: dict, figure_names: list[str]) -> str:
    u, s = metrics["units"], metrics["seconds"]
    from evaluation.claims import markdown as findings_md

    fig = {Path(n).stem: f"figures/{Path(n).name}" for n in figure_names}
    img = lambda key, alt: f"![{alt}]({fig[key]})" if key in fig else ""  # noqa: E731
    off = metrics["offline"]
    return "\n".join([
        "# branchpoint: evaluation report", "",
        f"Pair: target `{metrics['pair']['target']}`, draft `{metrics['pair']['draft']}`, "
        f"{metrics['pair']['threads']} CPU threads. {u['prompts']} TEST prompts (of {u['available_test_prompts']}) x "
        f"{len(u['seeds'])} seed(s), {u['max_new_tokens']} new tokens, each prompt at its own sampling setting; "
        f"{u['runs']} decodes in {s['decode']:.0f} s.", "",
        "## Headline", "", headline_paragraph(metrics), "",
        "## End-to-end decoding", "",
        "Tokens/s = new tokens / wall seconds (prefill included), summed over prompts and seeds; brackets: 95% "
        "bootstrap intervals over prompts, ratios paired by prompt and seed. *Decode after the prefill* leaves out "
        "the prompt's prefill (the same target pass for every policy), as the offline numbers do. Best static "
        "actions were chosen on TRAIN labels; *offline vs AR* is the same policy's path TPS on the TEST labels with "
        "the latency profile, the number the selector is trained to maximise.", "",
        evaluation_table(metrics), "", img("tps_by_policy", "tokens/s by policy"), "",
        "## Where the selector speculates, what it chooses, what it gains", "",
        selector_by_group(metrics), "",
        "## Online vs offline", "",
        f"Offline numbers use {off['test_roots']} TEST roots (statics fitted on {off['fit_roots']} TRAIN roots). "
        "Block efficiency carries over from the labels; the price of a step is what the pricing audit checks.", "",
        _selector_offline(off.get("selector")), "",
        offline_online_table(metrics.get("offline_vs_online") or {}), "",
        "## Pricing audit", "",
        "Every decoded step priced by `decoding/pricing.py` at its context length, next to what the decoder measured "
        "(seconds summed over each policy's steps, prefill on its own column). *Relative to AR* divides a policy's "
        "measured / modelled by autoregressive's in the same run: a machine phase cancels, a wrong relative price "
        f"does not; (off) marks a policy beyond 1 +- {AUDIT_TOLERANCE}.", "",
        audit_table(metrics.get("pricing_audit") or {}), "",
        "## Where the time goes", "",
        img("gain_by_temperature", "gain by temperature"), img("gain_by_source", "gain by prompt source"), "",
        img("acceptance_by_depth", "acceptance by depth"), img("chosen_actions", "chosen actions"), "",
        "## Findings from the collected labels", "",
        findings_md(metrics["findings"]), "",
    ])


def offline_online_table(rows: dict) -> str:
    """Each labelled policy's offline path estimate (ratio to AR, `decoding.throughput`) next to its online ratio;
    the policies whose online interval does not hold the estimate are named below the table."""
    if not rows:
        return ""
    lines = ["| policy | offline (path) x AR | online x AR, decode after the prefill [95%] | inside |",
             "| --- | --- | --- | --- |"]
    for name, r in rows.items():
        online = _ci({"value": r["online"], "low": r["low"], "high": r["high"]}, "{:.3f}")
        lines.append(f"| {name} | {r['offline']:.3f} | {online} | {'yes' if r['inside'] else '**no**'} |")
    out = [n for n, r in rows.items() if not r["inside"]]
    if out:
        lines += ["", f"Outside the online interval: {', '.join(out)}. The path estimator assumes a step's E and T "
                  "change slowly along the text and that every step runs to its E; end-of-decode steps, label noise and "
                  "prices that moved since the profile move the two apart (docs/throughput.md)."]
    return "\n".join(lines)


def summary_text(metrics: dict) -> str:
    lines = [f"{'policy':28s} {'action':8s} {'BE':>6s} {'tok/s':>7s} {'xAR':>6s} {'xTrav':>6s} {'offline xAR':>11s}"]
    for name, e in metrics["policies"].items():
        def v(key, e=e):
            x = (e.get(key) or {}).get("value")
            return math.nan if x is None else x
        off = (e.get("offline") or {}).get("vs_autoregressive", math.nan)
        lines.append(f"{name:28s} {e.get('action') or '-':8s} {e['block_efficiency']['value']:6.2f} "
                     f"{e['tokens_per_second']['value']:7.1f} {v('tps_vs_autoregressive'):6.2f} "
                     f"{v('tps_vs_traversal_best_static'):6.2f} {off:11.2f}")
    return "\n".join(lines)


def write_outputs(cfg, metrics: dict, runs: list[dict]) -> dict:
    """Plot data, figures and the report; returns their paths and a console summary."""
    ec = cfg.evaluate
    report = Path(ec.report)
    data = plot_data(metrics, Path(ec.plots))
    figs = figures(metrics, report.parent / "figures")
    report.parent.mkdir(parents=True, exist_ok=True)
    tmp = report.with_name(f".{report.name}.tmp{os.getpid()}")
    tmp.write_text(report_markdown(metrics, [str(p) for p in figs]))
    os.replace(tmp, report)
    return {"plots": data, "figures": figs, "report": report, "summary": summary_text(metrics)}
