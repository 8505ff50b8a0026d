"""Context lookup drafts: a chain proposed by copying from the context, at no draft cost (beyond the paper).

Where the text repeats itself (code that reuses a name from the prompt, a quoted phrase), the tokens after
the root are often a copy of what followed the same n-gram earlier in the context. `propose` finds the
longest suffix of the context (``min_ngram`` to ``max_ngram`` tokens, root included) that occurred before,
takes its most recent earlier occurrence, and proposes the tokens that followed it (at most ``length``).
This is the candidate generator of prompt lookup decoding (HF transformers' ``prompt_lookup_num_tokens``).

As a draft the proposal is a chain whose q rows are one-hot (`decoding.tree.proposal_tree`): q(x_i | root, x_<i) = 1 for the
proposed token. Any verifier of a chain then accepts x_i with probability p_i(x_i) (min(1, p / q)) and samples
a rejection from max(p - q, 0), i.e. p without x_i: the emitted token follows p exactly. Lossless because the
proposal is a function of the accepted context only, fixed before the step's randomness; the exact proof is
tests/test_lookup.py (every outcome enumerated on `decoding.exact`'s tables, every verifier of a chain).

`LookupFirst` is the policy: where a proposal of at least ``min_ngram`` matched tokens exists it verifies that
chain (no draft forward at all: the draft catches up on the accepted tokens at its next step); elsewhere it
asks its ``fallback`` (the trained selector, or the plain step for prompt lookup decoding alone). Its choice
is a `decoding.policy.Choice` whose ``proposal`` is that chain's tree, one-hot rows as wide as the target's; the
decoder verifies it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoding.actions import AR_ACTION, Action
from decoding.policy import Choice, Policy, StepResult, as_policy
from decoding.tree import proposal_tree

__all__ = ["MAX_NGRAM", "LookupFirst", "Proposal", "propose"]

HF_LENGTH = 10  # transformers' prompt_lookup_num_tokens in its docs' examples
HF_MAX_NGRAM = 2  # transformers' max_matching_ngram_size default
MAX_NGRAM = 4  # the longest suffix our policies match (a tuned shortest one says how selective they are)


@dataclass(frozen=True)
class Proposal:
    """Tokens proposed after the root and the length of the matched suffix (root included)."""

    tokens: tuple[int, ...]
    ngram: int


def propose(context: Sequence[int], length: int, max_ngram: int = HF_MAX_NGRAM, min_ngram: int = 1
            ) -> Proposal | None:
    """The lookup proposal after ``context`` (token ids, ending with the root), or None when no suffix of
    ``min_ngram``..``max_ngram`` tokens occurred earlier. The longest matching suffix wins; among its earlier
    occurrences the most recent one; the proposal is what followed it, at most ``length`` tokens."""
    if length < 1 or not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"propose needs length >= 1 and 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
    ids = np.asarray(context, dtype=np.int64)
    n = ids.shape[0]
    for g in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        suffix = ids[n - g:]
        # starts i < n - g of an earlier occurrence: ids[i:i + g] == suffix, scanned from the most recent
        starts = np.flatnonzero(ids[: n - g] == suffix[0])
        for i in starts[::-1]:
            if np.array_equal(ids[i:i + g], suffix):
                follow = ids[i + g: i + g + length]
                return Proposal(tuple(int(t) for t in follow), g)
    return None


class LookupFirst(Policy):
    """Verify a context lookup chain where one matches (at least ``min_ngram`` tokens), else ask ``fallback``.

    ``fallback``: a policy (the trained selector), or None for a plain step (prompt lookup decoding alone).
    ``method``: the verification method of lookup chains (None: the decoder's). The lookup itself needs the
    context only, so this policy adds no draft work; the fallback's needs decide the rest (``needs_draft``,
    ``needs_hidden_states``). Only the steps the fallback chose are passed to its ``observe``."""

    def __init__(self, fallback: Policy | None = None, length: int = HF_LENGTH, max_ngram: int = HF_MAX_NGRAM,
                 min_ngram: int = 1, method: str | None = None) -> None:
        if length < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"LookupFirst needs length >= 1 and 1 <= min_ngram ({min_ngram}) <= max_ngram "
                             f"({max_ngram}), got length {length}")
        self.fallback = as_policy(fallback if fallback is not None else AR_ACTION)
        self.length, self.max_ngram, self.min_ngram, self.method = int(length), int(max_ngram), int(min_ngram), method
        self.needs_draft = self.fallback.needs_draft
        self.uses_draft_model = self.fallback.uses_draft_model
        self.needs_hidden_states = self.fallback.needs_hidden_states

    def select(self, features):
        found = propose(features.context, self.length, self.max_ngram, self.min_ngram) \
            if features.context is not None else None
        if found is not None:  # a match starts before the suffix: a token always follows it
            vocab_size = len(features.p_prev)  # the target's rows: the proposal's one-hot q rows are as wide
            return Choice(Action(1, len(found.tokens), 0), self.method, proposal_tree(found.tokens, vocab_size))
        return self.fallback.select(features)

    def observe(self, step: StepResult) -> None:
        if not step.proposed:
            self.fallback.observe(step)

    def reset(self) -> None:
        self.fallback.reset()

    def __repr__(self) -> str:
        return (f"LookupFirst({self.fallback!r}, length={self.length}, ngram={self.min_ngram}..{self.max_ngram}, "
                f"method={self.method})")
