"""Delayed tree expansion and lossless tree verification (numpy, a few numba loops; no language model).

Stable reference interface (external checks call it):

    from decoding import Action, METHODS, sample_tree, verify, expected_block_efficiency
    tree = sample_tree(action, draft, rng)   # draft(prefix) -> q(.|root+prefix)
    res = verify(tree, target, method, rng)  # res.tokens: accepted draft tokens + one emitted token
    be = expected_block_efficiency(tree, target, method)  # exact over verification randomness

The names are resolved lazily (PEP 562): importing a numpy-only module such as `decoding.features`,
`decoding.policy` or `decoding.latency` loads neither the verifiers (numba, scipy) nor torch, so
an ONNX runtime can use them with numpy alone.
"""

from __future__ import annotations

from .lazy_names import lazy_getattr

_EXPORTS = {
    "Action": ".actions",
    "ActionSpace": ".actions",
    "parse_action": ".actions",
    "expected_block_efficiency": ".labels",
    "DraftTree": ".tree",
    "sample_tree": ".tree",
    "target_rows": ".tree",
    "METHODS": ".verifiers",
    "VerifyResult": ".verifiers",
    "get_method": ".verifiers",
    "verify": ".verifiers",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
