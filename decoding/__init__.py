"""Delayed tree expansion and lossless tree verification (numpy, a few numba loops; no language model).

Stable reference interface (external checks call it):

    from decoding import Action, METHODS, sample_tree, verify, expected_block_efficiency
    tree = sample_tree(action, draft, rng)   # draft(prefix) -> q(.|root+prefix)
    res = verify(tree, target, method, rng)  # res.tokens: accepted draft tokens + one emitted token
    be = expected_block_efficiency(tree, target, method)  # exact over verification randomness
"""

from .actions import Action, ActionSpace, parse_action
from .labels import expected_block_efficiency
from .tree import DraftTree, sample_tree, target_rows
from .verifiers import METHODS, VerifyResult, get_method, verify

__all__ = [
    "METHODS",
    "Action",
    "ActionSpace",
    "DraftTree",
    "VerifyResult",
    "expected_block_efficiency",
    "get_method",
    "parse_action",
    "sample_tree",
    "target_rows",
    "verify",
]
