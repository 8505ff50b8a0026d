"""The confidence-threshold dynamic chain: the draft policy HF transformers ships for assisted generation
(``num_assistant_tokens`` = 20 and ``assistant_confidence_threshold`` = 0.4 by default), as a peer of the
selector.

Rule (`stop_length`): draft x_1 ~ q_0 = q(.|root); after drafting x_i from q_{i-1}, stop when the draft's
top-1 probability there, ``max q_{i-1}``, is below ``threshold``, or when ``i = max_length``. The chain
(``K = 1, L2 = 0``, length n >= 1) is verified by standard speculative sampling (``naive``).

Why it stays lossless: n is a function of the draft's own rows along the drafted path, i.e. of the draft
randomness only, never of the target. Given the drafted chain, standard speculative sampling emits the
target's law whatever the chain (every chain length is lossless), so mixing over n does too. The exact
proof is tests/test_threshold_chain.py (every draft outcome enumerated on `decoding.exact.TablePair`),
with a negative control: a stop rule that peeks at the target is caught.

`ThresholdChain` asks for such a chain with a `decoding.policy.Choice` whose ``stop_after`` is its stop rule
(`ThresholdChain.stops_after`); the engine drafts it (`engine.drafting.draft_stop_chain`: each token fed only when
the chain continues, no draft work past the stop) and records the realized chain as the step's action.
"""

from __future__ import annotations

import numpy as np

from decoding.actions import Action
from decoding.policy import Choice, Policy
from decoding.tree import DraftTree, build_tree

HF_MAX_LENGTH = 20  # transformers' num_assistant_tokens default
HF_THRESHOLD = 0.4  # transformers' assistant_confidence_threshold default


def stop_length(q_rows: np.ndarray, max_length: int, threshold: float) -> int:
    """Chain length n of the rule (module docstring) from the draft rows ``q_rows[i] = q_i`` (``i < n``)."""
    for i in range(1, max_length):
        if float(np.max(q_rows[i - 1])) < threshold:
            return i
    return max_length


def truncate_chain(tree: DraftTree, n: int) -> DraftTree:
    """The first ``n`` draft tokens of a chain tree as a chain of length n."""
    if tree.action.K != 1 or tree.action.L2 != 0 or not 1 <= n <= tree.action.L1:
        raise ValueError(f"truncate_chain: {tree.action} is not a chain of length >= {n}")
    q = tree.q_rows[: n + 1].copy()
    q[n] = 0.0  # the new leaf's row is never used
    return build_tree(Action(1, n, 0), tree.tokens[: n + 1], q)


class ThresholdChain(Policy):
    """The dynamic chain as a policy: ``select`` asks for the chain of ``max_length`` with the stop rule; the decoder
    drafts it and records the realized chain."""

    needs_draft = False

    def __init__(self, max_length: int = HF_MAX_LENGTH, threshold: float = HF_THRESHOLD) -> None:
        if max_length < 1 or not 0 <= threshold <= 1:
            raise ValueError(f"ThresholdChain needs max_length >= 1 and threshold in [0, 1], got {max_length}, "
                             f"{threshold}")
        self.max_length, self.threshold = int(max_length), float(threshold)

    def select(self, features) -> Choice:
        return Choice(Action(1, self.max_length, 0), stop_after=self.stops_after)

    def stops_after(self, q_row) -> bool:
        """The stop rule: the draft's top-1 probability at this node is below the threshold."""
        return float(np.max(q_row)) < self.threshold

    def __repr__(self) -> str:
        return f"ThresholdChain(max_length={self.max_length}, threshold={self.threshold})"
