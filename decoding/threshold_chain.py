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

`draft_threshold_chain` drafts such a chain on the draft's KV cache, feeding each token only when the
chain continues (no draft work past the stop). The decoder calls it through a policy's ``draft_tree``
hook (`ThresholdChain.draft_tree`) and records the realized chain as the step's action.
"""

from __future__ import annotations

import numpy as np

from .actions import Action
from .sampling import Sampling, draw
from .tree import DraftTree, build_tree

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


def draft_threshold_chain(kv, root_slot: int, q_root: np.ndarray, max_length: int, threshold: float,
                          sampling: Sampling, vocab_size: int, rng: np.random.Generator, hidden: bool = False,
                          h_root: np.ndarray | None = None):
    """Draft the rule's chain below the root (the last slot of the draft cache ``kv``); returns a
    `decoding.engine.drafting.DraftedTree` whose action is the realized chain ``(1, n, 0)``."""
    from .engine.drafting import DraftedTree
    from .engine.torch_sampling import prob_rows
    from .engine.tree_pass import forward_nodes

    if root_slot != len(kv) - 1:
        raise RuntimeError(f"draft cache must end at the root (root slot {root_slot}, {len(kv)} slots)")
    tokens, rows = [-1], [np.asarray(q_root, dtype=np.float64)]
    node_slots = {0: root_slot}
    hid = {0: h_root} if hidden else None
    root_pos = kv.positions[root_slot]
    while True:
        i = len(tokens)  # the node drawn now, from rows[i - 1]
        tokens.append(int(draw(rows[i - 1][None], rng, 1)[0, 0]))
        if i >= max_length or float(np.max(rows[i - 1])) < threshold:
            break
        node_slots[i] = len(kv)
        logits, h = forward_nodes(kv, [tokens[i]], [root_pos + i], np.ones((1, len(kv) + 1), dtype=bool),
                                  output_hidden_states=hidden)
        rows.append(prob_rows(logits, sampling, vocab_size)[0])
        if hidden:
            hid[i] = h.float().cpu().numpy()[0]
    n = len(tokens) - 1
    q_rows = np.zeros((n + 1, vocab_size))
    q_rows[: len(rows)] = np.stack(rows)
    return DraftedTree(build_tree(Action(1, n, 0), np.array(tokens), q_rows), node_slots, hid, len(rows) - 1)


class ThresholdChain:
    """The dynamic chain as a policy: ``select`` names the cap (the chain of ``max_length``); a decoder with
    the ``draft_tree`` hook drafts through it and records the realized chain."""

    needs_hidden_states = False
    needs_draft = False

    def __init__(self, max_length: int = HF_MAX_LENGTH, threshold: float = HF_THRESHOLD) -> None:
        if max_length < 1 or not 0 <= threshold <= 1:
            raise ValueError(f"ThresholdChain needs max_length >= 1 and threshold in [0, 1], got {max_length}, "
                             f"{threshold}")
        self.max_length, self.threshold = int(max_length), float(threshold)

    def select(self, features) -> Action:
        return Action(1, self.max_length, 0)

    def draft_tree(self, kv, root_slot, q_root, action, sampling, vocab_size, rng, hidden=False, h_root=None):
        return draft_threshold_chain(kv, root_slot, q_root, self.max_length, self.threshold, sampling, vocab_size,
                                     rng, hidden, h_root)

    def __repr__(self) -> str:
        return f"ThresholdChain(max_length={self.max_length}, threshold={self.threshold})"
