"""``branchpoint headline``: stage headline, the dozen numbers of a pipeline run in one small file.

Reads the other stages' metrics files (``evaluate.metrics``, ``collect.metrics``, ``train_draft.metrics``;
a missing file or key gives ``null``) and writes ``metrics/headline.json`` (``--out``): one object
``{"headline": {...}}`` (dvc names its columns ``headline.<key>``, which ``dvc exp show --keep headline``
selects), so ``dvc metrics show metrics/headline.json``, ``dvc metrics diff
metrics/headline.json`` and ``dvc exp show --keep`` (README) show a run at a glance:

- ``selector_vs_ar`` and ``selector_vs_best_static`` (+ ``_lo`` / ``_hi``, the paired bootstrap interval),
  ``selector_vs_threshold_chain``, ``selector_vs_adaptive_chain``: end-to-end tokens/s of the exported selector
  ALONE on the TEST prompts over each reference policy (evaluate);
- ``prompt_lookup_vs_ar`` (+ interval): prompt lookup decoding alone (no draft model), lookup's own contribution;
- ``lookup_then_selector_vs_prompt_lookup`` (+ interval) and ``lookup_then_selector_vs_ar``: prompt lookup's tuned
  rule first and the selector where no suffix matched (``<selector>:lookup``), against lookup alone and AR;
- ``pricing_worst_relative``: of every policy's measured / modelled step seconds over autoregressive's (evaluate's
  pricing audit), the one farthest from 1;
- ``selector_tokens_per_second``, ``selector_block_efficiency``: the selector's own online numbers;
- ``offline_selector_vs_ar``, ``offline_oracle_vs_ar``: path TPS on TEST labels (selector, per-root oracle);
- ``draft_acceptance``: the draft's per-token acceptance on TEST prompts (mean over temperatures), of the pair's
  draft only: ``null`` when the metrics file names another draft than ``model.draft`` (a stale file);
- ``collect_seconds_per_root``: the cost of one collected root.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SECTIONS = ("model", "train_draft", "collect", "evaluate")  # the params sections it loads


OUT = "metrics/headline.json"
KEYS = ("selector_vs_ar", "selector_vs_ar_lo", "selector_vs_ar_hi", "selector_vs_best_static",
        "selector_vs_best_static_lo", "selector_vs_best_static_hi", "selector_vs_threshold_chain",
        "selector_vs_adaptive_chain", "prompt_lookup_vs_ar", "prompt_lookup_vs_ar_lo", "prompt_lookup_vs_ar_hi",
        "lookup_then_selector_vs_prompt_lookup", "lookup_then_selector_vs_prompt_lookup_lo",
        "lookup_then_selector_vs_prompt_lookup_hi", "lookup_then_selector_vs_ar", "pricing_worst_relative",
        "selector_tokens_per_second",
        "selector_block_efficiency", "offline_selector_vs_ar", "offline_oracle_vs_ar", "draft_acceptance",
        "collect_seconds_per_root")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=OUT, help="default: %(default)s")
    parser.add_argument("--experiments", action="store_true",
                        help="print the headline of every experiment (`dvc exp show --json`, passing -A, -n N, ... "
                             "after --) side by side instead of computing this run's")
    parser.add_argument("exp_show_args", nargs="*", help=argparse.SUPPRESS)


def _read(path: str | Path) -> dict:
    """A metrics file's JSON, or {} when it is missing (that stage did not run)."""
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        from decoding.errors import UserInputError

        raise UserInputError(f"{p}: not valid JSON ({e}); rerun the stage that writes it") from None


def _get(d, *path):
    """``d[path[0]][path[1]]...`` as a finite float, else None."""
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
        return None
    return float(d)


def _first(*values):
    return next((v for v in values if v is not None), None)


def _ratio(a, b):
    return a / b if a is not None and b else None


FLAT = ("selector_vs_best_static", "selector_vs_threshold_chain", "selector_vs_adaptive_chain", "prompt_lookup_vs",
        "lookup_then_selector_vs")  # evaluate's flat keys the headline copies (`evaluation.paired_stats`)


def from_evaluate(ev: dict) -> dict:
    """The evaluate part: flat keys when the evaluate stage writes them, else (the selector's ratios to AR and the
    best static) read from its policy table: the selector alone, named in ``ev["selector"]["policy"]``."""
    policy = (ev.get("selector") or {}).get("policy") or "selector"
    sel = (ev.get("policies") or {}).get(policy, {})
    offline = (ev.get("offline") or {}).get("selector") or {}
    return {
        "selector_vs_ar": _first(_get(ev, "selector_vs_ar"), _get(sel, "tps_vs_autoregressive", "value")),
        "selector_vs_ar_lo": _first(_get(ev, "selector_vs_ar_lo"), _get(sel, "tps_vs_autoregressive", "low")),
        "selector_vs_ar_hi": _first(_get(ev, "selector_vs_ar_hi"), _get(sel, "tps_vs_autoregressive", "high")),
        **{k: _get(ev, k) for k in KEYS if k.startswith(FLAT)},
        "selector_vs_best_static": _first(_get(ev, "selector_vs_best_static"),
                                          _get(sel, "tps_vs_best_static", "value")),
        "pricing_worst_relative": _worst_relative(ev.get("pricing_audit") or {}),
        "selector_tokens_per_second": _get(sel, "tokens_per_second", "value"),
        "selector_block_efficiency": _get(sel, "block_efficiency", "value"),
        "offline_selector_vs_ar": _get(offline, "selector_vs_autoregressive"),
        "offline_oracle_vs_ar": _ratio(_get(offline, "tps", "oracle"), _get(offline, "tps", "autoregressive")),
    }


def _worst_relative(audit: dict) -> float | None:
    values = [e["relative_to_autoregressive"] for e in audit.values() if e.get("relative_to_autoregressive")]
    return max(values, key=lambda v: abs(v - 1)) if values else None


def headline_metrics(ev: dict, collect: dict, draft: dict, draft_spec: str | None = None) -> dict:
    """All of `KEYS`, in that order (None where a stage did not write the number). ``draft_spec``: the pair's
    draft; a draft metrics file that names another draft gives no acceptance (one without a name is taken)."""
    named = draft.get("draft")
    if draft_spec is not None and named is not None and named != draft_spec:
        print(f"headline: {named!r} measured in the draft metrics is not model.draft {draft_spec!r}; "
              "draft_acceptance left null (rerun train_draft)")
        draft = {}
    acceptance = [float(v) for k, v in sorted(draft.items()) if k.startswith("acceptance_test_")
                  and isinstance(v, (int, float)) and math.isfinite(v)]
    out = {**from_evaluate(ev),
           "draft_acceptance": sum(acceptance) / len(acceptance) if acceptance else None,
           "collect_seconds_per_root": _get(collect, "seconds_per_root", "total")}
    return {k: out[k] for k in KEYS}


def run(cfg, args) -> int:
    from decoding.files import write_json_atomic

    if args.experiments:
        import subprocess

        done = subprocess.run(["dvc", "exp", "show", "--json", *args.exp_show_args], capture_output=True, text=True)
        if done.returncode != 0:
            from decoding.errors import UserInputError

            raise UserInputError(f"dvc exp show failed: {done.stderr.strip()}")
        print(experiments_table(json.loads(done.stdout)))
        return 0
    out = args.out
    values = headline_metrics(_read(cfg.evaluate.metrics), _read(cfg.collect.metrics), _read(cfg.train_draft.metrics),
                              cfg.model.draft)
    write_json_atomic(out, {"headline": values}, sort_keys=False)
    width = max(map(len, values))
    for k, v in values.items():
        print(f"{k:<{width}}  {'-' if v is None else f'{v:.4g}'}")
    print(f"headline -> {out}")
    return 0


def _runs(show: list[dict]) -> list[tuple[str, dict]]:
    """(label, data) of every row of ``dvc exp show --json``: each baseline commit, then its experiments."""
    def short(rev) -> str:
        rev = str(rev or "?")
        return rev[:7] if len(rev) == 40 else rev

    out = []
    for row in show:
        label = row.get("name") or short(row.get("rev"))
        if row.get("data"):
            out.append((label, row["data"]))
        for exp in row.get("experiments") or []:
            for rev in exp.get("revs") or []:
                if rev.get("data"):
                    out.append((rev.get("name") or short(rev.get("rev")), rev["data"]))
    return out


def experiments_table(show: list[dict], path: str = OUT, params: tuple[str, ...] = ("train.objective",
                      "train.feature_set")) -> str:
    """The headline of every run of ``dvc exp show --json``, transposed (one row per number, one column per
    run) so a dozen numbers of several experiments fit one screen; ``params`` rows first."""
    runs = _runs(show)
    rows = {p: [] for p in params} | {k: [] for k in KEYS}
    for _, data in runs:
        values = (((data.get("metrics") or {}).get(path) or {}).get("data") or {}).get("headline") or {}
        config = ((data.get("params") or {}).get("params.yaml") or {}).get("data") or {}
        for p in params:
            section, _, key = p.partition(".")
            rows[p].append(str((config.get(section) or {}).get(key, "-")))
        for k in KEYS:
            v = values.get(k)
            rows[k].append("-" if not isinstance(v, (int, float)) else f"{v:.4g}")
    names = [label for label, _ in runs]
    width = max(map(len, rows))
    cols = [max(len(n), *(len(r[i]) for r in rows.values())) for i, n in enumerate(names)]
    lines = [" " * width + "  " + "  ".join(n.rjust(c) for n, c in zip(names, cols, strict=True))]
    lines += [k.ljust(width) + "  " + "  ".join(v.rjust(c) for v, c in zip(r, cols, strict=True))
              for k, r in rows.items()]
    return "\n".join(lines)
