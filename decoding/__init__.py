"""Delayed tree expansion and the numbers around it: actions, trees, features, labels, prices (numpy).

Stable reference interface (external checks call it):

    from decoding import Action, METHODS, sample_tree, verify, expected_block_efficiency
    tree = sample_tree(action, draft, rng)   # draft(prefix) -> q(.|root+prefix)
    res = verify(tree, target, method, rng)  # res.tokens: accepted draft tokens + one emitted token
    be = expected_block_efficiency(tree, target, method)  # exact over verification randomness

The verification methods live in the package `verifiers`, the torch engine in `engine`. These names are
resolved on first use (PEP 562): importing a numpy-only module such as `decoding.features`,
`decoding.policy` or `decoding.latency` loads neither the verifiers (numba, scipy) nor torch, so an ONNX
runtime can use them with numpy alone. Project code imports each name from the module that defines it.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Action": "decoding.actions",
    "ActionSpace": "decoding.actions",
    "parse_action": "decoding.actions",
    "expected_block_efficiency": "decoding.labels",
    "DraftTree": "decoding.tree",
    "sample_tree": "decoding.tree",
    "target_rows": "decoding.tree",
    "METHODS": "verifiers",
    "VerifyResult": "verifiers",
    "get_method": "verifiers",
    "verify": "verifiers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'decoding' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
