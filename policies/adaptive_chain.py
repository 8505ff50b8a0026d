"""The adaptive chain: a chain length that follows recent acceptance (numpy only)."""

from __future__ import annotations

import numpy as np

from decoding.actions import Action
from decoding.policy import Policy, RootFeatures


class AdaptiveChain(Policy):
    """The acceptance-tracking chain length of SGLang / vLLM-style serving: a moving average of recent accepted
    lengths picks the next chain's length ``L1`` (``K = 1, L2 = 0``).

    It reads no features (``needs_draft`` False: the draft does no extra work) and infers each step's accepted length
    from the context length it is called with: a step that drafted L tokens and accepted a of them advances the
    context by ``a + 1``. A jump it cannot explain (a new prompt) restarts it at ``initial``. Rule: ``avg <- decay *
    avg + (1 - decay) * a``, next length = ``clip(floor(avg + 1/2) + 1, 1, max_length)``, so a chain that is fully
    accepted grows by one and a rejected one shrinks."""

    needs_draft = False

    def __init__(self, max_length: int, initial: int = 2, decay: float = 0.5) -> None:
        if max_length < 1 or not 1 <= initial <= max_length or not 0 <= decay < 1:
            raise ValueError(f"AdaptiveChain needs 1 <= initial ({initial}) <= max_length ({max_length}) and "
                             f"0 <= decay ({decay}) < 1")
        self.max_length, self.initial, self.decay = int(max_length), int(initial), float(decay)
        self.reset()

    def reset(self) -> None:
        self.avg = float(self.initial - 1)
        self.length = self.initial
        self.last_context: int | None = None

    def select(self, features: RootFeatures) -> Action:
        ctx = int(features.context_length)
        if self.last_context is not None and 1 <= ctx - self.last_context <= self.length + 1:
            accepted = ctx - self.last_context - 1
            self.avg = self.decay * self.avg + (1 - self.decay) * accepted
            self.length = int(min(self.max_length, max(1, np.floor(self.avg + 0.5) + 1)))
        elif self.last_context is not None:
            self.reset()
        self.last_context = ctx
        return Action(1, self.length, 0)

    def __repr__(self) -> str:
        return f"AdaptiveChain(max_length={self.max_length}, initial={self.initial}, decay={self.decay})"
