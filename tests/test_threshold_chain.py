"""The confidence-threshold dynamic chain (policies/threshold_chain.py): lossless by exact enumeration (with a
negative control that a target-peeking stop rule is caught), and its drafting on a real draft cache."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair

from decoding.actions import Action
from decoding.exact import (
    TablePair,
    chained_law,
    enumerate_trees,
    law_distance,
    target_law,
    tree_p_rows,
    with_cache,
)
from decoding.sampling import Sampling
from engine.cache import KVState
from engine.decoder import SpeculativeDecoder
from engine.drafting import DraftRoot, DraftRule, draft_stop_chain, draft_tree
from engine.torch_sampling import prob_rows
from engine.tree_pass import causal_allowed, forward_nodes
from policies.threshold_chain import ThresholdChain, stop_length, truncate_chain
from verifiers import get_method


def _emitted_law(pair: TablePair, max_length: int, n_tokens: int, stop) -> dict:
    """Exact law of the first ``n_tokens`` tokens when each step drafts a chain of ``max_length``, cuts it to
    ``stop(tree, p_rows)`` tokens and verifies the cut chain with standard speculative sampling."""
    naive = with_cache(get_method("naive"))

    def step(ctx):
        law: dict = {}
        for tree, prob in enumerate_trees(Action(1, max_length, 0), pair, ctx):
            cut = truncate_chain(tree, stop(tree, tree_p_rows(tree, pair, ctx)))
            for toks, mass in naive.outcome_distribution(cut, tree_p_rows(cut, pair, ctx)).items():
                law[toks] = law.get(toks, 0.0) + prob * mass
        return law

    return chained_law(step, n_tokens)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_confidence_stop_is_lossless_exactly(seed):
    pair = TablePair(3, seed)
    lengths = set()

    def confident(tree, _p_rows):  # the rule: draft-side rows only
        n = stop_length(tree.q_rows, 3, 0.8)
        lengths.add(n)
        return n

    got = _emitted_law(pair, 3, 3, confident)
    assert law_distance(got, target_law(pair, 3)) < 1e-12
    assert len(lengths) > 1  # the rule did cut chains at different lengths


def test_a_stop_rule_that_peeks_at_the_target_is_caught():
    """Negative control: stopping before the first token the target dislikes (p < q) is not lossless; the
    same enumeration detects it, so the test above can fail."""
    def peeking(tree, p_rows):
        for i in range(1, tree.num_nodes - 1):
            x = int(tree.tokens[i + 1])
            if p_rows[i, x] < tree.q_rows[i, x]:
                return i
        return tree.num_nodes - 1

    gaps = [law_distance(_emitted_law(TablePair(3, s), 3, 3, peeking), target_law(TablePair(3, s), 3)) for s in range(3)]
    assert max(gaps) > 1e-3, gaps


def test_stop_length_and_policy():
    q = np.array([[0.9, 0.1], [0.5, 0.5], [1.0, 0.0]])
    assert stop_length(q, 3, 0.4) == 3 and stop_length(q, 3, 0.6) == 2 and stop_length(q, 3, 0.95) == 1
    assert stop_length(q, 1, 0.0) == 1
    pol = ThresholdChain()
    assert (pol.max_length, pol.threshold) == (20, 0.4)
    choice = pol.select(None)  # the engine drafts the chain with the stop rule
    assert (choice.action, choice.proposal) == (Action(1, 20, 0), None)
    assert choice.stop_after(np.array([0.35, 0.3, 0.35])) and not choice.stop_after(np.array([0.4, 0.6, 0.0]))
    with pytest.raises(ValueError, match="threshold"):
        ThresholdChain(4, 1.5)


def _root_cache(draft, prompt):
    kv = KVState(draft)
    logits, _ = forward_nodes(kv, prompt, list(range(len(prompt))), causal_allowed(0, len(prompt)), keep=1)
    return kv, prob_rows(logits[-1], Sampling(), VOCAB)


@torch.inference_mode()
def test_drafting_stops_where_the_rule_says_and_matches_the_fixed_chain():
    _, draft = untied_pair(seed=0, noise=0.3)
    prompt = [3, 7, 1, 9, 4]
    kv, q_root = _root_cache(draft, prompt)
    full = draft_tree(DraftRoot(kv, q_root), Action(1, 6, 0), DraftRule(Sampling(), VOCAB), np.random.default_rng(5))
    confidences = full.tree.q_rows[:6].max(axis=1)
    for threshold in (0.0, float(np.median(confidences)), 1.0):
        kv, q_root = _root_cache(draft, prompt)
        rule = ThresholdChain(6, threshold).stops_after
        got = draft_stop_chain(DraftRoot(kv, q_root), 6, rule, DraftRule(Sampling(), VOCAB),
                               np.random.default_rng(5))
        n = stop_length(full.tree.q_rows, 6, threshold)
        assert got.tree.action == Action(1, n, 0)
        np.testing.assert_array_equal(got.tree.tokens, full.tree.tokens[: n + 1])
        np.testing.assert_allclose(got.tree.q_rows[:n], full.tree.q_rows[:n], atol=1e-6)
        assert got.forwards == n - 1 and len(kv) == len(prompt) + n - 1  # no draft work past the stop


def _decode_steps(policy, sampling, seed=3, n=40):
    target, draft = untied_pair(seed=0, noise=0.3)
    dec = SpeculativeDecoder(target, draft, VOCAB)
    res = dec.generate([1, 5, 9, 3], n, "naive", policy, sampling, seed=seed)
    return dec, res, res.steps


def test_the_decoder_drafts_through_the_policy_hook_and_records_the_realized_chain():
    pol = ThresholdChain(max_length=6, threshold=0.2)
    _, res, steps = _decode_steps(pol, Sampling(0.3))  # sharp enough rows that some chains continue
    lengths = [s.action.L1 for s in steps]
    assert all(s.action.K == 1 and s.action.L2 == 0 for s in steps)
    assert len(set(lengths)) > 1 and max(lengths) <= 6  # the stop rule cut chains (not always the cap)
    # the stats hold the realized shapes, as step classes (`decoding.pricing.step_class`)
    assert res.stats.classes == Counter(f"{s.method}:{s.action}" for s in steps)
    # the extremes: a threshold of 0 never stops early, one of 1 always stops after the first token
    assert {s.action for s in _decode_steps(ThresholdChain(6, 0.0), Sampling())[2][:-1]} == {Action(1, 6, 0)}
    assert {s.action for s in _decode_steps(ThresholdChain(6, 1.0), Sampling())[2]} == {Action(1, 1, 0)}


def test_greedy_decoding_with_the_threshold_chain_is_the_autoregressive_text():
    greedy = Sampling(temperature=0.0)
    dec, res, steps = _decode_steps(ThresholdChain(6, 0.5), greedy)
    ar = dec.generate([1, 5, 9, 3], 40, "autoregressive", sampling=greedy)
    assert res.tokens == ar.tokens and max(s.action.L1 for s in steps) > 1  # greedy rows are one-hot
