"""The pricing audit: what each policy's decoded steps cost against what `decoding.pricing` priced them at.

Every run of stage evaluate records, per step class (plain, ``lookup:n``, ``<method>:K,L1,L2``), its steps, their
measured seconds (the decoder's own timing, the draft's prompt prefill excluded) and their modelled seconds at the
same context lengths (`evaluation.online.priced`). Summed over a policy's runs:

- ``measured_over_modelled``: how much slower than the model its steps ran; a machine phase moves every policy alike;
- ``relative_to_autoregressive``: that ratio over autoregressive's in the same run. A phase cancels here; a wrong
  *relative* price does not, and relative prices are what the selector's decisions rest on. It holds when within
  1 +- `TOLERANCE` (the selector's gains are 4-8%: a 5% error flips them).

The prefill (the target's, and the draft's first forward where a policy drafts) is its own line. For a policy that
decides with features, ``deciding`` sets what choosing measured in the decoder (features and ``select``, per decided
step) beside its price (`evaluation.online.deciding`): the part of a step the profile and stage train time apart.
"""

from __future__ import annotations

from collections.abc import Sequence

from decoding.actions import AUTOREGRESSIVE

TOLERANCE = 0.03


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def pricing_audit(runs: Sequence[dict], reference: str = AUTOREGRESSIVE) -> dict[str, dict]:
    """``{policy: {"modelled_seconds", "measured_seconds", "prefill_seconds", "steps", "measured_over_modelled",
    "relative_to_autoregressive", "holds", "by_class": {class: {...}}}}`` over ``runs`` (module docstring); sums over
    each policy's steps, prefill excluded from the first two."""
    out: dict[str, dict] = {}
    for r in runs:
        if "priced" not in r:
            continue
        entry = out.setdefault(r["policy"], {"modelled_seconds": 0.0, "measured_seconds": 0.0, "prefill_seconds": 0.0,
                                             "steps": 0, "by_class": {}})
        entry["prefill_seconds"] += float(r["time_s"].get("prefill", 0.0))
        if r.get("deciding"):
            d = entry.setdefault("deciding", {"steps": 0, "measured_seconds": 0.0, "modelled_seconds": 0.0})
            for key, value in zip(("steps", "measured_seconds", "modelled_seconds"), r["deciding"], strict=True):
                d[key] += value
        for klass, (steps, measured, modelled) in r["priced"].items():
            c = entry["by_class"].setdefault(klass, {"steps": 0, "measured_seconds": 0.0, "modelled_seconds": 0.0})
            c["steps"] += steps
            c["measured_seconds"] += measured
            c["modelled_seconds"] += modelled
            entry["steps"] += steps
            entry["measured_seconds"] += measured
            entry["modelled_seconds"] += modelled
    ref = out.get(reference)
    ref_ratio = _ratio(ref["measured_seconds"], ref["modelled_seconds"]) if ref else None
    for entry in out.values():
        entry["measured_over_modelled"] = _ratio(entry["measured_seconds"], entry["modelled_seconds"])
        for c in entry["by_class"].values():
            c["measured_over_modelled"] = _ratio(c["measured_seconds"], c["modelled_seconds"])
            c["relative_to_autoregressive"] = (c["measured_over_modelled"] / ref_ratio
                                               if ref_ratio and c["measured_over_modelled"] else None)
        rel = entry["measured_over_modelled"] / ref_ratio if ref_ratio and entry["measured_over_modelled"] else None
        entry["relative_to_autoregressive"] = rel
        entry["holds"] = rel is not None and abs(rel - 1) <= TOLERANCE
        entry["by_class"] = dict(sorted(entry["by_class"].items(), key=lambda kv: -kv[1]["steps"]))
        d = entry.get("deciding")
        if d and d["steps"]:
            d["measured_ms_per_step"] = 1000 * d["measured_seconds"] / d["steps"]
            d["modelled_ms_per_step"] = 1000 * d["modelled_seconds"] / d["steps"]
    return out


def audit_table(audit: dict[str, dict], top_classes: int = 3) -> str:
    """Markdown: per policy its steps, modelled and measured step seconds, their ratio and the ratio relative to
    autoregressive (flagged beyond `TOLERANCE`), its prefill, and its most frequent step classes' relative ratios."""
    if not audit:
        return "(no pricing audit: evaluate ran without a latency profile)"
    rows = ["| policy | steps | modelled s | measured s | measured / modelled | relative to AR | prefill s | "
            "main step classes (relative to AR) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, e in audit.items():
        rel = e["relative_to_autoregressive"]
        flag = "" if e["holds"] else " (off)"
        classes = ", ".join(f"{k} x{c['steps']} {c['relative_to_autoregressive']:.3f}"
                            for k, c in list(e["by_class"].items())[:top_classes]
                            if c["relative_to_autoregressive"] is not None)
        rows.append(f"| {name} | {e['steps']} | {e['modelled_seconds']:.2f} | {e['measured_seconds']:.2f} | "
                    f"{e['measured_over_modelled']:.3f} | {'-' if rel is None else f'{rel:.3f}'}{flag} | "
                    f"{e['prefill_seconds']:.2f} | {classes} |")
    deciding = [f"{name} {e['deciding']['measured_ms_per_step']:.3f} vs {e['deciding']['modelled_ms_per_step']:.3f}"
                for name, e in audit.items() if e.get("deciding", {}).get("steps")]
    if deciding:
        rows += ["", "Deciding, ms per decided step, measured in the decoder (features + `select`) vs priced: "
                 + "; ".join(deciding) + "."]
    return "\n".join(rows)
