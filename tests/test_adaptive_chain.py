"""The acceptance-tracking adaptive chain (policies.adaptive_chain.AdaptiveChain): its rule on hand-made steps and,
through the real decoder, that the accepted lengths it infers from context lengths are the decoder's."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import VOCAB, untied_pair

from decoding.actions import Action
from decoding.policy import RootFeatures
from decoding.sampling import Sampling
from engine.decoder import SpeculativeDecoder
from policies.adaptive_chain import AdaptiveChain


def _root(ctx: int) -> RootFeatures:
    return RootFeatures(ctx, Sampling(), None)


def test_rule_grows_on_full_acceptance_shrinks_on_rejection_and_restarts_on_a_new_prompt():
    pol = AdaptiveChain(max_length=4, initial=2, decay=0.5)
    assert pol.select(_root(10)) == Action(1, 2, 0)  # first call: the initial length (avg 1)
    assert pol.select(_root(13)) == Action(1, 3, 0)  # accepted 2: avg 1.5 -> floor(2.0) + 1
    assert pol.select(_root(17)) == Action(1, 3, 0)  # accepted 3: avg 2.25 -> floor(2.75) + 1
    assert pol.select(_root(21)) == Action(1, 4, 0)  # accepted 3: avg 2.625 -> 3 + 1 (max_length 4)
    assert pol.avg == pytest.approx(2.625)
    assert pol.select(_root(22)) == Action(1, 2, 0)  # accepted 0: avg 1.3125 -> 1 + 1
    assert pol.select(_root(23)) == Action(1, 2, 0)  # accepted 0: avg 0.656 -> 1 + 1
    assert pol.select(_root(24)) == Action(1, 1, 0)  # accepted 0: avg 0.328 -> 0 + 1
    assert pol.select(_root(5)) == Action(1, 2, 0) and pol.avg == pytest.approx(1.0)  # a new prompt: restart
    pol.select(_root(7))  # accepted 1: avg 1.0
    assert pol.select(_root(40)) == Action(1, 2, 0) and pol.last_context == 40  # more than L + 1: restart
    with pytest.raises(ValueError, match="initial"):
        AdaptiveChain(max_length=2, initial=3)


def test_inferred_acceptance_matches_the_decoder():
    target, draft = untied_pair(seed=0, noise=0.3)
    dec = SpeculativeDecoder(target, draft, VOCAB)
    seen = []

    class Recorded(AdaptiveChain):  # what the policy knew after each step
        def observe(self, step):
            super().observe(step)
            seen.append((step.action, len(step.tokens) - 1, self.avg, self.length))

    pol = Recorded(max_length=5, initial=1, decay=0.5)
    dec.generate([1, 5, 9, 3], 40, "naive", pol, Sampling(), seed=3)
    assert len(seen) > 3 and all(a.K == 1 and a.L2 == 0 and a.L1 >= 1 for a, *_ in seen)
    avg, length = 0.0, 1
    for i, (action, accepted, _, _) in enumerate(seen):
        assert action == Action(1, length, 0), f"step {i}"
        if i + 1 < len(seen):  # the policy updates when it is called for the next step
            avg = 0.5 * avg + 0.5 * accepted
            length = min(5, max(1, int(np.floor(avg + 0.5)) + 1))
    assert len({a.L1 for a, *_ in seen}) > 1  # it does adapt on this pair
