"""The policy registry: every decoding policy by name, built from a plain mapping (`build_policy`).

`pipeline/decode.py`, `pipeline/evaluate.py` (through `evaluation.online`), the benchmarks and the transformers
integration build their policies here, so a name means one thing everywhere. Each entry returns a `BuiltPolicy`: the
`decoding.policy.Policy`, the verification method the decoder runs it with (a selector's `Choice` may override the
method per step), and what evaluation reports and prices of it:

| name | cfg keys | policy |
| --- | --- | --- |
| ``autoregressive`` | - | a plain step every step (no draft model) |
| ``static`` | ``action`` ("K,L1,L2"), ``method`` | the same tree every step |
| ``adaptive_chain`` | ``max_length``, ``initial`` | `policies.adaptive_chain.AdaptiveChain`, ``naive`` |
| ``threshold_chain`` | ``max_length``, ``threshold`` | `policies.threshold_chain.ThresholdChain`, ``naive`` |
| ``selector`` | ``folder``, ``latency`` (a profile path or None), ``methods`` (None: all) | `export.runtime.SelectorRuntime` |
| ``prompt_lookup`` | ``length``, ``min_ngram``, ``fallback`` (None, ``{"name": ..., **cfg}``, or a built `Policy`) | `policies.lookup.LookupFirst`: a lookup chain (``naive``) where the context repeats, else the fallback (None: a plain step) |

Numpy and onnxruntime only (no torch): a runtime that is not ours can use it as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from decoding.actions import AR_ACTION, AUTOREGRESSIVE, parse_action
from decoding.errors import UserInputError
from decoding.policy import Policy, StaticPolicy

from .adaptive_chain import AdaptiveChain

CHAIN_METHOD = "naive"  # chains (adaptive, threshold, lookup) are verified by standard speculative sampling


@dataclass(frozen=True)
class BuiltPolicy:
    """A policy of the registry, built (module docstring)."""

    policy: Policy
    method: str  # the decoder's method argument (``autoregressive`` for plain decoding)
    kind: str  # what it is, in reports: the registry name it was built as (evaluate also says "chain", "selector")
    name: str = ""  # its key in metrics and reports ("" -> ``kind``)
    action: str | None = None  # a static policy's action, "K,L1,L2"
    features: str | None = None  # the feature set a selector decides with (what deciding costs; None: no features)
    inference_seconds: float = 0.0  # a selector's own forward time per decided step

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.kind)

    def named(self, name: str, kind: str | None = None) -> BuiltPolicy:
        """The same policy under another metrics key (and reported kind)."""
        return replace(self, name=name, kind=kind or self.kind)


def _autoregressive(cfg: Mapping) -> BuiltPolicy:
    return BuiltPolicy(StaticPolicy(AR_ACTION), AUTOREGRESSIVE, "autoregressive")


def _static(cfg: Mapping) -> BuiltPolicy:
    action = parse_action(str(cfg["action"]))
    return BuiltPolicy(StaticPolicy(action), str(cfg.get("method", "traversal")), "static", action=str(action))


def _adaptive_chain(cfg: Mapping) -> BuiltPolicy:
    return BuiltPolicy(AdaptiveChain(int(cfg["max_length"]), int(cfg.get("initial", 2))), CHAIN_METHOD,
                       "adaptive_chain")


def _threshold_chain(cfg: Mapping) -> BuiltPolicy:
    from .threshold_chain import HF_MAX_LENGTH, HF_THRESHOLD, ThresholdChain

    policy = ThresholdChain(int(cfg.get("max_length", HF_MAX_LENGTH)), float(cfg.get("threshold", HF_THRESHOLD)))
    return BuiltPolicy(policy, CHAIN_METHOD, "threshold_chain")


def _selector(cfg: Mapping) -> BuiltPolicy:
    from export.runtime import SelectorRuntime

    runtime = SelectorRuntime(cfg["folder"], latency=cfg.get("latency"), methods=cfg.get("methods"))
    return BuiltPolicy(runtime, (cfg.get("methods") or runtime.methods)[0], "selector",
                       features=runtime.feature_set, inference_seconds=runtime.inference_seconds)


def _prompt_lookup(cfg: Mapping) -> BuiltPolicy:
    from .lookup import MAX_NGRAM, LookupFirst

    spec = cfg.get("fallback")
    if spec is not None and not isinstance(spec, Mapping):  # a policy its caller built and checked (transformers)
        fallback = BuiltPolicy(spec, CHAIN_METHOD, "policy")
    else:
        fallback = build_policy(spec["name"], spec) if spec else None
    min_ngram = int(cfg.get("min_ngram", 1))
    policy = LookupFirst(fallback.policy if fallback else None, int(cfg["length"]), max(MAX_NGRAM, min_ngram),
                         min_ngram, CHAIN_METHOD)
    method = fallback.method if fallback and fallback.method != AUTOREGRESSIVE else CHAIN_METHOD
    return BuiltPolicy(policy, method, "prompt_lookup", features=fallback.features if fallback else None,
                       inference_seconds=fallback.inference_seconds if fallback else 0.0)


POLICIES: dict[str, Callable[[Mapping], BuiltPolicy]] = {
    "autoregressive": _autoregressive, "static": _static, "adaptive_chain": _adaptive_chain,
    "threshold_chain": _threshold_chain, "selector": _selector, "prompt_lookup": _prompt_lookup,
}


def build_policy(name: str, cfg: Mapping[str, Any] | None = None) -> BuiltPolicy:
    """The policy registered as ``name``, built from ``cfg`` (module docstring); a clear error for an unknown name or
    a missing key."""
    if name not in POLICIES:
        raise UserInputError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    try:
        return POLICIES[name](cfg or {})
    except KeyError as e:
        raise UserInputError(f"policy {name!r} needs the setting {e.args[0]!r} (got {sorted(cfg or {})})") from None
