"""The two-stage decision online (decoding.policy.Cascade through SpeculativeDecoder): declining never runs the
draft, stage 2 sees the draft's root row (stage 1 never does), and greedy decoding stays the autoregressive text."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import VOCAB, untied_pair

from decoding.actions import Action
from decoding.engine import SpeculativeDecoder
from decoding.policy import Cascade, Choice, StaticPolicy
from decoding.sampling import Sampling

PROMPT = [1, 5, 9, 3]


class _Rule:
    """A hand-made selector recording what it saw; ``rule(features) -> Action | Choice``."""

    def __init__(self, rule, draft: bool) -> None:
        self.rule, self.needs_draft, self.needs_hidden_states, self.seen = rule, draft, False, []

    def select(self, features):
        self.seen.append(features)
        return self.rule(features)


def _counting_decoder():
    target, draft = untied_pair(seed=0, noise=0.3)
    calls = {"draft": 0}

    def count(module, args, kwargs):
        calls["draft"] += 1

    draft.register_forward_pre_hook(count, with_kwargs=True)
    return SpeculativeDecoder(target, draft, VOCAB), calls


def _stage2_by_confidence(features):  # a longer chain where the draft's root row is confident
    return Choice(Action(1, 3, 0) if float(features.q_root.max()) > 0.3 else Action(1, 1, 0), "naive")


def test_declining_never_runs_the_draft_and_speculating_refines_after_the_root_step():
    dec, calls = _counting_decoder()
    stage1 = _Rule(lambda f: Action(1, 2, 0) if f.context_length % 3 == 0 else Action(1, 0, 0), draft=False)
    stage2 = _Rule(_stage2_by_confidence, draft=True)
    per_step, last = [], {"draft": 0}

    def record(state, step):
        per_step.append((step.action, calls["draft"] - last["draft"]))
        last["draft"] = calls["draft"]

    res = dec.generate(PROMPT, 40, "traversal", Cascade(stage1, stage2), Sampling(0.3), seed=2, on_step=record)
    declined = [d for a, d in per_step if a.tree_size == 0]
    spoken = [(a, d) for a, d in per_step if a.tree_size > 0]
    assert declined and spoken and res.stats.steps == len(per_step)
    assert all(d == 0 for d in declined)  # declining is one plain target step: no draft forward
    assert all(d >= 1 for _, d in spoken)  # the root step (and the tree) when it speculates
    assert {a for a, _ in spoken} == {Action(1, 1, 0), Action(1, 3, 0)}  # stage 2 picked the shape, not stage 1
    assert len(stage2.seen) == len(spoken) and len(stage1.seen) == len(per_step)
    assert all(f.q_root is None and f.q_prev is None for f in stage1.seen)
    assert all(f.q_root is not None and f.q_root.shape == (VOCAB,) for f in stage2.seen)
    assert set(res.stats.methods) == {"naive"}  # stage 2's method, not the decoder's


def test_always_declining_is_autoregressive_decoding_without_the_draft():
    dec, calls = _counting_decoder()
    cascade = Cascade(StaticPolicy(Action(1, 0, 0)), _Rule(_stage2_by_confidence, draft=True))
    res = dec.generate(PROMPT, 24, "traversal", cascade, Sampling(), seed=4)
    ar = dec.generate(PROMPT, 24, "autoregressive", sampling=Sampling(), seed=4)
    assert res.tokens == ar.tokens and calls["draft"] == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_decoding_with_a_cascade_is_the_autoregressive_text(seed):
    dec, _ = _counting_decoder()
    stage1 = _Rule(lambda f: Action(2, 2, 1) if f.context_length % 2 else Action(1, 0, 0), draft=False)
    stage2 = _Rule(lambda f: Action(2, 2, 1) if float(np.max(f.q_root)) > 0.5 else Action(1, 2, 0), draft=True)
    greedy = Sampling(temperature=0.0)
    res = dec.generate(PROMPT, 32, "traversal", Cascade(stage1, stage2), greedy, seed=seed)
    ar = dec.generate(PROMPT, 32, "autoregressive", sampling=greedy, seed=seed)
    assert res.tokens == ar.tokens and len(stage2.seen) > 0


def test_stage_one_must_not_need_the_draft():
    with pytest.raises(ValueError, match="stage 1"):
        Cascade(_Rule(_stage2_by_confidence, draft=True), StaticPolicy(Action(1, 2, 0)))
