"""The one price of a step (decoding/pricing.py): hand-computed prices, measured ratios, the decision rule."""

import numpy as np
import pytest
from test_latency import toy, tp, tq

from decoding import pricing
from decoding.actions import Action, ActionSpace
from decoding.latency import LatencyProfileError, StepRatios
from decoding.policy import StepResult, StepTiming

ACTIONS = [Action(1, 0, 0), Action(4, 0, 0), Action(1, 3, 0), Action(2, 0, 2), Action(3, 2, 1), Action(2, 2, 3)]


def _tables_sum(l):  # noqa: E741 (the forwards each action's step makes, from the toy's tables)
    return np.array([
        tp(l, 1),  # autoregressive: one target pass on the root, no draft
        tp(l, 1),  # K ignored when L2 = 0
        tq(l, 1) + tq(l + 1, 1) + tq(l + 2, 1) + tp(l, 4),  # root, 2 fed trunk nodes (the 3rd is a leaf)
        tq(l, 1) + tq(l + 1, 2) + (tp(l, 4) * 3 + tp(l, 8)) / 4,  # root, one rollout level of 2 rows; n = 5
        tq(l, 1) + tq(l + 1, 1) + tq(l + 2, 1) + (tp(l, 4) + tp(l, 8)) / 2,  # L2 = 1: leaves only; n = 6
        tq(l, 1) + tq(l + 1, 1) + tq(l + 2, 1) + tq(l + 3, 2) + tq(l + 5, 2) + (tp(l, 8) * 7 + tp(l, 16)) / 8,
    ])


def test_without_measured_ratios_a_step_is_its_forwards_from_the_tables():
    m = toy()
    np.testing.assert_allclose(pricing.step_seconds(m, [100], ACTIONS)[0], _tables_sum(100), rtol=1e-12)
    np.testing.assert_allclose(pricing.model_ratio(m, [100], ACTIONS)[0], _tables_sum(100) / tp(100, 1), rtol=1e-12)
    with pytest.raises(ValueError, match="features"):
        pricing.step_seconds(m, [100], ACTIONS, None, "all")


def test_draft_forwards_list_each_forward_with_its_offset_and_rows():
    idx, rel, rows = pricing.draft_forwards([Action(3, 1, 3), Action(1, 0, 0)])
    assert idx.tolist() == [0, 0, 0, 0]
    assert list(zip(rel.tolist(), rows.tolist(), strict=True)) == [(0, 1), (1, 1), (2, 3), (5, 3)]


def _forwards_and_nodes():  # F(a) and N(a) of ACTIONS, by hand
    return np.array([0, 0, 3, 2, 3, 5]), np.array([0, 0, 3, 4, 5, 8])


def test_fitted_ratios_price_a_step_as_a_line_in_its_terms_times_a_plain_step():
    """tables * model ratio + step + forward * F + node * N, times the plain step (tables' pass x plain_scale); the
    plain step stays 1x whatever the coefficients; the context dependence comes from the tables."""
    coef = {"tables": 0.9, "step": 0.2, "forward": 0.05, "node": 0.01}
    m = toy(step_ratios=StepRatios(plain_scale=1.25, context=200.0, tree=coef))
    forwards, nodes = _forwards_and_nodes()
    for c in (200, 400):
        plain = tp(c, 1) * 1.25
        got = pricing.step_seconds(m, [c], ACTIONS)[0]
        want = plain * (0.9 * _tables_sum(c) / tp(c, 1) + 0.2 + 0.05 * forwards + 0.01 * nodes)
        want[:2] = plain
        np.testing.assert_allclose(got, want, rtol=1e-12)
    terms = pricing.tree_terms(m, [200], ACTIONS)[0]
    np.testing.assert_array_equal(terms[:2], 0.0)
    np.testing.assert_array_equal(terms[2:, 2], forwards[2:])
    np.testing.assert_array_equal(terms[2:, 3], nodes[2:])


def test_deciding_costs_its_feature_seconds_plus_inference_and_paper_adds_the_root_draft_step():
    m = toy(feature_seconds={"target_only": 2e-4, "paper": 7e-4})
    base = pricing.step_seconds(m, [150], ACTIONS)[0]
    target_only = pricing.step_seconds(m, [150], ACTIONS, None, "target_only", inference_seconds=1e-4)[0]
    np.testing.assert_allclose(target_only - base, 2e-4 + 1e-4, rtol=1e-12)
    paper = pricing.step_seconds(m, [150], ACTIONS, None, "paper")[0] - base
    np.testing.assert_allclose(paper[:2], 7e-4 + tq(150, 1), rtol=1e-12)  # declining: the draft's root
    np.testing.assert_allclose(paper[2:], 7e-4, rtol=1e-12)
    with pytest.raises(LatencyProfileError, match="no feature cost for feature set 'paper'"):
        pricing.step_seconds(toy(feature_seconds={"target_only": 2e-4}), [150], ACTIONS, None, "paper")


def test_each_method_pays_its_own_verification_beyond_traversal_method_major():
    verify = {"traversal": {"2,0,2": 3e-4, "1,3,0": 3e-4}, "gbv": {"2,0,2": 5.2e-3, "1,3,0": 6e-4}}
    m = toy(verify_seconds=verify)
    np.testing.assert_allclose(pricing.verify_offset(m, "gbv", ACTIONS), [0, 0, 3e-4, 4.9e-3, 0, 0], atol=1e-15)
    for none in ("traversal", "specinfer", None):
        np.testing.assert_array_equal(pricing.verify_offset(m, none, ACTIONS), np.zeros(len(ACTIONS)))
    per = pricing.step_seconds(m, [150, 300], ACTIONS)
    got = pricing.step_seconds(m, [150, 300], ACTIONS, ["traversal", "gbv"])
    assert got.shape == (2, 2 * len(ACTIONS))
    np.testing.assert_allclose(got[:, len(ACTIONS):], per + pricing.verify_offset(m, "gbv", ACTIONS), atol=1e-15)


def test_per_root_lengths_are_priced_once_per_distinct_length_in_their_order():
    m = toy()
    space = ActionSpace(K=range(1, 3), L1=range(0, 2), L2=range(0, 3))
    got = pricing.step_seconds(m, [300, 40, 300, 1000], space, None, "paper")
    for row, c in zip(got, [300, 40, 300, 1000], strict=True):
        np.testing.assert_array_equal(row, pricing.step_seconds(m, [c], space, None, "paper")[0])
    assert pricing.step_seconds(m, np.zeros(0, dtype=int), space).shape == (0, len(space))


def test_lookup_chains_are_one_target_pass_of_1_plus_n_tokens_in_the_fitted_line():
    m = toy(step_ratios=StepRatios(1.0, 100.0, chain={"tables": 1.1, "step": 0.05, "node": 0.02}))
    got = pricing.lookup_seconds(m, [100], [1, 3])[0]
    assert got[0] == pytest.approx(tp(100, 1) * (1.1 * tp(100, 2) / tp(100, 1) + 0.05 + 0.02))
    assert got[1] == pytest.approx(tp(100, 1) * (1.1 * tp(100, 4) / tp(100, 1) + 0.05 + 0.06))
    assert pricing.lookup_seconds(toy(), [100], [3])[0, 0] == pytest.approx(tp(100, 4))  # the tables alone


def test_decide_is_argmax_of_predicted_over_seconds_over_valid_outputs():
    E = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, np.nan]])
    T = np.array([[1.0, 1.0, 1.0], [1.0, 1.5, 1.0]])
    assert pricing.decide(E, T).tolist() == [2, 1]
    assert pricing.decide(E, T, valid=np.array([True, True, False])).tolist() == [1, 1]
    assert pricing.decide(np.array([2.0, 2.0]), np.array([1.0, 1.0])) == 0  # ties go to the first output


def test_a_decoded_step_is_priced_by_its_class():
    m = toy(step_ratios=StepRatios(1.0, 100.0, chain={"tables": 1.0, "step": 0.2, "node": 0.0}), verify_seconds={
        "traversal": {"1,3,0": 1e-4}, "naive": {"1,3,0": 2e-4}}, feature_seconds={"target_only": 3e-4})
    timing = StepTiming(0.05, 0.01, 0.03)

    def step(action, method=None, proposed=False, selected=False):
        return StepResult(action, method, [0], None, 100, timing, proposed, selected)

    chain = Action(1, 3, 0)
    assert pricing.step_class(chain, "naive", False) == "naive:1,3,0"
    assert pricing.step_class(chain, "naive", True) == "lookup:3"
    assert pricing.step_class(Action(1, 0, 0), None, False) == "plain"
    assert [pricing.step_kind(k) for k in ("plain", "lookup:3", "naive:1,3,0", "traversal:2,1,1")] == [
        "plain", "lookup", "draft", "draft"]
    assert pricing.kind_counts({"plain": 2, "lookup:3": 1, "naive:1,2,0": 4, "traversal:2,0,1": 1}) == {
        "plain": 2, "lookup": 1, "draft": 5}
    assert pricing.kind_counts({}) == {"plain": 0, "lookup": 0, "draft": 0}
    plain = tp(100, 1)
    assert pricing.price_step(m, step(Action(1, 0, 0))) == pytest.approx(plain)
    assert pricing.price_step(m, step(Action(1, 0, 0), selected=True), "target_only", 1e-4) == pytest.approx(
        plain + 3e-4 + 1e-4)
    assert pricing.price_step(m, step(chain, "naive", proposed=True, selected=True), "target_only") == pytest.approx(
        tp(100, 4) + 0.2 * plain)  # a lookup chain of 3: a pass of 4 tokens plus the fitted step; no deciding
    drafted = pricing.step_seconds(m, [100], [chain], ["naive"])[0, 0]
    assert pricing.price_step(m, step(chain, "naive")) == pytest.approx(drafted)
    assert drafted == pytest.approx(_tables_sum(100)[2] + 1e-4)  # naive's verify offset beyond Traversal's
