"""Context lookup drafts (policies/lookup.py): the proposal rule, losslessness by exact enumeration for every chain
verifier (with a negative control), and the decoder's lookup steps on real KV caches (greedy equals autoregressive)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair

from decoding.actions import AUTOREGRESSIVE, Action
from decoding.exact import TablePair, chained_law, law_distance, target_law, tree_p_rows, with_cache
from decoding.policy import Choice, Policy, StaticPolicy, StepResult, StepTiming
from decoding.sampling import Sampling
from decoding.tree import proposal_tree
from engine.decoder import SpeculativeDecoder
from policies.lookup import LookupFirst, Proposal, propose
from verifiers import METHODS, get_method

# ---------------------------------------------------------------- the proposal rule


def test_the_longest_suffix_wins_and_its_most_recent_occurrence():
    #          0  1  2  3  4  5  6  7  8  9 10
    context = [5, 1, 2, 9, 7, 1, 2, 3, 4, 1, 2]  # suffix [1, 2]: at 1 (then 9) and at 5 (then 3): most recent
    assert propose(context, 3, max_ngram=2) == Proposal((3, 4, 1), 2)
    # suffix [9, 1, 2] never occurred: the 3-gram fails, the 2-gram matches
    assert propose(context, 3, max_ngram=3) == Proposal((3, 4, 1), 2)
    # a 3-gram that did occur beats a more recent 2-gram
    context = [7, 1, 2, 8, 0, 1, 2, 6, 7, 1, 2]  # [7, 1, 2] at 0 (then 8); [1, 2] most recently at 5 (then 6)
    assert propose(context, 2, max_ngram=3) == Proposal((8, 0), 3)
    assert propose(context, 2, max_ngram=2) == Proposal((6, 7), 2)


def test_no_match_and_the_length_cap():
    assert propose([1, 2, 3, 4], 5, max_ngram=2) is None
    assert propose([3], 5) is None  # nothing before the root
    assert propose([1, 2, 3, 4, 2], 5, max_ngram=2, min_ngram=1) == Proposal((3, 4, 2), 1)
    assert propose([1, 2, 3, 4, 2], 5, max_ngram=2, min_ngram=2) is None
    assert propose([1, 2, 3, 4, 2], 1, max_ngram=1) == Proposal((3,), 1)
    with pytest.raises(ValueError, match="min_ngram"):
        propose([1, 2], 3, max_ngram=1, min_ngram=2)


def test_proposal_tree_is_a_chain_with_one_hot_rows():
    tree = proposal_tree([3, 1], vocab_size=5)
    assert tree.action == Action(1, 2, 0)
    assert tree.tokens.tolist() == [-1, 3, 1]
    assert tree.q_rows[0].tolist() == [0, 0, 0, 1, 0] and tree.q_rows[1].tolist() == [0, 1, 0, 0, 0]
    assert not tree.q_rows[2].any()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        proposal_tree([7], vocab_size=5)


# ---------------------------------------------------------------- losslessness, exactly

CHAIN_METHODS = sorted(m for m, v in METHODS.items() if v.supports(proposal_tree([0, 0, 0], 3)))


def _lookup_law(pair: TablePair, prompt: tuple[int, ...], n_tokens: int, method: str, length: int,
                wrong_q: bool = False) -> dict:
    """Exact law of the first ``n_tokens`` tokens after ``prompt`` when every step verifies the lookup proposal
    (a plain step where there is none). ``wrong_q``: the negative control verifies the proposal as if the draft had
    given it only half its mass."""
    m = with_cache(get_method(method))

    def step(ctx):
        found = propose(ctx, length, max_ngram=2)
        if found is None:
            p = pair.p(ctx)
            return {(int(t),): float(p[t]) for t in np.flatnonzero(p > 0)}
        tree = proposal_tree(found.tokens, pair.vocab_size)
        if wrong_q:
            tree.q_rows[:-1] = 0.5 * tree.q_rows[:-1] + 0.5 / pair.vocab_size
        return dict(m.outcome_distribution(tree, tree_p_rows(tree, pair, ctx)))

    return chained_law(step, n_tokens, prompt)


@pytest.mark.parametrize("method", CHAIN_METHODS)
@pytest.mark.parametrize("seed", [0, 1])
def test_lookup_chains_are_lossless_exactly(method, seed):
    pair = TablePair(3, seed)
    prompt = (0, 1, 2, 0, 1)  # repeats: the first step proposes (2, 0, 1), later ones propose what they find
    got = _lookup_law(pair, prompt, 4, method, length=3)
    assert law_distance(got, target_law(pair, 4, prompt)) < 1e-12


def test_verifying_with_the_wrong_q_is_caught():
    """Negative control: the same enumeration detects a proposal verified against a q that did not propose it."""
    gaps = [law_distance(_lookup_law(TablePair(3, s), (0, 1, 2, 0, 1), 3, "naive", 3, wrong_q=True),
                         target_law(TablePair(3, s), 3, (0, 1, 2, 0, 1))) for s in range(3)]
    assert max(gaps) > 1e-3, gaps


# ---------------------------------------------------------------- the policy and the decoder


class _Spy(Policy):
    """A fallback that records what it is asked and told."""

    needs_draft = False

    def __init__(self, action: Action) -> None:
        self.action, self.asked, self.observed = action, 0, 0

    def select(self, features):
        self.asked += 1
        return Choice(self.action, "traversal")

    def observe(self, step):
        self.observed += 1


class _Features:
    def __init__(self, context, vocab_size=8):
        self.context = context
        self.p_prev = np.full(vocab_size, 1.0 / vocab_size)  # the target's row: the proposal's rows are as wide


def test_lookup_first_proposes_or_asks_its_fallback():
    spy = _Spy(Action(2, 0, 1))
    policy = LookupFirst(spy, length=2, max_ngram=2, method="naive")
    choice = policy.select(_Features([4, 5, 6, 4, 5]))
    assert (choice.action, choice.method, choice.stop_after) == (Action(1, 2, 0), "naive", None)
    assert choice.proposal.tokens.tolist() == [-1, 6, 4] and choice.proposal.q_rows.shape == (3, 8)
    assert choice.proposal.q_rows[0, 6] == choice.proposal.q_rows[1, 4] == 1.0  # one-hot rows: q(x_i) = 1
    policy.observe(StepResult(choice.action, "naive", [6], None, 4, StepTiming(0.1, 0.0, 0.1), proposed=True))
    assert spy.asked == 0 and spy.observed == 0  # a lookup step is not the fallback's
    assert policy.select(_Features([4, 5, 6])) == Choice(Action(2, 0, 1), "traversal")
    policy.observe(StepResult(Action(2, 0, 1), "traversal", [1], None, 2, StepTiming(0.2, 0.1, 0.1)))
    assert spy.asked == 1 and spy.observed == 1
    plain = LookupFirst(None, length=2)
    assert plain.select(_Features([1, 2, 3])) == Action(1, 0, 0) and not plain.needs_draft


def _repetitive_prompt() -> list[int]:
    base = [3, 17, 42, 8, 23, 5, 61, 12]
    return base + [30, 31] + base[:5]


@pytest.mark.parametrize("fallback", [None, Action(2, 0, 1), Action(1, 2, 0)])
def test_greedy_decoding_with_lookup_steps_equals_autoregressive(fallback):
    """Greedy: every lossless policy emits the target's greedy sequence, so any slip in the caches after lookup
    steps (the target's pruning, the draft catching up on accepted proposals) changes the tokens."""
    target, draft = untied_pair(0)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    prompt = _repetitive_prompt()
    ar = decoder.generate(prompt, 40, AUTOREGRESSIVE, sampling=Sampling(0.0))
    fb = StaticPolicy(fallback) if fallback is not None else None
    got = decoder.generate(prompt, 40, "traversal", LookupFirst(fb, length=3, max_ngram=2), Sampling(0.0))
    assert got.tokens == ar.tokens
    lookups = sum(n for k, n in got.stats.classes.items() if k.startswith("lookup:"))
    assert lookups >= 1  # the prompt repeats itself: the first step at least proposes
    if fallback is not None:
        assert got.stats.classes[f"traversal:{fallback}"] >= 1  # and the fallback drafted after lookup steps


def test_sampled_lookup_steps_keep_both_caches_whole():
    """Sampling at T = 1 with lookup and drafted steps mixed: the target cache holds the emitted sequence up to the
    root, and the draft, once caught up, agrees with a fresh causal forward of that sequence."""
    target, draft = untied_pair(1)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    prompt = _repetitive_prompt()
    state = decoder.start(prompt, Sampling(1.0))
    from engine.decoder import DecodeRun
    from engine.stats import DecodeStats, Timer

    policy = LookupFirst(StaticPolicy(Action(1, 1, 0)), length=3, max_ngram=1)
    run = DecodeRun(policy, get_method("traversal"), Sampling(1.0), np.random.default_rng(0), DecodeStats("traversal"),
                    Timer(torch.device("cpu")), hidden=False)
    kinds = set()
    for _ in range(25):
        res = decoder.step(state, run)
        kinds.add(res.proposed)
        assert not res.proposed or res.action.tree_size > 0
        assert len(state.kv_t) == len(state.prompt) + len(state.out) - 1
    assert kinds == {True, False}  # both kinds of step happened
    q_root, _ = decoder.draft_root(state, Sampling(1.0), False)
    seq = state.prompt + state.out
    with torch.no_grad():
        ref = torch.softmax(draft(torch.tensor([seq])).logits[0, -1].float(), -1).numpy()
    assert np.abs(q_root - ref).max() < 1e-4
